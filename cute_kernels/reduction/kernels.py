"""Sum over the last dim, and over all elements (curriculum lesson 2).

Roofline: reads each input byte once and writes one value per row; N-1 adds per row, far below any
arithmetic limit. The floor is input bytes / read bandwidth (H200: a 1 GiB bf16 tensor, ~0.26 ms).
Schedule: row tiling (`schedules.row_tiling`); each thread folds its 128-bit vectors into a vector
of fp32 accumulators, then the row's threads combine by warp butterfly and a shared-memory stage
(`collectives.reduce`). Long rows are split over CTAs into fp32 partials that a second launch of the
same kernel sums, so the result never depends on timing (no atomics).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from collectives.reduce import add, group_reduce, group_smem
from collectives.vector_io import as_vectors, extent
from schedules.row_tiling import RowTiling
from schedules.walks import SplitRowWalk, row_tile_grid, strided_fold


class RowSum:
    """out[m, s] = sum of split `s` of row `m` of x (M, N); out has `splits` columns (1: final sum).

    x has unit stride along N and a row stride divisible by `vec`; its base is 16-byte aligned when
    vec > 1. CTAs walk row tiles grid-stride (at most `max_ctas` of them per split), so a CTA's
    launch cost is spread over many rows. Accumulation is fp32 in a fixed order; out is written in
    out's dtype.
    """

    def __init__(self, in_dtype, out_dtype, vec: int, index64: bool, tiling: RowTiling):
        self.in_dtype, self.out_dtype = in_dtype, out_dtype
        self.vec, self.index64, self.tiling = vec, index64, tiling

    @cute.jit
    def __call__(self, x: cute.Tensor, out: cute.Tensor, max_ctas: Int32, stream):
        ctas = row_tile_grid(extent(x, 0), max_ctas, self.tiling)
        self.kernel(x, out).launch(
            grid=[ctas, extent(out, 1), 1], block=[self.tiling.threads, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(self, x: cute.Tensor, out: cute.Tensor):
        vec = self.vec
        tpr = self.tiling.threads_per_row
        rows, n = extent(x, 0), extent(x, 1)
        splits = extent(out, 1)
        if cutlass.const_expr(self.index64):
            assert n.dtype is Int64 and rows.dtype is Int64, "64-bit variant traced with 32-bit sizes"

        buf = group_smem(cutlass.memory.SmemAllocator(), Float32, self.tiling.threads, tpr)

        w = SplitRowWalk.create(self.tiling, rows, n, vec, splits, self.index64)
        lane, nv, v_begin, v_count, tail = w.lane, w.nv, w.v_begin, w.v_count, w.tail
        _, split, _ = cute.arch.block_idx()
        for i in cutlass.range(w.count, unroll=1):
            row = w.row(i)
            acc = cute.full((vec,), 0.0, Float32)
            if row < rows:
                xv = as_vectors(x[row, None], n, vec)

                def load(j):
                    return xv[None, v_begin + j].load()

                def step(a, j, v):
                    return a + v.to(Float32)

                acc = strided_fold(v_count, lane, tpr, tpr * self.tiling.unroll, self.tiling.unroll, load, step, acc,
                                   tail_branch=False)
            total = acc.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
            if cutlass.const_expr(vec > 1):
                # The n % vec elements past the last vector belong to the last split; with fewer than
                # `vec` threads per row a lane takes several of them.
                if row < rows and split == splits - 1:
                    for k in cutlass.range_constexpr(-(-vec // tpr)):
                        if lane + k * tpr < tail:
                            total = total + x[row, nv * vec + lane + k * tpr].to(Float32)
            total = group_reduce(total, add, tpr, buf, Float32(0.0))
            if row < rows and lane == 0:
                out[row, split] = total.to(self.out_dtype)
            if cutlass.const_expr(buf is not None):
                cute.arch.barrier()  # the shared slots are rewritten by the next tile


class ColumnSum:
    """out[j] = sum over c of x[c, j] for x (C, N), fp32 accumulation in a fixed order (deterministic).

    What finishes a kernel that leaves per-CTA partial rows (the norms' backward: fp32 dweight/dbias
    partials, one row per CTA), with the cast to the output dtype fused. A CTA owns 32 `vec`-element
    column vectors (one per lane); its warps split the C rows (warp w sums rows w, w + warps, ...,
    several loads in flight), then warp 0 folds the warps' sums in warp order through shared memory.
    x has unit stride along N and a row stride divisible by `vec` (16-byte aligned when vec > 1).
    Roofline: C x N x 4 bytes read once; at C = 264, N = 4096 (4.3 MB) launch latency dominates.
    """

    def __init__(self, in_dtype, out_dtype, vec: int, threads: int):
        self.in_dtype, self.out_dtype, self.vec, self.threads = in_dtype, out_dtype, vec, threads

    @cute.jit
    def __call__(self, x: cute.Tensor, out: cute.Tensor, stream):
        cols = 32 * self.vec
        self.kernel(x, out).launch(grid=[(extent(x, 1) + cols - 1) // cols, 1, 1], block=[self.threads, 1, 1],
                                   stream=stream)

    @cute.kernel
    def kernel(self, x: cute.Tensor, out: cute.Tensor):
        vec, warps = self.vec, self.threads // 32
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        warp, lane = tidx // 32, tidx % 32
        c, n = extent(x, 0), extent(x, 1)
        buf = cutlass.memory.SmemAllocator().allocate_tensor(
            Float32, cute.make_layout((vec, 32, warps), stride=(1, vec, 32 * vec)), byte_alignment=16)
        j = bidx * 32 + lane  # this lane's column vector
        acc = cute.full((vec,), 0.0, Float32)
        if j < n // vec:
            for r in cutlass.range(warp, c, warps, unroll=4):
                acc = acc + as_vectors(x[r, None], n, vec)[None, j].load().to(Float32)
        buf[None, lane, warp].store(acc)
        cute.arch.barrier()
        if warp == 0 and j < n // vec:
            total = buf[None, lane, 0].load()
            for w in cutlass.range_constexpr(1, warps):
                total = total + buf[None, lane, w].load()
            as_vectors(out, n, vec)[None, j].store(total.to(self.out_dtype))
