"""FP8 e4m3 block quantization of values held in registers (the FP8 GEMM's quantizers, the norms' fused
FP8 output): the one place that defines the rounding.

For a block of values (1 x 128 columns of a row, a whole row, or a 128 x 128 tile):

    amax  = max |v| over the block           (NaN ignored: max.f32 returns the other operand)
    scale = max(amax, 1e-4) / 448            (correctly rounded division; 448 = e4m3's largest value)
    scale = 2^ceil(log2 scale) if ue8m0      (on the float's bits: +1 to the exponent if any mantissa bit)
    q     = e4m3(v * (1 / scale))            (correctly rounded reciprocal; cvt.rn.satfinite: nearest-even,
                                              saturating to +-448)

and the dequantized value is q * scale. `cute_kernels.quantize.ops.quantize_*_reference` is the
same arithmetic in torch (bitwise equal on CPU and GPU). Special values: a NaN element stays NaN
(the e4m3 NaN) and does not change its block's scale; a block holding +-inf gets scale inf, so
its finite elements quantize to 0 and its infinities to NaN (inf * 0).

The threads holding one block agree on its amax through `collectives.reduce` (a butterfly inside
a warp, shared memory across warps, `RowReducer` across a cluster): `held_amax` folds one
thread's values, `row_block_amaxes` does the whole 128-column-block reduction for a row held in
`collectives.rowwise.RowSlice` geometry.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from collectives.reduce import group_reduce, group_smem_slots

E4M3 = cutlass.Float8E4M3FN
E4M3_MAX = 448.0
AMAX_FLOOR = 1e-4  # keeps an all-zero block's scale finite and nonzero (its q are all 0)
BLOCK = 128


@cute.jit
def fmax(a, b):
    """max of two scalars or, element by element, of two tuples (`max.f32`: NaN-ignoring)."""
    if cutlass.const_expr(isinstance(a, tuple)):
        return tuple(cute.arch.fmax(x, y) for x, y in zip(a, b))
    return cute.arch.fmax(a, b)


def vector_amax(v) -> Float32:
    """max |v| over the elements of one fp32 TensorSSA vector (NaN ignored)."""
    a = cute.math.absf(v)
    m = a[0]
    for e in range(1, cute.size(a.shape)):
        m = cute.arch.fmax(m, a[e])
    return m


@cute.jit
def held_amax(values, valid=None):
    """max |v| over a thread's held fp32 vectors (a list of TensorSSA); vector k counts only where
    `valid[k]` (a list of predicates, or None for all). 0 when nothing counts."""
    m = Float32(0.0)
    for k in cutlass.range_constexpr(len(values)):
        a = vector_amax(values[k])
        if cutlass.const_expr(valid is None):
            m = cute.arch.fmax(m, a)
        else:
            if valid[k]:
                m = cute.arch.fmax(m, a)
    return m


INV_MAX = 1.0 / E4M3_MAX  # rounded to fp32 where used: RN(1/448)
INF = float("inf")


@cute.jit
def div_by_max(a: Float32) -> Float32:
    """a / 448 correctly rounded, for a >= 1e-4 or inf, without `div.rn.f32`: the compiler's
    division carries a slow-path subroutine call whose calling convention made the norms spill.
    This is that division's own fast path (Markstein: q0 = a * RN(1/448), remainder r =
    fma(-q0, 448, a) exact, q0 + r * RN(1/448) in one fma is RN(a / 448) when nothing overflows
    or goes subnormal, which a >= 1e-4 guarantees); inf stays inf."""
    c = Float32(INV_MAX)
    q0 = a * c
    r = cute.math.fma(-q0, Float32(E4M3_MAX), a)
    q = cute.math.fma(r, c, q0)
    if a == Float32(INF):
        q = a
    return q


@cute.jit
def scale_of(amax: Float32, ue8m0: cutlass.Constexpr[bool]) -> Float32:
    """The block's fp32 scale from its amax (see the module docstring)."""
    s = div_by_max(cute.arch.fmax(amax, Float32(AMAX_FLOOR)))
    if cutlass.const_expr(ue8m0):
        bits = s.bitcast(Int32)
        up = Int32(0)
        if (bits & Int32(0x7FFFFF)) != Int32(0):
            up = Int32(1)
        s = (((bits >> 23) + up) << 23).bitcast(Float32)
    return s


@cute.jit
def inverse(scale: Float32) -> Float32:
    """1 / scale correctly rounded (the reference's torch.reciprocal), for the scales `scale_of`
    makes (normal, with a normal reciprocal, or inf): `rcp.rn.f32`'s fast path without its
    slow-path call (see `div_by_max`): y0 = rcp.approx (MUFU.RCP), one Newton step in fma,
    y0 + y0 * (1 - s * y0); 1 / inf = 0."""
    y0 = cute.arch.rcp_approx(scale)
    e = cute.math.fma(-scale, y0, Float32(1.0))
    y = cute.math.fma(y0, e, y0)
    if scale == Float32(INF):
        y = Float32(0.0)
    return y


def to_e4m3(values, inv: Float32):
    """e4m3(v * inv) for each fp32 vector: `cvt.rn.satfinite.e4m3x2.f32`, two elements at a time."""
    return [(v * inv).to(E4M3) for v in values]


# --- a row held in RowSlice geometry, cut into 128-column blocks ----------------------------------
def block_geometry(vec: int, tpr: int, vpt: int) -> tuple[int, int]:
    """(lanes, kgroup) for a RowSlice of `tpr` threads x `vpt` vectors of `vec` elements: the
    `BLOCK // vec` vectors of a 128-column block are held by `lanes` consecutive lanes of the row
    group, each holding `kgroup` consecutive k (vector index (k * tpr + lane) per CTA slice)."""
    vb = BLOCK // vec
    assert vb * vec == BLOCK, f"vector of {vec} elements does not divide a {BLOCK}-column block"
    lanes = min(tpr, vb)
    kgroup = min(vpt, max(1, vb // tpr))
    return lanes, kgroup


def block_smem_slots(threads: int, vec: int, tpr: int, vpt: int) -> int:
    """Shared-memory fp32 slots `row_block_amaxes` needs (0 when a block fits in a warp)."""
    lanes, kgroup = block_geometry(vec, tpr, vpt)
    return group_smem_slots(threads, lanes, vpt // kgroup)


@cute.jit
def row_block_amaxes(sl, values, smem):
    """For a row held as `sl` (a `collectives.rowwise.RowSlice`), the amax of each 128-column block
    the thread holds a piece of: a tuple with one entry per k-group (`block_geometry`), entry g
    being the block of vectors k in [g * kgroup, (g + 1) * kgroup). Vectors past the row's end are
    skipped. Every thread of the CTA must call it (a barrier when a block spans warps); `smem`
    holds `block_smem_slots(...)` fp32 (None when 0), free again after the caller's next barrier."""
    lanes, kgroup = block_geometry(sl.vec, sl.tpr, sl.vpt)
    parts = []
    for g in cutlass.range_constexpr(sl.vpt // kgroup):
        ks = list(range(g * kgroup, (g + 1) * kgroup))
        parts.append(held_amax([values[k] for k in ks], [sl.valid(k) for k in ks]))
    return group_reduce(tuple(parts), fmax, lanes, smem)


def block_of(sl, g: int):
    """(128-column block index, whether this thread writes its scale) of k-group `g`."""
    lanes, kgroup = block_geometry(sl.vec, sl.tpr, sl.vpt)
    k = g * kgroup
    return sl.index(k) * sl.vec // BLOCK, (sl.lane % lanes == 0) & sl.valid(k)
