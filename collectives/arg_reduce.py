"""(value, index) pair reductions for argmax (curriculum lesson 12), as one 64-bit key.

A thread scans its elements in increasing index order keeping (best value, its index): it takes an
element only if it is strictly greater, or if it is the first NaN, so ties keep the lowest index and
the first NaN wins, as in `torch.argmax`. Across threads the pair is packed into one Int64 key whose
signed order is the argmax order:

    key = ordered(value) << 32  |  (0xFFFFFFFF - index)

`ordered` maps an fp32 to an int32 with the same order (negative floats have their 31 magnitude bits
flipped), after turning -0.0 into +0.0 (torch treats them as equal) and every NaN into INT32_MAX
(above +inf). A larger key is a larger value or, for equal values, a lower index. One `max` over
keys (through `collectives.reduce.group_reduce`, 64-bit shuffles) is then the pair reduction; the
result does not depend on the reduction order, so it is bit-for-bit deterministic. Keys are also
what a split row writes as partials for the second pass. Indices must fit in 32 bits (rows shorter
than 2^32 elements).

A 128-bit vector is scanned in two levels, so the per-element work is a packed max, not a
compare-and-select chain: `vector_max` is the vector's NaN-propagating maximum (a tree of
`max.NaN.bf16x2`/`f16x2` on its 32-bit words, or `max.NaN.f32`), `improves` compares it with the
running best once (strictly greater, or the first NaN: a later vector equal to the best keeps the
earlier index), and the thread keeps the raw words of the best vector; `locate` finds the position
inside that vector (its first element equal to the best, or its first NaN) once, after the scan.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float16, Float32, Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T

EMPTY = -(2**63)  # the key of a thread that saw no element: below every real key
_LOW = 0xFFFFFFFF


@cute.jit
def scan_update(best: Float32, idx, v: Float32, i):
    """One step of a thread's in-order scan: take `v` (at index `i`) if it beats `best`."""
    take = (v > best) | ((v != v) & (best == best))
    if take:
        best = v
        idx = i
    return best, idx


@cute.jit
def ordered_bits(v: Float32) -> Int32:
    """An int32 whose signed order is v's order; -0.0 == +0.0; every NaN above +inf."""
    r = cute.make_rmem_tensor((1,), Float32)
    r[0] = v + Float32(0.0)  # -0.0 + 0.0 = +0.0
    b = cute.recast_tensor(r, Int32)[0]
    b = b ^ ((b >> 31) & Int32(0x7FFFFFFF))
    if v != v:
        b = Int32(0x7FFFFFFF)
    return b


@cute.jit
def pack_key(best: Float32, idx, has) -> Int64:
    """The Int64 key of a thread's (best, idx); EMPTY when the thread saw nothing (`has` false)."""
    key = (Int64(ordered_bits(best)) << 32) | (Int64(_LOW) - Int64(idx))
    if not has:
        key = Int64(EMPTY)
    return key


@cute.jit
def key_index(key: Int64) -> Int64:
    """The element index a key carries."""
    return Int64(_LOW) - (key & Int64(_LOW))


def max_key(a, b):
    """The pair-reduction op on keys."""
    return cutlass.max(a, b)


# --- two-level scan of 128-bit vectors ------------------------------------------------------------
# Plain Python helpers, traced inline: their loops unroll at trace time and their choices are selects.
_PTX_TYPE = {BFloat16: "bf16", Float16: "f16"}


def neg_inf_word(dtype) -> Int32:
    """A 32-bit word whose `dtype` elements are all -inf."""
    bits = {BFloat16: 0xFF80FF80, Float16: 0xFC00FC00, Float32: 0xFF800000}[dtype]
    return Int32(bits - (1 << 32))


def select(cond, a, b):
    """`a` where `cond` else `b` (one select, no branch), typed like `a`."""
    return type(a)(cutlass.select_(cond, a, b))


def _asm(res_type, ptx: str, cons: str, *args):
    """A pure (side-effect free, so CSE/scheduling apply) PTX snippet on 32-bit registers."""
    return llvm.inline_asm(res_type, [Int32(a).ir_value() for a in args], ptx, cons,
                           has_side_effects=False, is_align_stack=False)


def _bits_f32(w) -> Float32:
    return Float32(_asm(T.f32(), "mov.b32 $0, $1;", "=f,r", w))


def vector_words(v) -> list:
    """The 32-bit words of a loaded 128-bit vector (a TensorSSA), as Int32 scalars."""
    w = v.bitcast(Int32)
    return [w[k] for k in range(cute.size(w.shape))]


def vector_max(words: list, dtype) -> Float32:
    """The NaN-propagating maximum (any NaN gives NaN) of the `dtype` elements packed in `words`,
    as fp32: a tree of packed max.NaN over the words, then over the two halves of the last one."""
    level = list(words)
    if dtype.width == 16:
        ty = _PTX_TYPE[dtype]
        while len(level) > 1:
            level = [Int32(_asm(T.i32(), f"max.NaN.{ty}x2 $0, $1, $2;", "=r,r,r", level[i], level[i + 1]))
                     for i in range(0, len(level), 2)]
        ptx = ("{ .reg .b16 lo, hi, m; mov.b32 {lo, hi}, $1; "
               f"max.NaN.{ty} m, lo, hi; cvt.f32.{ty} $0, m; }}")
        return Float32(_asm(T.f32(), ptx, "=f,r", level[0]))
    if dtype.width != 32:
        raise TypeError(f"vector_max takes 16- or 32-bit floats, got {dtype}")
    level = [_bits_f32(x) for x in level]
    while len(level) > 1:
        level = [cute.arch.fmax(level[i], level[i + 1], nan=True) for i in range(0, len(level), 2)]
    return level[0]


def improves(vm: Float32, best: Float32):
    """Whether a vector whose maximum is `vm` replaces the running `best` of lower indices:
    strictly greater, or a NaN while best is not one (ties and later NaNs keep the lower index)."""
    return ~(vm <= best) & (best == best)  # unordered greater: vm > best, or vm NaN


def locate(words: list, dtype, best: Float32) -> Int32:
    """Position in the vector `words` of its first element equal to `best`, or of its first NaN
    (the vector whose maximum is `best`, NaN-free unless best is NaN)."""
    per = 32 // dtype.width
    pos = Int32(len(words) * per - 1)
    for k in reversed(range(len(words) * per)):
        w = words[k // per]
        if per == 2:
            w = (w << 16) if k % 2 == 0 else (w & Int32(-65536))
            x = _bits_f32(w) if dtype is BFloat16 else Float32(
                _asm(T.f32(), "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $1; cvt.f32.f16 $0, hi; }", "=f,r", w))
        else:
            x = _bits_f32(w)
        pos = select((x == best) | (x != x), Int32(k), pos)
    return pos
