"""FlashAttention forward with e4m3 Q, K, V on Hopper (FA3's FP8 path): the bf16 forward's warp-specialized
schedule (`forward.py`) with FP8 WGMMAs (fp32 accumulators) and the descales folded in.

Semantics (`fp8_reference.fp8_attention_reference`): S = (q8 k8^T) q_scale k_scale softmax_scale with scales per
head or per 128-row / 128-key block; P = exp(S - rowmax) rounded to e4m3 (no extra scaling); l = the row sum of the
unrounded fp32 P; O = (P8 v8) v_scale / l, v's scale per 128-key block. The kernel computes P online, block by block
against the running max (as every FlashAttention does), so its P is rounded at each block's reference max and then
rescaled: it equals the reference up to e4m3's rounding of P, not bit for bit.

CTA per (128-row q tile, query head, batch), 384 threads:
  warpgroup 0 (producer, setmaxnreg 40):
    warp 0      TMA: Q (two 64-row halves, once), then per K/V block (last first) K -> ring k, V (keys, D) -> ring v
    warps 1-3   per block: wait v[s], transpose V (keys, D) -> V^T (D, keys) in P's key order into ring vt
                (`vt_ldsm`, the default: `transpose_v_stage_ldsm`, ldmatrix.trans, prmt, stmatrix; else
                `transpose_v_stage`: 32-bit shared loads, prmt, 32-bit shared stores), fence.proxy.async, release
                v[s], arrive on vt[s]
  warpgroups 1, 2 (consumers, setmaxnreg 232): 64 q rows each; FA3's intra-warpgroup overlap, step j (the first
  block's S and the last block's P V outside the loop):
    wait k; [wait for the turn]; S_{j+1} = Q K^T (D / 32 e4m3 WGMMAs, both operands K-major in smem); wait vt;
    O += P_j V_j (tile_n / 32 WGMMAs, A from registers); [pass the turn]; wait for S; release k
    [softcap: S *= k_scale[block], cap]; mask; online softmax (scale_log2 * q_scale [* k_scale per head]; block
    k scales fold into the row maxima and the exponent's factor, `softmax_rows(block_scale=)`; every `exp2_poly`-th
    column's exponential on the FMA pipe); with block scales O is kept in a v-scale unit: `lazy_rescale` t > 0
    (the default at D = 256: 7): the unit u moves only when the block's v scale leaves [u / 2, 2 u] (its ratio to u
    folded into P's exponent meanwhile) and rows keep their exponent reference while the max grows by <= 2^t, so
    corr is 1 on most warps; t = 0: the unit is the current block's v scale, corr *= v_scale[j] / v_scale[j+1]
    wait for P_j V_j; release vt; P_{j+1} = e4m3(S) in A-operand order (`acc_as_a_operand_fp8`: no shuffle, V^T
    carries the key order); O *= corr (lazy: skipped on the warps whose rows all kept their references and unit)
  epilogue: O *= the unit (or the head's v scale); O /= l; LSE = scale q_scale [k_scale] m + ln l; O stored from
  registers (two columns a 32-bit store, rows < S_q), LSE rows likewise.

Named barriers: 4 + w, the ping-pong turns of consumer w (as the bf16 forward). The three rings share one stage
count and one block sequence.

Tensors as the kernel sees them: Q, O (S_q, D, H_q, B), K, V (S_k, D, H_kv, B) (V not transposed: the kernel
transposes it), LSE (S_q, H_q, B), scales (blocks, H, B) fp32 (per head: one block, its index ignored).
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

from collectives import pdl
from collectives.attention_mask import MaskKind, apply_mask, apply_softcap, block_needs_mask, n_block_range
from collectives.fp8_attention import (
    E4M3,
    KMajorBytes,
    acc_as_a_operand_fp8,
    flat_words,
    transpose_v_stage,
    transpose_v_stage_ldsm,
)
from collectives.online_softmax import acc_rows_view, empty_rows, finalize_rows, rescale_rows, softmax_rows
from collectives.tma_pipeline import make_pipeline, operand_smem_layout, operand_tma
from collectives.vector_io import extent
from collectives.wgmma_mainloop import mma_blocks, stage_of
from schedules.attention import FP8_SCALE_BLOCK as SCALE_BLOCK
from schedules.attention import FP8_TILE_M as TILE_M
from schedules.attention import block_coords, tile_coords
from schedules.attention import fp8_default_lazy as default_lazy
from schedules.attention import fp8_default_tile_n as default_tile_n
from schedules.attention import fp8_max_stages as max_stages
from schedules.attention import fp8_smem_bytes as smem_bytes

CONSUMER_WGS = 2
PRODUCER_REGS = 40  # warp 0's TMA and warps 1-3's transposes
CONSUMER_REGS = 232  # 40 + 2 x 232 = 504 of 512 per thread slot
TRANSPOSE_WARPS = 3
_TURN_BAR = 4  # ping-pong: consumer warpgroup w may issue its GEMMs: 4 + w (the bf16 forward's ids)
SMEM_LIMIT = 227 * 1024
LAZY_MAX = 7  # a lazily kept reference lets P reach 2^t, times 2 for O's v unit: 2^8 = 256 < 448 (e4m3's max)


class FlashAttnFwdFP8:
    def __init__(self, head_dim: int, out_dtype, mask: MaskKind = MaskKind(), softcap: bool = False,
                 block_scales: bool = True, tile_n: int = 0, stages: int = 0, exp2_poly: int = 0,
                 lazy_rescale: int = -1, vt_ldsm: bool = True):
        self.d, self.out_dtype, self.mask, self.softcap = head_dim, out_dtype, mask, softcap
        self.exp2_poly = exp2_poly  # every k-th column's exponential on the FMA pipe (`exp2_fma`); 0: none
        # keep a row's exponent reference while its max grows by <= 2^lazy_rescale (0: never), and O's v-scale unit
        # while the block's v scale stays within 2x of it: O's rescale is skipped on the warps where both hold
        if lazy_rescale < 0:
            lazy_rescale = default_lazy(head_dim)
        if not 0 <= lazy_rescale <= LAZY_MAX:
            raise ValueError(f"lazy_rescale must be in [0, {LAZY_MAX}] (P' <= 2^(t + 1) must fit e4m3), "
                             f"got {lazy_rescale}")
        self.lazy = lazy_rescale
        self.vt_ldsm = vt_ldsm  # V^T by ldmatrix.trans / stmatrix (`transpose_v_stage_ldsm`), else 32-bit words
        self.block_scales = block_scales
        self.tile_n = tile_n or default_tile_n(head_dim)
        self.stages = stages or max_stages(head_dim, self.tile_n)
        if (block_scales and SCALE_BLOCK % self.tile_n) or self.tile_n % 32:
            raise ValueError(f"tile_n must be a multiple of 32 (and divide {SCALE_BLOCK} with block scales), got "
                             f"{self.tile_n}")
        if smem_bytes(head_dim, self.tile_n, self.stages) > SMEM_LIMIT:
            raise ValueError(f"D {head_dim}, tile_n {self.tile_n}, {self.stages} stages: "
                             f"{smem_bytes(head_dim, self.tile_n, self.stages)} B of smem")

    @cute.jit
    def __call__(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, o: cute.Tensor, lse: cute.Tensor,
                 q_scale: cute.Tensor, k_scale: cute.Tensor, v_scale: cute.Tensor, scale_log2: Float32,
                 scale_lse: Float32, scale_over_cap: Float32, cap: Float32, window_left: Int32, window_right: Int32,
                 stream):
        d, tile_n, stages = self.d, self.tile_n, self.stages
        kmaj = warpgroup.OperandMajorMode.K
        tiled_mma_qk = sm90_utils.make_trivial_tiled_mma(E4M3, E4M3, kmaj, kmaj, Float32, (1, 1, 1),
                                                         tiler_mn=(64, tile_n))
        tiled_mma_pv = sm90_utils.make_trivial_tiled_mma(E4M3, E4M3, kmaj, kmaj, Float32, (1, 1, 1),
                                                         tiler_mn=(64, d), a_source=warpgroup.OperandSource.RMEM)
        # Q: a (64, D) stage per consumer; K and V as loaded: (tile_n, D) K-major; V^T (D, tile_n) K-major
        sQ_layout = operand_smem_layout(LayoutEnum.ROW_MAJOR, E4M3, 64, d, CONSUMER_WGS)
        sK_layout = operand_smem_layout(LayoutEnum.ROW_MAJOR, E4M3, tile_n, d, stages)
        sVt_layout = operand_smem_layout(LayoutEnum.ROW_MAJOR, E4M3, d, tile_n, stages)
        tma_q, tma_gq = operand_tma(q, sQ_layout, 64, d, 1)
        tma_k, tma_gk = operand_tma(k, sK_layout, tile_n, d, 1)
        tma_v, tma_gv = operand_tma(v, sK_layout, tile_n, d, 1)

        @cute.struct
        class Storage:
            q_bars: cute.struct.MemRange[cutlass.Int64, 2]
            k_bars: cute.struct.MemRange[cutlass.Int64, stages * 2]
            v_bars: cute.struct.MemRange[cutlass.Int64, stages * 2]
            vt_bars: cute.struct.MemRange[cutlass.Int64, stages * 2]
            sQ: cute.struct.Align[cute.struct.MemRange[E4M3, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[E4M3, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[E4M3, cute.cosize(sK_layout)], 1024]
            sVt: cute.struct.Align[cute.struct.MemRange[E4M3, cute.cosize(sVt_layout)], 1024]

        self.storage = Storage
        q_tiles = (extent(q, 0) + TILE_M - 1) // TILE_M
        grid = [cutlass.max(q_tiles, 1), cute.size(q, mode=[2]), cute.size(q, mode=[3])]
        self.kernel(tiled_mma_qk, tiled_mma_pv, tma_q, tma_gq, tma_k, tma_gk, tma_v, tma_gv, o, lse, q_scale,
                    k_scale, v_scale, scale_log2, scale_lse, scale_over_cap, cap, window_left, window_right,
                    sQ_layout, sK_layout, sVt_layout).launch(grid=grid, block=[128 * (1 + CONSUMER_WGS), 1, 1],
                                                             stream=stream, use_pdl=pdl.LAUNCH)

    @cute.kernel
    def kernel(self, tiled_mma_qk: cute.TiledMma, tiled_mma_pv: cute.TiledMma, tma_q: cute.CopyAtom, mQ: cute.Tensor,
               tma_k: cute.CopyAtom, mK: cute.Tensor, tma_v: cute.CopyAtom, mV: cute.Tensor, mO: cute.Tensor,
               mLSE: cute.Tensor, mQs: cute.Tensor, mKs: cute.Tensor, mVs: cute.Tensor, scale_log2: Float32,
               scale_lse: Float32, scale_over_cap: Float32, cap: Float32, window_left: Int32, window_right: Int32,
               sQ_layout: cute.ComposedLayout, sK_layout: cute.ComposedLayout, sVt_layout: cute.ComposedLayout):
        d, tile_n, stages = self.d, self.tile_n, self.stages
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = warp // 4
        if warp == 0:
            cpasync.prefetch_descriptor(tma_q)
            cpasync.prefetch_descriptor(tma_k)
            cpasync.prefetch_descriptor(tma_v)

        smem = cutlass.memory.SmemAllocator()
        st = smem.allocate(self.storage)
        q_bytes = cute.size_in_bytes(E4M3, cute.slice_(sQ_layout, (None, None, 0))) * CONSUMER_WGS
        kv_bytes = cute.size_in_bytes(E4M3, cute.slice_(sK_layout, (None, None, 0)))
        consumer_warps = 4 * CONSUMER_WGS
        pipe_q = make_pipeline(st.q_bars.data_ptr(), 1, q_bytes, (1, 1), consumer_warps)
        pipe_k = make_pipeline(st.k_bars.data_ptr(), stages, kv_bytes, (1, 1), consumer_warps)
        pipe_v = make_pipeline(st.v_bars.data_ptr(), stages, kv_bytes, (1, 1), TRANSPOSE_WARPS)
        # V^T: each transposing warp's lane 0 arrives once its lanes' stores are fenced; every consumer thread
        # releases (after the P V WGMMAs that read the stage are done)
        pipe_vt = pipeline.PipelineAsync.create(
            barrier_storage=st.vt_bars.data_ptr(), num_stages=stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, TRANSPOSE_WARPS),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 128 * CONSUMER_WGS), defer_sync=True)
        pipeline.pipeline_init_arrive(cluster_shape_mn=(1, 1), is_relaxed=True)

        sQ = st.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = st.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = st.sV.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sVt = st.sVt.get_tensor(sVt_layout.outer, swizzle=sVt_layout.inner)

        pipeline.pipeline_init_wait(cluster_shape_mn=(1, 1))
        pdl.enter()

        # ---- the tile: (q tile, head, batch), its K/V block range, its loads' partitions ----
        bx, by, bz = cute.arch.block_idx()
        seqlen_q = extent(mQ, 0)
        seqlen_k = extent(mK, 0)
        q_tiles = (seqlen_q + TILE_M - 1) // TILE_M
        mi, bh, bb = block_coords(bx, by, bz, False)
        m_block, h, b = tile_coords(mi, bh, bb, q_tiles, self.mask.right)
        hk = h // (cute.size(mQ, mode=[2]) // cute.size(mK, mode=[2]))
        n_min, n_max = n_block_range(m_block, TILE_M, tile_n, seqlen_q, seqlen_k, window_left, window_right,
                                     self.mask)
        n_count = cutlass.max(n_max - n_min, 0)
        gQ = cute.local_tile(mQ[(None, None, h, b)], (64, d), (None, 0))
        gK = cute.local_tile(mK[(None, None, hk, b)], (tile_n, d), (None, 0))
        gV = cute.local_tile(mV[(None, None, hk, b)], (tile_n, d), (None, 0))
        tQsQ, tQgQ = cpasync.tma_partition(tma_q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2),
                                           cute.group_modes(gQ, 0, 2))
        tKsK, tKgK = cpasync.tma_partition(tma_k, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2),
                                           cute.group_modes(gK, 0, 2))
        tVsV, tVgV = cpasync.tma_partition(tma_v, 0, cute.make_layout(1), cute.group_modes(sV, 0, 2),
                                           cute.group_modes(gV, 0, 2))
        tile = SimpleNamespace(m_block=m_block, h=h, hk=hk, b=b, n_max=n_max, n_count=n_count, seqlen_q=seqlen_q,
                               seqlen_k=seqlen_k, left=window_left, right=window_right)

        if mi < q_tiles:
            if wg == 0:
                cute.arch.setmaxregister_decrease(PRODUCER_REGS)
                if warp == 0:
                    # (each role its own namespace of the pipelines: a jit method rebinds the attributes of the
                    # namespace it is given, and a value rebound inside one role's branch may not reach another's)
                    self.loader(tma_q, tQgQ, tQsQ, tma_k, tKgK, tKsK, tma_v, tVgV, tVsV,
                                SimpleNamespace(q=pipe_q, k=pipe_k, v=pipe_v), m_block, n_max, n_count)
                else:
                    self.transposer(warp - 1, sV, sVt, st.sV.data_ptr(), st.sVt.data_ptr(), sK_layout,
                                    sVt_layout, SimpleNamespace(v=pipe_v, vt=pipe_vt), n_count)
            else:
                cute.arch.setmaxregister_increase(CONSUMER_REGS)
                self.consumer(wg - 1, tidx, tiled_mma_qk, tiled_mma_pv, sQ, sK, sVt,
                              SimpleNamespace(q=pipe_q, k=pipe_k, vt=pipe_vt), tile, mO, mLSE, mQs,
                              mKs, mVs, scale_log2, scale_lse, scale_over_cap, cap)

    @cute.jit
    def loader(self, tma_q: cute.CopyAtom, tQgQ: cute.Tensor, tQsQ: cute.Tensor, tma_k: cute.CopyAtom,
               tKgK: cute.Tensor, tKsK: cute.Tensor, tma_v: cute.CopyAtom, tVgV: cute.Tensor, tVsV: cute.Tensor,
               pipes: SimpleNamespace, m_block: Int32, n_max: Int32, n_count: Int32):
        """Warp 0: TMA of Q once, then K and V of each block, last block first (each its own method: the warp
        roles' branches assign no variable)."""
        pipe_q, pipe_k, pipe_v, stages = pipes.q, pipes.k, pipes.v, self.stages
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        pipe_q.producer_acquire(q_state)
        q_bar = pipe_q.producer_get_barrier(q_state)
        for w in cutlass.range_constexpr(CONSUMER_WGS):
            cute.copy(tma_q, tQgQ[(None, m_block * CONSUMER_WGS + w)], tQsQ[(None, w)], tma_bar_ptr=q_bar)
        pipe_q.producer_commit(q_state)
        kv = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, stages)
        for i in cutlass.range(n_count, unroll=1):
            n = n_max - 1 - i
            pipe_k.producer_acquire(kv)
            cute.copy(tma_k, tKgK[(None, n)], tKsK[(None, kv.index)],
                      tma_bar_ptr=pipe_k.producer_get_barrier(kv))
            pipe_k.producer_commit(kv)
            pipe_v.producer_acquire(kv)
            cute.copy(tma_v, tVgV[(None, n)], tVsV[(None, kv.index)],
                      tma_bar_ptr=pipe_v.producer_get_barrier(kv))
            pipe_v.producer_commit(kv)
            kv.advance()
        # the rings' tails (`producer_tail`, whose stage count is a run-time value here): every stage released
        for _ in cutlass.range_constexpr(stages):
            pipe_k.sync_object_empty.wait(kv.index, kv.phase)
            pipe_v.sync_object_empty.wait(kv.index, kv.phase)
            kv.advance()

    @cute.jit
    def transposer(self, warp: Int32, sV: cute.Tensor, sVt: cute.Tensor, sV_ptr: cute.Pointer,
                   sVt_ptr: cute.Pointer, sV_layout: cute.ComposedLayout, sVt_layout: cute.ComposedLayout,
                   pipes: SimpleNamespace, n_count: Int32):
        """Warps 1-3: each V block (keys, D) into V^T (D, keys) in P's key order, stage for stage."""
        bufs = SimpleNamespace(src=flat_words(sV_ptr, sV_layout), dst=flat_words(sVt_ptr, sVt_layout),
                               v_base=Int32(sV_ptr.toint()), vt_base=Int32(sVt_ptr.toint()),
                               v=KMajorBytes.of(sV_layout), vt=KMajorBytes.of(sVt_layout))
        raw = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        out = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        lane = cute.arch.lane_idx()
        for _ in cutlass.range(n_count, unroll=1):
            pipes.v.consumer_wait(raw)
            pipes.vt.producer_acquire(out)
            self.transpose_stage(bufs, raw.index, warp, lane)
            # the stores are read by WGMMA (the async proxy); every lane fences its own before the warp's arrive
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.sync_warp()
            pipes.v.consumer_release(raw)  # (one lane a warp: TMA pipeline consumers signal per warp)
            # (if_generate, not a traced `if`: that one rebinds the pipeline's values inside the region)
            if_generate(lane == 0, lambda: pipes.vt.producer_commit(out))
            raw.advance()
            out.advance()
        # the ring's tail (`producer_tail`, whose stage count is a run-time value here): every stage released
        for _ in cutlass.range_constexpr(self.stages):
            pipes.vt.sync_object_empty.wait(out.index, out.phase)
            out.advance()

    @cute.jit
    def transpose_stage(self, bufs: SimpleNamespace, stage: Int32, warp: Int32, lane: Int32):
        """One V stage into V^T (the transposer's work between its ring waits and signals): ldmatrix.trans /
        stmatrix with `vt_ldsm`, else 32-bit words. `bufs`: the two buffers as flat words and as shared addresses,
        their `KMajorBytes`."""
        if cutlass.const_expr(self.vt_ldsm):
            transpose_v_stage_ldsm(bufs.v_base, bufs.vt_base, stage, warp, lane, TRANSPOSE_WARPS, bufs.v, bufs.vt,
                                   self.tile_n, self.d)
        else:
            transpose_v_stage(bufs.src, bufs.dst, stage, warp, lane, TRANSPOSE_WARPS, bufs.v, bufs.vt, self.tile_n,
                              self.d)

    @cute.jit
    def scale_at(self, m: cute.Tensor, block: Int32, head: Int32, b: Int32) -> Float32:
        """A scale of (blocks, H, B): the block's with block scales, else the head's."""
        if cutlass.const_expr(self.block_scales):
            return m[block, head, b]
        return m[0, head, b]

    @cute.jit
    def consumer(self, cwg: Int32, tidx: Int32, tiled_mma_qk: cute.TiledMma, tiled_mma_pv: cute.TiledMma,
                 sQ: cute.Tensor, sK: cute.Tensor, sVt: cute.Tensor, pipes: SimpleNamespace, tile: SimpleNamespace,
                 mO: cute.Tensor, mLSE: cute.Tensor, mQs: cute.Tensor, mKs: cute.Tensor, mVs: cute.Tensor,
                 scale_log2: Float32, scale_lse: Float32, scale_over_cap: Float32, cap: Float32):
        d, tile_n, stages = self.d, self.tile_n, self.stages
        tid = tidx % 128
        thr_qk = tiled_mma_qk.get_slice(tid)
        thr_pv = tiled_mma_pv.get_slice(tid)
        tSrQ = stage_of(tiled_mma_qk.make_fragment_A(thr_qk.partition_A(sQ)), cwg)
        tSrK = tiled_mma_qk.make_fragment_B(thr_qk.partition_B(sK))
        tOrV = tiled_mma_pv.make_fragment_B(thr_pv.partition_B(sVt))
        acc_s = cute.make_rmem_tensor(thr_qk.partition_shape_C((64, tile_n)), Float32)
        acc_o = cute.make_rmem_tensor(thr_pv.partition_shape_C((64, d)), Float32)
        p = cute.make_rmem_tensor(thr_pv.partition_shape_A((64, tile_n)), E4M3)
        tScS = thr_qk.partition_C(cute.make_identity_tensor((64, tile_n)))
        tOcO = thr_pv.partition_C(cute.make_identity_tensor((64, d)))
        s_rows = acc_rows_view(acc_s)
        o_rows = acc_rows_view(acc_o)
        rows = cute.size(o_rows, mode=[0])
        row_max, row_sum = empty_rows(rows)
        corr = cute.make_rmem_tensor((rows,), Float32)
        acc_o.fill(0.0)
        tiled_mma_pv.set(warpgroup.Field.ACCUMULATE, True)
        row0 = tile.m_block * TILE_M + cwg * 64
        n_count, n_max = tile.n_count, tile.n_max
        h, hk, b = tile.h, tile.hk, tile.b
        per_block = max(1, SCALE_BLOCK // tile_n)  # K/V blocks per scale block (block scales; per-head: unused)

        # the tile's descale: q's (one 128-row block), k's with per-head scales; into the softmax's scales
        f = self.scale_at(mQs, tile.m_block, h, b)
        if cutlass.const_expr(not self.block_scales):
            f = f * mKs[0, hk, b]
        sl2, slse, soc = scale_log2, scale_lse, scale_over_cap
        if cutlass.const_expr(self.softcap):
            soc = scale_over_cap * f  # softcap: the logits are capped after the scale; the softmax sees them as is
        else:
            sl2 = scale_log2 * f
            slse = scale_lse * f
        # v's scale of the block whose units O is in (block scales; per head it is applied once at the end)
        vs_prev = self.scale_at(mVs, cutlass.max(n_max - 1, 0) // per_block, hk, b)
        # lazy with block scales: O's unit u moves only when a block's v scale leaves [u / 2, 2 u]; each block's
        # v scale / u is folded into P's exponent instead of into O's rescale
        unit = self.unit_of(vs_prev)

        my_turn = pipeline.NamedBarrier(barrier_id=_TURN_BAR + cwg, num_threads=256)
        their_turn = pipeline.NamedBarrier(barrier_id=_TURN_BAR + (cwg + 1) % CONSUMER_WGS, num_threads=256)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        pipes.q.consumer_wait(q_state)
        if cwg == 0:
            my_turn.arrive()  # warpgroup 1 goes first
        my_turn.arrive_and_wait()
        # FA3's intra-warpgroup overlap (as the bf16 forward's default): step j issues S_{j+1} = Q K^T and P_j V_j
        # together, runs S_{j+1}'s softmax under P_j V_j, then (P_j V_j done) rescales O and writes P_{j+1} over
        # P_j's registers. Blocks walk from the last (n_max - 1) down.
        kv = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, stages)
        if n_count > 0:
            n = n_max - 1
            ks, vs = self.block_scales_at(mKs, mVs, n, per_block, hk, b)
            pipes.k.consumer_wait(kv)
            warpgroup.fence()
            mma_blocks(tiled_mma_qk, acc_s, tSrQ, stage_of(tSrK, kv.index), zero_first=True)
            warpgroup.commit_group()
            their_turn.arrive()
            warpgroup.wait_group(0)
            pipes.k.consumer_release(kv)
            self.block_softmax(acc_s, s_rows, tScS, n, row0, tile, row_max, row_sum, corr, sl2, soc, cap, ks,
                               Float32(1.0), unit)  # O is still 0: no rescale
            acc_as_a_operand_fp8(acc_s, p)
            if cutlass.const_expr(self.block_scales):
                vs_prev = vs  # (per head, vs_prev is the head's v scale, applied once at the end)
            kv_v = kv.clone()
            kv.advance()
            for i in cutlass.range(1, n_count, unroll=1):
                n = n_max - 1 - i
                ks, vs = self.block_scales_at(mKs, mVs, n, per_block, hk, b)
                # (the GEMM sets the atom's ACCUMULATE field, a new IR value: on a copy made in this loop body)
                qk = cutlass.new_from_mlir_values(tiled_mma_qk, cutlass.extract_mlir_values(tiled_mma_qk))
                pipes.k.consumer_wait(kv)
                my_turn.arrive_and_wait()
                warpgroup.fence()
                mma_blocks(qk, acc_s, tSrQ, stage_of(tSrK, kv.index), zero_first=True)
                warpgroup.commit_group()
                pipes.vt.consumer_wait(kv_v)
                mma_blocks(tiled_mma_pv, acc_o, p, stage_of(tOrV, kv_v.index))
                warpgroup.commit_group()
                their_turn.arrive()
                warpgroup.wait_group(1)  # S_{j+1} done, P_j V_j may still run
                pipes.k.consumer_release(kv)
                # O holds v_scale[block j] units; from P_{j+1} V_{j+1} on, v_scale[n]'s (lazy: the unit's, updated)
                keep, unit = self.block_softmax(acc_s, s_rows, tScS, n, row0, tile, row_max, row_sum, corr, sl2,
                                                soc, cap, ks, vs_prev / vs, unit, vs)
                if cutlass.const_expr(self.block_scales):
                    vs_prev = vs
                warpgroup.wait_group(0)
                pipes.vt.consumer_release(kv_v)
                if cutlass.const_expr(self.lazy > 0):
                    # (P first: no fp32 probability live across the rescale's branch)
                    acc_as_a_operand_fp8(acc_s, p)
                    rescale_rows(o_rows, corr, keep)
                else:
                    rescale_rows(o_rows, corr)
                    acc_as_a_operand_fp8(acc_s, p)
                kv_v.advance()
                kv.advance()
            pipes.vt.consumer_wait(kv_v)
            my_turn.arrive_and_wait()
            warpgroup.fence()
            mma_blocks(tiled_mma_pv, acc_o, p, stage_of(tOrV, kv_v.index))
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            pipes.vt.consumer_release(kv_v)
        # a warpgroup's last turn (its last P V) passes no turn on: warpgroup 0 hands warpgroup 1 its last here
        if cwg < CONSUMER_WGS - 1:
            their_turn.arrive()

        # ---- epilogue: O *= v_scale (the last block's, or the head's), O /= l, LSE, O and LSE from registers ----
        u = unit if cutlass.const_expr(self.lazy > 0 and self.block_scales) else vs_prev
        for r in cutlass.range_constexpr(rows):
            corr[r] = u
        rescale_rows(o_rows, corr)
        lse = cute.make_rmem_tensor((rows,), Float32)
        finalize_rows(o_rows, row_max, row_sum, lse, slse)
        c_rows = acc_rows_view(tOcO)
        if c_rows[0, 0][1] == 0:
            for r in cutlass.range_constexpr(rows):
                row = row0 + c_rows[r, 0][0]
                if row < tile.seqlen_q:
                    mLSE[row, h, b] = lse[r]
        gO = cute.local_tile(mO[(None, None, h, b)], (64, d), (None, 0))[(None, None, tile.m_block * CONSUMER_WGS + cwg)]
        r_o = cute.make_rmem_tensor(acc_o.shape, self.out_dtype)
        r_o.store(acc_o.load().to(self.out_dtype))
        out_rows = acc_rows_view(r_o)
        g_rows = acc_rows_view(thr_pv.partition_C(gO))
        for r in cutlass.range_constexpr(rows):
            if row0 + c_rows[r, 0][0] < tile.seqlen_q:
                for c in cutlass.range_constexpr(cute.size(out_rows, mode=[1])):
                    g_rows[r, c] = out_rows[r, c]

    @cute.jit
    def block_scales_at(self, mKs: cute.Tensor, mVs: cute.Tensor, n: Int32, per_block: cutlass.Constexpr[int],
                        hk: Int32, b: Int32):
        """(k scale, v scale) of K/V block n with block scales (k's floored above 0: the softmax scales a row's
        maximum by it), else (1, 1): per-head scales are folded in once."""
        ks = Float32(1.0)
        vs = Float32(1.0)
        if cutlass.const_expr(self.block_scales):
            ks = cute.arch.fmax(mKs[n // per_block, hk, b], Float32(1e-30))
            vs = mVs[n // per_block, hk, b]
        return ks, vs

    @cute.jit
    def block_softmax(self, acc_s: cute.Tensor, s_rows: cute.Tensor, tScS: cute.Tensor, n: Int32, row0: Int32,
                      tile: SimpleNamespace, row_max: cute.Tensor, row_sum: cute.Tensor, corr: cute.Tensor,
                      sl2: Float32, soc: Float32, cap: Float32, ks: Float32, v_ratio: Float32, unit: Float32,
                      vs: Float32 = None):
        """Block n's S (fp32, in registers) into probabilities: k's block scale (a multiply before the softcap, else
        folded into the softmax), softcap, mask, online softmax; corr (O's factor) also carries `v_ratio`, the
        change of O's v-scale units (block scales).

        Lazy (`lazy_rescale` t > 0): rows keep their exponent reference while the max grows by <= 2^t (a warp
        vote); with block scales O stays in the unit `unit` while the block's v scale vs is within [unit / 2,
        2 unit]: P' = P vs / unit (its log2 added to the exponent; l sums P), else the unit becomes vs and corr
        carries unit / vs (any sign; |vs| floored at 1e-30). Returns (keep: O's rescale may be skipped on this
        warp, the unit); `vs` None: the first block (O is 0)."""
        if cutlass.const_expr(self.block_scales and self.softcap):
            for e in cutlass.range_constexpr(cute.size(acc_s)):  # the cap sees the descaled logits
                acc_s[e] = acc_s[e] * ks
        self.scores(acc_s, tScS, n, row0, tile, soc, cap)
        bscale = ks if cutlass.const_expr(self.block_scales and not self.softcap) else None
        keep = cutlass.Boolean(False)
        if cutlass.const_expr(self.lazy == 0):
            softmax_rows(s_rows, row_max, row_sum, corr, sl2, block_scale=bscale, poly_every=self.exp2_poly)
            if cutlass.const_expr(self.block_scales):
                for r in cutlass.range_constexpr(cute.size(corr)):
                    corr[r] = corr[r] * v_ratio
        elif cutlass.const_expr(not self.block_scales or vs is None):
            keep = softmax_rows(s_rows, row_max, row_sum, corr, sl2, lazy_threshold=float(self.lazy),
                                block_scale=bscale, poly_every=self.exp2_poly)
        else:
            ratio = self.unit_of(vs) * cute.arch.rcp_approx(unit)  # the same on every thread of the CTA
            keep_u = (ratio >= Float32(0.5)) & (ratio <= Float32(2.0))
            inv = cute.arch.rcp_approx(ratio)  # unit / vs
            bias = cute.math.log2(Float32(cutlass.select_(keep_u, ratio, Float32(1.0))), fastmath=True)
            keep = softmax_rows(s_rows, row_max, row_sum, corr, sl2, lazy_threshold=float(self.lazy),
                                block_scale=bscale, poly_every=self.exp2_poly, p_log2_bias=bias,
                                sum_scale=Float32(cutlass.select_(keep_u, inv, Float32(1.0))))
            corr_u = Float32(cutlass.select_(keep_u, Float32(1.0), inv))
            for r in cutlass.range_constexpr(cute.size(corr)):
                corr[r] = corr[r] * corr_u
            unit = Float32(cutlass.select_(keep_u, unit, self.unit_of(vs)))
            keep = keep & keep_u
        return keep, unit

    @cute.jit
    def unit_of(self, vs: Float32) -> Float32:
        """A v scale as O's unit: |vs| floored at 1e-30, its sign kept (a zero scale would make the unit's ratios
        infinite)."""
        tiny = Float32(1e-30)
        return Float32(cutlass.select_(cute.arch.fmax(vs, -vs) >= tiny, vs, tiny))

    @cute.jit
    def scores(self, acc_s: cute.Tensor, tScS: cute.Tensor, n: Int32, row0: Int32, tile: SimpleNamespace,
               scale_over_cap: Float32, cap: Float32):
        """Softcap, then the mask on the blocks that cross the band's edges or the key end (a branch per block)."""
        kind = self.mask
        if cutlass.const_expr(self.softcap):
            apply_softcap(acc_s, scale_over_cap, cap)
        if block_needs_mask(n, tile.m_block, TILE_M, self.tile_n, tile.seqlen_q, tile.seqlen_k, tile.left,
                            tile.right, kind):
            apply_mask(acc_s, tScS, row0, n * self.tile_n, tile.seqlen_k, tile.seqlen_k - tile.seqlen_q, tile.left,
                       tile.right, kind)
