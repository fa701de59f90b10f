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
from collectives.quantize import BLOCK, E4M3, fmax, inverse, scale_of, vector_amax
from collectives.reduce import warp_reduce
from collectives.vector_io import as_vectors, extent
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


class SwigluQuant:
    """(q, s) = the 1x128 e4m3 quantization of silu(gate) * up, taken from the fp32 product (no 16-bit rounding
    between): the FP8 MLP's activation feeding the next FP8 GEMM. A CTA a row (grid-stride past the cap), the row's
    16-byte vectors over its threads; a 128-column block's 16 vectors sit on 16 consecutive lanes, whose butterfly
    gives the block's amax (`collectives.quantize`: scale, reciprocal, e4m3 as `quantize_1x128`). Every lane runs
    every step (the shuffles need the whole warp); a vector past the row reads vector 0 and stores nothing."""

    def __init__(self, dtype, threads: int = 128):
        if threads % 16:
            raise ValueError(f"threads must be a multiple of 16, got {threads}")
        self.dtype, self.threads = dtype, threads
        self.vec = 128 // dtype.width

    @cute.jit
    def __call__(self, gate: cute.Tensor, up: cute.Tensor, q: cute.Tensor, s: cute.Tensor, max_ctas: Int32, stream):
        """gate, up (M, I) with unit column stride, I a multiple of 128; q (M, I) e4m3; s (M, I / 128) fp32."""
        ctas = cutlass.max(cutlass.min(extent(gate, 0), max_ctas), 1)
        self.kernel(gate, up, q, s).launch(grid=[ctas, 1, 1], block=[self.threads, 1, 1], stream=stream,
                                           use_pdl=pdl.LAUNCH)

    @cute.kernel
    def kernel(self, mG: cute.Tensor, mU: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor):
        pdl.enter()  # (launched as a programmatic dependent: collectives.pdl)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        rows, n = extent(mG, 0), extent(mG, 1)
        nvec = n // self.vec
        per_block = BLOCK // self.vec
        for r in cutlass.range(bidx, rows, gdim, unroll=1):
            g_row = as_vectors(mG[r, None], n, self.vec)
            u_row = as_vectors(mU[r, None], n, self.vec)
            q_row = as_vectors(mQ[r, None], n, self.vec)
            for i in cutlass.range((nvec + self.threads - 1) // self.threads, unroll=1):
                j = i * self.threads + tidx
                jc = cutlass.min(j, nvec - 1)
                y = silu_mul(g_row[None, jc].load().to(Float32), u_row[None, jc].load().to(Float32), True)
                scale = scale_of(warp_reduce(vector_amax(y), fmax, per_block), False)
                qv = cute.make_rmem_tensor((self.vec,), E4M3)
                qv.store((y * inverse(scale)).to(E4M3))
                if j < nvec:
                    q_row[None, j].store(qv.load())
                    if j % per_block == 0:
                        mS[r, j // per_block] = scale
