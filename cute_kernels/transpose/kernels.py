"""Transpose, 2-D and batched (curriculum lessons 8 and 9: coalescing, bank conflicts, TMA).

Roofline: out[b, j, i] = x[b, i, j] reads and writes every byte once: 2 x bytes, no arithmetic; the
floor is bytes / copy bandwidth (H200 ~4.2 TB/s: a 256 MiB bf16 matrix, 0.13 ms).
Schedule: one CTA per T x T tile of one batch entry (T = 128 bytes of elements: 64 bf16/fp16, 32
fp32), a 1-D grid of (M/T) x (N/T) x batch CTAs; the t-th CTA takes the tile `TileOrder.tile(t)`
(`schedules/tile_order.py`): by default groups of 32 tile-rows walked column by column, so the CTAs
resident together write 4 KB of each output row they touch and read several KB of each input row
(the plain row-major order writes ~1-2 KB of every output row: 84-89% of copy on 8192 x 8192
against 96% on a batch of 2048 x 2048). Variants:

- naive: each thread reads a 16-byte chunk of an input row (coalesced) and writes its elements down
  a column of the output (each store of a warp touches 32 different rows: uncoalesced).
- smem: the tile goes global -> shared (16-byte chunks, coalesced), is transposed inside shared
  memory into a second tile (a warp reads one chunk of 32 consecutive rows, writes 32 consecutive
  elements of a row), and goes shared -> global (16-byte chunks, coalesced). The tiles are padded by
  16 bytes per row (`collectives.smem_tiles.padded_tile`; pad 0 shows the 8-way conflict).
- swizzle: the same with the 128-byte CuTe swizzle instead of padding (`swizzled_tile`).
- tma: the swizzled tiles are filled by one TMA load (`cp.async.bulk.tensor`, an mbarrier counts
  the bytes) and drained by one TMA store; out-of-range rows and columns are clipped by the TMA unit.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64
from cutlass.cute.nvgpu import cpasync

from collectives.smem_tiles import allocate_tile, allocate_tiles, chunk_elems, padded_tile, swizzled_tile
from collectives.vector_io import extent
from cute_kernels.transpose import VARIANTS
from schedules.tile_order import TileOrder


def tile_size(dtype) -> int:
    """Tile side in elements: one 128-byte row."""
    return 1024 // dtype.width


class Transpose:
    """out (N, M, B) = x (M, N, B) with modes 0/1 swapped (batch last, unit stride along mode 1).

    Aligned variants (vec > 1) need M and N multiples of 16 bytes of elements and 16-byte aligned
    bases and batch strides; `vec == 1` is the any-shape scalar version (not for `tma`).
    """

    def __init__(self, variant: str, dtype, vec: int, index64: bool, threads: int = 128, pad: int = -1,
                 order: TileOrder = TileOrder(), sub: int = 1, persistent: bool = False):
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        if variant == "tma" and vec == 1:
            raise ValueError("the TMA variant needs 16-byte aligned rows (vec > 1)")
        self.variant, self.dtype, self.vec, self.index64, self.threads = variant, dtype, vec, index64, threads
        self.T = tile_size(dtype)
        self.cv = chunk_elems(dtype)
        self.pad = self.cv if pad < 0 else pad  # elements of padding per row (smem variant)
        self.order = order
        if sub not in (1, 2) or (sub > 1 and variant == "naive"):
            raise ValueError(f"sub must be 1, or 2 for the shared-memory variants, got {sub} ({variant})")
        self.sub = sub  # a CTA takes sub x sub adjacent T x T tiles (one (sub T) x (sub T) block)
        if persistent and variant != "tma":
            raise ValueError(f"persistent is for the TMA variant, got {variant}")
        self.persistent = persistent  # max_ctas CTAs walk the blocks, the next block's load under this one

    def _tile_layout(self):
        if cutlass.const_expr(self.variant == "smem"):
            return padded_tile(self.T, self.T, self.pad)
        return swizzled_tile(self.T, self.T, self.dtype)

    @cute.jit
    def __call__(self, x: cute.Tensor, out: cute.Tensor, max_ctas: Int32, stream):
        T = self.T
        B = T * self.sub
        m, n, b = extent(x, 0), extent(x, 1), extent(x, 2)
        tiles_m, tiles_n = Int32((m + B - 1) // B), Int32((n + B - 1) // B)  # blocks of sub x sub tiles
        blocks = tiles_m * tiles_n * Int32(b)
        grid = [blocks, 1, 1]  # one CTA per block, in `self.order`
        if cutlass.const_expr(self.variant == "tma"):
            layout = self._tile_layout()
            atom_l, tma_x = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), x, layout, (T, T))
            atom_s, tma_o = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), out, layout, (T, T))
            if cutlass.const_expr(self.persistent):
                self.kernel_tma_persistent(atom_l, tma_x, atom_s, tma_o, tiles_m, tiles_n, blocks).launch(
                    grid=[cutlass.min(blocks, max_ctas), 1, 1], block=[self.threads, 1, 1], stream=stream)
            else:
                self.kernel_tma(atom_l, tma_x, atom_s, tma_o, tiles_m, tiles_n).launch(
                    grid=grid, block=[self.threads, 1, 1], stream=stream)
        else:
            self.kernel(x, out, tiles_m, tiles_n).launch(grid=grid, block=[self.threads, 1, 1], stream=stream)

    # --- pieces ---------------------------------------------------------------------------------
    @cute.jit
    def _smem_transpose(self, sA: cute.Tensor, sB: cute.Tensor):
        """sB[c, r] = sA[r, c]. A warp's 32 lanes take 32 consecutive rows r and one 16-byte chunk
        j: each reads sA[r, chunk j] (one 128-bit load) and writes its elements to rows j*cv + k of
        sB at column r (32 consecutive elements of a row per store: conflict-free)."""
        T, cv = self.T, self.cv
        tidx, _, _ = cute.arch.thread_idx()
        for it in cutlass.range_constexpr(T * (T // cv) // self.threads):
            i = tidx + it * self.threads
            r = i % T
            j = i // T
            v = cute.zipped_divide(sA, (1, cv))[(0, None), (r, j)].load()
            for k in cutlass.range_constexpr(cv):
                sB[j * cv + k, r] = v[k]

    @cute.kernel
    def kernel(self, x: cute.Tensor, out: cute.Tensor, tiles_m: Int32, tiles_n: Int32):
        T, vec = self.T, self.vec
        tidx, _, _ = cute.arch.thread_idx()
        t, _, _ = cute.arch.block_idx()
        tm, tn, b = self.order.tile(t, tiles_m, tiles_n)
        m, n = extent(x, 0), extent(x, 1)
        if cutlass.const_expr(self.index64):
            b, tm, tn = Int64(b), Int64(tm), Int64(tn)  # a single dim may pass 2^31
        r0 = tm * T
        c0 = tn * T
        xb = x[None, None, b]
        ob = out[None, None, b]
        per_row = T // vec
        passes = T * per_row // self.threads
        unroll = min(passes, 4)  # 16-byte variants: every pass in flight; scalar ones: 4 at a time

        if cutlass.const_expr(self.variant == "naive"):
            for it in cutlass.range(passes, unroll=unroll):
                i = tidx + it * self.threads
                r = r0 + i // per_row
                c = c0 + (i % per_row) * vec
                if r < m and c < n:
                    v = cute.zipped_divide(xb, (1, vec))[(0, None), (r, c // vec)].load()
                    for k in cutlass.range_constexpr(vec):
                        ob[c + k, r] = v[k]
        else:
            smem = cutlass.memory.SmemAllocator()
            q = self.sub * self.sub
            sAs = [allocate_tile(smem, self.dtype, self._tile_layout()) for _ in range(q)]
            sBs = [allocate_tile(smem, self.dtype, self._tile_layout()) for _ in range(q)]
            # each sub-tile's first row and column in x (its block is (sub T) x (sub T) at (r0, c0) * sub)
            origins = [(r0 * self.sub + (s_ // self.sub) * T, c0 * self.sub + (s_ % self.sub) * T) for s_ in range(q)]
            for s_ in cutlass.range_constexpr(q):  # every sub-tile's loads in flight before the barrier
                rs, cs = origins[s_]
                for it in cutlass.range(passes, unroll=unroll):
                    i = tidx + it * self.threads
                    r = i // per_row
                    c = (i % per_row) * vec
                    if rs + r < m and cs + c < n:
                        v = cute.zipped_divide(xb, (1, vec))[(0, None), (rs + r, (cs + c) // vec)].load()
                        cute.zipped_divide(sAs[s_], (1, vec))[(0, None), (r, c // vec)].store(v)
            cute.arch.barrier()
            for s_ in cutlass.range_constexpr(q):
                self._smem_transpose(sAs[s_], sBs[s_])
            cute.arch.barrier()
            for s_ in cutlass.range_constexpr(q):
                rs, cs = origins[s_]
                for it in cutlass.range(passes, unroll=unroll):
                    i = tidx + it * self.threads
                    r = i // per_row
                    c = (i % per_row) * vec
                    if cs + r < n and rs + c < m:
                        v = cute.zipped_divide(sBs[s_], (1, vec))[(0, None), (r, c // vec)].load()
                        cute.zipped_divide(ob, (1, vec))[(0, None), (cs + r, (rs + c) // vec)].store(v)

    @cute.kernel
    def kernel_tma(self, atom_l: cute.CopyAtom, tma_x: cute.Tensor, atom_s: cute.CopyAtom, tma_o: cute.Tensor,
                   tiles_m: Int32, tiles_n: Int32):
        """Warp 0 drives the TMA unit. The TMA copies must be called by a whole warp (the DSL elects
        the issuing lane with `elect.sync`, which under a one-thread branch deadlocks); the barrier
        set-up is one elected lane's."""
        q = self.sub * self.sub
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        t, _, _ = cute.arch.block_idx()
        block = self.order.tile(t, tiles_m, tiles_n)
        smem = cutlass.memory.SmemAllocator()
        sA = allocate_tiles(smem, self.dtype, self._tile_layout(), q)  # (T, T, sub-tile)
        sB = allocate_tiles(smem, self.dtype, self._tile_layout(), q)
        mbar = smem.allocate_tensor(Int64, cute.make_layout(1), byte_alignment=8).iterator
        if warp == 0:
            with cute.arch.elect_one():
                cute.arch.mbarrier_init(mbar, 1)
        cute.arch.mbarrier_init_fence()
        cute.arch.barrier()
        if warp == 0:
            self._issue_loads(atom_l, tma_x, sA, 0, mbar, block)
        cute.arch.mbarrier_wait(mbar, Int32(0))
        for s_ in cutlass.range_constexpr(q):
            self._smem_transpose(sA[None, None, s_], sB[None, None, s_])
        cute.arch.fence_proxy("async.shared", space="cta")  # our writes to sB, visible to the TMA unit
        cute.arch.barrier()
        if warp == 0:
            self._issue_stores(atom_s, tma_o, sB, 0, block)
            cute.arch.cp_async_bulk_wait_group(0, read=True)  # sB must outlive the store's reads

    @cute.kernel
    def kernel_tma_persistent(self, atom_l: cute.CopyAtom, tma_x: cute.Tensor, atom_s: cute.CopyAtom,
                              tma_o: cute.Tensor, tiles_m: Int32, tiles_n: Int32, blocks: Int32):
        """`kernel_tma` with CTAs that walk the blocks (block t, t + grid, ... in `self.order`) through two
        load stages and two store buffers: block i+1's TMA loads are issued before block i is waited for,
        and block i's TMA stores drain while block i+1 is transposed. Per block: warp 0 issues the next
        load, waits until at most one store group still reads (block i-1's: block i-2's, which read this
        store buffer, is done), everyone waits for this block's bytes, a barrier, the smem transpose, the
        proxy fence, a barrier, warp 0 issues the stores. Stage s = i % 2 (a runtime index into the staged
        tiles: the transpose's swizzled addresses are computed once, not per stage), phase (i // 2) % 2."""
        q = self.sub * self.sub
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        t0, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        smem = cutlass.memory.SmemAllocator()
        sA = allocate_tiles(smem, self.dtype, self._tile_layout(), 2 * q)  # (T, T, stage * q + sub-tile)
        sB = allocate_tiles(smem, self.dtype, self._tile_layout(), 2 * q)
        mbar = smem.allocate_tensor(Int64, cute.make_layout(2), byte_alignment=8).iterator

        if warp == 0:
            with cute.arch.elect_one():
                cute.arch.mbarrier_init(mbar, 1)
                cute.arch.mbarrier_init(mbar + 1, 1)
        cute.arch.mbarrier_init_fence()
        cute.arch.barrier()
        count = (blocks - t0 + grid - 1) // grid  # blocks of this CTA (>= 1: the grid is at most `blocks`)
        if warp == 0:  # block 0's loads into stage 0
            self._issue_loads(atom_l, tma_x, sA, 0, mbar, self.order.tile(t0, tiles_m, tiles_n))
        for i in cutlass.range(count, unroll=1):
            s = i % 2
            if warp == 0:
                if i + 1 < count:  # the next block into the other stage (its readers passed a barrier)
                    self._issue_loads(atom_l, tma_x, sA, (1 - s) * q, mbar + (1 - s),
                                      self.order.tile(t0 + (i + 1) * grid, tiles_m, tiles_n))
                cute.arch.cp_async_bulk_wait_group(1, read=True)  # block i-2's stores have read sB stage s
            cute.arch.mbarrier_wait(mbar + s, (i // 2) % 2)
            cute.arch.barrier()
            for s_ in cutlass.range_constexpr(q):
                self._smem_transpose(sA[None, None, s * q + s_], sB[None, None, s * q + s_])
            cute.arch.fence_proxy("async.shared", space="cta")  # our sB writes, visible to the TMA unit
            cute.arch.barrier()
            if warp == 0:
                self._issue_stores(atom_s, tma_o, sB, s * q, self.order.tile(t0 + i * grid, tiles_m, tiles_n))
        if warp == 0:
            cute.arch.cp_async_bulk_wait_group(0, read=True)  # the smem must outlive the last stores' reads

    def _issue_stores(self, atom_s, tma_o, sB, first, block):
        """Warp 0 (trace-time helper): the sub x sub TMA stores of block `block` = (tm, tn, batch entry) from
        tiles first, first + 1, ... of the staged sB (block tile (i, j) of x goes to tile (j, i) of out),
        committed as one bulk group."""
        sub, T = self.sub, self.T
        tm, tn, b = block
        for s_ in range(sub * sub):
            gO = cute.local_tile(tma_o[None, None, b], (T, T), (tn * sub + s_ % sub, tm * sub + s_ // sub))
            tBsB, tBgO = cpasync.tma_partition(atom_s, 0, cute.make_layout(1),
                                               cute.group_modes(sB[None, None, first + s_], 0, 2),
                                               cute.group_modes(gO, 0, 2))
            cute.copy(atom_s, tBsB, tBgO)
        cute.arch.cp_async_bulk_commit_group()

    def _issue_loads(self, atom_l, tma_x, sA, first, bar, block):
        """Warp 0 (trace-time helper, no control flow of its own): the sub x sub TMA loads of block `block` =
        (tm, tn, batch entry) into tiles first, first + 1, ... of the staged sA, their bytes expected on `bar`."""
        sub, T = self.sub, self.T
        tm, tn, b = block
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive_and_expect_tx(bar, sub * sub * T * T * self.dtype.width // 8)
        for s_ in range(sub * sub):
            gX = cute.local_tile(tma_x[None, None, b], (T, T), (tm * sub + s_ // sub, tn * sub + s_ % sub))
            tAsA, tAgX = cpasync.tma_partition(atom_l, 0, cute.make_layout(1),
                                               cute.group_modes(sA[None, None, first + s_], 0, 2),
                                               cute.group_modes(gX, 0, 2))
            cute.copy(atom_l, tAgX, tAsA, tma_bar_ptr=bar)
