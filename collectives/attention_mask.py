"""Attention masks on the S = Q K^T accumulator: causal, sliding window, key-length tail, softcap.

The mask is one rule. With `off = seqlen_k - seqlen_q` (bottom-right alignment: the last query sees
the last key when the sequences differ), query row i may see key column j iff

    j < seqlen_k,   j <= i + off + right  (when right >= 0),   j >= i + off - left  (when left >= 0)

`causal` is right = 0; a sliding window is (left, right) with -1 meaning unbounded on that side.
Whether a side is bounded is a compile-time fact (`MaskKind`), the window sizes are runtime ints.

Three views of the rule, one place:

* `n_block_range`: the K/V blocks a Q tile touches at all (the others are skipped: not loaded,
  not computed). Works on Python ints (tests, host) and DSL ints (the kernel) alike.
* `block_needs_mask`: whether a block has any masked element for the tile's valid rows; the
  others (the interior of the band) skip the elementwise work.
* `apply_mask`: the elementwise step, -inf where the rule says no, each accumulator element's
  (row, column) taken from the MMA partition of an identity tensor (no knowledge of the WGMMA
  register layout needed).

`apply_softcap` is the optional logit cap s -> cap * tanh(s * scale / cap) (Gemma-2 style), applied
before the mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from schedules.index_math import imax, imin


@dataclass(frozen=True)
class MaskKind:
    left: bool = False  # a left window bound (sliding window)
    right: bool = False  # a right bound (causal: right = 0, or a window's right side)

    def __str__(self) -> str:
        return {(False, False): "none", (False, True): "right", (True, False): "left", (True, True): "band"}[
            (self.left, self.right)]


def n_block_range(m_block, tile_m: int, tile_n: int, seqlen_q, seqlen_k, left, right, kind: MaskKind):
    """[n_min, n_max): the K/V blocks the Q tile `m_block` needs (n_max <= n_min: none; its rows
    are fully masked). Divisions only of non-negative values."""
    n_blocks = (seqlen_k + tile_n - 1) // tile_n
    off = seqlen_k - seqlen_q
    row0 = m_block * tile_m
    row1 = imin(row0 + tile_m, seqlen_q) - 1
    n_max = n_blocks
    n_min = 0
    if kind.right:
        hi = row1 + off + right + 1  # one past the last column row1 may see
        n_max = imin(n_blocks, (imax(hi, 0) + tile_n - 1) // tile_n)
    if kind.left:
        lo = row0 + off - left  # the first column row0 may see
        n_min = imax(lo, 0) // tile_n
    return n_min, n_max


def block_needs_mask(n_block, m_block, tile_m: int, tile_n: int, seqlen_q, seqlen_k, left, right,
                     kind: MaskKind):
    """True when block `n_block` of Q tile `m_block` has a masked element in a valid row (a row
    < seqlen_q): it crosses the key-length end or an edge of the band."""
    off = seqlen_k - seqlen_q
    row0 = m_block * tile_m
    row1 = imin(row0 + tile_m, seqlen_q) - 1
    col0 = n_block * tile_n
    col1 = col0 + tile_n - 1
    need = col1 >= seqlen_k
    if kind.right:
        need = need | (col1 > row0 + off + right)
    if kind.left:
        need = need | (col0 < row1 + off - left)
    return need


def mask_split(n_min, n_max, m_block, tile_m: int, tile_n: int, seqlen_q, seqlen_k, left, right, kind: MaskKind):
    """`block_needs_mask` over the walk [n_min, n_max) as three runs: [n_hi, n_max) crosses the key end
    or the band's right edge, [n_min, n_lo) its left edge, [n_lo, n_hi) needs no mask (n_min <= n_lo <=
    n_hi <= n_max; a block on both sides counts as the right run). The right predicate holds from some
    block upwards (col1 >= min(seqlen_k, row0 + off + right + 1)), the left one from some block
    downwards (col0 < row1 + off - left), so the runs are exact, not conservative. Returns (n_lo, n_hi).
    Python and DSL ints alike; divisions only of non-negative values."""
    off = seqlen_k - seqlen_q
    row0 = m_block * tile_m
    row1 = imin(row0 + tile_m, seqlen_q) - 1
    hi_col = seqlen_k  # the first column that is masked on the right for row0 (and every later row)
    if kind.right:
        hi_col = imin(hi_col, row0 + off + right + 1)
    top = imax(n_max, n_min)
    n_hi = imin(imax(imax(hi_col, 0) // tile_n, n_min), top)  # col1 >= hi_col <=> n >= floor(hi_col / tile_n)
    n_lo = n_min
    if kind.left:
        lo_col = row1 + off - left  # columns below it are masked for row1 (and every earlier row)
        n_lo = imin(imax((imax(lo_col, 0) + tile_n - 1) // tile_n, n_min), n_hi)  # col0 < lo_col <=> n < ceil
    return n_lo, n_hi


def visible(i: int, j: int, seqlen_q: int, seqlen_k: int, left: int, right: int) -> bool:
    """The rule for one (row, column), host side (the brute-force reference of the tests)."""
    off = seqlen_k - seqlen_q
    if j >= seqlen_k:
        return False
    if right >= 0 and j > i + off + right:
        return False
    if left >= 0 and j < i + off - left:
        return False
    return True


@cute.jit
def apply_mask(
    acc: cute.Tensor,
    tScS: cute.Tensor,
    row0,
    col0,
    seqlen_k,
    off,
    left,
    right,
    kind: cutlass.Constexpr,
    transposed: cutlass.Constexpr = False,
):
    """acc[i] = -inf where (row0 + r, col0 + c) is masked, (r, c) = tScS[i]; `transposed`: the accumulator is
    S^T (the backward's keys x queries), (c, r) = tScS[i]."""
    for i in cutlass.range_constexpr(cute.size(acc)):
        r = row0 + tScS[i][1 if transposed else 0]
        c = col0 + tScS[i][0 if transposed else 1]
        masked = c >= seqlen_k
        if cutlass.const_expr(kind.right):
            masked = masked | (c > r + off + right)
        if cutlass.const_expr(kind.left):
            masked = masked | (c < r + off - left)
        if masked:
            acc[i] = Float32(float("-inf"))


@cute.jit
def apply_softcap(acc: cute.Tensor, scale_over_cap: Float32, cap: Float32, slope: cute.Tensor | None = None):
    """acc[i] = cap * tanh(acc[i] * scale / cap): the softmax scale is folded in (use 1 after). With `slope` (the
    backward) also slope[i] = 1 - tanh^2, the cap's derivative over the scale."""
    for i in cutlass.range_constexpr(cute.size(acc)):
        t = cute.math.tanh(acc[i] * scale_over_cap, fastmath=True)
        acc[i] = cap * t
        if cutlass.const_expr(slope is not None):
            slope[i] = Float32(1.0) - t * t
