"""sin and cos of fp32 arguments to about an ulp without local memory.

The library's accurate `sincos` reduces arguments past ~1e5 radians by Payne-Hanek, whose table of partial products
lives in local memory in every kernel that calls it, even when no such argument comes; the MUFU approximations
(`sin.approx`) are off by ~5e-7 absolute at small arguments, more than fp32's own rounding there. Here the reduction
by pi/2 runs in fp64 (the fp32 argument is exact in fp64; a two-part pi/2 keeps the remainder accurate while the
quadrant count stays below 2^20, arguments up to ~1.6e6, past which an fp32 argument's own ulp exceeds 0.1 radians),
then minimax polynomials on [-pi/4, pi/4] (the classic single-precision ones) in fp32, and the quadrant picks the
signs."""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Float32, Float64, Int32

TWO_OVER_PI = 0.63661977236758134308
PIO2_HI = 1.57079632673412561417e00  # the first 33 bits of pi/2: k * PIO2_HI is exact for |k| < 2^20
PIO2_LO = 6.07710050650619224932e-11  # pi/2 - PIO2_HI
S = (-1.9515295891e-4, 8.3321608736e-3, -1.6666654611e-1)  # sin(r) = r + r^3 (S0 r^4 + S1 r^2 + S2)
C = (2.443315711809948e-5, -1.388731625493765e-3, 4.166664568298827e-2)  # cos(r) = 1 - r^2/2 + r^4 (...)


@cute.jit
def sincos(x: Float32):
    """(sin x, cos x) of one fp32 value, each within about an ulp (`|x|` < ~1.6e6)."""
    x64 = Float64(x)
    k = cute.math.floor(x64 * Float64(TWO_OVER_PI) + Float64(0.5))
    r = Float32((x64 - k * Float64(PIO2_HI)) - k * Float64(PIO2_LO))
    q = Int32(k) & 3
    z = r * r
    s = ((Float32(S[0]) * z + Float32(S[1])) * z + Float32(S[2])) * z * r + r
    c = ((Float32(C[0]) * z + Float32(C[1])) * z + Float32(C[2])) * z * z - Float32(0.5) * z + Float32(1.0)
    sin_x, cos_x = s, c
    if q == 1:
        sin_x, cos_x = c, -s
    elif q == 2:
        sin_x, cos_x = -s, -c
    elif q == 3:
        sin_x, cos_x = -c, s
    return sin_x, cos_x

