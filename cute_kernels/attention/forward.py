"""FlashAttention forward on Hopper, FA3-style warp-specialized or FA2-style:
O = softmax(scale * Q K^T [softcap] [mask]) V and the fp32 log-sum-exp per query row.

Roofline: 4 * S_q * S_k * D * H * B FLOPs (two GEMMs; half of that with a causal mask), over
(2 S_q + 2 S_k) * D * H * B * 2 bytes of Q, K, V, O: S / 2 FLOP/byte at S_q = S_k = S (2048 at
S = 4096), tensor-core bound (H200: 989 TFLOP/s dense bf16 by spec; FA3 reports ~600-750 on H100 at
long sequences). The exponentials are the second ceiling: one MUFU ex2 per S element (16/clk/SM,
~2.1 PFLOP/s-equivalent at D = 128), serial with the GEMMs unless one warpgroup's softmax overlaps
the other's WGMMAs, hence the ping-pong.

Schedule: `schedules.attention.AttentionSchedule` (one producer warp: TMA of the Q tile once, then K
and V blocks through two rings of smem stages; two consumer warpgroups of 64 Q rows each: WGMMA
S = Q K^T from smem, mask + online softmax in registers, WGMMA O += P V with P from registers;
named barriers alternate the consumers' GEMMs; with `overlap` each consumer also keeps S_{j+1} = Q K^T
and P_j V in flight together, its softmax running under the second; `double_p` keeps P in two register
buffers so that no wgmma wait sits inside the softmax, `overlap_two_p`). `kind="fa2"` is the same kernel
without warp specialization (trace-time branches): every warpgroup computes 64 Q rows, warp 0 issues
the TMA loads in line between its own GEMMs, no setmaxnreg, no ping-pong. Collectives:
`tma_pipeline` (smem atoms, TMA atoms, the stage rings), `wgmma_mainloop.acc_as_a_operand` (P as the
register A operand),
`attention_mask` (block ranges, elementwise mask, softcap), `online_softmax` (row states),
`epilogue.store_tile` (O via stmatrix + TMA store, staged through the warpgroup's own Q rows).

Tile orders (`schedules.attention`): one CTA a tile on the grid (q_tiles, H_q, B), heads first, or a 1-D grid
in FA3's L2-grouped longest-first order (`l2_groups`, `grouped_coords`). `persistent` (fa3, batched): one CTA per
SM walks the tiles of that order (`PersistentWalk`); the producer warp and the consumers carry their K/V ring
positions as block counts (`ring_state`), the producer loads the next tile's first K/V blocks before its Q, and the
consumers release the Q buffer once O's TMA stores have read it (O is staged through Q).

Tensors, as the kernel sees them: Q and O (S_q, D, H_q, B), K (S_k, D, H_kv, B), V (D, S_k, H_kv, B)
(V^T: the B operand of P V is MN-major), LSE (S_q, H_q, B) fp32. D is static (a signature
parameter), every other size and stride symbolic; the unit-stride mode is D. GQA: query head h reads
K/V head h // (H_q / H_kv). Rows past S_q / S_k are zero-filled by TMA loads and clipped by TMA
stores; key columns past S_k are masked.

Varlen (`varlen=True`, entry `call_varlen`): B sequences packed along the row axis, Q/O
(total_q, D, H_q, 1), K/V likewise, sequence b = rows [cu_seqlens[b], cu_seqlens[b + 1]) (int32,
read on the device by every thread of the CTA, so every warp derives the same tile, the same
block range and the same skip decision). The grid is (ceil(max_seqlen_q / tile_m), H_q, B); a CTA
past its sequence's last q tile skips everything after the barrier init (producer and consumers
alike: one CTA-uniform branch around the warp roles). Loads keep TMA with the packed tensors'
descriptors: the sequence's views are `cute.domain_offset`s of the packed coordinate tensors by
its first row, so a tile's tail rows are the next sequence's (or zero-filled past the end); they
are harmless: keys past seqlen_k are masked (their P is 0), query rows past seqlen_q are computed
and dropped. The O store is the part TMA cannot do with one descriptor: a (64, D) box clips only
at the packed tensor's end, so a partial last tile would overwrite the next sequence's first rows.
O is therefore stored straight from the accumulator registers with st.global (pairs of adjacent
columns, 32 bits), predicated per row on seqlen_q (FA3 makes the same choice for varlen); no smem
staging, no epilogue barrier (Q's smem is not reused). The alternative, a ragged TMA view (an
extra mode whose coordinate is the sequence end, the base pointer shifted back by a large extent,
so the box clips at the end of each sequence), keeps TMA stores but rests on an out-of-allocation
base address; left for a measured need. LSE (total_q, H_q, 1): row q_start + i.
"""

from __future__ import annotations

from types import SimpleNamespace

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.cutlass_dsl import if_generate
from cutlass.tensor_utils import LayoutEnum

from collectives import epilogue as epi
from collectives import pdl
from collectives.attention_mask import MaskKind, apply_mask, apply_softcap, block_needs_mask, mask_split, n_block_range
from collectives.online_softmax import (
    LAZY_RESCALE_LOG2,
    acc_rows_view,
    empty_rows,
    finalize_rows,
    rescale_rows,
    softmax_rows,
    update_rows,
)
from collectives.tma_pipeline import make_pipeline, operand_smem_layout, operand_tma
from collectives.vector_io import extent
from collectives.wgmma_mainloop import acc_a_view, acc_as_a_operand, mma_blocks, stage_of
from schedules.attention import (
    AttentionSchedule,
    PersistentWalk,
    block_coords,
    grouped_coords,
    l2_group_heads,
    linear_coords,
    persistent_ctas,
    tile_coords,
)
from schedules.hardware import num_sms
from schedules.walks import take_tile

# Named barrier ids (0 is __syncthreads).
_EPI_BAR = 1  # the O store of consumer warpgroup w: 1 + w
_TURN_BAR = 4  # ping-pong: consumer warpgroup w may issue its GEMMs: 4 + w (ids 1-3 are the O stores')
_EPI_TILE = (64, 32)
_EPI_STAGES = 2


