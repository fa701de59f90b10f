"""Torch op `cute_kernels::transpose`: swap the last two dims of a 2-D or batched 3-D tensor (lessons 8-9).

`transpose(x, variant=...)` returns a new contiguous tensor `x.transpose(-2, -1).contiguous()`,
bitwise. Variants (see `cute_kernels.transpose.kernels`): "naive" (uncoalesced writes, for
comparison), "smem" (padded shared-memory tile), "swizzle" (swizzled tile), "tma" (TMA load and
store of swizzled tiles; the default). The 16-byte variants need both dims multiples of 16 bytes of
elements (8 bf16/fp16, 4 fp32) and 16-byte aligned data; otherwise the scalar version of the same
variant runs ("tma" falls back to the scalar "swizzle"; also to "swizzle" for a dim of 2^31 elements,
past the TMA unit's 32-bit coordinates). The tile order is the catalogue default (`order=grouped`,
`schedules/tile_order.py`); a TMA transpose of a matrix of ~100 MiB or more gives each CTA a 2 x 2 block
of tiles (`schedules.tile_order.transpose_sub`). Inputs whose last dim is not unit-stride,
or whose batch dim cannot be expressed as one stride, are first copied to a contiguous buffer.
"""

from __future__ import annotations

import torch

from cute_kernels import catalog, dtypes
from cute_kernels.torch_ops import INDEX32_LIMIT, call, check_tensor, register_op
from cute_kernels.transpose import VARIANTS
from schedules.hardware import num_sms
from schedules.tile_order import persistent_ctas_per_sm, transpose_sub


def _check(x, variant):
    check_tensor("x", x)
    if x.dim() not in (2, 3):
        raise ValueError(f"x must be 2-D (M, N) or batched 3-D (B, M, N), got shape {tuple(x.shape)}")
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")


def _transpose_fake(x, variant="tma"):
    _check(x, variant)
    shape = (*x.shape[:-2], x.shape[-1], x.shape[-2])
    return torch.empty(shape, dtype=x.dtype, device=x.device)


def _transpose_cuda(x, variant="tma", config=None):
    """The op's CUDA body; `config` (a dict of catalog overrides, e.g. {"order": "row"}) is for the
    benchmark's comparisons of schedules, not part of the op's schema."""
    out = _transpose_fake(x, variant)
    if out.numel() == 0:
        return out
    x3 = x if x.dim() == 3 else x.unsqueeze(0)
    if x3.stride(-1) != 1:
        x3 = x3.contiguous()
    b, m, n = x3.shape
    o3 = out if out.dim() == 3 else out.unsqueeze(0)
    vec = 16 // x.element_size()
    aligned = (m % vec == 0 and n % vec == 0 and x3.data_ptr() % 16 == 0 and x3.stride(1) % vec == 0
               and (b == 1 or x3.stride(0) % vec == 0))
    if variant == "tma" and (not aligned or max(m, n) > INDEX32_LIMIT - 128):  # TMA coordinates are s32
        variant = "swizzle"
    index64 = max(b * x3.stride(0) if b > 1 else m * x3.stride(1), b * m * n) > INDEX32_LIMIT
    config = dict(config or {})
    if variant != "tma":  # (also after the TMA fallback above) a TMA-only option
        config.pop("persistent", None)
    if variant != "naive" and "sub" not in config:  # large matrices: a CTA per 2 x 2 block of tiles
        config["sub"] = transpose_sub(variant, m, n, x.element_size())
    fn = catalog.get(f"transpose.{variant}").compiled(dtype=dtypes.name_of(x.dtype), aligned=aligned, index64=index64,
                                                      **config)
    xs = x3.permute(1, 2, 0)
    if b == 1:  # a single batch entry: its stride is never used; give it one the kernel accepts
        xs = xs.as_strided((m, n, 1), (x3.stride(1), 1, m * x3.stride(1)))
    ctas = num_sms(x.device.index or 0) * persistent_ctas_per_sm(config.get("sub", 1))
    fn(xs, o3.permute(1, 2, 0), ctas)
    return out


def _setup(ctx, inputs, output):
    ctx.variant = inputs[1] if len(inputs) > 1 else "tma"


def _backward(ctx, g):
    return call("cute_kernels::transpose", g.contiguous(), ctx.variant), None


register_op("cute_kernels::transpose", "(Tensor x, str variant=\"tma\") -> Tensor", _transpose_cuda, _transpose_fake,
            _backward, _setup)


def transpose(x: torch.Tensor, variant: str = "tma") -> torch.Tensor:
    """`x.transpose(-2, -1).contiguous()` for 2-D or 3-D x, by the given kernel variant."""
    return call("cute_kernels::transpose", x, variant)
