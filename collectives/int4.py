"""INT4 weights dequantized in registers (the W4A16 GEMM): a packed word of eight nibbles to four 16-bit pairs.

The packed order (`cute_kernels.w4a16.pack`) puts the pair (element 2j, element 2j + 1) of a word's eight elements in
nibbles j and j + 4, so pair j is `(word >> 4 j) & 0x000F000F` in the low bits of each 16-bit half. OR-ing in a
magic exponent makes each half the 16-bit float M + n exactly (bf16: 0x4300 = 128, 7 mantissa bits; fp16: 0x6400 =
1024, 10 bits): one `lop3`. Then (M + n) - (M + z) = n - z exactly (small integers) by a packed fma with 1, and
times the group's scale s rounded once by a packed multiply: (n - z) s in the weight dtype, the value
`unpack_int4` defines. About two instructions a weight.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from collectives.ptx import asm_b32


def magic_of(dtype) -> tuple[int, float]:
    """(the 16-bit pattern of M with empty mantissa bits for a nibble, M): bf16 128, fp16 1024."""
    if dtype is cutlass.BFloat16:
        return 0x4300, 128.0
    if dtype is cutlass.Float16:
        return 0x6400, 1024.0
    raise ValueError(f"int4 dequantization is for bf16 / fp16 weights, got {dtype}")


def pair_of(value, dtype) -> cutlass.Int32:
    """A 16-bit scalar `value` (of `dtype`) twice in one 32-bit word."""
    r = cute.make_rmem_tensor((2,), dtype)
    r[0] = value
    r[1] = value
    return cute.recast_tensor(r, cutlass.Int32)[0]


def biased_pair(word, j: int, dtype) -> cutlass.Int32:
    """Pair j (0-3) of packed `word` as the 16-bit pair (M + n, ...), exact: a shift (j > 0) and one `lop3`. A kernel
    that takes these into its MMAs removes M + z on its fp32 sums: sum (M + n) x - (M + z) sum x."""
    bits, _ = magic_of(dtype)
    shifted = word if j == 0 else cutlass.Int32(word) >> (4 * j)  # (arithmetic: the masked bits are the same)
    return asm_b32(f"{{.reg .b32 k, c; mov.b32 k, 0x000F000F; mov.b32 c, {bits | bits << 16}; "
                f"lop3.b32 $0, $1, k, c, 0xEA;}}", "=r,r", shifted)


def _ones_bits(dtype) -> int:
    return 0x3F803F80 if dtype is cutlass.BFloat16 else 0x3C003C00


def ones_pair(dtype) -> cutlass.Int32:
    """The 16-bit pair (1, 1) as a word: an A fragment of ones makes an MMA sum its B operand over k."""
    return cutlass.Int32(_ones_bits(dtype))


def dequant_pair(word, j: int, neg_offset2, scale2, dtype) -> cutlass.Int32:
    """Pair j (0-3) of packed `word` as a 16-bit pair ((n - z) s, ...): `neg_offset2` holds -(M + z) twice,
    `scale2` s twice (words from `pair_of`); with `scale2` None the integers (n - z) themselves (exact), for a kernel
    that applies the group's scale to its fp32 partial sums instead."""
    ty = "bf16x2" if dtype is cutlass.BFloat16 else "f16x2"
    m = biased_pair(word, j, dtype)
    d = asm_b32(f"{{.reg .b32 o; mov.b32 o, {_ones_bits(dtype)}; fma.rn.{ty} $0, $1, o, $2;}}", "=r,r,r", m, neg_offset2)
    if scale2 is None:
        return d
    return asm_b32(f"mul.rn.{ty} $0, $1, $2;", "=r,r,r", d, scale2)
