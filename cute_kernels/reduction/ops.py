"""Torch ops `cute_kernels::row_sum` (sum over the last dim) and `::sum_all` (lesson 2).

fp32 accumulation in a fixed order: the same input gives the same bits on every run (on a given GPU
model: the split count follows the SM count). Rows too long to fill the GPU are split over CTAs;
their fp32 partials are summed by a second launch of the same kernel, never by atomics. The output
dtype defaults to the input's, like `torch.sum`. An input whose last dim is not unit-stride, or whose
leading dims cannot be flattened to one row stride, is first copied to a contiguous buffer.
"""

from __future__ import annotations

import torch

from cute_kernels import dtypes
from cute_kernels.reduction import COL_SUM, ROW_SUM
from cute_kernels.torch_ops import INDEX32_LIMIT, call, check_out_dtype, check_tensor, register_op
from cute_kernels.torch_ops import rows_of as _rows_of
from schedules.hardware import num_sms
from schedules.row_tiling import plan_rows


def _kernel(dtype, out_dtype, aligned, index64, tiling):
    """The row sum for `tiling` (its schedule) and this signature, from the compile cache."""
    return ROW_SUM.compiled(tiling, dtype=dtypes.name_of(dtype), out_dtype=dtypes.name_of(out_dtype), aligned=aligned,
                            index64=index64)


def _sum_rows(x2: torch.Tensor, out: torch.Tensor, **plan_options) -> None:
    """out[m] = sum(x2[m, :]) for a (M, N) unit-stride matrix, M, N >= 1. `plan_options` override
    the schedule defaults of `plan_rows` (threads, unroll, ctas_per_sm; used by the tuner)."""
    m, n = x2.shape
    vec = 16 // x2.element_size()
    aligned = x2.data_ptr() % 16 == 0 and x2.stride(0) % vec == 0
    v = vec if aligned else 1
    index64 = max(m * x2.stride(0), n) > INDEX32_LIMIT
    sms = num_sms(x2.device.index or 0)
    plan = plan_rows(m, n // v, sms, **plan_options)
    if plan.splits == 1:
        _kernel(x2.dtype, out.dtype, aligned, index64, plan.tiling)(x2, out.view(m, 1), plan.max_ctas(sms))
        return
    partial = torch.empty(m, plan.splits, dtype=torch.float32, device=x2.device)
    _kernel(x2.dtype, torch.float32, aligned, index64, plan.tiling)(x2, partial, plan.max_ctas(sms))
    stage2 = plan_rows(m, plan.splits, sms, max_splits=1)
    _kernel(torch.float32, out.dtype, plan.splits % 4 == 0, False, stage2.tiling)(
        partial, out.view(m, 1), stage2.max_ctas(sms))


def sum_columns_into(partials: torch.Tensor, out: torch.Tensor) -> None:
    """out[:] = partials.sum(0) rounded once to out's dtype, for fp32 (C, N) partials (C >= 1, unit
    stride along N) and a contiguous (N,) out: `COL_SUM`, fp32 in a fixed order (the same bits
    every run), the cast fused. The norms' backward finishes its per-CTA weight-gradient partials with
    it: one launch of 1.7 us where torch's sum(0) and cast took 7.0 + 1.0 us (C = 264, N = 4096, H200)."""
    c, n = partials.shape
    vec = 16 // partials.element_size()
    aligned = (n % vec == 0 and partials.stride(0) % vec == 0 and partials.data_ptr() % 16 == 0
               and out.data_ptr() % (vec * out.element_size()) == 0)
    threads = min(1024, max(128, 32 * (1 << max(0, c - 1).bit_length())))
    fn = COL_SUM.compiled(dtype=dtypes.name_of(partials.dtype), out_dtype=dtypes.name_of(out.dtype), aligned=aligned,
                          threads=threads)
    fn(partials, out)


def _row_sum_fake(x, out_dtype=None):
    check_tensor("x", x, min_ndim=1)
    check_out_dtype("out_dtype", out_dtype)
    return torch.empty(x.shape[:-1], dtype=out_dtype or x.dtype, device=x.device)


def _sum_all_fake(x, out_dtype=None):
    check_tensor("x", x)
    check_out_dtype("out_dtype", out_dtype)
    return torch.empty((), dtype=out_dtype or x.dtype, device=x.device)


def _row_sum_cuda(x, out_dtype=None):
    out = _row_sum_fake(x, out_dtype)
    if out.numel() == 0:
        return out
    if x.shape[-1] == 0:
        return out.zero_()
    _sum_rows(_rows_of(x), out.view(-1))
    return out


def _sum_all_cuda(x, out_dtype=None):
    out = _sum_all_fake(x, out_dtype)
    if x.numel() == 0:
        return out.zero_()
    flat = (x if x.is_contiguous() else x.contiguous()).view(1, -1)
    _sum_rows(_rows_of(flat), out.view(1))
    return out


def _setup(ctx, inputs, output):
    ctx.shape, ctx.dtype = inputs[0].shape, inputs[0].dtype


register_op("cute_kernels::row_sum", "(Tensor x, ScalarType? out_dtype=None) -> Tensor", _row_sum_cuda, _row_sum_fake,
            lambda ctx, g: (g.unsqueeze(-1).expand(ctx.shape).to(ctx.dtype), None), _setup)
register_op("cute_kernels::sum_all", "(Tensor x, ScalarType? out_dtype=None) -> Tensor", _sum_all_cuda, _sum_all_fake,
            lambda ctx, g: (g.expand(ctx.shape).to(ctx.dtype), None), _setup)


def sum(x: torch.Tensor, dim: int | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:  # noqa: A001
    """Sum of all elements (`dim=None`) or over the last dim (`dim=-1`), fp32-accumulated, deterministic."""
    if dim is None:
        return call("cute_kernels::sum_all", x, out_dtype)
    if isinstance(x, torch.Tensor) and dim not in (-1, x.dim() - 1):
        raise ValueError(f"dim must be None or the last dim (-1), got {dim}; move that dim last first")
    return call("cute_kernels::row_sum", x, out_dtype)
