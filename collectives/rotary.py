"""Rotary position embedding of one vector of a head row, in fp32 (the RoPE kernel and the fused RoPE + KV append).

With angle entries c = cos[p, i], s = sin[p, i], a pair (a, b) becomes (a c - b s, b c + a s); `inverse` rotates by
the negated angle (the adjoint, for the backward). NeoX pairs element i of the first half with element i of the
second (two vectors in, two out); GPT-J pairs adjacent elements (one vector of 2 n elements, n angle entries).
Inputs are TensorSSA vectors in any float type, angles fp32; results are fp32 TensorSSA, rounded by the caller.
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Float32


def rotate_halves(x1, x2, cs, sn, inverse: bool = False):
    """NeoX: (x1 c - x2 s, x2 c + x1 s) elementwise (s negated when `inverse`)."""
    a, b = x1.to(Float32), x2.to(Float32)
    if inverse:
        return a * cs + b * sn, b * cs - a * sn
    return a * cs - b * sn, b * cs + a * sn


def rotate_pairs(x, cs, sn, inverse: bool = False):
    """GPT-J: each adjacent pair (x[2i], x[2i + 1]) of `x` rotated by angle entry i (`cs`, `sn`: n = len(x) / 2)."""
    n = cute.size(cs.shape)
    f = cute.make_rmem_tensor((2 * n,), Float32)
    f.store(x.to(Float32))
    c = cute.make_rmem_tensor((n,), Float32)
    c.store(cs)
    s = cute.make_rmem_tensor((n,), Float32)
    s.store(sn)
    o = cute.make_rmem_tensor((2 * n,), Float32)
    for i in range(n):  # unrolled as it traces
        a, b = f[2 * i], f[2 * i + 1]
        si = -s[i] if inverse else s[i]
        o[2 * i] = a * c[i] - b * si
        o[2 * i + 1] = b * c[i] + a * si
    return o.load()
