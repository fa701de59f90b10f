"""A row held in registers: the base of every "load once, reduce, compute, store" row-wise kernel
(RMSNorm, LayerNorm, softmax, log-softmax, cross-entropy; curriculum lessons 4-7).

A row of N elements is cut into 128-bit vectors of `vec` elements. The `threads_per_row` (tpr)
threads of a row group, in each of the `cluster_n` CTAs of a cluster, hold `vpt` vectors each:

    vector index of (rank, k, lane) = (rank * vpt + k) * tpr + lane,   k < vpt

so for every k the row group reads one contiguous, coalesced run of tpr vectors, and a CTA of a
cluster owns one contiguous slice of the row. Vectors past the row's end are never loaded or
stored; they hold a fill value (0 for sums, -inf for maxima) so the reductions need no masks.

`RowSlice` does the loads, stores and per-thread folds; `RowReducer` turns a per-thread value
into the row's value: warp butterfly, then shared memory across the warps of a row
(`collectives.reduce.group_reduce`), then distributed shared memory across the CTAs of a cluster
(`collectives.reduce.cluster_reduce`). Schedules come from `schedules.row_tiling.plan_held_rows`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from collectives.reduce import cluster_reduce, cluster_smem_slots, group_reduce, group_smem_slots
from collectives.vector_io import as_vectors


@dataclass(frozen=True)  # frozen: the DSL then knows a loop cannot mutate it (no loop-carried state)
class RowSlice:
    """The vectors of one row that this thread holds. Build inside a kernel; `lane` is the thread's
    index in its row group, `rank` its CTA's rank in the cluster (0 without one), `n` the row length
    (a multiple of `vec`: the kernels' aligned variants require it, the scalar ones have vec=1)."""

    vec: int
    tpr: int
    vpt: int
    lane: Any
    rank: Any
    n: Any

    @property
    def nv(self):
        return self.n // self.vec if self.vec > 1 else self.n

    def index(self, k: int):
        """Vector index (in the row) of this thread's k-th vector."""
        return (self.rank * self.vpt + k) * self.tpr + self.lane

    def valid(self, k: int):
        return self.index(k) < self.nv

    def view(self, row: cute.Tensor) -> cute.Tensor:
        """A flat row (unit stride, 16-byte aligned when vec > 1) as (vec, N / vec) vectors."""
        return as_vectors(row, self.n, self.vec)

    @cute.jit
    def load(self, row: cute.Tensor, ok, fill: cutlass.Constexpr[float]):
        """This thread's vectors of `row` (a list of TensorSSA in the row's dtype); `fill` where the
        vector is past the row's end or `ok` (the row exists) is false."""
        rv = self.view(row)
        out = []
        for k in cutlass.range_constexpr(self.vpt):
            v = cute.full((self.vec,), fill, row.element_type)
            if ok and self.valid(k):
                v = rv[None, self.index(k)].load()
            out.append(v)
        return out

    @cute.jit
    def store(self, row: cute.Tensor, ok, values):
        """Write this thread's vectors `values` (fp32 TensorSSA) into `row`, converted to its dtype."""
        rv = self.view(row)
        for k in cutlass.range_constexpr(self.vpt):
            if ok and self.valid(k):
                rv[None, self.index(k)].store(values[k].to(row.element_type))

    @staticmethod
    def to_f32(values):
        return [v.to(Float32) for v in values]

    @staticmethod
    def sum(values):
        """Sum of all held elements (fp32), vector lanes first, then across vectors."""
        acc = values[0]
        for k in range(1, len(values)):
            acc = acc + values[k]
        return acc.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)

    @cute.jit
    def masked_sum(self, values):
        """Sum of the held elements of vectors inside the row (vectors past its end are skipped:
        for values whose fill would not be 0, like x - mean)."""
        acc = Float32(0.0)
        for k in cutlass.range_constexpr(self.vpt):
            s = values[k].reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
            if self.valid(k):
                acc = acc + s
        return acc


@dataclass(frozen=True)
class RowReducer:
    """Row reductions for a CTA of `threads` threads in groups of `tpr`, over `cluster_n` CTAs.

    `RowReducer.allocate` (inside the kernel) takes one set of shared-memory slots per call site:
    `widths[s]` scalars for site s. Every thread of the CTA must call `reduce` for every site (it
    has barriers), also threads whose row is past the end. Between tiles the caller runs
    `end_tile` (a CTA barrier, so the slots of the group stage may be rewritten); the cluster
    stage alternates two slot sets by tile parity instead of waiting again.
    """

    threads: int
    tpr: int
    cluster_n: int
    group_bufs: tuple
    cluster_bufs: tuple

    @staticmethod
    def allocate(smem, threads: int, tpr: int, cluster_n: int, widths: tuple[int, ...]) -> "RowReducer":
        group_bufs, cluster_bufs = [], []
        for w in widths:
            g = group_smem_slots(threads, tpr, w)
            group_bufs.append(smem.allocate_tensor(Float32, cute.make_layout(g), byte_alignment=16) if g else None)
            c = cluster_smem_slots(threads // tpr, cluster_n, w)
            cluster_bufs.append(
                smem.allocate_tensor(Float32, cute.make_layout((c, 2)), byte_alignment=16) if c else None)
        return RowReducer(threads, tpr, cluster_n, tuple(group_bufs), tuple(cluster_bufs))

    @property
    def needs_barrier(self) -> bool:
        return any(b is not None for b in self.group_bufs)

    @cute.jit
    def reduce(self, val, op, init, site: cutlass.Constexpr[int], parity):
        """The row's reduction of `val` (a scalar or tuple) by `op`, in every thread of the row."""
        val = group_reduce(val, op, self.tpr, self.group_bufs[site], init)
        if cutlass.const_expr(self.cluster_n > 1):
            tidx, _, _ = cute.arch.thread_idx()
            _, rank, _ = cute.arch.block_idx()
            val = cluster_reduce(val, op, self.cluster_n, self.cluster_bufs[site][None, parity],
                                 tidx // self.tpr, tidx % self.tpr, rank)
        return val

    @cute.jit
    def end_tile(self):
        if cutlass.const_expr(self.needs_barrier):
            cute.arch.barrier()


@cute.jit
def cluster_start(cluster_n: cutlass.Constexpr[int]):
    """Before the first write into a peer's shared memory every CTA of the cluster must have started."""
    if cutlass.const_expr(cluster_n > 1):
        cute.arch.cluster_arrive_relaxed()
        cute.arch.cluster_wait()


def my_tile_count(rows, rows_per_cta: int, bidx, gdim, index64: bool):
    """Row tiles this CTA walks when CTAs stride over `ceil(rows / rows_per_cta)` tiles by the grid
    size (unit-step count: DSL 4.8.1 cannot trace a loop whose dynamic step is 64-bit).
    Returns (count, bidx, gdim) in the index width."""
    tiles = (rows + rows_per_cta - 1) // rows_per_cta
    if index64:
        from cutlass import Int64

        bidx, gdim, tiles = Int64(bidx), Int64(gdim), Int64(tiles)
    return (cutlass.max(tiles - bidx, 0) + gdim - 1) // gdim, bidx, gdim
