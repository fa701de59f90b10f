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
def as_vectors(t: cute.Tensor, n, vec: cutlass.Constexpr[int]) -> cute.Tensor:
    """View the first `(n // vec) * vec` elements of flat tensor `t` as (vec, n // vec) columns."""
    return cute.make_tensor(t.iterator, cute.make_layout((vec, n // vec), stride=(1, vec)))


def extent(t: cute.Tensor, mode: int):
    """Size of mode `mode` of `t`, in the width its layout declares.

    Use this, not `t.shape[mode]`: in DSL 4.8.1 the Python `shape` tuple hands back Int32 elements
    even for a 64-bit (`sym_int64`) dimension, silently truncating sizes past 2^31, while
    `cute.size(t, mode=[i])` keeps the declared width.
    """
    return cute.size(t, mode=[mode])
