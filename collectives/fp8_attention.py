"""FP8 (e4m3) FlashAttention's two layout steps: P from the S accumulator as the A operand of O += P V, and V^T
in shared memory for that GEMM's B operand. Used by `cute_kernels.attention.fp8_forward`.

FP8 WGMMA (k = 32 per instruction) takes both shared-memory operands K-major, and A from registers only as
K-major bytes. For O += P V that means:

1. **V^T with keys contiguous.** V arrives by TMA as (keys, D), D contiguous (the K operand's layout). A
   transposing step rewrites each stage as V^T (D, keys), keys contiguous, in the WGMMA's 128-byte-swizzled
   K-major layout (`transpose_v_stage`): 4 x 4 byte blocks, four 32-bit shared loads (four keys, four d) ->
   eight `prmt` -> four 32-bit shared stores (four d, four keys).

2. **P's key order.** Within each 32-key slice, thread lane % 4 = c of a warp holds, per row, these S
   accumulator columns (fp32 C fragment: column pairs 8 n + 2c, 8 n + 2c + 1):

       C columns of lane c:   2c 2c+1 | 8+2c 9+2c | 16+2c 17+2c | 24+2c 25+2c

   and the 8-bit A fragment wants, per row, K slots (A fragment: four consecutive bytes, twice):

       A slots of lane c:     4c 4c+1 4c+2 4c+3 | 16+4c 16+4c+1 16+4c+2 16+4c+3

   The same eight values per row and lane, so no value leaves its thread: A slot k holds key pi(k),

       pi(32 q + 16 j + 4 c + i) = 32 q + 16 j + 8 (i // 2) + 2 c + (i % 2)     (i < 4, c < 4, j < 2)

   and V^T is written with the same permutation of its key columns (slot k of row d holds V[pi(k), d]), so
   sum_k P[r, pi(k)] V[pi(k), d] is P V exactly. FA3 instead shuffles P's bytes between lanes; here the
   permutation costs nothing, since the transposing step rewrites V anyway.

       S accumulator (one row, lane c, a 32-key slice)        A operand registers of lane c
       n-block 0    1     2     3                             word 0 (slots 4c..4c+3)  word 1 (16+4c..)
       [2c,2c+1] [8+2c,9+2c] [16+2c,17+2c] [24+2c,25+2c]  ->  [2c, 2c+1, 8+2c, 9+2c]  [16+2c, .., 25+2c]

   The conversion keeps each column pair adjacent (one `cvt.rn.satfinite.e4m3x2.f32` a pair).

Index maps are plain arithmetic on Python or DSL ints, so the CPU tests replay them
(tests/attention/test_fp8_forward_cpu.py).
"""

from __future__ import annotations

import re

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from collectives.wgmma_mainloop import permute_bytes

E4M3 = cutlass.Float8E4M3FN
SLICE = 32  # keys per FP8 WGMMA K block


