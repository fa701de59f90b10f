"""Torch op `cute_kernels::argmax` over the last dim (lesson 12).

Returns int64 indices like `torch.argmax(x, dim=-1)`: ties resolve to the lowest index and a row
holding a NaN returns the index of its first NaN. Bit-for-bit deterministic (the split count follows
the SM count, the result does not depend on it). Rows of zero length are an error (as in torch);
rows must be shorter than 2^32 elements. An input whose last dim is not unit-stride, or whose
leading dims cannot be flattened to one row stride, is first copied to a contiguous buffer.
"""

from __future__ import annotations

import torch

from cute_kernels import dtypes
from cute_kernels.argmax import ARGMAX
from cute_kernels.reduction.ops import _rows_of
from cute_kernels.torch_ops import INDEX32_LIMIT, UNCAPPED, call, check_tensor, register_op
from schedules.hardware import num_sms
from schedules.row_tiling import plan_rows


def _kernel(dtype: str, aligned, index64, keys_out, tiling, row_head=False):
    """The ArgMax kernel for `tiling` (its schedule) and this signature, from the compile cache."""
    return ARGMAX.compiled(tiling, dtype=dtype, aligned=aligned, index64=index64, keys_out=keys_out,
                           row_head=row_head)


# The per-row aligned head for 16-bit rows that are not 16-byte aligned. H200: bf16 16384 x 50257 3.08 -> 4.26 TB/s
# (73.0 -> 101 % of the read ceiling, 1.38x), test_argmax_row_heads passing: the default
ROW_HEAD_DEFAULT = True


def _argmax_rows(x2: torch.Tensor, out: torch.Tensor, row_head=None, **plan_options) -> None:
    """out[m] = argmax(x2[m, :]) for a (M, N) unit-stride matrix, M, N >= 1. `row_head`: None = the
    default (ROW_HEAD_DEFAULT), True / False to force the head + vectors path where it applies."""
    m, n = x2.shape
    vec = 16 // x2.element_size()
    aligned = x2.data_ptr() % 16 == 0 and x2.stride(0) % vec == 0
    # 16-bit rows that are not 16-byte aligned (odd lengths: a 50257-word vocabulary) read a scalar head up
    # to each row's first 16-byte boundary, then 128-bit vectors (the 2-byte scalar path ran 72 % of the
    # read ceiling on bf16 16384 x 50257); fp32's 4-byte scalar path already ran 98.5 % there
    row_head = (ROW_HEAD_DEFAULT if row_head is None else row_head) and (
        not aligned and x2.element_size() == 2 and n >= 2 * vec)
    v = vec if aligned or row_head else 1
    index64 = max(m * x2.stride(0), n) > INDEX32_LIMIT
    sms = num_sms(x2.device.index or 0)
    plan = plan_rows(m, (n - (v - 1)) // v if row_head else n // v, sms, unroll=4, **plan_options)
    name = dtypes.name_of(x2.dtype)
    if plan.splits == 1:
        # One CTA per row tile (no cap): the hardware keeps as many resident as registers allow.
        # The cap of plan.max_ctas (4 per SM) made fp32 32768x4096 1.33 waves once the two-level
        # scan took 39 registers (3 CTAs of 512 resident): 102% -> 83.5% of the read ceiling.
        _kernel(name, aligned, index64, False, plan.tiling, row_head)(x2, out.view(m, 1), UNCAPPED)
        return
    keys = torch.empty(m, plan.splits, dtype=torch.int64, device=x2.device)
    _kernel(name, aligned, index64, True, plan.tiling, row_head)(x2, keys, plan.max_ctas(sms))
    stage2 = plan_rows(m, plan.splits, sms, max_splits=1)
    _kernel("key", False, False, False, stage2.tiling)(keys, out.view(m, 1), stage2.max_ctas(sms))


def _argmax_fake(x):
    check_tensor("x", x, min_ndim=1)
    if x.shape[-1] == 0:
        raise ValueError(f"x has an empty last dim (shape {tuple(x.shape)}): argmax of nothing is undefined")
    if x.shape[-1] >= 2**32:
        raise ValueError(f"x rows must be shorter than 2^32 elements, got {x.shape[-1]}")
    return torch.empty(x.shape[:-1], dtype=torch.int64, device=x.device)


def _argmax_cuda(x):
    out = _argmax_fake(x)
    if out.numel():
        _argmax_rows(_rows_of(x), out.view(-1))
    return out


register_op("cute_kernels::argmax", "(Tensor x) -> Tensor", _argmax_cuda, _argmax_fake)


def argmax(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """Index of the maximum along the last dim (int64), like `torch.argmax(x, dim=-1)`."""
    if isinstance(x, torch.Tensor) and dim not in (-1, x.dim() - 1):
        raise ValueError(f"dim must be the last dim (-1), got {dim}; move that dim last first")
    out = call("cute_kernels::argmax", x)
    return out.unsqueeze(-1) if keepdim else out
