"""Vectorized global-memory access.

A flat run of `n` elements whose base is 16-byte aligned is viewed as `(vec, n // vec)`: column `j`
is one vector of `vec` contiguous elements that a single 128-bit `ld/st.global.v4` moves. The
`n % vec` elements past the last full vector are the caller's tail.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute


def vec_elems(dtype, vec_bytes: int = 16) -> int:
    """Elements per `vec_bytes` access for a cutlass numeric type."""
    return max(1, vec_bytes * 8 // dtype.width)


@cute.jit
def as_vectors(t: cute.Tensor, n, vec: cutlass.Constexpr[int], rows_like=None) -> cute.Tensor:
    """View the first `(n // vec) * vec` elements of flat tensor `t` as (vec, n // vec) columns.

    A rank-2 `t` (rows, cols) with unit column stride and any row stride (a column slice of a wider matrix, e.g.
    one half of a fused projection's output) is walked in row-major order instead: column j is vector
    j % (cols / vec) of row j // (cols / vec), so `n` = rows x cols and cols % vec == 0 (the caller's
    guarantee; no tail then). `rows_like`: a matrix of the same shape whose extents are used instead of t's, so
    that matrices walked together share one division of the vector index."""
    if cutlass.const_expr(cute.rank(t) == 2):
        like = t if cutlass.const_expr(rows_like is None) else rows_like
        return cute.make_tensor(t.iterator, cute.make_layout((vec, (extent(like, 1) // vec, extent(like, 0))),
                                                             stride=(1, (vec, t.stride[0]))))
    return cute.make_tensor(t.iterator, cute.make_layout((vec, n // vec), stride=(1, vec)))


def row_vectors(row: cute.Tensor, vec: int) -> cute.Tensor:
    """A whole row (a 1-D slice of static length, e.g. a head row of D elements) as (vec, len / vec) columns:
    column j is one vector access."""
    return as_vectors(row, cute.size(row), vec)


def extent(t: cute.Tensor, mode: int):
    """Size of mode `mode` of `t`, in the width its layout declares.

    Use this, not `t.shape[mode]`: in DSL 4.8.1 the Python `shape` tuple hands back Int32 elements
    even for a 64-bit (`sym_int64`) dimension, silently truncating sizes past 2^31, while
    `cute.size(t, mode=[i])` keeps the declared width.
    """
    return cute.size(t, mode=[mode])


def widen_f32(v, dtype) -> list:
    """The elements of a loaded vector `v` (TensorSSA of `dtype`) as a list of fp32 scalars.

    bf16 is the top half of an fp32, so each 32-bit pair widens with one integer op per element
    (`p << 16` for the even element, `p & 0xffff0000` for the odd one); the generic conversion
    spends three ops per pair (it moves the odd element down first). Other types convert as usual.
    """
    n = cute.size(v.shape)
    if dtype is not cutlass.BFloat16 or n % 2:
        f = v.to(cutlass.Float32)
        return [f[e] for e in range(n)]
    r = cute.make_rmem_tensor((n,), dtype)
    r.store(v)
    pairs = cute.recast_tensor(r, cutlass.Int32)
    out = []
    for i in range(n // 2):
        p = pairs[i]
        out.append((p << 16).bitcast(cutlass.Float32))
        out.append((p & cutlass.Int32(-65536)).bitcast(cutlass.Float32))
    return out


def widen_again(v):
    """A 16-bit vector `v` (TensorSSA) widened to fp32 as a TensorSSA by other instructions than
    `v.to(Float32)` (bf16: `widen_f32`'s integer ops), for a later pass over a row held in 16 bits:
    were it the same conversion, the compiler would merge it with the first pass's and keep that
    fp32 copy of the row live across the reduction between them (twice the registers: the held
    RMSNorm row spilled 248 B at 80). Same values; other types convert as usual."""
    if v.dtype is not cutlass.BFloat16:
        return v.to(cutlass.Float32)
    els = widen_f32(v, v.dtype)
    r = cute.make_rmem_tensor((len(els),), cutlass.Float32)
    for i in range(len(els)):
        r[i] = els[i]
    return r.load()