class FlashAttnFwd:
    def __init__(self, dtype, head_dim: int, schedule: AttentionSchedule, mask: MaskKind = MaskKind(),
                 softcap: bool = False, varlen: bool = False):
        self.dtype, self.d, self.s = dtype, head_dim, schedule
        self.mask, self.softcap, self.varlen = mask, softcap, varlen

    @cute.jit
    def __call__(
        self,
        q: cute.Tensor,
        k: cute.Tensor,
        v: cute.Tensor,
        o: cute.Tensor,
        lse: cute.Tensor,
        counter: cute.Tensor,
        scale_log2: Float32,
        scale_lse: Float32,
        scale_over_cap: Float32,
        cap: Float32,
        window_left: Int32,
        window_right: Int32,
        stream,
    ):
        """Batched: Q/O (S_q, D, H_q, B), K (S_k, D, H_kv, B), V^T (D, S_k, H_kv, B), LSE (S_q, H_q, B); `counter`
        (int32, (1,), 0 before the launch and after it) hands out the tiles of a `dynamic` walk (unread without)."""
        self.launch(q, k, v, o, lse, None, None, None, scale_log2, scale_lse, scale_over_cap, cap, window_left,
                    window_right, stream, counter)

    @cute.jit
    def call_varlen(
        self,
        q: cute.Tensor,
        k: cute.Tensor,
        v: cute.Tensor,
        o: cute.Tensor,
        lse: cute.Tensor,
        cu_seqlens_q: cute.Tensor,
        cu_seqlens_k: cute.Tensor,
        max_seqlen_q: Int32,
        scale_log2: Float32,
        scale_lse: Float32,
        scale_over_cap: Float32,
        cap: Float32,
        window_left: Int32,
        window_right: Int32,
        stream,
    ):
        """Packed sequences: Q/O (total_q, D, H_q, 1), K (total_k, D, H_kv, 1), V^T (D, total_k, H_kv, 1),
        LSE (total_q, H_q, 1); sequence b is rows [cu_seqlens[b], cu_seqlens[b + 1]) (int32, B + 1)."""
        self.launch(q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, scale_log2, scale_lse,
                    scale_over_cap, cap, window_left, window_right, stream, None)

    @cute.jit
    def launch(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, o: cute.Tensor, lse: cute.Tensor, cu_seqlens_q,
               cu_seqlens_k, max_seqlen_q, scale_log2: Float32, scale_lse: Float32, scale_over_cap: Float32,
               cap: Float32, window_left: Int32, window_right: Int32, stream, counter):
        s, d, dt = self.s, self.d, self.dtype
        k_major = LayoutEnum.from_tensor(k).sm90_mma_major_mode()
        v_layout = LayoutEnum.from_tensor(v)
        tiled_mma_qk = sm90_utils.make_trivial_tiled_mma(
            dt, dt, LayoutEnum.from_tensor(q).sm90_mma_major_mode(), k_major, Float32, (1, 1, 1),
            tiler_mn=(64, s.tile_n))
        tiled_mma_pv = sm90_utils.make_trivial_tiled_mma(
            dt, dt, warpgroup.OperandMajorMode.K, v_layout.sm90_mma_major_mode(), Float32, (1, 1, 1),
            tiler_mn=(64, d), a_source=warpgroup.OperandSource.RMEM)
        stages = s.num_stages(d, dt.width // 8)
        # Q: one (64, D) stage per consumer warpgroup; K: (tile_n, D) K-major; V^T: (D, tile_n) MN-major.
        sQ_layout = operand_smem_layout(LayoutEnum.ROW_MAJOR, dt, 64, d, s.consumer_wgs)
        sK_layout = operand_smem_layout(LayoutEnum.ROW_MAJOR, dt, s.tile_n, d, stages)
        sV_layout = operand_smem_layout(v_layout, dt, d, s.tile_n, stages)
        sO_layout = epi.smem_layout(LayoutEnum.ROW_MAJOR, dt, _EPI_TILE, _EPI_STAGES)
        tma_q, tma_gq = operand_tma(q, sQ_layout, 64, d, 1)
        tma_k, tma_gk = operand_tma(k, sK_layout, s.tile_n, d, 1)
        tma_v, tma_gv = operand_tma(v, sV_layout, d, s.tile_n, 1)
        if cutlass.const_expr(self.varlen):
            tma_o, tma_go = None, o  # varlen: O rows stored from registers, predicated on the sequence end
        else:
            tma_o, tma_go = epi.store_tma(o, sO_layout, _EPI_TILE)

        @cute.struct
        class Storage:
            q_bars: cute.struct.MemRange[cutlass.Int64, 2]
            k_bars: cute.struct.MemRange[cutlass.Int64, stages * 2]
            v_bars: cute.struct.MemRange[cutlass.Int64, stages * 2]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sV_layout)], 1024]
            tile_slots: cute.struct.MemRange[Int32, 2]  # `dynamic`: the index of the CTA's j-th tile in slot j % 2

        self.storage = Storage
        if cutlass.const_expr(self.varlen):
            q_tiles = (max_seqlen_q + s.tile_m - 1) // s.tile_m
            batch = cute.size(cu_seqlens_q, mode=[0]) - 1
        else:
            q_tiles = (extent(q, 0) + s.tile_m - 1) // s.tile_m
            batch = cute.size(q, mode=[3])
        if cutlass.const_expr(s.persistent):
            if cutlass.const_expr(self.varlen):
                raise ValueError("persistent is built for batched attention, not varlen")
            # one CTA per SM (the count of the device this is compiled on; any count computes the same tiles),
            # no more than there are tiles
            grid = [persistent_ctas(q_tiles, cute.size(q, mode=[2]), batch, num_sms()), 1, 1]
        elif cutlass.const_expr(s.l2_groups):
            if cutlass.const_expr(self.varlen):
                raise ValueError("l2_groups is built for batched attention, not varlen")
            grid = [cutlass.max(q_tiles, 1) * cute.size(q, mode=[2]) * batch, 1, 1]
        elif cutlass.const_expr(s.heads_first):
            grid = [cute.size(q, mode=[2]), batch, cutlass.max(q_tiles, 1)]
        else:
            grid = [cutlass.max(q_tiles, 1), cute.size(q, mode=[2]), batch]
        self.kernel(tiled_mma_qk, tiled_mma_pv, tma_q, tma_gq, tma_k, tma_gk, tma_v, tma_gv, tma_o, tma_go, lse,
                    counter, cu_seqlens_q, cu_seqlens_k, scale_log2, scale_lse, scale_over_cap, cap, window_left, window_right,
                    sQ_layout, sK_layout, sV_layout, sO_layout).launch(grid=grid, block=[s.threads, 1, 1],
                                                                       stream=stream, use_pdl=pdl.LAUNCH)

    @cute.kernel
    def kernel(
        self,
        tiled_mma_qk: cute.TiledMma,
        tiled_mma_pv: cute.TiledMma,
        tma_q: cute.CopyAtom,
        mQ: cute.Tensor,
        tma_k: cute.CopyAtom,
        mK: cute.Tensor,
        tma_v: cute.CopyAtom,
        mV: cute.Tensor,
        tma_o: cute.CopyAtom | None,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        mCounter: cute.Tensor | None,
        mCuQ: cute.Tensor | None,
        mCuK: cute.Tensor | None,
        scale_log2: Float32,
        scale_lse: Float32,
        scale_over_cap: Float32,
        cap: Float32,
        window_left: Int32,
        window_right: Int32,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        sO_layout: cute.ComposedLayout,
    ):
        s, dt = self.s, self.dtype
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = warp // 4
        if warp == 0:
            cpasync.prefetch_descriptor(tma_q)
            cpasync.prefetch_descriptor(tma_k)
            cpasync.prefetch_descriptor(tma_v)
            if cutlass.const_expr(not self.varlen):
                cpasync.prefetch_descriptor(tma_o)

        smem = cutlass.memory.SmemAllocator()
        st = smem.allocate(self.storage)
        stages = cute.size(sK_layout, mode=[2])
        q_stage = cute.slice_(sQ_layout, (None, None, 0))
        q_bytes = cute.size_in_bytes(dt, q_stage) * s.consumer_wgs
        kv_bytes = cute.size_in_bytes(dt, cute.slice_(sK_layout, (None, None, 0)))
        consumer_warps = 4 * s.consumer_wgs
        pipe_q = make_pipeline(st.q_bars.data_ptr(), 1, q_bytes, (1, 1), consumer_warps)
        pipe_k = make_pipeline(st.k_bars.data_ptr(), stages, kv_bytes, (1, 1), consumer_warps)
        pipe_v = make_pipeline(st.v_bars.data_ptr(), stages, kv_bytes, (1, 1), consumer_warps)
        pipeline.pipeline_init_arrive(cluster_shape_mn=(1, 1), is_relaxed=True)

        sQ = st.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = st.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = st.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)

        pipeline.pipeline_init_wait(cluster_shape_mn=(1, 1))
        pdl.enter()  # the set-up above overlaps the previous kernel's tail (collectives.pdl)
        pipes = SimpleNamespace(q=pipe_q, k=pipe_k, v=pipe_v)
        g = SimpleNamespace(mQ=mQ, mK=mK, mV=mV, mO=mO, mCuQ=mCuQ, mCuK=mCuK, tma_q=tma_q, tma_k=tma_k, tma_v=tma_v,
                            sQ=sQ, sK=sK, sV=sV, left=window_left, right=window_right)
        # the epilogue's operands; each tile adds its O tiles (gO)
        outs = dict(mLSE=mLSE, tma_o=tma_o, sQ_ptr=st.sQ.data_ptr(), q_stage=q_stage, sO_layout=sO_layout,
                    scale_log2=scale_log2, scale_lse=scale_lse, scale_over_cap=scale_over_cap, cap=cap)

        if cutlass.const_expr(s.persistent):
            # ---- one CTA per SM walks the tiles (static stride or `dynamic`); both roles carry their ring positions
            self.persistent_walk(g, pipes, outs, st.tile_slots.get_tensor(cute.make_layout(2)), mCounter, wg, warp,
                                 tidx, tiled_mma_qk, tiled_mma_pv)
        else:
            bx, by, bz = cute.arch.block_idx()
            if cutlass.const_expr(s.l2_groups):
                coords = grouped_coords(Int32(bx), self.grid_q_tiles(mQ), Int32(cute.size(mQ, mode=[2])),
                                        Int32(cute.size(mQ, mode=[3])), self.group(mQ, mK))
            else:
                coords = block_coords(bx, by, bz, s.heads_first)
            valid, loads, tile, gO = self.tile_setup(g, *coords)
            out = SimpleNamespace(gO=gO, **outs)
            # varlen: the grid covers the longest sequence; a CTA past its sequence's last q tile does
            # nothing (a CTA-uniform condition: producer and consumers skip alike). Batched: always true.
            if valid:
                if cutlass.const_expr(s.warp_specialized):
                    if wg == 0:
                        # ---- fa3 producer: one warp loads Q once, then K and V of each block, last block first ----
                        cute.arch.setmaxregister_decrease(s.producer_regs)
                        if warp == 0:
                            self.load_q(pipes, loads, tile.m_block)
                            kv = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, stages)
                            for i in cutlass.range(tile.n_count, unroll=1):
                                self.load_kv(pipes, loads, kv, tile.n_max - 1 - i)
                                kv.advance()
                            # producer_tail advances the state it is given (a full turn of the ring: the
                            # phase flips), so each ring gets its own copy of the state after the last load
                            pipe_k.producer_tail(kv.clone())
                            pipe_v.producer_tail(kv)
                    else:
                        cute.arch.setmaxregister_increase(s.consumer_regs)
                        self.consumer(wg - 1, tidx, warp, tiled_mma_qk, tiled_mma_pv, sQ, sK, sV, pipes, loads, tile,
                                      out)
                else:
                    # ---- fa2: every warpgroup computes its 64 rows; warp 0 also issues the loads in line ----
                    self.consumer(wg, tidx, warp, tiled_mma_qk, tiled_mma_pv, sQ, sK, sV, pipes, loads, tile, out)

    @cute.jit
    def persistent_walk(self, g: SimpleNamespace, pipes: SimpleNamespace, outs: dict, slots: cute.Tensor,
                        mCounter: cute.Tensor, wg: Int32, warp: Int32, tidx: Int32, tiled_mma_qk: cute.TiledMma,
                        tiled_mma_pv: cute.TiledMma):
        """`persistent`: one CTA per SM walks the tiles of linear index t (`linear_coords`), starting at its block
        index x. The static walk steps t by the CTA count X (`PersistentWalk`); `dynamic` takes each next t from
        the counter (`take_tile`). Both roles carry their ring positions: the producer loads a tile's first K/V
        blocks while the consumers finish the previous tile and store its O through the Q buffer, then Q once
        they release it, then the rest.

        `dynamic`: the producer writes each tile's t into slot j % 2 before the arrive on Q's full barrier for the
        CTA's j-th Q (the arrive releases it, the consumers' wait acquires it); slot j % 2 was last read at the
        start of tile j - 2, before the Q release the producer waited for when it loaded Q j - 1. A t >= total,
        sent with a bare arrive, ends the consumers' loop."""
        s, d = self.s, self.d
        stages = s.num_stages(d, self.dtype.width // 8)
        walk, group = self.walk(g.mQ), self.group(g.mQ, g.mK)
        total = walk.q_tiles * walk.heads * walk.batch
        if wg == 0:
            cute.arch.setmaxregister_decrease(s.producer_regs)
            if warp == 0:
                t = walk.first
                j = Int32(0)
                base = Int32(0)  # K/V blocks loaded so far
                while t < total:
                    p_valid, p_loads, p_tile, p_gO = self.tile_setup(
                        g, *linear_coords(t, walk.q_tiles, walk.heads, walk.batch, s.heads_first, group))
                    first = cutlass.min(p_tile.n_count, stages)
                    for i in cutlass.range(first, unroll=1):
                        self.load_kv(pipes, p_loads, self.ring_state(base + i, stages, True), p_tile.n_max - 1 - i)
                    if cutlass.const_expr(s.dynamic):
                        slots[j % 2] = t  # every lane: the same value, before the (one-lane) arrive of load_q
                    self.load_q(pipes, p_loads, p_tile.m_block, j)
                    for i in cutlass.range(first, p_tile.n_count, unroll=1):
                        self.load_kv(pipes, p_loads, self.ring_state(base + i, stages, True), p_tile.n_max - 1 - i)
                    base = base + p_tile.n_count
                    j = j + 1
                    if cutlass.const_expr(s.dynamic):
                        t = take_tile(mCounter, total, walk.stride)
                    else:
                        t = t + walk.stride
                if cutlass.const_expr(s.dynamic):
                    # no tile left: the index past the end, on a bare arrive once the last Q is released
                    slots[j % 2] = t
                    q_state = self.ring_state(j, 1, True)
                    pipes.q.sync_object_empty.wait(q_state.index, q_state.phase)
                    with cute.arch.elect_one():
                        cute.arch.mbarrier_arrive(pipes.q.producer_get_barrier(q_state))
                # the K/V rings' tails (`producer_tail`, whose stage count became a run-time value when the
                # pipelines were passed into this function): every stage released before the warp exits
                kv = self.ring_state(base, stages, True)
                for _ in cutlass.range_constexpr(stages):
                    pipes.k.sync_object_empty.wait(kv.index, kv.phase)
                    pipes.v.sync_object_empty.wait(kv.index, kv.phase)
                    kv.advance()
        else:
            cute.arch.setmaxregister_increase(s.consumer_regs)
            j = Int32(0)
            base = Int32(0)  # K/V blocks consumed so far
            t = walk.first
            if cutlass.const_expr(s.dynamic):
                pipes.q.consumer_wait(self.ring_state(j, 1, False))
                t = slots[j % 2]
            while t < total:
                c_valid, c_loads, c_tile, c_gO = self.tile_setup(
                    g, *linear_coords(t, walk.q_tiles, walk.heads, walk.batch, s.heads_first, group))
                c_tile.kv_base, c_tile.q_index = base, j
                self.consumer(wg - 1, tidx, warp, tiled_mma_qk, tiled_mma_pv, g.sQ, g.sK, g.sV, pipes, c_loads, c_tile,
                              SimpleNamespace(gO=c_gO, **outs))
                base = base + c_tile.n_count
                j = j + 1
                if cutlass.const_expr(s.dynamic):
                    pipes.q.consumer_wait(self.ring_state(j, 1, False))
                    t = slots[j % 2]
                else:
                    t = t + walk.stride

    @cute.jit
    def tile_setup(self, g: SimpleNamespace, mi: Int32, bh: Int32, bb: Int32):
        """The tile at q-tile index `mi` (`block_coords`), query head `bh`, batch `bb`: (whether it exists, its
        loads' partitions, its coordinates and K/V block range, its O tiles). Every thread computes the same
        values from the same reads (cu_seqlens included), so the producer and the consumers agree on the tile's
        existence, its blocks and their order."""
        s, d, kind = self.s, self.d, self.mask
        mQ, mK, mV, mO = g.mQ, g.mK, g.mV, g.mO
        if cutlass.const_expr(self.varlen):
            q_start = g.mCuQ[bb]
            k_start = g.mCuK[bb]
            seqlen_q = g.mCuQ[bb + 1] - q_start
            seqlen_k = g.mCuK[bb + 1] - k_start
            bt = 0  # the tensors' batch mode (one packed batch)
        else:
            seqlen_q = extent(mQ, 0)
            seqlen_k = extent(mK, 0)
            q_start = 0
            bt = bb
        q_tiles = (seqlen_q + s.tile_m - 1) // s.tile_m
        m_block, h, b = tile_coords(mi, bh, bb, q_tiles, kind.right)
        hk = h // (cute.size(mQ, mode=[2]) // cute.size(mK, mode=[2]))
        n_min, n_max = n_block_range(m_block, s.tile_m, s.tile_n, seqlen_q, seqlen_k, g.left, g.right, kind)
        n_count = cutlass.max(n_max - n_min, 0)

        # Global tiles: Q/O (64, D, q sub-tiles of 64 rows), K (tile_n, D, blocks), V^T (D, tile_n, blocks);
        # varlen: the sequence's first row is row 0 of its views (domain offsets of the packed tensors)
        mQ_b, mK_b, mV_b, mO_b = mQ[(None, None, h, bt)], mK[(None, None, hk, bt)], mV[(None, None, hk, bt)], \
            mO[(None, None, h, bt)]
        if cutlass.const_expr(self.varlen):
            mQ_b = cute.domain_offset((q_start, 0), mQ_b)
            mO_b = cute.domain_offset((q_start, 0), mO_b)
            mK_b = cute.domain_offset((k_start, 0), mK_b)
            mV_b = cute.domain_offset((0, k_start), mV_b)
        gQ = cute.local_tile(mQ_b, (64, d), (None, 0))
        gK = cute.local_tile(mK_b, (s.tile_n, d), (None, 0))
        gV = cute.local_tile(mV_b, (d, s.tile_n), (0, None))
        gO = cute.local_tile(mO_b, (64, d), (None, 0))
        tQsQ, tQgQ = cpasync.tma_partition(g.tma_q, 0, cute.make_layout(1), cute.group_modes(g.sQ, 0, 2),
                                           cute.group_modes(gQ, 0, 2))
        tKsK, tKgK = cpasync.tma_partition(g.tma_k, 0, cute.make_layout(1), cute.group_modes(g.sK, 0, 2),
                                           cute.group_modes(gK, 0, 2))
        tVsV, tVgV = cpasync.tma_partition(g.tma_v, 0, cute.make_layout(1), cute.group_modes(g.sV, 0, 2),
                                           cute.group_modes(gV, 0, 2))
        loads = SimpleNamespace(q=g.tma_q, gq=tQgQ, sq=tQsQ, k=g.tma_k, gk=tKgK, sk=tKsK, v=g.tma_v, gv=tVgV, sv=tVsV)
        # kv_base / q_index: the ring positions of the tile's first K/V block and of its Q (0: a one-tile CTA)
        tile = SimpleNamespace(m_block=m_block, h=h, b=bt, n_min=n_min, n_max=n_max, n_count=n_count, seqlen_q=seqlen_q,
                               seqlen_k=seqlen_k, left=g.left, right=g.right, q_start=q_start, kv_base=0, q_index=0)
        return mi < q_tiles, loads, tile, gO

    def walk(self, mQ: cute.Tensor) -> PersistentWalk:
        """This CTA's tiles in a persistent grid (built where it is used: a Python object cannot cross a run-time
        `if`)."""
        bx, _, _ = cute.arch.block_idx()
        gx, _, _ = cute.arch.grid_dim()
        return PersistentWalk(self.grid_q_tiles(mQ), Int32(cute.size(mQ, mode=[2])), Int32(cute.size(mQ, mode=[3])),
                              Int32(bx), Int32(gx))

    def grid_q_tiles(self, mQ: cute.Tensor):
        """Q tiles as the launch grid counts them: at least one (no division by zero at S_q = 0; `tile_setup` then
        finds no tile)."""
        return cutlass.max((extent(mQ, 0) + self.s.tile_m - 1) // self.s.tile_m, 1)

    def group(self, mQ: cute.Tensor, mK: cute.Tensor):
        """Query heads per L2 group (`l2_groups`; None without it): from the keys' length, the head dim and the
        query heads per K/V head."""
        if cutlass.const_expr(not self.s.l2_groups):
            return None
        return l2_group_heads(extent(mK, 0), self.d, Int32(cute.size(mQ, mode=[2]) // cute.size(mK, mode=[2])),
                              self.dtype.width // 8)

    def ring_state(self, count, stages: int, producer: bool):
        """The pipeline state after `count` uses of a ring of `stages` (0, a Python int: a fresh state)."""
        user = pipeline.PipelineUserType.Producer if producer else pipeline.PipelineUserType.Consumer
        if isinstance(count, int) and count == 0:
            return pipeline.make_pipeline_state(user, stages)
        phase = (count // stages) % 2
        return pipeline.PipelineState(stages, count, count % stages, 1 - phase if producer else phase)

    # --- the loads (fa3: the producer warp; fa2: warp 0 between its own GEMMs) --------------------
    @cute.jit
    def load_q(self, pipes: SimpleNamespace, loads: SimpleNamespace, m_block: Int32, index=0):
        """Q of q tile `m_block` into the Q buffer, the CTA's `index`-th Q (persistent: the buffer is acquired once
        the consumers have released the previous one)."""
        s = self.s
        q_state = self.ring_state(index, 1, True)
        pipes.q.producer_acquire(q_state)
        q_bar = pipes.q.producer_get_barrier(q_state)
        for w in cutlass.range_constexpr(s.consumer_wgs):
            cute.copy(loads.q, loads.gq[(None, m_block * s.consumer_wgs + w)], loads.sq[(None, w)], tma_bar_ptr=q_bar)
        pipes.q.producer_commit(q_state)

    @cute.jit
    def load_kv(self, pipes: SimpleNamespace, loads: SimpleNamespace, kv: pipeline.PipelineState, n: Int32):
        """K and V^T of block n into stage kv.index, each on its ring's full barrier."""
        pipes.k.producer_acquire(kv)
        cute.copy(loads.k, loads.gk[(None, n)], loads.sk[(None, kv.index)], tma_bar_ptr=pipes.k.producer_get_barrier(kv))
        pipes.k.producer_commit(kv)
        pipes.v.producer_acquire(kv)
        cute.copy(loads.v, loads.gv[(None, n)], loads.sv[(None, kv.index)], tma_bar_ptr=pipes.v.producer_get_barrier(kv))
        pipes.v.producer_commit(kv)

    @cute.jit
    def load_kv_inline(self, pipes: SimpleNamespace, loads: SimpleNamespace, tile: SimpleNamespace, j: Int32):
        """fa2: warp 0 loads the j-th block of the walk (block n_max - 1 - j) when there is one. Its
        producer state is computed from j (no state carried through the consumers' branches)."""
        stages = self.s.num_stages(self.d, self.dtype.width // 8)
        if j < tile.n_count:
            kv = pipeline.PipelineState(stages, j, j % stages, 1 - (j // stages) % 2)
            self.load_kv(pipes, loads, kv, tile.n_max - 1 - j)

    # --- the GEMMs of one K/V block (issued, committed, not waited for) -------------------------
    @cute.jit
    def qk_gemm(self, tiled_mma: cute.TiledMma, acc_s: cute.Tensor, tSrQ: cute.Tensor, tSrK: cute.Tensor, stage: Int32):
        """S = Q K^T: D / 16 WGMMAs, both operands in smem."""
        warpgroup.fence()
        if cutlass.const_expr(cute.size(tSrQ, mode=[2]) in (4, 6, 8, 16)):  # D <= 128 and 256 (see `mma_blocks`)
            mma_blocks(tiled_mma, acc_s, tSrQ, stage_of(tSrK, stage), zero_first=True)
        else:
            mma_blocks(tiled_mma, acc_s, tSrQ, tSrK, zero_first=True, b_stage=stage)
        warpgroup.commit_group()

    @cute.jit
    def pv_gemm(self, tiled_mma: cute.TiledMma, acc_o: cute.Tensor, p: cute.Tensor, tOrV: cute.Tensor, stage: Int32):
        """O += P V: tile_n / 16 WGMMAs, P from registers."""
        warpgroup.fence()
        mma_blocks(tiled_mma, acc_o, p, stage_of(tOrV, stage))
        warpgroup.commit_group()

    @cute.jit
    def scores(self, acc_s: cute.Tensor, tScS: cute.Tensor, n: Int32, row0: Int32, tile: SimpleNamespace,
               out: SimpleNamespace, masked: cutlass.Constexpr = None):
        """Softcap, then the mask: `masked` None: only on blocks that cross the band's edges or the key
        end (`block_needs_mask`, a branch per block); True: always (a run of such blocks, `split_mask`);
        False: never (the interior run). Masking a block that needs none changes no value."""
        s, kind = self.s, self.mask
        if cutlass.const_expr(self.softcap):
            apply_softcap(acc_s, out.scale_over_cap, out.cap)
        if cutlass.const_expr(masked is None):
            if block_needs_mask(n, tile.m_block, s.tile_m, s.tile_n, tile.seqlen_q, tile.seqlen_k, tile.left,
                                tile.right, kind):
                apply_mask(acc_s, tScS, row0, n * s.tile_n, tile.seqlen_k, tile.seqlen_k - tile.seqlen_q, tile.left,
                           tile.right, kind)
        elif cutlass.const_expr(masked):
            apply_mask(acc_s, tScS, row0, n * s.tile_n, tile.seqlen_k, tile.seqlen_k - tile.seqlen_q, tile.left,
                       tile.right, kind)

    @cute.jit
    def q_fragment(self, sQ: cute.Tensor, cwg: Int32) -> cute.Tensor:
        """Q's WGMMA descriptors for consumer warpgroup `cwg` (its 64 rows of the (64, D, warpgroups) smem Q).

        Partitioned FA4's way: Q seen as one (64 x warpgroups, D) operand of a tiled MMA with one atom per consumer
        warpgroup, sliced at the warpgroup's first thread (a warp-uniform index). Indexing the stage of a one-warpgroup
        partition by `cwg` instead computes the same addresses, but ptxas then rebuilt Q's descriptor in every K/V step
        and stepped its 8 K-slices with 32-bit add-with-carry pairs (d128 steady step: 467 instructions, this form
        448, FA4's 455; `python -m perf.loop_mix`)."""
        s, dt = self.s, self.dtype
        per_wg = sm90_utils.make_trivial_tiled_mma(dt, dt, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K,
                                                   Float32, (s.consumer_wgs, 1, 1), tiler_mn=(64, s.tile_n))
        q_rows = cute.make_tensor(sQ.iterator, cute.group_modes(cute.select(sQ.layout, mode=[0, 2, 1]), 0, 2))
        return per_wg.make_fragment_A(per_wg.get_slice(cwg * 128).partition_A(q_rows))

    # --- a computing warpgroup: 64 Q rows ------------------------------------------------------
    @cute.jit
    def consumer(self, cwg: Int32, tidx: Int32, warp: Int32, tiled_mma_qk: cute.TiledMma, tiled_mma_pv: cute.TiledMma,
                 sQ: cute.Tensor, sK: cute.Tensor, sV: cute.Tensor, pipes: SimpleNamespace, loads: SimpleNamespace,
                 tile: SimpleNamespace, out: SimpleNamespace):
        s, d, dt = self.s, self.d, self.dtype
        stages = s.num_stages(d, dt.width // 8)
        tid = tidx % 128
        thr_qk = tiled_mma_qk.get_slice(tid)
        thr_pv = tiled_mma_pv.get_slice(tid)
        tSrQ = self.q_fragment(sQ, cwg)
        tSrK = tiled_mma_qk.make_fragment_B(thr_qk.partition_B(sK))
        tOrV = tiled_mma_pv.make_fragment_B(thr_pv.partition_B(sV))
        acc_s = cute.make_rmem_tensor(thr_qk.partition_shape_C((64, s.tile_n)), Float32)
        acc_o = cute.make_rmem_tensor(thr_pv.partition_shape_C((64, d)), Float32)
        tScS = thr_qk.partition_C(cute.make_identity_tensor((64, s.tile_n)))
        tOcO = thr_pv.partition_C(cute.make_identity_tensor((64, d)))
        s_rows = acc_rows_view(acc_s)
        o_rows = acc_rows_view(acc_o)
        rows = cute.size(o_rows, mode=[0])
        row_max, row_sum = empty_rows(rows)
        acc_o.fill(0.0)
        tiled_mma_pv.set(warpgroup.Field.ACCUMULATE, True)
        row0 = tile.m_block * s.tile_m + cwg * 64
        n_count, n_max = tile.n_count, tile.n_max
        my_turn = pipeline.NamedBarrier(barrier_id=_TURN_BAR + cwg, num_threads=256)
        # the next warpgroup's turn: the other one of two, round robin over three (FA3's scheduler barriers)
        their_turn = pipeline.NamedBarrier(barrier_id=_TURN_BAR + (cwg + 1) % s.consumer_wgs, num_threads=256)

        if cutlass.const_expr(not s.warp_specialized):
            # fa2: warp 0 loads Q and the first stages - 1 blocks before anyone computes
            if warp == 0:
                self.load_q(pipes, loads, tile.m_block)
                for j in cutlass.range_constexpr(s.prefetch):
                    self.load_kv_inline(pipes, loads, tile, Int32(j))
        q_state = self.ring_state(tile.q_index, 1, False)
        pipes.q.consumer_wait(q_state)
        if cutlass.const_expr(s.pingpong):
            if cwg == 0:
                my_turn.arrive()  # warpgroup 1 goes first
            my_turn.arrive_and_wait()
        if cutlass.const_expr(not s.overlap):
            lazy = LAZY_RESCALE_LOG2 if s.lazy_rescale else 0.0  # the online softmax's lazy_threshold
            kv = self.ring_state(tile.kv_base, stages, False)
            for i in cutlass.range(n_count, unroll=1):
                n = n_max - 1 - i
                if cutlass.const_expr(not s.warp_specialized and s.prefetch == 0):
                    if warp == 0:  # fa2 with one stage: load this block, then everyone waits for it
                        self.load_kv_inline(pipes, loads, tile, i)
                # S = Q K^T
                pipes.k.consumer_wait(kv)
                self.qk_gemm(tiled_mma_qk, acc_s, tSrQ, tSrK, kv.index)
                if cutlass.const_expr(s.pingpong):
                    their_turn.arrive()
                if cutlass.const_expr(not s.warp_specialized and s.prefetch > 0):
                    if warp == 0:  # fa2: the load of a later block, under this block's S GEMM
                        self.load_kv_inline(pipes, loads, tile, i + s.prefetch)
                warpgroup.wait_group(0)
                pipes.k.consumer_release(kv)
                # softcap, mask, online softmax (rescales O), P in registers
                self.scores(acc_s, tScS, n, row0, tile, out)
                update_rows(s_rows, o_rows, row_max, row_sum, out.scale_log2, lazy_threshold=lazy,
                            sum_from_corr=s.sum_from_corr)
                p = acc_as_a_operand(acc_s, dt, pinned=s.pinned_p)
                # O += P V
                pipes.v.consumer_wait(kv)
                if cutlass.const_expr(s.pingpong):
                    my_turn.arrive_and_wait()
                self.pv_gemm(tiled_mma_pv, acc_o, p, tOrV, kv.index)
                warpgroup.wait_group(0)
                pipes.v.consumer_release(kv)
                kv.advance()
        elif cutlass.const_expr(s.double_p):
            # the overlap with P in two register buffers: no wait for P_j V_j inside block j+1's softmax
            mm = SimpleNamespace(qk=tiled_mma_qk, pv=tiled_mma_pv, tSrQ=tSrQ, tSrK=tSrK, tOrV=tOrV, acc_s=acc_s,
                                 acc_o=acc_o, tScS=tScS, s_rows=s_rows, o_rows=o_rows, row_max=row_max,
                                 row_sum=row_sum, row0=row0, my_turn=my_turn, their_turn=their_turn)
            self.overlap_two_p(mm, pipes, tile, out)
        else:
            # FA3's intra-warpgroup overlap: S_{j+1} and P_j V_j are in flight together; the softmax of
            # S_{j+1} runs under P_j V_j, and O is rescaled once that GEMM is done.
            p = cute.make_rmem_tensor(acc_a_view(acc_s).shape, dt)
            corr = cute.make_rmem_tensor((rows,), Float32)
            if n_count > 0:
                kv = self.ring_state(tile.kv_base, stages, False)
                pipes.k.consumer_wait(kv)
                self.qk_gemm(tiled_mma_qk, acc_s, tSrQ, tSrK, kv.index)
                if cutlass.const_expr(s.pingpong):
                    their_turn.arrive()
                warpgroup.wait_group(0)
                pipes.k.consumer_release(kv)
                self.scores(acc_s, tScS, n_max - 1, row0, tile, out)
                softmax_rows(s_rows, row_max, row_sum, corr, out.scale_log2,
                             sum_from_corr=s.sum_from_corr)  # O is still 0: no rescale
                acc_as_a_operand(acc_s, dt, p, pinned=s.pinned_p)
                kv_v = kv.clone()
                kv.advance()
                mm = SimpleNamespace(qk=tiled_mma_qk, pv=tiled_mma_pv, tSrQ=tSrQ, tSrK=tSrK, tOrV=tOrV, acc_s=acc_s,
                                     acc_o=acc_o, tScS=tScS, s_rows=s_rows, o_rows=o_rows, row_max=row_max,
                                     row_sum=row_sum, row0=row0, my_turn=my_turn, their_turn=their_turn, p=p,
                                     corr=corr)
                if cutlass.const_expr(s.split_mask):
                    # the walk's runs (`mask_split`): walk index i is block n_max - 1 - i; the blocks
                    # at the key end / right edge come first, then the interior, then the left edge
                    n_lo, n_hi = mask_split(tile.n_min, n_max, tile.m_block, s.tile_m, s.tile_n, tile.seqlen_q,
                                            tile.seqlen_k, tile.left, tile.right, self.mask)
                    # (a left edge at D > 128: the interior and the left run share one loop with the
                    # per-block branch; with three loops there ptxas serialized every WGMMA)
                    left_run = self.mask.left and d <= 128
                    i_mid = cutlass.max(n_max - n_hi, 1)
                    i_left = cutlass.max(n_max - n_lo, 1) if cutlass.const_expr(left_run) else n_count
                    for i in cutlass.range(1, i_mid, unroll=1):
                        self.overlap_block(n_max - 1 - i, kv, kv_v, True, mm, pipes, tile, out)
                        kv_v.advance()
                        kv.advance()
                    for i in cutlass.range(i_mid, i_left, unroll=1):
                        self.overlap_block(n_max - 1 - i, kv, kv_v, None if self.mask.left and not left_run else False,
                                           mm, pipes, tile, out)
                        kv_v.advance()
                        kv.advance()
                    if cutlass.const_expr(left_run):
                        for i in cutlass.range(i_left, n_count, unroll=1):
                            self.overlap_block(n_max - 1 - i, kv, kv_v, True, mm, pipes, tile, out)
                            kv_v.advance()
                            kv.advance()
                else:
                    for i in cutlass.range(1, n_count, unroll=1):
                        self.overlap_block(n_max - 1 - i, kv, kv_v, None, mm, pipes, tile, out)
                        kv_v.advance()
                        kv.advance()
                if cutlass.const_expr(s.late_v_release):
                    if n_count > 1:  # the last step's V, held back by `overlap_block`
                        prev = kv_v.clone()
                        prev.reverse()
                        pipes.v.consumer_release(prev)
                pipes.v.consumer_wait(kv_v)
                if cutlass.const_expr(s.pingpong):
                    my_turn.arrive_and_wait()
                self.pv_gemm(tiled_mma_pv, acc_o, p, tOrV, kv_v.index)
                warpgroup.wait_group(0)
                pipes.v.consumer_release(kv_v)
        if cutlass.const_expr(s.pingpong):
            # a warpgroup's last turn (its last P V) passes no turn on: every one but the last in the
            # order hands the next one its last turn here
            if cwg < s.consumer_wgs - 1:
                their_turn.arrive()

        # ---- epilogue: O /= l, LSE, O through this warpgroup's own Q rows (its S GEMMs are done) ----
        lse = cute.make_rmem_tensor((rows,), Float32)
        finalize_rows(o_rows, row_max, row_sum, lse, out.scale_lse)
        c_rows = acc_rows_view(tOcO)
        if c_rows[0, 0][1] == 0:
            for r in cutlass.range_constexpr(rows):
                row = row0 + c_rows[r, 0][0]
                if row < tile.seqlen_q:
                    out.mLSE[tile.q_start + row, tile.h, tile.b] = lse[r]
        if cutlass.const_expr(self.varlen):
            self.store_o_rows(tiled_mma_pv, acc_o, tOcO, tid, row0, tile,
                              out.gO[(None, None, tile.m_block * s.consumer_wgs + cwg)])
        else:
            self.store_o_tma(tiled_mma_pv, acc_o, tid, warp, cwg, tile, out)
        if cutlass.const_expr(s.persistent):
            pipes.q.consumer_release(q_state)  # O's stores have read the Q buffer (`store_o_tma`): the next Q may come

    @cute.jit
    def overlap_block(self, n: Int32, kv: pipeline.PipelineState, kv_v: pipeline.PipelineState,
                      masked: cutlass.Constexpr, mm: SimpleNamespace, pipes: SimpleNamespace, tile: SimpleNamespace,
                      out: SimpleNamespace):
        """One step of the one-buffer overlap: S_{j+1} = Q K_n^T (stage kv) and P_j V_j (stage kv_v)
        issued, the softmax of S_{j+1} (mask per `scores`' `masked`), then the wait for P_j V_j, the O
        rescale and P_{j+1} into P_j's registers. The caller advances both states."""
        s = self.s
        # qk_gemm sets the atom's ACCUMULATE field (a new IR value): on a copy, so that nothing created
        # inside one loop is used in the next (`split_mask` runs this in three loops)
        qk = cutlass.new_from_mlir_values(mm.qk, cutlass.extract_mlir_values(mm.qk))
        pipes.k.consumer_wait(kv)
        if cutlass.const_expr(s.pingpong):
            mm.my_turn.arrive_and_wait()
        self.qk_gemm(qk, mm.acc_s, mm.tSrQ, mm.tSrK, kv.index)
        pipes.v.consumer_wait(kv_v)
        self.pv_gemm(mm.pv, mm.acc_o, mm.p, mm.tOrV, kv_v.index)
        if cutlass.const_expr(s.pingpong):
            mm.their_turn.arrive()
        warpgroup.wait_group(1)  # S_{j+1} done, P_j V_j may still run
        pipes.k.consumer_release(kv)
        if cutlass.const_expr(s.late_v_release):
            # V_{j-1}'s stage (P_{j-1} V_{j-1} was waited for one step ago), not V_j's after this step's wait below:
            # an arrive there is a memory operation that ptxas schedules early, and the P V wait before it with it, to
            # the top of the softmax (PC sampling: 4.5 % of the samples on that wait, FA4's 0.1 %)
            prev = kv_v.clone()
            prev.reverse()
            # (not in the walk's first step: block 0 had no P V before it)
            if_generate(kv_v.count > tile.kv_base, lambda: pipes.v.consumer_release(prev))
        self.scores(mm.acc_s, mm.tScS, n, mm.row0, tile, out, masked)
        softmax_rows(mm.s_rows, mm.row_max, mm.row_sum, mm.corr, out.scale_log2, sum_from_corr=s.sum_from_corr,
                     exact_one=s.skip_rescale)
        warpgroup.wait_group(0)
        if cutlass.const_expr(not s.late_v_release):
            pipes.v.consumer_release(kv_v)
        rescale_rows(mm.o_rows, mm.corr, skip_ones=s.skip_rescale)
        acc_as_a_operand(mm.acc_s, self.dtype, mm.p, pinned=s.pinned_p)

    # --- the overlap with two P buffers (`AttentionSchedule.double_p`) ----------------------------
    def consumer_state(self, i, base=0):
        """The consumer state of the i-th block of the walk (both rings advance once per block), `base` blocks
        consumed before the walk (the tile's `kv_base`)."""
        stages = self.s.num_stages(self.d, self.dtype.width // 8)
        if not (isinstance(base, int) and base == 0):
            i = i + base
        return pipeline.PipelineState(stages, i, i % stages, (i // stages) % 2)

    @cute.jit
    def overlap_two_p(self, mm: SimpleNamespace, pipes: SimpleNamespace, tile: SimpleNamespace,
                      out: SimpleNamespace):
        """FA3's intra-warpgroup overlap with P_{i-1} and P_i in different registers. Step i waits for
        K_i, then for P_{i-2} V_{i-2} (issued one softmax earlier: normally done), rescales O by
        corr_{i-1}, takes its turn, issues S_i = Q K_i^T and P_{i-1} V_{i-1}, waits for S_i only and runs
        its softmax into the other P buffer while P_{i-1} V_{i-1} is on the tensor cores: no wgmma wait
        inside the softmax. (With one buffer P_i may not overwrite P_{i-1} before P_{i-1} V_{i-1} is
        done; ptxas hoists that `wait_group(0)` to the top of the softmax, so the default overlap runs
        its exponentials after P_j V_j, not under it; docs/kernels/attention.md.) Same operations on the
        same values as the one-buffer overlap: O after P_{i-2} V_{i-2}, times corr_{i-1}, plus
        P_{i-1} V_{i-1}; the softmax is the same code. Registers cannot be indexed at run time, so the
        walk runs in pairs of steps with fixed roles (pa -> pb, pb -> pa); with an odd step count block
        0's P goes to pb and the first pass skips its first half. 32 more registers at tile_n 128."""
        s, dt = self.s, self.dtype
        n_count, n_max = tile.n_count, tile.n_max
        pa = cute.make_rmem_tensor(acc_a_view(mm.acc_s).shape, dt)
        pb = cute.make_rmem_tensor(acc_a_view(mm.acc_s).shape, dt)
        corr = cute.make_rmem_tensor((cute.size(mm.o_rows, mode=[0]),), Float32)
        if n_count > 0:
            kv = self.consumer_state(Int32(0), tile.kv_base)
            pipes.k.consumer_wait(kv)
            self.qk_gemm(mm.qk, mm.acc_s, mm.tSrQ, mm.tSrK, kv.index)
            if cutlass.const_expr(s.pingpong):
                mm.their_turn.arrive()
            warpgroup.wait_group(0)
            pipes.k.consumer_release(kv)
            self.scores(mm.acc_s, mm.tScS, n_max - 1, mm.row0, tile, out)
            softmax_rows(mm.s_rows, mm.row_max, mm.row_sum, corr, out.scale_log2, sum_from_corr=s.sum_from_corr,
                         exact_one=s.skip_rescale)
            corr.fill(1.0)  # O is 0 until P_0 V_0: step 1 rescales it by exactly 1
            odd = (n_count - 1) % 2
            if odd == 1:
                acc_as_a_operand(mm.acc_s, dt, pb)
            else:
                acc_as_a_operand(mm.acc_s, dt, pa)
            for j in cutlass.range(n_count // 2, unroll=1):
                i0 = 2 * j + 1 - odd
                if i0 >= 1:  # false once: the first pass of an odd step count
                    self.overlap_step(i0, pa, pb, corr, mm, pipes, tile, out)
                self.overlap_step(i0 + 1, pb, pa, corr, mm, pipes, tile, out)
            # the last block's P V (its P in pa), after P_{n-2} V_{n-2} and the last rescale
            warpgroup.wait_group(0)
            if_generate(n_count >= 2, lambda: pipes.v.consumer_release(self.consumer_state(n_count - 2, tile.kv_base)))
            rescale_rows(mm.o_rows, corr, skip_ones=s.skip_rescale)
            kv_v = self.consumer_state(n_count - 1, tile.kv_base)
            pipes.v.consumer_wait(kv_v)
            if cutlass.const_expr(s.pingpong):
                mm.my_turn.arrive_and_wait()
            self.pv_gemm(mm.pv, mm.acc_o, pa, mm.tOrV, kv_v.index)
            warpgroup.wait_group(0)
            pipes.v.consumer_release(kv_v)

    @cute.jit
    def overlap_step(self, i: Int32, src: cute.Tensor, dst: cute.Tensor, corr: cute.Tensor, mm: SimpleNamespace,
                     pipes: SimpleNamespace, tile: SimpleNamespace, out: SimpleNamespace):
        """Step i >= 1 of `overlap_two_p`: P_{i-1} (in `src`) V_{i-1} issued, S_i's softmax into `dst`."""
        s = self.s
        # qk_gemm sets the atom's ACCUMULATE field (a new IR value): on a copy, so that nothing created
        # inside the caller's `if` is used after it
        qk = cutlass.new_from_mlir_values(mm.qk, cutlass.extract_mlir_values(mm.qk))
        kv = self.consumer_state(i, tile.kv_base)
        kv_v = self.consumer_state(i - 1, tile.kv_base)
        # K's wait first: its try-wait loop ends the basic block, so ptxas cannot hoist the wgmma wait
        # below into the previous step's softmax (it does within one block: see overlap's docs)
        pipes.k.consumer_wait(kv)
        # P_{i-2} V_{i-2}, issued one softmax ago, done (nothing is pending at i = 1). wait_group(0),
        # not 1 after S_i's issue: ptxas serializes every wgmma (C7514) when O is read after a
        # wait_group(1) that retires a group issued in the previous iteration
        warpgroup.wait_group(0)
        # (if_generate, not a traced `if`: the traced one rebinds the pipeline's values inside the
        # region and the IR no longer verifies)
        if_generate(i >= 2, lambda: pipes.v.consumer_release(self.consumer_state(i - 2, tile.kv_base)))
        rescale_rows(mm.o_rows, corr, skip_ones=s.skip_rescale)  # O *= corr_{i-1}
        if cutlass.const_expr(s.pingpong):
            mm.my_turn.arrive_and_wait()
        self.qk_gemm(qk, mm.acc_s, mm.tSrQ, mm.tSrK, kv.index)
        pipes.v.consumer_wait(kv_v)
        self.pv_gemm(mm.pv, mm.acc_o, src, mm.tOrV, kv_v.index)
        if cutlass.const_expr(s.pingpong):
            mm.their_turn.arrive()
        warpgroup.wait_group(1)  # S_i done; P_{i-1} V_{i-1} may still run
        pipes.k.consumer_release(kv)
        self.scores(mm.acc_s, mm.tScS, tile.n_max - 1 - i, mm.row0, tile, out)
        softmax_rows(mm.s_rows, mm.row_max, mm.row_sum, corr, out.scale_log2, sum_from_corr=s.sum_from_corr,
                     exact_one=s.skip_rescale)
        acc_as_a_operand(mm.acc_s, self.dtype, dst)

    @cute.jit
    def store_o_rows(self, tiled_mma: cute.TiledMma, acc_o: cute.Tensor, tOcO: cute.Tensor, tid: Int32, row0: Int32,
                     tile: SimpleNamespace, gO: cute.Tensor):
        """varlen: O straight from the accumulator registers to global memory, two adjacent columns (32
        bits) per store, only rows inside the sequence. A TMA store of the (64, D) box would clip only at
        the packed tensor's end and overwrite the next sequence's first rows."""
        r_o = cute.make_rmem_tensor(acc_o.shape, self.dtype)
        r_o.store(acc_o.load().to(self.dtype))
        o_rows = acc_rows_view(r_o)
        g_rows = acc_rows_view(tiled_mma.get_slice(tid).partition_C(gO))
        c_rows = acc_rows_view(tOcO)
        for r in cutlass.range_constexpr(cute.size(o_rows, mode=[0])):
            if row0 + c_rows[r, 0][0] < tile.seqlen_q:
                for c in cutlass.range_constexpr(cute.size(o_rows, mode=[1])):
                    g_rows[r, c] = o_rows[r, c]

    @cute.jit
    def store_o_tma(self, tiled_mma_pv: cute.TiledMma, acc_o: cute.Tensor, tid: Int32, warp: Int32, cwg: Int32,
                    tile: SimpleNamespace, out: SimpleNamespace):
        """O through this warpgroup's own Q rows (its S GEMMs are done) and TMA stores of (64, 32) boxes."""
        s, dt = self.s, self.dtype
        sO_layout = out.sO_layout
        per_wg = cute.append(sO_layout.outer, cute.make_layout(s.consumer_wgs, stride=cute.cosize(out.q_stage)))
        sO = cute.make_tensor(cute.recast_ptr(out.sQ_ptr, sO_layout.inner, dt), per_wg)[(None, None, None, cwg)]
        store_pipe = pipeline.PipelineTmaStore.create(
            num_stages=_EPI_STAGES, producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 128))
        epi_bar = pipeline.NamedBarrier(barrier_id=_EPI_BAR + cwg, num_threads=128)
        # O overwrites this warpgroup's Q stage: each warp's tensor core reads its own 16 Q rows, so
        # every warp's last S = Q K^T must be done before any warp writes (implied by the collective
        # last P V GEMM; explicit here, once per tile)
        epi_bar.arrive_and_wait()
        epi.store_tile(tiled_mma_pv, acc_o, tid, sO, 0, _EPI_STAGES, Int32(0), out.tma_o,
                       out.gO[(None, None, tile.m_block * s.consumer_wgs + cwg)], _EPI_TILE, dt, LayoutEnum.ROW_MAJOR,
                       epi_bar, warp % 4 == 0, store_pipe)
        store_pipe.producer_tail()
        if cutlass.const_expr(s.persistent):
            epi_bar.arrive_and_wait()  # the storing thread's bulk stores have read sQ: the warpgroup may release Q
