"""FP8 e4m3 block quantizers feeding the FP8 GEMM: activations 1 x 128, weights 128 x 128.

Roofline: read x once (2 bytes per element in bf16), write q (1 byte) and one fp32 scale per 128
(activations) or 16384 (weights) elements: 3 bytes per element, purely memory-bound (a few flops
and one cvt per element). The floor is those bytes / copy bandwidth (H200: 256 MiB of bf16 in and
128 MiB of e4m3 out in ~0.09 ms).

Schedule: a 128-column block-row is held by a group of 8 threads, 16 elements each, as
`collectives.rowwise.RowSlice` vectors (128-bit loads when aligned, vector j of the block-row in
lane j % 8, so each load instruction of a group reads 128 contiguous bytes; the e4m3 stores are
64-bit, 32 bits for fp32 inputs). The block's amax, scale and conversion are
`collectives.quantize`.

* `block_rows = 1` (activations, 1 x 128): a CTA of 256 threads quantizes 32 block-rows per pass,
  `passes` passes per tile (more loads in flight), CTAs walking the (row, K-block) items
  grid-stride in row-major order; the group's amax is a 3-step butterfly. Scales go to
  sa[row, kb] of whatever strided (M, KB) tensor the op hands in (the GEMM's MN-major one).
* `block_rows = 128` (weights, 128 x 128): a CTA per block (grid-stride over blocks): 4 passes of
  32 block-rows, the amax over the whole CTA (`collectives.reduce.group_reduce`, one barrier),
  the values held in registers in x's dtype meanwhile (64 elements per thread), so x is read once.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from collectives.quantize import BLOCK, fmax, held_amax, inverse, scale_of, to_e4m3
from collectives.reduce import group_reduce, group_smem_slots, warp_reduce
from collectives.rowwise import RowSlice, my_tile_count
from collectives.vector_io import extent

GROUP = 8  # threads per 128-column block-row: 16 elements each


class BlockQuantize:
    """x (R, K) bf16/fp16/fp32 -> q (R, K) e4m3 and fp32 scales, one per `block_rows` x 128 block:
    (R, ceil(K/128)) for block_rows 1, (ceil(R/128), ceil(K/128)) for block_rows 128."""

    def __init__(self, dtype, vec: int, index64: bool, block_rows: int, ue8m0: bool, threads: int = 256,
                 passes: int = 2):
        assert block_rows in (1, BLOCK) and threads % 32 == 0
        self.dtype, self.vec, self.index64, self.ue8m0 = dtype, vec, index64, ue8m0
        self.block_rows, self.threads = block_rows, threads
        self.vpt = BLOCK // GROUP // vec
        self.groups = threads // GROUP
        if block_rows == BLOCK:
            assert BLOCK % self.groups == 0, "threads must divide into 8-thread groups that tile 128 rows"
            passes = BLOCK // self.groups
        self.passes = passes

    @cute.jit
    def __call__(self, x: cute.Tensor, q: cute.Tensor, scales: cute.Tensor, max_ctas: Int32, stream):
        rows, k = extent(x, 0), extent(x, 1)
        kbs = (k + BLOCK - 1) // BLOCK
        if cutlass.const_expr(self.block_rows == 1):
            per_tile = self.groups * self.passes
            tiles = (rows * kbs + per_tile - 1) // per_tile
        else:
            tiles = ((rows + BLOCK - 1) // BLOCK) * kbs
        ctas = cutlass.max(cutlass.min(tiles, max_ctas), 1)
        self.kernel(x, q, scales).launch(grid=[ctas, 1, 1], block=[self.threads, 1, 1], stream=stream)

    def _slice(self, lane, k, kb):
        """This thread's RowSlice of the block-row at K-block kb (`n` = the columns it has)."""
        return RowSlice(self.vec, GROUP, self.vpt, lane, 0, cutlass.min(k - kb * BLOCK, BLOCK))

    @staticmethod
    def _block(t: cute.Tensor, row, kb):
        """The 128-column block-row (row, kb) of t as a flat tensor (it may run past K: RowSlice
        never touches vectors past its `n`)."""
        return cute.local_tile(t, (1, BLOCK), (row, kb))[0, None]

    @cute.kernel
    def kernel(self, x: cute.Tensor, q: cute.Tensor, scales: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        rows, k = extent(x, 0), extent(x, 1)
        kbs = (k + BLOCK - 1) // BLOCK
        lane = tidx % GROUP
        group = tidx // GROUP
        if cutlass.const_expr(self.block_rows == 1):
            per_tile = self.groups * self.passes
            count, bidx, gdim = my_tile_count(rows * kbs, per_tile, bidx, gdim, self.index64)
            for i in cutlass.range(count, unroll=1):
                base = (bidx + i * gdim) * per_tile
                held = []
                for p in cutlass.range_constexpr(self.passes):
                    item = base + p * self.groups + group
                    row = item // kbs
                    kb = item - row * kbs
                    ok = row < rows
                    sl = self._slice(lane, k, kb)
                    held.append((sl, row, kb, ok, sl.load(self._block(x, row, kb), ok, 0.0)))
                for p in cutlass.range_constexpr(self.passes):
                    sl, row, kb, ok, vals = held[p]
                    vals = sl.to_f32(vals)
                    s = scale_of(warp_reduce(held_amax(vals), fmax, GROUP), self.ue8m0)
                    sl.store(self._block(q, row, kb), ok, to_e4m3(vals, inverse(s)))
                    if ok and lane == 0:
                        scales[row, kb] = s
        else:
            smem = cutlass.memory.SmemAllocator()
            buf = smem.allocate_tensor(Float32, cute.make_layout(group_smem_slots(self.threads, self.threads)),
                                       byte_alignment=16)
            count, bidx, gdim = my_tile_count(((rows + BLOCK - 1) // BLOCK) * kbs, 1, bidx, gdim, self.index64)
            for i in cutlass.range(count, unroll=1):
                t = bidx + i * gdim
                nb = t // kbs
                kb = t - nb * kbs
                sl = self._slice(lane, k, kb)
                held = []
                for p in cutlass.range_constexpr(self.passes):
                    row = nb * BLOCK + p * self.groups + group
                    ok = row < rows
                    held.append((row, ok, sl.load(self._block(x, row, kb), ok, 0.0)))  # in x's dtype
                m = Float32(0.0)
                for p in cutlass.range_constexpr(self.passes):
                    m = cute.arch.fmax(m, held_amax(sl.to_f32(held[p][2])))
                s = scale_of(group_reduce(m, fmax, self.threads, buf), self.ue8m0)
                inv = inverse(s)
                for p in cutlass.range_constexpr(self.passes):
                    row, ok, vals = held[p]
                    sl.store(self._block(q, row, kb), ok, to_e4m3(sl.to_f32(vals), inv))
                if tidx == 0:
                    scales[nb, kb] = s
                cute.arch.barrier()  # the amax slots are rewritten by the next block
