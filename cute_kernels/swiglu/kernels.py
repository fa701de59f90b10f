"""SiLU and SwiGLU, forward and backward (curriculum lesson 11: operator fusion).

Roofline: a handful of fp32 operations per element against 2-5 tensors moved, so memory-bound.
Bytes per element x dtype size: silu fwd 2 (x, y), silu bwd 3 (x, dy, dx), swiglu fwd 3 (gate, up,
out), swiglu bwd 5 (gate, up, dout, dgate, dup). On an H200 (~4.2 TB/s copy) a 256 MiB-per-tensor
bf16 SwiGLU forward moves 768 MiB: floor 0.19 ms; the backward 1.25 GiB: 0.32 ms. Unfused torch
(silu, then mul) moves 5 tensors forward instead of 3 and ~9 backward instead of 5.
Schedule: the elementwise grid-stride map (`collectives.vector_map.map_vectors`): 128-bit vectors,
`unroll` of them in flight per thread, a scalar tail; all math in fp32, one rounding per output.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from collectives import pdl
from collectives.activations import sigmoid, silu_mul
from collectives.vector_map import map_grid, map_vectors
from schedules.grid_stride import GridStride

# op -> (inputs, outputs)
ARITY = {"silu_fwd": (1, 1), "silu_bwd": (2, 1), "swiglu_fwd": (2, 1), "swiglu_bwd": (3, 2)}


class GatedActivation:
    """The four maps, all on flat tensors of one length:

    - silu_fwd:   (x) -> (y = x * sigmoid(x))
    - silu_bwd:   (x, dy) -> (dx = dy * s * (1 + x * (1 - s))),  s = sigmoid(x)
    - swiglu_fwd: (gate, up) -> (out = silu(gate) * up)
    - swiglu_bwd: (gate, up, dout) -> (dgate = dout * up * silu'(gate), dup = dout * silu(gate))

    `__call__` always takes three input and two output tensors; the ones an op does not use are
    ignored (pass any tensor of the right dtype).
    """

    def __init__(self, op: str, dtype, vec: int, index64: bool, schedule: GridStride):
        if op not in ARITY:
            raise ValueError(f"op must be one of {tuple(ARITY)}, got {op!r}")
        self.op, self.dtype, self.vec, self.index64, self.schedule = op, dtype, vec, index64, schedule

    def _f(self, *vals):
        dt = self.dtype
        fast = dt.width == 16
        v = [t.to(Float32) for t in vals]
        if cutlass.const_expr(self.op == "silu_fwd"):
            return ((v[0] * sigmoid(v[0], fast)).to(dt),)
        if cutlass.const_expr(self.op == "silu_bwd"):
            s = sigmoid(v[0], fast)
            return ((v[1] * s * (1.0 + v[0] * (1.0 - s))).to(dt),)
        if cutlass.const_expr(self.op == "swiglu_fwd"):
            return (silu_mul(v[0], v[1], fast).to(dt),)
        g, up, dout = v
        s = sigmoid(g, fast)
        silu = g * s
        dgate = dout * up * (s * (1.0 + g * (1.0 - s)))
        return (dgate.to(dt), (dout * silu).to(dt))

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, o1: cute.Tensor, o2: cute.Tensor,
                 max_ctas: Int32, stream):
        ctas, passes = map_grid(cute.size(o1, mode=[0]) // self.vec, self.schedule, max_ctas, self.index64)
        self.kernel(a, b, c, o1, o2, passes).launch(grid=[ctas, 1, 1], block=[self.schedule.threads, 1, 1],
                                                    stream=stream, use_pdl=pdl.LAUNCH)

    @cute.kernel
    def kernel(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, o1: cute.Tensor, o2: cute.Tensor,
               passes: Int32):
        n_in, n_out = ARITY[self.op]
        ins = (a, b, c)[:n_in]
        outs = (o1, o2)[:n_out]
        map_vectors(ins, outs, self._f, self.vec, self.schedule, self.index64, full_passes=passes)
