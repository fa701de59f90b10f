"""GEMV, decode-shaped: y = W x with W (N, K) and x of 1-8 columns (curriculum lesson 3).

Roofline: W is read once (N*K elements), x (K*B) and y (N*B) are small; 2*N*K*B FLOPs, i.e. B
FLOPs per byte of bf16 W: memory-bound for every B <= 8 on an H200 (~4.2 TB/s, ~60 TFLOP/s of
fp32 FMA). Floor: bytes of W / copy bandwidth: 4096^2 bf16 (32 MiB) 8 us, 16384^2 (512 MiB) 0.13 ms.
Schedule: row parallel with the row sum's tiling (`schedules.row_tiling`): a row of W belongs to
`threads_per_row` threads that stride over its 128-bit vectors, `unroll` in flight; each vector of W
is multiplied by the same vector of every column of x (read through L1/L2: every row re-reads x)
into fp32 vector accumulators; the row's threads then combine each column with `group_reduce`.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from collectives.reduce import add, group_reduce, group_smem_slots
from collectives.vector_io import as_vectors, extent
from schedules.grid_stride import strided_fold
from schedules.row_tiling import RowTiling, SplitRowWalk, row_tile_grid


class Gemv:
    """y[n, b] = sum_k W[n, k] * xt[b, k] for W (N, K), xt (B, K) (x transposed: each column of x
    contiguous), y (N, B) with any strides. `cols` = B is a compile-time constant (1..8).

    W and xt have unit stride along K and row strides divisible by `vec` (16-byte aligned bases
    when vec > 1). Accumulation is fp32 in a fixed order (deterministic); y is rounded once.
    """

    def __init__(self, dtype, cols: int, vec: int, index64: bool, tiling: RowTiling):
        if not 1 <= cols <= 8:
            raise ValueError(f"cols must be in [1, 8], got {cols}")
        self.dtype, self.cols, self.vec, self.index64, self.tiling = dtype, cols, vec, index64, tiling

    @cute.jit
    def __call__(self, w: cute.Tensor, xt: cute.Tensor, y: cute.Tensor, max_ctas: Int32, stream):
        ctas = row_tile_grid(extent(w, 0), max_ctas, self.tiling)
        self.kernel(w, xt, y).launch(grid=[ctas, 1, 1], block=[self.tiling.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, w: cute.Tensor, xt: cute.Tensor, y: cute.Tensor):
        vec, B = self.vec, self.cols
        tpr = self.tiling.threads_per_row
        rows, k = extent(w, 0), extent(w, 1)

        smem = cutlass.memory.SmemAllocator()
        slots = group_smem_slots(self.tiling.threads, tpr)
        bufs = [None] * B
        if cutlass.const_expr(slots > 0):
            buf = smem.allocate_tensor(Float32, cute.make_layout(slots * B), byte_alignment=16)
            # One slot range per column: the B reductions of a tile need no barrier between them.
            bufs = [cute.make_tensor(buf.iterator + c * slots, cute.make_layout(slots)) for c in range(B)]

        wk = SplitRowWalk.create(self.tiling, rows, k, vec, 1, self.index64)  # rows are never split
        lane, nv, tail = wk.lane, wk.nv, wk.tail
        for i in cutlass.range(wk.count, unroll=1):
            row = wk.row(i)
            acc = tuple(cute.full((vec,), 0.0, Float32) for _ in range(B))
            if row < rows:
                wv = as_vectors(w[row, None], k, vec)
                xvs = [as_vectors(xt[c, None], k, vec) for c in range(B)]

                def load(j):
                    return wv[None, j].load()

                def step(a, j, v):
                    wf = v.to(Float32)
                    return tuple(a[c] + wf * xvs[c][None, j].load().to(Float32) for c in range(B))

                acc = strided_fold(nv, lane, tpr, tpr * self.tiling.unroll, self.tiling.unroll, load, step, acc)
            sums = tuple(acc[c].reduce(cute.ReductionOp.ADD, Float32(0.0), 0) for c in range(B))
            if cutlass.const_expr(vec > 1):
                if row < rows:
                    for t in cutlass.range_constexpr(-(-vec // tpr)):
                        e = nv * vec + lane + t * tpr
                        if lane + t * tpr < tail:
                            wf = w[row, e].to(Float32)
                            sums = tuple(sums[c] + wf * xt[c, e].to(Float32) for c in range(B))
            for c in cutlass.range_constexpr(B):
                total = group_reduce(sums[c], add, tpr, bufs[c], Float32(0.0))
                if row < rows and lane == 0:
                    y[row, c] = total.to(self.dtype)
            if cutlass.const_expr(slots > 0):
                cute.arch.barrier()  # the shared slots are rewritten by the next tile