def slot_key(k):
    """pi: the key held by K slot k of P's A operand (and by column k of V^T in shared memory)."""
    base = k - k % 16
    i = k % 4
    c = (k % 16) // 4
    return base + 8 * (i // 2) + 2 * c + i % 2


def acc_a_view_fp8(acc: cute.Tensor) -> cute.Tensor:
    """An fp32 WGMMA accumulator ((2, 2, V), MMA_M, MMA_N) seen as the 8-bit register A operand of the next
    WGMMA, (((2, 2), 2, 2), MMA_M, V / 4): element (i, h, j, kb) (i = i0 + 2 i1) is the accumulator value of row
    half h, column pair block 4 kb + 2 j + i1, column i0 of the pair, i.e. key 32 kb + 16 j + 8 i1 + 2c + i0 =
    pi(slot 32 kb + 16 j + 4c + i). V must be a multiple of 4 (the tile's keys a multiple of 32)."""
    lay = cute.make_layout(acc.layout.shape)  # compact, in the accumulator's own index order
    s, d = lay.shape, lay.stride
    v = s[0][2]
    if v % 4:
        raise ValueError(f"P as an FP8 A operand needs the tile's keys in 32-key slices, got {8 * v} keys")
    d0, d1, d2 = d[0]
    view = cute.make_layout((((2, 2), 2, 2), s[1], (v // 4, s[2])),
                            stride=(((d0, d2), d1, 2 * d2), d[1], (4 * d2, d[2])))
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, view))


def acc_as_a_operand_fp8(acc: cute.Tensor, out: cute.Tensor) -> cute.Tensor:
    """P (the fp32 accumulator) rounded to e4m3 (nearest even, saturating) into `out`, the register A operand of
    O += P V in slot order (`acc_a_view_fp8`)."""
    view = acc_a_view_fp8(acc)
    out.store(view.load().to(E4M3))
    return out


# --- V^T in shared memory ---------------------------------------------------------------------------------------
def _word_swizzle(inner):
    """The byte swizzle S<b, m, s> of an 8-bit smem layout as a swizzle of 32-bit word offsets, S<b, m - 2, s>: the
    one that layout algebra (`crd2idx` of a composed word layout) needs. A swizzle on a pointer acts on byte
    addresses whatever the element type (`collectives.smem_tiles.swizzle_128b`), so `smem_words` keeps the byte
    swizzle on its word pointer; this one is for replaying the offsets (tests/attention/_fp8_probe.py)."""
    b, m, s = (int(x) for x in re.fullmatch(r"S<(\d+),(\d+),(\d+)>", str(inner)).groups())
    if m < 2:
        raise ValueError(f"swizzle {inner} moves bytes inside a 32-bit word")
    return cute.make_swizzle(b, m - 2, s)


def word_layouts(layout: cute.ComposedLayout):
    """(word-offset swizzle, word layout) of a swizzled 8-bit smem layout (rows, cols, stages), cols contiguous:
    word (r, w, stage) is bytes (r, 4w .. 4w + 3, stage)."""
    return _word_swizzle(layout.inner), cute.recast_layout(32, 8, layout.outer)


def smem_words(ptr: cute.Pointer, layout: cute.ComposedLayout) -> cute.Tensor:
    """The 8-bit swizzled smem tensor at `ptr` (its unswizzled byte pointer) as 32-bit words: the word layout of
    `word_layouts` on a pointer that carries the byte swizzle itself (a pointer's swizzle acts on byte addresses).
    `_word_swizzle`'s first check still applies: no byte may move inside its word."""
    _word_swizzle(layout.inner)
    return cute.make_tensor(cute.recast_ptr(ptr, layout.inner, Int32), cute.recast_layout(32, 8, layout.outer))


def unit_coords(u, d: int):
    """Transpose unit u (of tile_n / 4 x D / 4) of a stage: (key slice q, half j, lane quad c, d-quad dq). A warp's
    32 consecutive units are 4 c x 4 d-quads x 2 halves: its loads touch 8 rows' 16-byte chunks, its stores 4 rows'
    chunks in two halves, each at most two to a bank (128-byte swizzle)."""
    lane = u % 32
    grp = u // 32
    c = lane % 4
    dq_lo = (lane // 4) % 4
    j = lane // 16
    dq_groups = d // 16
    dq = (grp % dq_groups) * 4 + dq_lo
    q = grp // dq_groups
    return q, j, c, dq


def unit_keys(q, j, c):
    """The four keys of a transpose unit, in slot order: slots 32 q + 16 j + 4 c + i hold keys pi(...)."""
    base = 32 * q + 16 * j + 2 * c
    return base, base + 1, base + 8, base + 9


def transpose_words(w0, w1, w2, w3, prmt=permute_bytes):
    """A 4 x 4 byte transpose: w_i holds bytes (key_i, d_0..3); returns x_e holding bytes (key_0..3, d_e). `prmt`:
    PTX `prmt.b32` (a Python model of it in the CPU tests)."""
    lo01 = prmt(w0, w1, 0x5140)  # [w0.b0, w1.b0, w0.b1, w1.b1]
    lo23 = prmt(w2, w3, 0x5140)
    hi01 = prmt(w0, w1, 0x7362)  # [w0.b2, w1.b2, w0.b3, w1.b3]
    hi23 = prmt(w2, w3, 0x7362)
    return prmt(lo01, lo23, 0x5410), prmt(lo01, lo23, 0x7632), prmt(hi01, hi23, 0x5410), prmt(hi01, hi23, 0x7632)


@cute.jit
def transpose_v_stage(src: cute.Tensor, dst: cute.Tensor, stage: Int32, t: Int32, threads: cutlass.Constexpr[int],
                      tile_n: cutlass.Constexpr[int], d: cutlass.Constexpr[int]):
    """V (tile_n, D) of smem stage `stage` -> V^T (D, tile_n) with P's key order (slot k of row e holds
    V[pi(k), e]); `src`, `dst`: the two staged layouts as 32-bit words (`smem_words`). Thread t of `threads`
    (a multiple of 32) takes units t, t + threads, ...; the caller fences (async proxy) and signals."""
    units = (tile_n // 4) * (d // 4)
    for u in cutlass.range(t, units, threads, unroll=1):
        q, j, c, dq = unit_coords(u, d)
        k0, k1, k2, k3 = unit_keys(q, j, c)
        x = transpose_words(src[(k0, dq, stage)], src[(k1, dq, stage)], src[(k2, dq, stage)],
                            src[(k3, dq, stage)])
        slot_word = 8 * q + 4 * j + c  # slots 32 q + 16 j + 4 c .. + 3
        for e in cutlass.range_constexpr(4):
            dst[(4 * dq + e, slot_word, stage)] = x[e]
