"""Elementwise copy, add and axpby (curriculum lesson 1).

Roofline: no arithmetic to speak of; `copy` moves 2 bytes/elem x dtype size (read + write), `add`
and `axpby` 3. The floor is bytes / copy bandwidth: on an H200 (4.2 TB/s measured d2d) a 256 MiB
bf16 add moves 768 MiB, 0.19 ms.
Schedule: grid-stride (`schedules.grid_stride`) over 128-bit vectors, `unroll` vectors per thread in
flight; the `n % vec` tail is done by scalar accesses of the last CTA. `BulkCopy` is the copy's
TMA variant (`schedules.bulk_chunks`): one CTA per contiguous chunk, one thread issuing
`cp.async.bulk` global -> shared -> global.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass.experimental import primitives as prims

from collectives.vector_io import as_vectors, extent
from schedules.bulk_chunks import BulkChunks
from schedules.grid_stride import GridStride, strided_fold

OPS = ("copy", "add", "axpby")


@dataclass(frozen=True)
class ElementwiseConfig:
    schedule: GridStride = GridStride()
    vec: int = 0  # elements per access; 0 = one 16-byte vector, 1 = scalar (misaligned operands)

    def __str__(self) -> str:
        return f"{self.schedule}v{self.vec}"


class Elementwise:
    """out = f(x, y): `copy` (x), `add` (x + y), `axpby` (a*x + b*y, computed in fp32)."""

    def __init__(self, op: str, dtype, vec: int, index64: bool, schedule: GridStride):
        if op not in OPS:
            raise ValueError(f"op must be one of {OPS}, got {op!r}")
        self.op, self.dtype, self.vec, self.index64 = op, dtype, vec, index64
        self.schedule = schedule

    def _apply(self, xv, yv, a, b):
        if cutlass.const_expr(self.op == "copy"):
            return xv
        xf = xv.to(Float32)
        yf = yv.to(Float32)
        if cutlass.const_expr(self.op == "add"):
            r = xf + yf
        else:
            r = a * xf + b * yf
        return r.to(self.dtype)

    @cute.jit
    def __call__(
        self,
        x: cute.Tensor,
        y: cute.Tensor,
        out: cute.Tensor,
        a: Float32,
        b: Float32,
        max_ctas: Int32,
        stream,
    ):
        ctas, passes = map_grid(extent(out, 0) // self.vec, self.schedule, max_ctas, self.index64)
        self.kernel(x, y, out, a, b, passes).launch(
            grid=[ctas, 1, 1], block=[self.schedule.threads, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(self, x: cute.Tensor, y: cute.Tensor, out: cute.Tensor, a: Float32, b: Float32, passes: Int32):
        ins = (x, y) if cutlass.const_expr(self.op != "copy") else (x,)

        def f(xv, yv=None):
            return (self._apply(xv, yv, a, b),)

        map_vectors(ins, (out,), f, self.vec, self.schedule, self.index64, full_passes=passes)


def map_grid(n_vectors, schedule, max_ctas, index64: bool):
    """(CTAs, the grid's complete passes over the vectors) of a `map_vectors` launch, in the launch's
    host code: one pass until the grid reaches `max_ctas`, past that CTAs loop (`GridStride.grid`).
    The pass count is divided here once instead of by every thread (it is 0, unused, for the 64-bit
    variant, which divides on the device)."""
    ctas = cutlass.max(cutlass.min(cute.ceil_div(n_vectors, schedule.items_per_cta_pass()), max_ctas), 1)
    passes = Int32(0)
    if cutlass.const_expr(not index64):
        _, _, pass_stride = schedule.thread_walk(0, ctas, 0)
        passes = n_vectors // pass_stride
    return ctas, passes


@cute.jit
def map_vectors(ins: tuple, outs: tuple, f: Callable, vec: cutlass.Constexpr[int], schedule: cutlass.Constexpr,
                index64: cutlass.Constexpr[bool], with_index: cutlass.Constexpr[bool] = False, full_passes=None):
    """The body of every elementwise kernel: `outs[k][i] = f(ins[0][i], ins[1][i], ...)[k]` for all i.

    All tensors are flat, of one length (that of `outs[0]`), 16-byte aligned when `vec` > 1. `f`
    takes and returns TensorSSA vectors (`vec` elements; one element for the scalar tail) and returns
    a tuple with one vector per output, already in that output's dtype. The grid walks 128-bit
    vectors under `schedule` (a `GridStride`); the `n % vec` tail is done by the last CTA.
    With `with_index`, f's first argument is the flat index of the vector's first element (for
    operands broadcast along a mode, e.g. the split-K GEMM's bias). `full_passes`: the grid's
    complete passes over the vectors when the launch computed them (`map_grid`; ignored by the
    64-bit variant).
    """
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    gdim, _, _ = cute.arch.grid_dim()
    n = extent(outs[0], 0)
    if cutlass.const_expr(index64):
        assert n.dtype is Int64, "64-bit variant traced with a 32-bit size"
        first, stride, pass_stride = schedule.thread_walk(Int64(bidx), Int64(gdim), Int64(tidx))
    else:
        first, stride, pass_stride = schedule.thread_walk(bidx, gdim, tidx)

    in_v = [as_vectors(t, n, vec) for t in ins]
    out_v = [as_vectors(t, n, vec) for t in outs]

    def load(j):
        return tuple(v[None, j].load() for v in in_v)

    def step(acc, j, vals):
        res = f(j * vec, *vals) if cutlass.const_expr(with_index) else f(*vals)
        for k in cutlass.range_constexpr(len(out_v)):
            out_v[k][None, j].store(res[k])
        return acc

    strided_fold(n // vec, first, stride, pass_stride, schedule.unroll, load, step, Int32(0),
                 full_passes=None if cutlass.const_expr(index64) else full_passes)

    if cutlass.const_expr(vec > 1):
        # Scalar tail: the last n % vec elements, one per thread of the last CTA.
        tail_start = (n // vec) * vec
        if bidx == gdim - 1:
            t = tail_start + tidx
            if t < n:
                one = cute.make_layout(1)
                vals = [cute.make_tensor(x.iterator + t, one).load() for x in ins]
                res = f(t, *vals) if cutlass.const_expr(with_index) else f(*vals)
                for k in cutlass.range_constexpr(len(outs)):
                    cute.make_tensor(outs[k].iterator + t, one).store(res[k])


class BulkCopy:
    """out = x through shared memory by the TMA unit's 1-D bulk copies (`schedules.bulk_chunks`).

    Roofline: as `copy`; the variant is about latency at 1-16 MiB, where the grid-stride copy waits
    out one DRAM round trip per thread (ncu at 1 MiB: 8 % of DRAM throughput, 55 % long-scoreboard
    stalls). CTA b (one warp) owns elements [b * chunk, (b + 1) * chunk) of the 16-byte-aligned part
    `n - n % vec`; its thread 0 arms one mbarrier per piece with the piece's byte count, issues the
    `pieces` loads (`cp.async.bulk.shared::cluster.global...complete_tx::bytes`), then for each piece
    waits on its barrier and issues its store (`cp.async.bulk.global.shared::cta.bulk_group`), and
    waits for the stores to have read shared memory before the CTA exits. The last `n % vec`
    elements are scalar copies by the last CTA's lanes. Operands must be 16-byte aligned (bulk
    copies need 16-byte addresses and sizes): the op takes the grid-stride kernel otherwise.
    The signature is `Elementwise`'s (y, a, b and max_ctas unused), so callers time both alike.
    """

    threads = 32

    def __init__(self, dtype, index64: bool, schedule: BulkChunks):
        self.dtype, self.index64, self.schedule = dtype, index64, schedule
        self.esize = dtype.width // 8
        self.vec = 16 // self.esize
        self.chunk = schedule.chunk_bytes // self.esize  # elements per CTA
        self.piece = self.chunk // schedule.pieces

    @cute.jit
    def __call__(
        self,
        x: cute.Tensor,
        y: cute.Tensor,
        out: cute.Tensor,
        a: Float32,
        b: Float32,
        max_ctas: Int32,
        stream,
    ):
        n = extent(out, 0)
        main = n - n % self.vec
        ctas = cutlass.max((main + (self.chunk - 1)) // self.chunk, 1)
        self.kernel(x, out).launch(grid=[Int32(ctas), 1, 1], block=[self.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, x: cute.Tensor, out: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        n = extent(out, 0)
        main = n - n % self.vec
        pieces = self.schedule.pieces
        smem = cutlass.memory.SmemAllocator()
        buf = smem.allocate_tensor(self.dtype, cute.make_layout(self.chunk), byte_alignment=128).iterator
        mbar = smem.allocate_tensor(Int64, cute.make_layout(pieces), byte_alignment=8).iterator
        start = Int64(bidx) * self.chunk if cutlass.const_expr(self.index64) else bidx * self.chunk
        rem = main - start  # aligned elements from this CTA's chunk on (<= 0: tail-only CTA)
        lead = tidx == 0 and rem > 0
        if lead:
            for k in cutlass.range_constexpr(pieces):
                cute.arch.mbarrier_init(mbar + k, 1)
            cute.arch.mbarrier_init_fence()
            for k in cutlass.range_constexpr(pieces):
                if cutlass.const_expr(k == 0):
                    self._load(x, buf, mbar, start, rem, k)
                elif k * self.piece < rem:
                    self._load(x, buf, mbar, start, rem, k)
        # Scalar tail (n % vec < 16 elements) while the loads are in flight; `tidx < n - main`, not
        # `main + tidx < n`, which wraps past 2^31 - 32 in the 32-bit variant.
        if bidx == gdim - 1:
            if tidx < n - main:
                one = cute.make_layout(1)
                cute.make_tensor(out.iterator + main + tidx, one).store(
                    cute.make_tensor(x.iterator + main + tidx, one).load())
        if lead:
            for k in cutlass.range_constexpr(pieces):
                if cutlass.const_expr(k == 0):
                    self._store(out, buf, mbar, start, rem, k)
                elif k * self.piece < rem:
                    self._store(out, buf, mbar, start, rem, k)
            cute.arch.cp_async_bulk_commit_group()
            cute.arch.cp_async_bulk_wait_group(0, read=True)  # the buffer must outlive the stores' reads

    def _bytes(self, rem, k: int):
        """Bytes of piece k of a chunk whose aligned remainder is `rem` elements (a multiple of vec,
        so of 16 bytes)."""
        return Int32(cutlass.min(rem - k * self.piece, self.piece)) * self.esize

    @cute.jit
    def _load(self, x: cute.Tensor, buf, mbar, start, rem, k: cutlass.Constexpr[int]):
        nbytes = self._bytes(rem, k)
        cute.arch.mbarrier_arrive_and_expect_tx(mbar + k, nbytes)
        prims.cp_async_bulk_shared_cluster_global(buf + k * self.piece, x.iterator + start + k * self.piece,
                                                  mbar + k, nbytes)

    @cute.jit
    def _store(self, out: cute.Tensor, buf, mbar, start, rem, k: cutlass.Constexpr[int]):
        cute.arch.mbarrier_wait(mbar + k, Int32(0))
        prims.cp_async_bulk_global_shared_cta(out.iterator + start + k * self.piece, buf + k * self.piece,
                                              self._bytes(rem, k))
