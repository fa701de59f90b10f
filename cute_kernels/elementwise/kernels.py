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

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass.experimental import primitives as prims

from collectives import pdl
from collectives.vector_io import extent
from collectives.vector_map import map_grid, map_vectors
from schedules.bulk_chunks import BulkChunks
from schedules.grid_stride import GridStride

OPS = ("copy", "add", "axpby")


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
            grid=[ctas, 1, 1], block=[self.schedule.threads, 1, 1], stream=stream, use_pdl=pdl.LAUNCH
        )

    @cute.kernel
    def kernel(self, x: cute.Tensor, y: cute.Tensor, out: cute.Tensor, a: Float32, b: Float32, passes: Int32):
        ins = (x, y) if cutlass.const_expr(self.op != "copy") else (x,)

        def f(xv, yv=None):
            return (self._apply(xv, yv, a, b),)

        map_vectors(ins, (out,), f, self.vec, self.schedule, self.index64, full_passes=passes)


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
        self.kernel(x, out).launch(grid=[Int32(ctas), 1, 1], block=[self.threads, 1, 1], stream=stream,
                                   use_pdl=pdl.LAUNCH)

    @cute.kernel
    def kernel(self, x: cute.Tensor, out: cute.Tensor):
        pdl.enter()  # (launched as a programmatic dependent: collectives.pdl)
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
