"""GEMV, decode-shaped: y = W x with W (N, K) and x of 1-8 columns (curriculum lesson 3).

Roofline: W is read once (N*K elements), x (K*B) and y (N*B) are small; 2*N*K*B FLOPs, i.e. B
FLOPs per byte of bf16 W: memory-bound for every B <= 8 on an H200 (~4.2 TB/s, ~60 TFLOP/s of
fp32 FMA). Floor: bytes of W / copy bandwidth: 4096^2 bf16 (32 MiB) 8 us, 16384^2 (512 MiB) 0.13 ms.
At B = 8 the fp32 FMAs alone (8 per element of W) take half the SM's issue slots at that
bandwidth, so everything else per element of W has to be cut to the bone.
Schedule: row parallel with the row sum's tiling (`schedules.row_tiling`) and a register tile of
`row_block` (R) rows per thread: a group of `threads_per_row` threads owns R consecutive rows of W
and strides over their 128-bit vectors, `unroll` k-vectors (R W-vectors each) in flight. Per
k-vector a thread loads and converts each of the B column vectors of x once (read through L1/L2:
x is re-read by every row group) and adds the R*B dot products of the vector into R*B fp32 scalar
accumulators, so x costs B/R loads and 8*B/R conversions per vector of W instead of B and 8*B.
The group then sums its R*B values with `group_reduce_spread` (about one shuffle per value).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from collectives import pdl
from collectives.reduce import group_reduce_spread, group_smem
from collectives.vector_io import as_vectors, extent, widen_f32
from schedules.row_tiling import RowTiling
from schedules.walks import SplitRowWalk, row_tile_grid, strided_fold


class Gemv:
    """y[n, b] = sum_k W[n, k] * xt[b, k] for W (N, K), xt (B, K) (x transposed: each column of x
    contiguous), y (N, B) with any strides. `cols` = B is a compile-time constant (1..8), and so is
    `row_block` = R, the rows of W each thread accumulates at once (1, 2, 4 or 8; R*B <= 32).

    W and xt have unit stride along K and row strides divisible by `vec` (16-byte aligned bases
    when vec > 1). Accumulation is fp32 in a fixed order (deterministic); y is rounded once.
    """

    def __init__(self, dtype, cols: int, vec: int, index64: bool, tiling: RowTiling, row_block: int = 1):
        if not 1 <= cols <= 8:
            raise ValueError(f"cols must be in [1, 8], got {cols}")
        if row_block not in (1, 2, 4, 8) or row_block * cols > 32:
            raise ValueError(f"row_block must be 1, 2, 4 or 8 with row_block * cols <= 32, got {row_block} "
                             f"for cols={cols}")
        self.dtype, self.cols, self.vec, self.index64, self.tiling = dtype, cols, vec, index64, tiling
        self.row_block = row_block

    @cute.jit
    def __call__(self, w: cute.Tensor, xt: cute.Tensor, y: cute.Tensor, max_ctas: cutlass.Int32, stream):
        ctas = row_tile_grid(extent(w, 0), max_ctas, self.tiling, self.row_block)
        self.kernel(w, xt, y).launch(grid=[ctas, 1, 1], block=[self.tiling.threads, 1, 1], stream=stream,
                                     use_pdl=pdl.LAUNCH)

    @cute.kernel
    def kernel(self, w: cute.Tensor, xt: cute.Tensor, y: cute.Tensor):
        pdl.enter()  # (launched as a programmatic dependent: collectives.pdl)
        vec, B, R = self.vec, self.cols, self.row_block
        tpr = self.tiling.threads_per_row
        rows, k = extent(w, 0), extent(w, 1)

        buf = group_smem(cutlass.memory.SmemAllocator(), Float32, self.tiling.threads, tpr, R * B)

        wk = SplitRowWalk.create(self.tiling, rows, k, vec, 1, self.index64, R)  # rows are never split
        lane, nv, tail = wk.lane, wk.nv, wk.tail
        for i in cutlass.range(wk.count, unroll=1):
            first = wk.row(i)
            sums = tuple(Float32(0.0) for _ in range(R * B))
            if first < rows:
                # Rows past the end (last tile only) re-read the last row; their sums are dropped.
                rs = [cutlass.min(first + q, rows - 1) for q in range(R)]
                wvs = [as_vectors(w[r, None], k, vec) for r in rs]
                xvs = [as_vectors(xt[c, None], k, vec) for c in range(B)]

                def load(j):
                    return tuple(wvs[q][None, j].load() for q in range(R))

                def step(a, j, v):
                    wf = [widen_f32(v[q], self.dtype) for q in range(R)]
                    xf = [widen_f32(xvs[c][None, j].load(), self.dtype) for c in range(B)]
                    a = list(a)
                    for e in cutlass.range_constexpr(vec):
                        for q in cutlass.range_constexpr(R):
                            for c in cutlass.range_constexpr(B):
                                a[q * B + c] = a[q * B + c] + wf[q][e] * xf[c][e]
                    return tuple(a)

                sums = strided_fold(nv, lane, tpr, tpr * self.tiling.unroll, self.tiling.unroll, load, step, sums)
                if cutlass.const_expr(vec > 1):
                    for t in cutlass.range_constexpr(-(-vec // tpr)):
                        e = nv * vec + lane + t * tpr
                        if lane + t * tpr < tail:
                            sl = list(sums)
                            for q in cutlass.range_constexpr(R):
                                wf = w[rs[q], e].to(Float32)
                                for c in cutlass.range_constexpr(B):
                                    sl[q * B + c] = sl[q * B + c] + wf * xt[c, e].to(Float32)
                            sums = tuple(sl)
            for total, idx, owner in group_reduce_spread(sums, tpr, buf):
                q = idx // B
                row = first + q
                if owner != 0:
                    if row < rows:
                        y[row, idx - q * B] = total.to(self.dtype)
            if cutlass.const_expr(buf is not None):
                cute.arch.barrier()  # the shared slots are rewritten by the next tile
