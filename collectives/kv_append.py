"""The KV-cache append: where a new token's K / V row goes and how it is stored (decode attention's append, the
fused RoPE + append). One place defines the cache slot and the FP8 quantization of appended rows.

Cache layout as the kernels see it: (pages, page rows, H_kv, D). A contiguous cache (B, L_max, H_kv, D) is one
page per sequence; a paged one is (num_pages, page_size, H_kv, D) with a block table (B, max_pages) int32. A
token at position `pos` of sequence b goes to
- contiguous: page b, row pos;
- paged:      page block_table[b, pos // page_size], row pos % page_size.

FP8 (e4m3) caches store x / scale, saturating to +-448, with dequant scales x = x8 * scale:
- per KV head: the scale is given (the scale tensor viewed as (1, 1, H_kv) with zero strides);
- per token and head: scale = amax |x| / 448 over the row's D elements (1 for an all-zero row), computed from
  the values being stored (fp32, before any rounding) and written beside the row at (page, row, head).
The same bits as the torch reference of `decode_ops` (`fp8_scale`, `to_fp8`): the scale as amax times the fp32
reciprocal of 448 (how torch divides by a scalar), the values by a correctly rounded division.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from collectives.quantize import E4M3, E4M3_MAX, vector_amax

SCALE_KINDS = ("none", "head", "token")


@cute.jit
def cache_slot(table: cute.Tensor, b, pos, page_rows, paged: cutlass.Constexpr[bool]):
    """(page, row) of the token at position `pos` of sequence `b`."""
    if cutlass.const_expr(paged):
        return table[b, pos // page_rows], pos % page_rows
    return b, pos


@cute.jit
def row_amax(v, lanes: cutlass.Constexpr[int]) -> Float32:
    """max |v| over the fp32 vectors `v` of `lanes` consecutive lanes (a power of two <= 32, aligned groups of a
    warp): the lane's own maximum, then butterfly shuffles. Every lane of the warp must take part."""
    m = vector_amax(v)
    k = 1
    while k < lanes:  # unrolled as it traces
        m = cute.arch.fmax(m, cute.arch.shuffle_sync_bfly(m, offset=k))
        k *= 2
    return m


@cute.jit
def token_scale(amax: Float32) -> Float32:
    """The per-token dequant scale of a row whose largest magnitude is `amax`: amax x RN(1 / 448), or 1 for a zero
    row. (torch divides by a Python scalar as a product with its fp32 reciprocal; this is that bit for bit.)"""
    s = Float32(1.0)
    if amax > Float32(0.0):
        s = amax * Float32(1.0 / E4M3_MAX)
    return s


@cute.jit
def store_row_vector(dst: cute.Tensor, values, scale: Float32, kind: cutlass.Constexpr[str]):
    """One vector of an appended row: `values` (fp32 TensorSSA) into `dst` (a vector view of the cache row), in the
    cache's element type; FP8 (`kind` head / token) as values / scale, saturating."""
    if cutlass.const_expr(kind == "none"):
        dst.store(values.to(dst.element_type))
    else:
        q = cute.make_rmem_tensor(values.shape, Float32)
        q.store(values)
        for e in cutlass.range_constexpr(cute.size(q)):
            q[e] = cute.arch.fmin(cute.arch.fmax(q[e] / scale, Float32(-E4M3_MAX)), Float32(E4M3_MAX))
        dst.store(q.load().to(E4M3))
