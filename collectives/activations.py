"""Activation math shared by the elementwise SwiGLU kernels and the GEMM epilogue."""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Float32


def sigmoid(x, fast: bool):
    """1 / (1 + e^-x) in fp32, of one value or a vector (TensorSSA). `fast` (16-bit outputs): the hardware
    reciprocal (`rcp.approx.ftz`, ~1 ulp of fp32, invisible after the rounding to 16 bits but for rare ties) instead
    of an IEEE division, which is a MUFU.RCP, Newton steps and a range check calling a slow path per element: the
    SiLU forward issued ~20 instructions per element (91 % of copy bandwidth) and ~7 with it; the gated GEMM
    epilogue 1920 SASS instructions at 64 x 128 against 1064 without the activation. fp32 outputs keep the division
    (their tests allow 4 ulps over torch). Flushing to zero only touches x < -87, where sigmoid(x) < 2^-126."""
    e = 1.0 + cute.math.exp(-x, fastmath=True)
    if not fast:
        return 1.0 / e
    if not hasattr(e, "shape"):  # one value
        return cute.arch.rcp_approx(e)
    d = cute.make_rmem_tensor(x.shape, Float32)
    d.store(e)
    for i in range(cute.size(d)):  # the vector's elements, unrolled as it traces
        d[i] = cute.arch.rcp_approx(d[i])
    return d.load()


def silu_mul(gate, up, fast: bool):
    """silu(gate) * up in fp32 (SwiGLU's product), of values or vectors; `fast` as `sigmoid`."""
    return gate * sigmoid(gate, fast) * up
