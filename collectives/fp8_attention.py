"""FP8 (e4m3) FlashAttention's two layout steps: P from the S accumulator as the A operand of O += P V, and V^T
in shared memory for that GEMM's B operand. Used by `cute_kernels.attention.fp8_forward`.

FP8 WGMMA (k = 32 per instruction) takes both shared-memory operands K-major, and A from registers only as
K-major bytes. For O += P V that means:

1. **V^T with keys contiguous.** V arrives by TMA as (keys, D), D contiguous (the K operand's layout). A
   transposing step rewrites each stage as V^T (D, keys), keys contiguous, in the WGMMA's 128-byte-swizzled
   K-major layout (`transpose_v_stage`): 4 x 4 byte blocks, four 32-bit shared loads (four keys, four d) ->
   eight `prmt` -> four 32-bit shared stores (four d, four keys). The swizzled addresses are closed forms
   (`KMajorBytes`), computed once per lane and 16-d group: each 32-key slice then adds a constant to the loads'
   addresses and flips one bit of the stores', so a block costs about 25 instructions a unit, not the ~200 of
   generic swizzled-tensor indexing (which decomposes every runtime coordinate).

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

from collectives.ptx import ldmatrix_x4_trans, stmatrix_x4
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
class KMajorBytes:
    """An 8-bit K-major swizzled smem layout as `operand_smem_layout` makes it, ((8, R/8), (W, C/W), (1, stages)) :
    ((W, 8W), (1, R W), (0, stage bytes)) under the byte swizzle S<b, 4, 3> (W = 16 * 2^b bytes per atom row), as
    closed-form byte offsets: plain integer arithmetic on Python or DSL ints (the CPU tests replay it against the
    layout's own `crd2idx`). Built at trace time from the layout; the form is checked there."""

    def __init__(self, width: int, rows: int, cols: int, stage_bytes: int, swizzle_bits: int):
        self.width, self.rows, self.cols, self.stage_bytes, self.bits = width, rows, cols, stage_bytes, swizzle_bits
        if width != 16 << swizzle_bits or cols % width or rows % 8:
            raise ValueError(f"not a K-major {width}-byte swizzled tile: rows {rows}, cols {cols}, S<{swizzle_bits},4,3>")
        self.mask = ((1 << swizzle_bits) - 1) << 4  # the 16-byte chunk bits the swizzle flips

    @staticmethod
    def of(layout: cute.ComposedLayout) -> "KMajorBytes":
        b, m, sh = (int(x) for x in re.fullmatch(r"S<(\d+),(\d+),(\d+)>", str(layout.inner)).groups())
        (r8, rb), (w, cb), (_, st) = layout.outer.shape
        (w1, w8), (one, rw), (_, sb) = layout.outer.stride
        if (m, sh, r8, w1, one) != (4, 3, 8, w, 1) or w8 != 8 * w or (cb > 1 and rw != 8 * rb * w):
            raise ValueError(f"unexpected smem layout {layout}")
        return KMajorBytes(w, 8 * rb, w * cb, sb if st > 1 else 8 * rb * w * cb, b)

    def slice_step(self, q: int):
        """(xor, add): the byte offset of (row, col + 32 q) is offset(row, col) ^ xor + add for col < 32 (q a Python
        int). Within a W-byte atom row the step is an XOR of the slot bits (col's bits are below 32 and the swizzle's
        XOR commutes with it: (rowpart + (col ^ x)) ^ 32 q' = rowpart + ((col + 32 q') ^ x) while 32 q' < W); past
        it, whole column blocks of R W bytes (tiles wider than one atom row: V^T of 192 or 256 keys)."""
        step = 32 * q
        return step % self.width, (step // self.width) * self.rows * self.width

    def offset(self, row, col):
        """Byte offset of (row, col) in stage 0, swizzled. The swizzle XORs chunk bits 4.. with bits 7.. of the
        offset, which only row * W holds (col % W < W <= 128 and the column block's R W >= 8 W are clear of them)."""
        w = self.width
        lw = w.bit_length() - 1
        hi = row * w if self.cols == w else row * w + (col >> lw) * (self.rows * w)
        return hi + ((col & (w - 1)) ^ (((row * w) >> 3) & self.mask))


def transpose_lane_roles(lane):
    """(c, dq_lo, j) of a transposing lane: its units' lane quad, d-quad within its 16-d group, and 16-key half.
    Under the 128-byte swizzle a warp's 32-bit loads and stores each meet two lanes to a bank (the two halves j);
    no choice of five lane bits clears both (loads want d-chunks across lanes, stores key-chunks)."""
    return lane & 3, (lane >> 2) & 3, lane >> 4


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


def group_addresses(v: KMajorBytes, vt: KMajorBytes, g, c, dq_lo, j):
    """A lane's word addresses for d-group g (16 d): the four source words (keys unit_keys(0, j, c), d-quad
    dq = 4 g + dq_lo) of key slice 0, and the four destination words (rows 4 dq + e, slot word 4 j + c). Key slice
    q adds q * 8 W_v words to a source (32 rows: whole swizzle atoms) and flips bits of a destination's byte offset:
    `slice_words`."""
    dq = 4 * g + dq_lo
    src = tuple(v.offset(k, 4 * dq) >> 2 for k in unit_keys(0, j, c))
    dst = tuple(vt.offset(4 * dq + e, 16 * j + 4 * c) for e in range(4))
    return src, dst


def slice_words(v: KMajorBytes, vt: KMajorBytes, src, dst, q: int):
    """Key slice q's word addresses from `group_addresses`' (q a Python int): sources shifted by 32 rows, and each
    destination byte offset stepped by 32 slot bytes q times (`KMajorBytes.slice_step`)."""
    x, add = vt.slice_step(q)
    return tuple(s + q * 8 * v.width for s in src), tuple(((t ^ x) + add) >> 2 for t in dst)


@cute.jit
def transpose_v_stage(src: cute.Tensor, dst: cute.Tensor, stage: Int32, warp: Int32, lane: Int32,
                      warps: cutlass.Constexpr[int], v: cutlass.Constexpr, vt: cutlass.Constexpr,
                      tile_n: cutlass.Constexpr[int], d: cutlass.Constexpr[int]):
    """V (tile_n, D) of smem stage `stage` -> V^T (D, tile_n) with P's key order (slot k of row e holds
    V[pi(k), e]); `src`, `dst`: the two buffers as flat unswizzled 32-bit words, `v`, `vt` their `KMajorBytes`.
    Warp `warp` of `warps` takes the d-groups warp, warp + warps, ...; each lane four key-quads x four d of every
    key slice there. The caller fences (async proxy) and signals."""
    c, dq_lo, j = transpose_lane_roles(lane)
    s0 = stage * (v.stage_bytes // 4)
    t0 = stage * (vt.stage_bytes // 4)
    for g in cutlass.range(warp, d // 16, warps, unroll=1):
        src0, dst0 = group_addresses(v, vt, g, c, dq_lo, j)
        for q in cutlass.range_constexpr(tile_n // 32):
            sw, dw = slice_words(v, vt, src0, dst0, q)
            x = transpose_words(src[s0 + sw[0]], src[s0 + sw[1]], src[s0 + sw[2]], src[s0 + sw[3]])
            for e in cutlass.range_constexpr(4):
                dst[t0 + dw[e]] = x[e]


# --- V^T by ldmatrix.trans / stmatrix (FA3's way: 512 bytes a warp instruction, not 128) ---------------------------
# A unit is a 32-key slice q x 16-d chunk g. ldmatrix.x4.trans reads four 8 x 16-byte matrices, keys 8 i .. 8 i + 7
# (i < 4) of the slice x d bytes 16 g .. 16 g + 15, as b16 elements transposed: thread t = 4 r + c gets, in register
# i, bytes (V[k, e], V[k, e + 1], V[k + 1, e], V[k + 1, e + 1]) with k = 8 i + 2 c, e = 16 g + 2 r. Its registers 0
# and 1 hold keys 2c, 2c + 1, 8 + 2c, 9 + 2c of d e and e + 1: exactly P's slots 4c .. 4c + 3 (pi), two prmt away
# from V^T's words of rows e and e + 1; registers 2, 3 likewise for slots 16 + 4c ... stmatrix.x4 then writes the
# four words as matrices (rows 16 g + 2 r [+ 1], slot chunk 0 or 1 of the slice): thread t's register j is row r of
# matrix j, bytes 4c .. 4c + 3, which is where its word belongs.
LDSM_EVEN, LDSM_ODD = 0x6420, 0x7531  # prmt: bytes 0, 2 of a and b (d = e), bytes 1, 3 (d = e + 1)


def ldsm_lane_offsets(v: KMajorBytes, vt: KMajorBytes, g, lane):
    """A lane's byte offsets (stage 0, key slice 0) for d-chunk g: its ldmatrix row (V: key 8 (lane // 8) + lane % 8,
    d bytes 16 g ..) and its stmatrix row (V^T: row 16 g + 2 (lane % 8) + (lane // 8) % 2, slot chunk lane // 16)."""
    i, r = lane >> 3, lane & 7
    return v.offset(8 * i + r, 16 * g), vt.offset(16 * g + 2 * r + (i & 1), 16 * (i >> 1))


def ldsm_slice(v: KMajorBytes, vt: KMajorBytes, src, dst, q: int):
    """Key slice q's offsets from `ldsm_lane_offsets`' (as `slice_words`: sources 32 rows on, destinations stepped by
    `KMajorBytes.slice_step`)."""
    x, add = vt.slice_step(q)
    return src + q * 32 * v.width, (dst ^ x) + add


def ldsm_words(r0, r1, r2, r3, prmt=permute_bytes):
    """ldmatrix.trans's four registers -> stmatrix's four: V^T words (row e, slots 4c..), (e + 1, 4c..), (e, 16 +
    4c..), (e + 1, 16 + 4c..)."""
    return prmt(r0, r1, LDSM_EVEN), prmt(r0, r1, LDSM_ODD), prmt(r2, r3, LDSM_EVEN), prmt(r2, r3, LDSM_ODD)


@cute.jit
def transpose_v_stage_ldsm(v_base: Int32, vt_base: Int32, stage: Int32, warp: Int32, lane: Int32,
                           warps: cutlass.Constexpr[int], v: cutlass.Constexpr, vt: cutlass.Constexpr,
                           tile_n: cutlass.Constexpr[int], d: cutlass.Constexpr[int]):
    """`transpose_v_stage` by ldmatrix.trans / prmt / stmatrix: `v_base`, `vt_base` the buffers' 32-bit shared
    addresses; warp `warp` of `warps` takes the d-chunks warp, warp + warps, ... The caller fences and signals."""
    s0 = v_base + stage * v.stage_bytes
    t0 = vt_base + stage * vt.stage_bytes
    for g in cutlass.range(warp, d // 16, warps, unroll=1):
        src, dst = ldsm_lane_offsets(v, vt, g, lane)
        for q in cutlass.range_constexpr(tile_n // 32):
            a, b = ldsm_slice(v, vt, src, dst, q)
            w = ldsm_words(*ldmatrix_x4_trans(s0 + a))
            stmatrix_x4(t0 + b, *w)


def flat_words(ptr: cute.Pointer, layout: cute.ComposedLayout) -> cute.Tensor:
    """The smem buffer of an 8-bit staged `layout` at `ptr` (unswizzled) as flat 32-bit words: `transpose_v_stage`
    computes swizzled offsets itself (`KMajorBytes`)."""
    return cute.make_tensor(cute.recast_ptr(ptr, None, Int32), cute.make_layout(cute.cosize(layout.outer) // 4))
