"""FlashAttention backward on Hopper, FA3's arrangement: dQ, dK, dV of O = softmax(scale Q K^T) V.

Three kernels (the schedule: `schedules.attention_bwd`):

1. `FlashAttnBwdPre`: per query row D = rowsum(dO * O) - dLSE (fp32; dLSE, a gradient flowing into the
   returned LSE, is 0 without one) and LSE2 = LSE * log2(e), written into (tile-padded) per-row
   vectors: rows past a sequence's end get LSE2 = +inf and D = 0, so their P is exactly 0 and the main
   kernel needs no row predicate; and the dQ accumulator tile of the block zeroed.
2. `FlashAttnBwd` (main): one CTA per (K/V block, K/V head, batch); walks the query blocks (and with GQA
   every query head of the group) that see its keys; see `schedules.attention_bwd` for the warp roles.
   Per query block, consumer warpgroup w (keys [64 w, 64 w + 64)):
       S^T = K_w Q^T, dP^T = V_w dO^T            (WGMMA, smem x smem, committed together)
       P = exp2(S^T * scale_log2 - LSE2[col])     (softcap and mask first; P -> bf16 A operand)
       dS = P (dP - D[col])  [* (1 - tanh^2) with softcap]
       dV_w += P^T dO,  dK_w += dS^T Q           (WGMMA, A from registers)
       dS -> smem;  dQ_part = dS K               (WGMMA, smem x smem; its warpgroup's part)
       dQ_part -> smem -> bulk reduce-add into the fp32 accumulator (warp 1)
   dK = scale * dK and dV are stored from registers, predicated on the sequence's keys.
3. `FlashAttnBwdPost`: dQ = scale * accumulator, in the input dtype.

Roofline: 5 GEMMs of 2 * S_q * S_k * D each (S, dP, dV, dK, dQ) against the forward's 2: 2.5x its FLOPs
(visible pairs only), tensor-core bound; the exponentials are one MUFU per S element as in the forward.

Tensors as the kernels see them (D static, everything else symbolic): Q, dO (S_q, D, H_q, B); K, V
(S_k, D, H_kv, B); dK, dV (S_k, D, H_kv, B) in the input dtype; LSE2, D (S_pad, H_q, B) fp32, S_pad =
q_tiles * tile_m; the dQ accumulator (tile_m * D, q_tiles, H_q, B) fp32 in MMA order (`schedules.attention_bwd`);
varlen: B = 1 packed, sequence b's padded tiles start at `varlen_tile_base`.

Deterministic mode: the dQ tile of (batch, head, m block) takes its contributions in K/V-block order. A
semaphore per tile (int32, zeroed) counts the blocks that added theirs; the dQ warp of block n waits until it
reads n's place in the order (acquire), issues its reduce-add, waits for its completion and adds 1 (release).
The order is ascending, or descending with a right bound (causal: block n's first query blocks then wait for
nobody), and the grid launches the key blocks in that order, so a block waits only for blocks launched before
it (no deadlock however few fit at once). dK and dV are summed in registers in a fixed order anyway.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

from collectives import epilogue as epi
from collectives.attention_mask import MaskKind, apply_mask, apply_softcap, n_block_range
from collectives.online_softmax import acc_rows_view
from collectives.tma_pipeline import make_pipeline, operand_smem_layout
from collectives.vector_io import extent
from collectives.wgmma_mainloop import acc_as_a_operand, mma_blocks, stage_of
from schedules.attention_bwd import AttentionBwdSchedule, m_block_range, varlen_tile_base
from schedules.hardware import SETMAXNREG_LAUNCH

# Named barrier ids (0 is __syncthreads)
_PDS_BAR = 1  # the consumers: dS of this block is in smem (2 x 128 threads)
_DQ_EMPTY = 2  # + 2 w + b: warpgroup w's dQ smem chunk in buffer b may be written (128 + 32 threads)
_DQ_FULL = 6  # + 2 w + b: warpgroup w's dQ chunk in buffer b is written (128 + 32 threads)
_DQ_HALF = 10  # + b, dq_split "k": warpgroup 0's partial in buffer b is written, warpgroup 1 may add (2 x 128)
_OWN_DS = 12  # + w, dq_split "k": warpgroup w's dS rows are in smem (128 threads)
_OWN_P = 14  # + w, p_smem: warpgroup w's P rows are in smem (128 threads)
LOG2E = math.log2(math.e)
_PRE_GROUP = 8  # preprocess: threads per row


def reduce_add_bulk_f32(smem_ptr, gmem_ptr, nbytes: int):
    """cp.reduce.async.bulk .add.f32: `nbytes` (a multiple of 16) of fp32 from shared memory added into global memory,
    in the issuing thread's bulk async-group."""
    llvm.inline_asm(None, [gmem_ptr.toint().ir_value(), smem_ptr.toint().ir_value(), Int32(nbytes).ir_value()],
                    "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [$0], [$1], $2;", "l,r,r",
                    has_side_effects=True, is_align_stack=False)


def mma_order(ptr, tid, n: int) -> cute.Tensor:
    """The `n` values of warpgroup thread `tid` in a chunk kept in the accumulator's register order ("MMA order"):
    element e at (e // 4) * 512 + 4 tid + e % 4 of the chunk at `ptr`, so 128 threads move 16 bytes each side by side."""
    return cute.make_tensor((ptr + 4 * tid).align(16), cute.make_layout((4, n // 4), stride=(1, 512)))


def seq_rows(varlen: bool, cu, bb, rows, tile_m: int):
    """(first row, length, first padded tile, the tensors' batch index) of batch entry `bb`: varlen, sequence bb of
    the packed tensors (`cu`, the offsets) and its tiles from `varlen_tile_base`, or past the last sequence (the grid's
    tail slot, `zero_tail_rows`) length 0; else all `rows` of batch bb."""
    if varlen:
        n = cute.size(cu, mode=[0]) - 1
        bq = cutlass.min(bb, n - 1)
        start = cu[bq]
        length = Int32(cutlass.select_(bb < n, cu[bq + 1] - start, Int32(0)))
        return start, length, varlen_tile_base(start, bq, tile_m), 0
    return 0, rows, 0, bb


@cute.jit
def zero_tail_rows(outs, cu, head, slot, rows_per_slot: int, tidx, threads: int, dtype, d: int):
    """Varlen: rows [cu[-1], total) of each (total, D, H, 1) view in `outs` lie in no sequence; their gradient is 0.
    Slot `slot` of the grid's x extent (this head's CTAs of the tail slot) zeroes every x-th group of `rows_per_slot`
    rows, 16 bytes a store, so that the gradients need no full zero fill before the kernels."""
    slots, _, _ = cute.arch.grid_dim()
    start = cu[cute.size(cu, mode=[0]) - 1]
    total = extent(outs[0], 0)
    vecs = d // 8
    zeros = cute.make_rmem_tensor((8,), dtype)
    zeros.fill(0.0)
    for r0 in cutlass.range(start + slot * rows_per_slot, total, slots * rows_per_slot, unroll=1):
        for idx in cutlass.range(tidx, rows_per_slot * vecs, threads, unroll=1):
            r = r0 + idx // vecs
            if r < total:
                for out in outs:
                    v = cute.make_tensor(out[(r, None, head, 0)].iterator, cute.make_layout((8, vecs), stride=(1, 8)))
                    v[(None, idx % vecs)].store(zeros.load())


def consumer_warpgroup():
    """The consumer warpgroup index (0, 1) from the warp index, made warp-uniform: the smem operand slices (and so every
    WGMMA descriptor built from them) then live in uniform registers, not rebuilt per thread before each WGMMA."""
    return cute.arch.make_warp_uniform(cute.arch.warp_idx()) // 4 - 1


def _mma(dt, a_major, b_major, atoms, tiler_mn, a_regs=False):
    return sm90_utils.make_trivial_tiled_mma(
        dt, dt, a_major, b_major, Float32, atoms, tiler_mn=tiler_mn,
        **({"a_source": warpgroup.OperandSource.RMEM} if a_regs else {}))


def transposed(t: cute.Tensor) -> cute.Tensor:
    """The (cols, rows, ...) view of a (rows, cols, ...) smem tile (the swizzle rides on the pointer)."""
    modes = [1, 0] + list(range(2, cute.rank(t.layout)))
    return cute.make_tensor(t.iterator, cute.select(t.layout, mode=modes))


class BwdMmas:
    """The tiled MMAs of the backward, one atom per consumer warpgroup (a warpgroup's slice is its part).

    kv_split "rows":
    s:  S^T, dP^T (tile_n, tile_m) = K / V (tile_n, D) x Q / dO^T, both K-major in smem.
    kv: dK, dV (tile_n, D) = dS^T / P^T (registers) x Q / dO (D contiguous: MN-major B).
    pv: dV's (kv, or with p_smem P^T from smem, K-major A).
    dq: dQ (tile_m, D) = dS (q-contiguous smem: MN-major A) x K (MN-major B), cut per `dq_split`.
    kv_split "dim" (the warpgroups split the keys of S and the head dim of the rest):
    s:  S, dP (tile_m, tile_n) = Q / dO x K / V^T, both K-major.
    kv: dK, dV (tile_n, D) = dS^T / P^T (smem, keys contiguous: MN-major A) x Q / dO (MN-major B).
    dq: dQ (tile_m, D) = dS (K-major A) x K (MN-major B)."""

    def __init__(self, dt, d: int, s: AttentionBwdSchedule):
        K, MN = cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN
        wgs = s.consumer_wgs
        rows, cols = s.dq_tile(d)
        self.dq_rows, self.dq_cols = rows, cols
        if s.kv_split == "dim":
            self.s = _mma(dt, K, K, (1, wgs, 1), (64, s.tile_n // wgs))
            self.kv = _mma(dt, MN, MN, (1, wgs, 1), (64, d // wgs))
            self.dq = _mma(dt, K, MN, (1, wgs, 1), (64, cols))
            return
        self.s = _mma(dt, K, K, (wgs, 1, 1), (64, s.tile_m))
        self.kv = _mma(dt, K, MN, (wgs, 1, 1), (64, d), a_regs=True)
        # dV += P^T dO: A from registers as dK's, or with p_smem from P^T in smem (keys, q: q contiguous, K-major)
        self.pv = _mma(dt, K, MN, (wgs, 1, 1), (64, d)) if s.p_smem else self.kv
        sp = s.split(d)
        atoms = {"m": (2, 1, 1), "n": (1, 2, 1), "one": (1, 1, 1), "k": (1, 1, 1)}[sp]
        self.dq = _mma(dt, MN, MN, atoms, (64, cols))


class FlashAttnBwd:
    def __init__(self, dtype, head_dim: int, schedule: AttentionBwdSchedule, mask: MaskKind = MaskKind(),
                 softcap: bool = False, varlen: bool = False, deterministic: bool = False):
        schedule.check(head_dim, dtype.width // 8)
        self.dtype, self.d, self.s = dtype, head_dim, schedule
        self.mask, self.softcap, self.varlen, self.deterministic = mask, softcap, varlen, deterministic

    @cute.jit
    def __call__(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, do: cute.Tensor, lse2: cute.Tensor,
                 dpsum: cute.Tensor, dq_acc: cute.Tensor, dk: cute.Tensor, dv: cute.Tensor, sem: cute.Tensor,
                 scale_log2: Float32, scale: Float32, scale_over_cap: Float32, cap: Float32, window_left: Int32,
                 window_right: Int32, stream):
        """Batched; `sem` (q_tiles, H_q, B) int32 zeroed (deterministic; unread without)."""
        self.launch(q, k, v, do, lse2, dpsum, dq_acc, dk, dv, sem, None, None, None, scale_log2, scale,
                    scale_over_cap, cap, window_left, window_right, stream)

    @cute.jit
    def call_varlen(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, do: cute.Tensor, lse2: cute.Tensor,
                    dpsum: cute.Tensor, dq_acc: cute.Tensor, dk: cute.Tensor, dv: cute.Tensor, sem: cute.Tensor,
                    cu_seqlens_q: cute.Tensor, cu_seqlens_k: cute.Tensor, max_seqlen_k: Int32, scale_log2: Float32,
                    scale: Float32, scale_over_cap: Float32, cap: Float32, window_left: Int32, window_right: Int32,
                    stream):
        self.launch(q, k, v, do, lse2, dpsum, dq_acc, dk, dv, sem, cu_seqlens_q, cu_seqlens_k, max_seqlen_k,
                    scale_log2, scale, scale_over_cap, cap, window_left, window_right, stream)

    def p_rows_layout(self):
        """p_smem: the smem tile of P^T (keys, q: q contiguous), one buffer (each warpgroup reads only its own rows)."""
        return operand_smem_layout(LayoutEnum.ROW_MAJOR, self.dtype, self.s.tile_n, self.s.tile_m, 1)

    @cute.jit
    def launch(self, q, k, v, do, lse2, dpsum, dq_acc, dk, dv, sem, cu_q, cu_k, max_seqlen_k, scale_log2, scale,
               scale_over_cap, cap, window_left, window_right, stream):
        s, d, dt = self.s, self.d, self.dtype
        mm = BwdMmas(dt, d, s)
        st = s.stages
        ac = s.atom_cols(d)
        sQ_layout = operand_smem_layout(LayoutEnum.ROW_MAJOR, dt, s.tile_m, d, st, ac)
        sK_layout = operand_smem_layout(LayoutEnum.ROW_MAJOR, dt, s.tile_n, d, 1, ac)
        if cutlass.const_expr(s.kv_split == "dim"):  # dS and P (q, keys): keys contiguous
            sdS_layout = operand_smem_layout(LayoutEnum.ROW_MAJOR, dt, s.tile_m, s.tile_n, st)
        else:  # dS (keys, q): q contiguous
            sdS_layout = operand_smem_layout(LayoutEnum.ROW_MAJOR, dt, s.tile_n, s.tile_m, st)
        p_elems = cute.cosize(sdS_layout) if s.kv_split == "dim" else cute.cosize(self.p_rows_layout())
        vec_layout = cute.make_layout((s.tile_m, st))
        dq_elems = s.tile_m * d * s.dq_buffers
        tma_q, gq = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), q,
                                                cute.slice_(sQ_layout, (None, None, 0)), (s.tile_m, d))
        tma_do, gdo = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), do,
                                                  cute.slice_(sQ_layout, (None, None, 0)), (s.tile_m, d))
        tma_k, gk = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), k,
                                                cute.slice_(sK_layout, (None, None, 0)), (s.tile_n, d))
        tma_v, gv = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), v,
                                                cute.slice_(sK_layout, (None, None, 0)), (s.tile_n, d))
        tma_l, gl = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), lse2,
                                                cute.make_layout(s.tile_m), (s.tile_m,))
        tma_p, gp = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), dpsum,
                                                cute.make_layout(s.tile_m), (s.tile_m,))

        @cute.struct
        class Storage:
            q_bars: cute.struct.MemRange[cutlass.Int64, st * 2]
            do_bars: cute.struct.MemRange[cutlass.Int64, st * 2]
            kv_bars: cute.struct.MemRange[cutlass.Int64, 2]
            sL: cute.struct.Align[cute.struct.MemRange[Float32, s.tile_m * st], 128]
            sP: cute.struct.Align[cute.struct.MemRange[Float32, s.tile_m * st], 128]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
            sdS: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sdS_layout)], 1024]
            sdQ: cute.struct.Align[cute.struct.MemRange[Float32, dq_elems], 1024]
            if cutlass.const_expr(s.kv_split == "dim" or s.p_smem):
                sPm: cute.struct.Align[cute.struct.MemRange[dt, p_elems], 1024]  # P

        self.storage = Storage
        if cutlass.const_expr(self.varlen):
            batch = cute.size(cu_q, mode=[0]) - 1
            n_blocks = (max_seqlen_k + s.tile_n - 1) // s.tile_n
        else:
            batch = cute.size(q, mode=[3])
            n_blocks = (extent(k, 0) + s.tile_n - 1) // s.tile_n
        # varlen: one more z slot, whose CTAs zero dK / dV rows past the last sequence (`zero_tail_rows`)
        grid = [cutlass.max(n_blocks, 1), cute.size(k, mode=[2]), batch + (1 if cutlass.const_expr(self.varlen) else 0)]
        self.kernel(mm.s, mm.kv, mm.dq, tma_q, gq, tma_do, gdo, tma_k, gk, tma_v, gv, tma_l, gl, tma_p, gp, dq_acc,
                    dk, dv, sem, cu_q, cu_k, Int32(cute.size(q, mode=[2]) // cute.size(k, mode=[2])), scale_log2,
                    scale, scale_over_cap, cap, window_left, window_right, sQ_layout, sK_layout, sdS_layout,
                    vec_layout).launch(grid=grid, block=[s.threads, 1, 1], stream=stream, **SETMAXNREG_LAUNCH)

    @cute.kernel
    def kernel(self, mma_s: cute.TiledMma, mma_kv: cute.TiledMma, mma_dq: cute.TiledMma, tma_q: cute.CopyAtom,
               mQ: cute.Tensor, tma_do: cute.CopyAtom, mdO: cute.Tensor, tma_k: cute.CopyAtom, mK: cute.Tensor,
               tma_v: cute.CopyAtom, mV: cute.Tensor, tma_l: cute.CopyAtom, mL: cute.Tensor, tma_p: cute.CopyAtom,
               mP: cute.Tensor, mdQ: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor, mSem: cute.Tensor,
               mCuQ: cute.Tensor | None, mCuK: cute.Tensor | None, group: Int32, scale_log2: Float32,
               scale: Float32, scale_over_cap: Float32, cap: Float32, left: Int32, right: Int32,
               sQ_layout: cute.ComposedLayout, sK_layout: cute.ComposedLayout, sdS_layout: cute.ComposedLayout,
               vec_layout: cute.Layout):
        s, d, dt = self.s, self.d, self.dtype
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = warp // 4
        if warp == 0:
            for atom in (tma_q, tma_do, tma_k, tma_v, tma_l, tma_p):
                cpasync.prefetch_descriptor(atom)
        smem = cutlass.memory.SmemAllocator()
        stor = smem.allocate(self.storage)
        st = s.stages
        q_bytes = cute.size_in_bytes(dt, cute.slice_(sQ_layout, (None, None, 0))) + s.tile_m * 4
        kv_bytes = 2 * cute.size_in_bytes(dt, cute.slice_(sK_layout, (None, None, 0)))
        consumer_warps = 4 * s.consumer_wgs
        pipe_q = make_pipeline(stor.q_bars.data_ptr(), st, q_bytes, (1, 1), consumer_warps)
        pipe_do = make_pipeline(stor.do_bars.data_ptr(), st, q_bytes, (1, 1), consumer_warps)
        pipe_kv = make_pipeline(stor.kv_bars.data_ptr(), 1, kv_bytes, (1, 1), consumer_warps)
        pipeline.pipeline_init_arrive(cluster_shape_mn=(1, 1), is_relaxed=True)
        sQ = stor.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sdO = stor.sdO.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = stor.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)[None, None, 0]
        sV = stor.sV.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)[None, None, 0]
        sdS = stor.sdS.get_tensor(sdS_layout.outer, swizzle=sdS_layout.inner)
        sPm = None
        if cutlass.const_expr(s.kv_split == "dim"):
            sPm = stor.sPm.get_tensor(sdS_layout.outer, swizzle=sdS_layout.inner)
        elif cutlass.const_expr(s.p_smem):
            sPr_layout = self.p_rows_layout()
            sPm = stor.sPm.get_tensor(sPr_layout.outer, swizzle=sPr_layout.inner)
        sL = stor.sL.get_tensor(vec_layout)
        sP = stor.sP.get_tensor(vec_layout)
        sdQ = stor.sdQ.get_tensor(cute.make_layout(s.tile_m * d * s.dq_buffers))
        pipeline.pipeline_init_wait(cluster_shape_mn=(1, 1))

        # ---- the CTA's keys and its walk (every thread computes the same values) ----
        n_block, hk, bb = cute.arch.block_idx()
        if cutlass.const_expr(self.deterministic and self.mask.right):
            # dQ's contributions go in descending key-block order here (`dq_writer`): the blocks launch in that order,
            # so that a block only ever waits for blocks launched before it
            gx, _, _ = cute.arch.grid_dim()
            n_block = gx - 1 - n_block
        q_start, seqlen_q, tile_base, bt = seq_rows(self.varlen, mCuQ, bb, extent(mQ, 0), s.tile_m)
        k_start, seqlen_k, _, _ = seq_rows(self.varlen, mCuK, bb, extent(mK, 0), s.tile_n)
        m_min, m_max = m_block_range(n_block, s.tile_m, s.tile_n, seqlen_q, seqlen_k, left, right, self.mask)
        m_count = cutlass.max(m_max - m_min, 0)
        steps = m_count * group  # the walk: the group's query heads, each over [m_min, m_max)
        w = SimpleNamespace(n_block=n_block, hk=hk, b=bt, bb=bb, q_start=q_start, k_start=k_start, seqlen_q=seqlen_q,
                            seqlen_k=seqlen_k, tile_base=tile_base, m_min=m_min, m_count=m_count, steps=steps,
                            group=group, left=left, right=right)
        if n_block * s.tile_n < seqlen_k:  # varlen: blocks past this sequence's keys do nothing
            if wg == 0:
                cute.arch.setmaxregister_decrease(s.producer_regs)
                if warp == 0:
                    self.producer(w, tma_q, mQ, tma_do, mdO, tma_k, mK, tma_v, mV, tma_l, mL, tma_p, mP, sQ, sdO, sK,
                                  sV, sL, sP, pipe_q, pipe_do, pipe_kv)
                elif warp == 1:
                    self.dq_writer(w, mdQ, sdQ, mSem)
            else:
                args = (w, tidx - 128, mma_s, mma_kv, mma_dq, sQ, sdO, sK, sV, sdS, sL, sP, sdQ, pipe_q, pipe_do,
                        pipe_kv, mdK, mdV, scale_log2, scale, scale_over_cap, cap)
                if cutlass.const_expr(s.kv_split == "dim"):
                    cute.arch.setmaxregister_increase(s.consumer_regs)
                    self.consumer_dsplit(*args, sPm)
                elif cutlass.const_expr(s.dq_wgs(d) == s.consumer_wgs):
                    cute.arch.setmaxregister_increase(s.consumer_budget(d, True))
                    self.consumer(*args, sPm=sPm)
                else:  # warpgroup 1 computes dQ alone: the code is traced once per role, with its own budget
                    if wg == 1:
                        cute.arch.setmaxregister_increase(s.consumer_budget(d, True))
                        self.consumer(*args, computes_dq=True, sPm=sPm)
                    else:
                        cute.arch.setmaxregister_increase(s.consumer_budget(d, False))
                        self.consumer(*args, computes_dq=False, sPm=sPm)
        if cutlass.const_expr(self.varlen):
            if bb == cute.size(mCuK, mode=[0]) - 1:  # the tail slot: key rows past the last sequence
                zero_tail_rows((mdK, mdV), mCuK, hk, n_block, s.tile_n, tidx, s.threads, dt, d)

    @cute.jit
    def step_coords(self, w: SimpleNamespace, i: Int32):
        """The i-th step of the walk: (query head, m block)."""
        return w.hk * w.group + i // cutlass.max(w.m_count, 1), w.m_min + i % cutlass.max(w.m_count, 1)

    # --- warp 0: the loads -------------------------------------------------------------------------
    @cute.jit
    def producer(self, w, tma_q, mQ, tma_do, mdO, tma_k, mK, tma_v, mV, tma_l, mL, tma_p, mP, sQ, sdO, sK, sV, sL,
                 sP, pipe_q, pipe_do, pipe_kv):
        s, d = self.s, self.d
        if w.steps > 0:
            mK_b = mK[(None, None, w.hk, w.b)]
            mV_b = mV[(None, None, w.hk, w.b)]
            if cutlass.const_expr(self.varlen):
                mK_b = cute.domain_offset((w.k_start, 0), mK_b)
                mV_b = cute.domain_offset((w.k_start, 0), mV_b)
            gK = cute.local_tile(mK_b, (s.tile_n, d), (w.n_block, 0))
            gV = cute.local_tile(mV_b, (s.tile_n, d), (w.n_block, 0))
            tKsK, tKgK = cpasync.tma_partition(tma_k, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2),
                                               cute.group_modes(gK, 0, 2))
            tVsV, tVgV = cpasync.tma_partition(tma_v, 0, cute.make_layout(1), cute.group_modes(sV, 0, 2),
                                               cute.group_modes(gV, 0, 2))
            kv = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
            pipe_kv.producer_acquire(kv)
            bar = pipe_kv.producer_get_barrier(kv)
            cute.copy(tma_k, tKgK, tKsK, tma_bar_ptr=bar)
            cute.copy(tma_v, tVgV, tVsV, tma_bar_ptr=bar)
            pipe_kv.producer_commit(kv)
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, s.stages)
            for i in cutlass.range(w.steps, unroll=1):
                h, m = self.step_coords(w, i)
                mQ_h = mQ[(None, None, h, w.b)]
                mdO_h = mdO[(None, None, h, w.b)]
                if cutlass.const_expr(self.varlen):
                    mQ_h = cute.domain_offset((w.q_start, 0), mQ_h)
                    mdO_h = cute.domain_offset((w.q_start, 0), mdO_h)
                gQ = cute.local_tile(mQ_h, (s.tile_m, d), (m, 0))
                gdO = cute.local_tile(mdO_h, (s.tile_m, d), (m, 0))
                gL = cute.local_tile(mL[(None, h, w.b)], (s.tile_m,), (w.tile_base + m,))
                gP = cute.local_tile(mP[(None, h, w.b)], (s.tile_m,), (w.tile_base + m,))
                tQsQ, tQgQ = cpasync.tma_partition(tma_q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2),
                                                   cute.group_modes(gQ, 0, 2))
                tOsO, tOgO = cpasync.tma_partition(tma_do, 0, cute.make_layout(1), cute.group_modes(sdO, 0, 2),
                                                   cute.group_modes(gdO, 0, 2))
                tLsL, tLgL = cpasync.tma_partition(tma_l, 0, cute.make_layout(1), sL, gL)
                tPsP, tPgP = cpasync.tma_partition(tma_p, 0, cute.make_layout(1), sP, gP)
                pipe_q.producer_acquire(state)
                bar_q = pipe_q.producer_get_barrier(state)
                cute.copy(tma_q, tQgQ, tQsQ[(None, state.index)], tma_bar_ptr=bar_q)
                cute.copy(tma_l, tLgL, tLsL[(None, state.index)], tma_bar_ptr=bar_q)
                pipe_q.producer_commit(state)
                pipe_do.producer_acquire(state)
                bar_o = pipe_do.producer_get_barrier(state)
                cute.copy(tma_do, tOgO, tOsO[(None, state.index)], tma_bar_ptr=bar_o)
                cute.copy(tma_p, tPgP, tPsP[(None, state.index)], tma_bar_ptr=bar_o)
                pipe_do.producer_commit(state)
                state.advance()
            pipe_q.producer_tail(state.clone())
            pipe_do.producer_tail(state)

    # --- warp 1: dQ partials into the fp32 accumulator ----------------------------------------------
    @cute.jit
    def dq_writer(self, w, mdQ, sdQ, mSem):
        """Per step: for each warpgroup's chunk of buffer i % dq_buffers, once the reduce-add that last read it is done,
        let the warpgroup write it (EMPTY); when it is written (FULL), add it into the accumulator with one bulk
        reduce-add. Two buffers let the consumers store block i + 1's dQ while block i's add waits (its turn, in
        deterministic mode)."""
        s, d = self.s, self.d
        chunks = s.dq_chunks(d)
        nbuf = s.dq_buffers
        chunk = s.tile_m * d // chunks
        lane = cute.arch.lane_idx()
        for i in cutlass.range(w.steps, unroll=1):
            h, m = self.step_coords(w, i)
            buf = i % nbuf
            for c in cutlass.range_constexpr(chunks):
                if cutlass.const_expr(not self.deterministic):
                    # groups are issued a chunk at a time, buffer after buffer: this one's last reader was chunks *
                    # (nbuf - 1) + (chunks - 1 - c) groups ago
                    cute.arch.cp_async_bulk_wait_group(chunks * (nbuf - 1) + chunks - 1 - c, read=True)
                cute.arch.barrier_arrive(barrier_id=_DQ_EMPTY + 2 * c + buf, number_of_threads=160)
            gdQ = mdQ[(None, w.tile_base + m, h, w.b)]
            if cutlass.const_expr(self.deterministic):
                # the key blocks that see query block m are [n_lo, n_hi); with a right bound (causal) the diagonal
                # block comes first, descending (each block then meets its first query blocks without waiting:
                # FA3's order), else ascending
                n_lo, n_hi = n_block_range(m, s.tile_m, s.tile_n, w.seqlen_q, w.seqlen_k, w.left, w.right, self.mask)
                want = w.n_block - n_lo
                if cutlass.const_expr(self.mask.right):
                    want = n_hi - 1 - w.n_block
                flag = (mSem.iterator + cute.crd2idx((w.tile_base + m, h, w.b), mSem.layout)).llvm_ptr
                if lane == 0:
                    seen = cute.arch.load(flag, Int32, sem="acquire", scope="gpu")
                    while seen != want:
                        seen = cute.arch.load(flag, Int32, sem="acquire", scope="gpu")
                cute.arch.sync_warp()
            for c in cutlass.range_constexpr(chunks):
                cute.arch.barrier(barrier_id=_DQ_FULL + 2 * c + buf, number_of_threads=160)
                if lane == 0:
                    reduce_add_bulk_f32((sdQ.iterator + buf * (s.tile_m * d) + c * chunk), (gdQ.iterator + c * chunk),
                                        chunk * 4)
                cute.arch.cp_async_bulk_commit_group()
            if cutlass.const_expr(self.deterministic):
                cute.arch.cp_async_bulk_wait_group(0, read=False)
                if lane == 0:
                    cute.arch.fence_acq_rel_gpu()
                    flag = (mSem.iterator + cute.crd2idx((w.tile_base + m, h, w.b), mSem.layout)).llvm_ptr
                    cute.arch.atomic_add(flag, Int32(1), sem="release", scope="gpu")
                cute.arch.sync_warp()
        cute.arch.cp_async_bulk_wait_group(0, read=False)

    # --- the consumer warpgroups ---------------------------------------------------------------------
    @cute.jit
    def consumer(self, w, ctid, mma_s, mma_kv, mma_dq, sQ, sdO, sK, sV, sdS, sL, sP, sdQ, pipe_q, pipe_do, pipe_kv,
                 mdK, mdV, scale_log2, scale, scale_over_cap, cap, computes_dq: cutlass.Constexpr = True, sPm=None):
        """Consumer warpgroup `ctid // 128` (keys [64 w, 64 w + 64) of the block); `computes_dq`: whether it has a part
        of dQ = dS K (with dq_split "one" the second warpgroup has none, and a smaller register budget); `sPm`: P^T's
        smem tile (p_smem)."""
        s, d, dt = self.s, self.d, self.dtype
        # `set` below gives the atom a new field value: on a copy, so that nothing this call creates is used after it
        # (it is traced once per warpgroup role under a run-time branch)
        mma_kv = cutlass.new_from_mlir_values(mma_kv, cutlass.extract_mlir_values(mma_kv))
        cwg = consumer_warpgroup()
        tid = ctid % 128
        chunks = s.dq_chunks(d)
        chunk = s.tile_m * d // chunks
        own_keys = s.split(d) == "k"
        early = s.early_stats and not self.softcap
        wg_s = mma_s.get_slice(cwg * 128)
        wg_kv = mma_kv.get_slice(cwg * 128)
        thr_s = mma_s.get_slice(ctid)
        thr_kv = mma_kv.get_slice(ctid)
        # S^T / dP^T: A = this warpgroup's K / V rows, B = the Q / dO stages
        tSrK = mma_s.make_fragment_A(wg_s.partition_A(sK))
        tSrV = mma_s.make_fragment_A(wg_s.partition_A(sV))
        tSrQ = mma_s.make_fragment_B(wg_s.partition_B(sQ))
        tSrdO = mma_s.make_fragment_B(wg_s.partition_B(sdO))
        # dK / dV: B = Q / dO seen as (D, tile_m) (MN-major)
        tKrQt = mma_kv.make_fragment_B(wg_kv.partition_B(transposed(sQ)))
        tVrdOt = mma_kv.make_fragment_B(wg_kv.partition_B(transposed(sdO)))
        acc_s = cute.make_rmem_tensor(thr_s.partition_shape_C((s.tile_n, s.tile_m)), Float32)
        acc_dp = cute.make_rmem_tensor(thr_s.partition_shape_C((s.tile_n, s.tile_m)), Float32)
        acc_dk = cute.make_rmem_tensor(thr_kv.partition_shape_C((s.tile_n, d)), Float32)
        acc_dv = cute.make_rmem_tensor(thr_kv.partition_shape_C((s.tile_n, d)), Float32)
        acc_dk.fill(0.0)
        acc_dv.fill(0.0)
        tScS = thr_s.partition_C(cute.make_identity_tensor((s.tile_n, s.tile_m)))
        # dS into its (keys, q) q-contiguous smem tile by stmatrix
        r2s_ds = epi.acc_smem_copy(mma_s, LayoutEnum.ROW_MAJOR, dt)
        tRS_sdS = r2s_ds.get_slice(ctid).partition_D(sdS)
        mma_pv, tVsP, tRS_sP = mma_kv, None, None
        if cutlass.const_expr(s.p_smem):  # dV's A operand from P^T in smem: this warpgroup's own key rows
            mma_pv = BwdMmas(dt, d, s).pv
            mma_pv.set(warpgroup.Field.ACCUMULATE, True)
            tVsP = mma_pv.make_fragment_A(mma_pv.get_slice(cwg * 128).partition_A(sPm))
            tRS_sP = r2s_ds.get_slice(ctid).partition_D(sPm)
        s_rows = acc_rows_view(acc_s)
        dp_rows = acc_rows_view(acc_dp)
        c_rows = acc_rows_view(tScS)
        cols = cute.size(s_rows, mode=[1])
        rows = cute.size(s_rows, mode=[0])
        mma_kv.set(warpgroup.Field.ACCUMULATE, True)
        pds_bar = pipeline.NamedBarrier(barrier_id=_PDS_BAR, num_threads=128 * s.consumer_wgs)
        # dQ = dS K: this warpgroup's part (dq_split "one": warpgroup 0's, traced but unused by the other role; "k":
        # the whole tile over this warpgroup's keys, its own dS rows and K rows)
        dq_slot = cutlass.min(cwg, chunks - 1)
        wg_dq = mma_dq.get_slice(dq_slot * 128)
        thr_dq = mma_dq.get_slice(dq_slot * 128 + tid)
        sdS_dq, sK_dq = sdS, sK
        if cutlass.const_expr(own_keys):
            sdS_dq = cute.local_tile(sdS, (64, s.tile_m, s.stages), (cwg, 0, 0))
            sK_dq = cute.local_tile(sK, (64, d), (cwg, 0))
        tdQrdS = mma_dq.make_fragment_A(wg_dq.partition_A(transposed(sdS_dq)))
        tdQrK = mma_dq.make_fragment_B(wg_dq.partition_B(transposed(sK_dq)))
        acc_dq = cute.make_rmem_tensor(thr_dq.partition_shape_C((s.tile_m, d)), Float32)
        sdQ_thr = mma_order(sdQ.iterator + dq_slot * chunk, tid, cute.size(acc_dq))
        one_minus_t2 = None
        if cutlass.const_expr(self.softcap):
            one_minus_t2 = cute.make_rmem_tensor(acc_s.shape, Float32)

        if w.steps > 0:
            kv = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
            pipe_kv.consumer_wait(kv)
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, s.stages)
            for i in cutlass.range(w.steps, unroll=1):
                _, m = self.step_coords(w, i)
                ms = cutlass.new_from_mlir_values(mma_s, cutlass.extract_mlir_values(mma_s))
                mq = cutlass.new_from_mlir_values(mma_dq, cutlass.extract_mlir_values(mma_dq))
                idx = state.index
                pipe_q.consumer_wait(state)
                warpgroup.fence()
                mma_blocks(ms, acc_s, tSrK, stage_of(tSrQ, idx), zero_first=True)
                warpgroup.commit_group()
                # early_stats: the column statistics (LSE2, later D) go into registers while the GEMMs run, so that no
                # exponential waits on its shared-memory load; else (and with softcap, whose tanh' tile needs those
                # registers) each is read where it is used
                stat = None
                if cutlass.const_expr(early):
                    stat = cute.make_rmem_tensor(cols, Float32)
                    for c in cutlass.range_constexpr(cols):
                        stat[c] = sL[c_rows[0, c][1], idx]
                pipe_do.consumer_wait(state)
                warpgroup.fence()
                mma_blocks(ms, acc_dp, tSrV, stage_of(tSrdO, idx), zero_first=True)
                warpgroup.commit_group()
                warpgroup.wait_group(1)
                # ---- P = exp2(S * scale_log2 - LSE2), masked (softcap first) ----
                if cutlass.const_expr(self.softcap):
                    apply_softcap(acc_s, scale_over_cap, cap, one_minus_t2)
                if self.needs_mask(w, m):
                    apply_mask(acc_s, tScS, m * s.tile_m, w.n_block * s.tile_n, w.seqlen_k, w.seqlen_k - w.seqlen_q, w.left, w.right,
                               self.mask, transposed=True)
                for c in cutlass.range_constexpr(cols):
                    lse_c = stat[c] if cutlass.const_expr(early) else sL[c_rows[0, c][1], idx]
                    for r in cutlass.range_constexpr(rows):
                        s_rows[r, c] = cute.math.exp2(s_rows[r, c] * scale_log2 - lse_c, fastmath=True)
                if cutlass.const_expr(early):
                    for c in cutlass.range_constexpr(cols):
                        stat[c] = sP[c_rows[0, c][1], idx]
                if cutlass.const_expr(s.early_dv):
                    # ---- dV += P^T dO, issued before the wait for dP^T (P's bf16 copy then lives beside S and dP) ----
                    self.issue_dv(mma_pv, acc_dv, acc_s, tVsP, tRS_sP, r2s_ds, stage_of(tVrdOt, idx), cwg)
                    warpgroup.wait_group(1)  # dP^T done (dV may run)
                else:
                    warpgroup.wait_group(0)
                # ---- dS = P (dP - D) ----
                for c in cutlass.range_constexpr(cols):
                    d_c = stat[c] if cutlass.const_expr(early) else sP[c_rows[0, c][1], idx]
                    for r in cutlass.range_constexpr(rows):
                        dp_rows[r, c] = s_rows[r, c] * (dp_rows[r, c] - d_c)
                if cutlass.const_expr(self.softcap):
                    for e in cutlass.range_constexpr(cute.size(acc_dp)):
                        acc_dp[e] = acc_dp[e] * one_minus_t2[e]
                if cutlass.const_expr(not s.early_dv):
                    # ---- dV += P^T dO: P converted after dS, so S and dP are the only fp32 tiles live at once ----
                    self.issue_dv(mma_pv, acc_dv, acc_s, tVsP, tRS_sP, r2s_ds, stage_of(tVrdOt, idx), cwg)
                ds_a = acc_as_a_operand(acc_dp, dt)
                # ---- dS -> smem (q-contiguous), for dQ ----
                if cutlass.const_expr(s.stages == 1 and not own_keys):
                    pds_bar.arrive_and_wait()  # the other warpgroup's dQ GEMM of the last block has read dS
                # dS's A-operand registers hold the accumulator's elements in its own linear order (one 64-row atom per
                # warpgroup: `acc_a_view` only regroups the modes), so they are also the source of the smem store
                epi.copy_acc_to_smem(r2s_ds, tRS_sdS[(None, None, None, idx)],
                                     cute.make_tensor(ds_a.iterator, acc_dp.layout))
                cute.arch.fence_view_async_shared()
                if cutlass.const_expr(own_keys):
                    cute.arch.barrier(barrier_id=_OWN_DS + cwg, number_of_threads=128)
                else:
                    pds_bar.arrive_and_wait()
                # ---- dQ = dS K (this warpgroup's part), dK += dS^T Q ----
                if cutlass.const_expr(computes_dq):
                    warpgroup.fence()
                    mma_blocks(mq, acc_dq, stage_of(tdQrdS, idx), tdQrK, zero_first=True)
                    warpgroup.commit_group()
                warpgroup.fence()
                mma_blocks(mma_kv, acc_dk, ds_a, stage_of(tKrQt, idx))
                warpgroup.commit_group()
                if cutlass.const_expr(computes_dq):
                    warpgroup.wait_group(2)
                    pipe_do.consumer_release(state)  # dV's GEMM has read dO
                    warpgroup.wait_group(1)
                    if cutlass.const_expr(own_keys):
                        self.store_dq_sum(acc_dq, sdQ_thr, cwg, i)
                    else:
                        self.store_dq_part(acc_dq, sdQ_thr, cwg, i)
                else:
                    warpgroup.wait_group(1)
                    pipe_do.consumer_release(state)
                warpgroup.wait_group(0)
                pipe_q.consumer_release(state)
                state.advance()
        # ---- dK = scale dK, dV: stored from registers, rows inside the sequence ----
        self.store_rows(mma_kv, acc_dk, ctid, w, mdK, scale)
        self.store_rows(mma_kv, acc_dv, ctid, w, mdV, Float32(1.0))

    @cute.jit
    def issue_dv(self, mma_pv, acc_dv, acc_s, tVsP, tRS_sP, r2s, tVrdOt, cwg):
        """dV += P^T dO, issued and committed: P^T (bf16) as the A operand from registers, or with p_smem stored to this
        warpgroup's rows of the P tile first (stmatrix; the warpgroup's last dV GEMM has read it: waited at the end
        of its step) and read from there."""
        p_a = acc_as_a_operand(acc_s, self.dtype)
        if cutlass.const_expr(self.s.p_smem):
            epi.copy_acc_to_smem(r2s, tRS_sP[(None, None, None, 0)], cute.make_tensor(p_a.iterator, acc_s.layout))
            cute.arch.fence_view_async_shared()
            cute.arch.barrier(barrier_id=_OWN_P + cwg, number_of_threads=128)
            warpgroup.fence()
            mma_blocks(mma_pv, acc_dv, tVsP[(None, None, None, 0)], tVrdOt)
        else:
            warpgroup.fence()
            mma_blocks(mma_pv, acc_dv, p_a, tVrdOt)
        warpgroup.commit_group()

    @cute.jit
    def store_dq_part(self, acc_dq, sdQ_thr, cwg, i):
        """The warpgroup's dQ part of step i into its chunk of buffer i % dq_buffers (MMA order, 128-bit stores), once
        the dQ warp has released it; then signal it written."""
        buf = i % self.s.dq_buffers
        cute.arch.barrier(barrier_id=_DQ_EMPTY + 2 * cwg + buf, number_of_threads=160)
        dst = cute.make_tensor((sdQ_thr.iterator + buf * (self.s.tile_m * self.d)).align(16), sdQ_thr.layout)
        cute.autovec_copy(cute.make_tensor(acc_dq.iterator, sdQ_thr.layout.shape), dst)
        cute.arch.fence_view_async_shared()
        cute.arch.barrier_arrive(barrier_id=_DQ_FULL + 2 * cwg + buf, number_of_threads=160)

    @cute.jit
    def store_dq_sum(self, acc_dq, sdQ_thr, cwg, i):
        """dq_split "k": the two warpgroups' partials of step i summed into buffer i % dq_buffers. Warpgroup 0 stores
        its partial once the dQ warp has released the buffer; warpgroup 1 then adds its own onto it and signals the sum
        written (the dQ warp's one chunk)."""
        buf = i % self.s.dq_buffers
        dst = cute.make_tensor((sdQ_thr.iterator + buf * (self.s.tile_m * self.d)).align(16), sdQ_thr.layout)
        mine = cute.make_tensor(acc_dq.iterator, sdQ_thr.layout.shape)
        if cwg == 0:
            cute.arch.barrier(barrier_id=_DQ_EMPTY + buf, number_of_threads=160)
            cute.autovec_copy(mine, dst)
            cute.arch.barrier_arrive(barrier_id=_DQ_HALF + buf, number_of_threads=256)
        else:
            cute.arch.barrier(barrier_id=_DQ_HALF + buf, number_of_threads=256)
            other = cute.make_rmem_tensor(sdQ_thr.layout.shape, Float32)
            cute.autovec_copy(dst, other)
            mine.store(mine.load() + other.load())
            cute.autovec_copy(mine, dst)
            cute.arch.fence_view_async_shared()
            cute.arch.barrier_arrive(barrier_id=_DQ_FULL + buf, number_of_threads=160)

    def needs_mask(self, w, m):
        """Whether query block m of this key block has a masked (query, key) pair: the key end or a band edge."""
        s, kind = self.s, self.mask
        off = w.seqlen_k - w.seqlen_q
        col0 = w.n_block * s.tile_n
        col1 = col0 + s.tile_n - 1
        row0 = m * s.tile_m
        row1 = row0 + s.tile_m - 1
        need = col1 >= w.seqlen_k
        if cutlass.const_expr(kind.right):
            need = need | (col1 > row0 + off + w.right)
        if cutlass.const_expr(kind.left):
            need = need | (col0 < row1 + off - w.left)
        return need

    @cute.jit
    def consumer_dsplit(self, w, ctid, mma_s, mma_kv, mma_dq, sQ, sdO, sK, sV, sdS, sL, sP, sdQ, pipe_q, pipe_do,
                        pipe_kv, mdK, mdV, scale_log2, scale, scale_over_cap, cap, sPm):
        """kv_split "dim" (D > 128): consumer warpgroup w computes S and dP for keys [32 w, 32 w + 32) of the 64-key
        block (per-row statistics), writes its P and dS halves to smem, and after the consumers' barrier dV, dK and dQ
        for head-dim columns [w D / 2, (w + 1) D / 2), every operand from smem."""
        s, d, dt = self.s, self.d, self.dtype
        mma_kv = cutlass.new_from_mlir_values(mma_kv, cutlass.extract_mlir_values(mma_kv))
        cwg = consumer_warpgroup()
        tid = ctid % 128
        chunk = s.tile_m * d // 2
        wg_s = mma_s.get_slice(cwg * 128)
        wg_kv = mma_kv.get_slice(cwg * 128)
        wg_dq = mma_dq.get_slice(cwg * 128)
        thr_s = mma_s.get_slice(ctid)
        thr_kv = mma_kv.get_slice(ctid)
        thr_dq = mma_dq.get_slice(ctid)
        # S / dP: A = the Q / dO stages, B = this warpgroup's K / V rows
        tSrQ = mma_s.make_fragment_A(wg_s.partition_A(sQ))
        tSrdO = mma_s.make_fragment_A(wg_s.partition_A(sdO))
        tSrK = mma_s.make_fragment_B(wg_s.partition_B(sK))
        tSrV = mma_s.make_fragment_B(wg_s.partition_B(sV))
        # dV / dK: A = P^T / dS^T (keys, q), B = dO / Q seen as (D, q): this warpgroup's columns
        tVrPt = mma_kv.make_fragment_A(wg_kv.partition_A(transposed(sPm)))
        tKrdSt = mma_kv.make_fragment_A(wg_kv.partition_A(transposed(sdS)))
        tVrdOt = mma_kv.make_fragment_B(wg_kv.partition_B(transposed(sdO)))
        tKrQt = mma_kv.make_fragment_B(wg_kv.partition_B(transposed(sQ)))
        # dQ: A = dS (q, keys), B = K seen as (D, keys)
        tdQrdS = mma_dq.make_fragment_A(wg_dq.partition_A(sdS))
        tdQrK = mma_dq.make_fragment_B(wg_dq.partition_B(transposed(sK)))
        acc_s = cute.make_rmem_tensor(thr_s.partition_shape_C((s.tile_m, s.tile_n)), Float32)
        acc_dp = cute.make_rmem_tensor(thr_s.partition_shape_C((s.tile_m, s.tile_n)), Float32)
        acc_dk = cute.make_rmem_tensor(thr_kv.partition_shape_C((s.tile_n, d)), Float32)
        acc_dv = cute.make_rmem_tensor(thr_kv.partition_shape_C((s.tile_n, d)), Float32)
        acc_dq = cute.make_rmem_tensor(thr_dq.partition_shape_C((s.tile_m, d)), Float32)
        acc_dk.fill(0.0)
        acc_dv.fill(0.0)
        tScS = thr_s.partition_C(cute.make_identity_tensor((s.tile_m, s.tile_n)))
        r2s = epi.acc_smem_copy(mma_s, LayoutEnum.ROW_MAJOR, dt)
        thr_r2s = r2s.get_slice(ctid)
        tRS_sP = thr_r2s.partition_D(sPm)
        tRS_sdS = thr_r2s.partition_D(sdS)
        s_rows = acc_rows_view(acc_s)
        dp_rows = acc_rows_view(acc_dp)
        c_rows = acc_rows_view(tScS)
        cols = cute.size(s_rows, mode=[1])
        rows = cute.size(s_rows, mode=[0])
        mma_kv.set(warpgroup.Field.ACCUMULATE, True)
        pds_bar = pipeline.NamedBarrier(barrier_id=_PDS_BAR, num_threads=256)
        sdQ_thr = mma_order(sdQ.iterator + cwg * chunk, tid, cute.size(acc_dq))
        one_minus_t2 = None
        if cutlass.const_expr(self.softcap):
            one_minus_t2 = cute.make_rmem_tensor(acc_s.shape, Float32)
        if w.steps > 0:
            kv = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
            pipe_kv.consumer_wait(kv)
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, s.stages)
            for i in cutlass.range(w.steps, unroll=1):
                _, m = self.step_coords(w, i)
                ms = cutlass.new_from_mlir_values(mma_s, cutlass.extract_mlir_values(mma_s))
                mq = cutlass.new_from_mlir_values(mma_dq, cutlass.extract_mlir_values(mma_dq))
                idx = state.index
                pipe_q.consumer_wait(state)
                warpgroup.fence()
                mma_blocks(ms, acc_s, stage_of(tSrQ, idx), tSrK, zero_first=True)
                warpgroup.commit_group()
                pipe_do.consumer_wait(state)
                warpgroup.fence()
                mma_blocks(ms, acc_dp, stage_of(tSrdO, idx), tSrV, zero_first=True)
                warpgroup.commit_group()
                warpgroup.wait_group(1)
                if cutlass.const_expr(self.softcap):
                    apply_softcap(acc_s, scale_over_cap, cap, one_minus_t2)
                if self.needs_mask(w, m):
                    apply_mask(acc_s, tScS, m * s.tile_m, w.n_block * s.tile_n, w.seqlen_k, w.seqlen_k - w.seqlen_q,
                               w.left, w.right, self.mask)
                for r in cutlass.range_constexpr(rows):
                    lse_r = sL[c_rows[r, 0][0], idx]
                    for c in cutlass.range_constexpr(cols):
                        s_rows[r, c] = cute.math.exp2(s_rows[r, c] * scale_log2 - lse_r, fastmath=True)
                warpgroup.wait_group(0)
                for r in cutlass.range_constexpr(rows):
                    d_r = sP[c_rows[r, 0][0], idx]
                    for c in cutlass.range_constexpr(cols):
                        dp_rows[r, c] = s_rows[r, c] * (dp_rows[r, c] - d_r)
                if cutlass.const_expr(self.softcap):
                    for e in cutlass.range_constexpr(cute.size(acc_dp)):
                        acc_dp[e] = acc_dp[e] * one_minus_t2[e]
                p_r = cute.make_rmem_tensor(acc_s.layout, dt)
                p_r.store(acc_s.load().to(dt))
                ds_r = cute.make_rmem_tensor(acc_dp.layout, dt)
                ds_r.store(acc_dp.load().to(dt))
                if cutlass.const_expr(s.stages == 1):
                    pds_bar.arrive_and_wait()  # the last block's GEMMs (both warpgroups) have read P and dS
                pst = idx if cutlass.const_expr(s.stages > 1) else 0
                epi.copy_acc_to_smem(r2s, tRS_sP[(None, None, None, pst)], p_r)
                epi.copy_acc_to_smem(r2s, tRS_sdS[(None, None, None, pst)], ds_r)
                cute.arch.fence_view_async_shared()
                pds_bar.arrive_and_wait()
                # ---- dK += dS^T Q, dV += P^T dO, dQ = dS K: this warpgroup's head-dim half. dK and dV first, so that
                # Q's and dO's stages go back to the producer (with one stage at D = 256: the next block's loads) while
                # dQ still runs ----
                warpgroup.fence()
                mma_blocks(mma_kv, acc_dk, stage_of(tKrdSt, pst), stage_of(tKrQt, idx))
                warpgroup.commit_group()
                warpgroup.fence()
                mma_blocks(mma_kv, acc_dv, stage_of(tVrPt, pst), stage_of(tVrdOt, idx))
                warpgroup.commit_group()
                warpgroup.fence()
                mma_blocks(mq, acc_dq, stage_of(tdQrdS, pst), tdQrK, zero_first=True)
                warpgroup.commit_group()
                warpgroup.wait_group(2)
                pipe_q.consumer_release(state)
                warpgroup.wait_group(1)
                pipe_do.consumer_release(state)
                warpgroup.wait_group(0)
                self.store_dq_part(acc_dq, sdQ_thr, cwg, i)
                state.advance()
        self.store_rows(mma_kv, acc_dk, ctid, w, mdK, scale)
        self.store_rows(mma_kv, acc_dv, ctid, w, mdV, Float32(1.0))

    @cute.jit
    def store_rows(self, mma_kv, acc, ctid, w, mOut, mul):
        """dK or dV (tile_n, D) of this block: `mul` * acc in the input dtype, key rows < seqlen_k only."""
        s, d = self.s, self.d
        r_o = cute.make_rmem_tensor(acc.shape, self.dtype)
        r_o.store((acc.load() * mul).to(self.dtype))
        mO = mOut[(None, None, w.hk, w.b)]
        if cutlass.const_expr(self.varlen):
            mO = cute.domain_offset((w.k_start, 0), mO)
        gO = cute.local_tile(mO, (s.tile_n, d), (w.n_block, 0))
        thr = mma_kv.get_slice(ctid)
        g_rows = acc_rows_view(thr.partition_C(gO))
        c_rows = acc_rows_view(thr.partition_C(cute.make_identity_tensor((s.tile_n, d))))
        o_rows = acc_rows_view(r_o)
        row0 = w.n_block * s.tile_n
        for r in cutlass.range_constexpr(cute.size(o_rows, mode=[0])):
            if row0 + c_rows[r, 0][0] < w.seqlen_k:
                for c in cutlass.range_constexpr(cute.size(o_rows, mode=[1])):
                    g_rows[r, c] = o_rows[r, c]


# --- preprocess: D = rowsum(dO * O) - dLSE, LSE2, the dQ accumulator zeroed ---------------------------
class FlashAttnBwdPre:
    """One CTA of 128 threads per (padded query tile, head, batch): 8 threads per row, then the tile's dQ accumulator
    chunk zeroed with 128-bit stores. `with_dlse`: a gradient into the LSE is read (else none: no zero tensor, no
    fill kernel); `zero_sem`: the tile's deterministic-mode semaphore is zeroed here too (one kernel fewer)."""

    def __init__(self, dtype, head_dim: int, tile_m: int, varlen: bool = False, with_dlse: bool = True,
                 zero_sem: bool = False):
        self.dtype, self.d, self.tile_m, self.varlen = dtype, head_dim, tile_m, varlen
        self.with_dlse, self.zero_sem = with_dlse, zero_sem

    @cute.jit
    def __call__(self, o: cute.Tensor, do: cute.Tensor, lse: cute.Tensor, dlse: cute.Tensor, lse2: cute.Tensor,
                 dpsum: cute.Tensor, dq_acc: cute.Tensor, sem: cute.Tensor, cu_q: cute.Tensor, max_seqlen_q: Int32,
                 stream):
        """o / do (S, D, H, B); lse / dlse (S, H, B) fp32 (dlse unread without `with_dlse`); lse2 / dpsum (S_pad, H,
        B); dq_acc (tile_m D, tiles, H, B); sem (tiles, H, B) int32 (unread without `zero_sem`); varlen: B = 1 packed
        and `cu_q` the offsets (batched: unread, and max_seqlen_q is S)."""
        if cutlass.const_expr(self.varlen):
            batch = cute.size(cu_q, mode=[0]) - 1
        else:
            batch = cute.size(o, mode=[3])
        tiles = (max_seqlen_q + self.tile_m - 1) // self.tile_m
        self.kernel(o, do, lse, dlse, lse2, dpsum, dq_acc, sem, cu_q).launch(
            grid=[cutlass.max(tiles, 1), cute.size(o, mode=[2]), batch], block=[128, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mO: cute.Tensor, mdO: cute.Tensor, mL: cute.Tensor, mdL: cute.Tensor, mL2: cute.Tensor,
               mD: cute.Tensor, mdQ: cute.Tensor, mSem: cute.Tensor, mCuQ: cute.Tensor):
        tm, d = self.tile_m, self.d
        tidx, _, _ = cute.arch.thread_idx()
        m, h, bb = cute.arch.block_idx()
        q_start, seqlen, base, bt = seq_rows(self.varlen, mCuQ, bb, extent(mO, 0), tm)
        if m * tm < seqlen:
            # rows in groups of 8 threads, each thread 16-byte vectors of O and dO a row apart by 8 (128 contiguous bytes
            # per group and step), the group's sum by a butterfly over its 8 lanes
            g = tidx % _PRE_GROUP
            vecs = d // 8
            for p in cutlass.range_constexpr(tm * _PRE_GROUP // 128):
                r = p * (128 // _PRE_GROUP) + tidx // _PRE_GROUP
                row = m * tm + r
                acc = Float32(0.0)
                if row < seqlen:
                    vo = cute.make_tensor(mO[(q_start + row, None, h, bt)].iterator,
                                          cute.make_layout((8, vecs), stride=(1, 8)))
                    vd = cute.make_tensor(mdO[(q_start + row, None, h, bt)].iterator,
                                          cute.make_layout((8, vecs), stride=(1, 8)))
                    for kk in cutlass.range_constexpr((vecs + _PRE_GROUP - 1) // _PRE_GROUP):
                        j = g + kk * _PRE_GROUP
                        if cutlass.const_expr(vecs % _PRE_GROUP == 0):
                            a = vo[(None, j)].load().to(Float32)
                            b = vd[(None, j)].load().to(Float32)
                            for e in cutlass.range_constexpr(8):
                                acc = acc + a[e] * b[e]
                        elif j < vecs:
                            a = vo[(None, j)].load().to(Float32)
                            b = vd[(None, j)].load().to(Float32)
                            for e in cutlass.range_constexpr(8):
                                acc = acc + a[e] * b[e]
                for off in (4, 2, 1):
                    acc = acc + cute.arch.shuffle_sync_bfly(acc, offset=off)
                if g == 0:
                    l2 = Float32(float("inf"))
                    if row < seqlen:
                        if cutlass.const_expr(self.with_dlse):
                            acc = acc - mdL[q_start + row, h, bt]
                        l2 = mL[q_start + row, h, bt] * Float32(LOG2E)
                    mL2[(base + m) * tm + r, h, bt] = l2
                    mD[(base + m) * tm + r, h, bt] = acc
            chunk = mdQ[(None, base + m, h, bt)]
            zeros = cute.make_rmem_tensor((4,), Float32)
            zeros.fill(0.0)
            vz = cute.make_tensor(chunk.iterator, cute.make_layout((4, tm * d // 4), stride=(1, 4)))
            for j in cutlass.range(tidx, tm * d // 4, 128, unroll=4):
                vz[(None, j)].store(zeros.load())
            if cutlass.const_expr(self.zero_sem):
                if tidx == 0:
                    mSem[base + m, h, bt] = Int32(0)


# --- postprocess: dQ = scale * accumulator, in the input dtype ------------------------------------------
class FlashAttnBwdPost:
    """One CTA of 128 x dq_chunks threads per (query tile, head, batch): each thread reads its values of the MMA-order
    chunk and writes them where the dQ partition of the main kernel put them, rows < seqlen_q only."""

    def __init__(self, dtype, head_dim: int, schedule: AttentionBwdSchedule, varlen: bool = False):
        self.dtype, self.d, self.s, self.varlen = dtype, head_dim, schedule, varlen

    @cute.jit
    def __call__(self, dq_acc: cute.Tensor, dq: cute.Tensor, cu_q: cute.Tensor, max_seqlen_q: Int32, scale: Float32,
                 stream):
        s, d = self.s, self.d
        mm = BwdMmas(self.dtype, d, s)
        if cutlass.const_expr(self.varlen):
            batch = cute.size(cu_q, mode=[0]) - 1
        else:
            batch = cute.size(dq, mode=[3])
        tiles = (max_seqlen_q + s.tile_m - 1) // s.tile_m
        # varlen: one more z slot, whose CTAs zero dQ rows past the last sequence (`zero_tail_rows`)
        self.kernel(mm.dq, dq_acc, dq, cu_q, scale).launch(
            grid=[cutlass.max(tiles, 1), cute.size(dq, mode=[2]), batch + (1 if cutlass.const_expr(self.varlen) else 0)],
            block=[128 * s.dq_chunks(d), 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mma_dq: cute.TiledMma, mAcc: cute.Tensor, mdQ: cute.Tensor, mCuQ: cute.Tensor, scale: Float32):
        s, d = self.s, self.d
        tidx, _, _ = cute.arch.thread_idx()
        m, h, bb = cute.arch.block_idx()
        q_start, seqlen, base, bt = seq_rows(self.varlen, mCuQ, bb, extent(mdQ, 0), s.tile_m)
        if m * s.tile_m < seqlen:
            chunk = s.tile_m * d // s.dq_chunks(d)
            cwg = tidx // 128
            tid = tidx % 128
            thr = mma_dq.get_slice(tidx)
            acc = cute.make_rmem_tensor(thr.partition_shape_C((s.tile_m, d)), Float32)
            n = cute.size(acc)
            g = mAcc[(None, base + m, h, bt)]
            src = mma_order(g.iterator + cwg * chunk, tid, n)
            cute.autovec_copy(src, cute.make_tensor(acc.iterator, src.layout.shape))
            r_o = cute.make_rmem_tensor(acc.shape, self.dtype)
            r_o.store((acc.load() * scale).to(self.dtype))
            mO = mdQ[(None, None, h, bt)]
            if cutlass.const_expr(self.varlen):
                mO = cute.domain_offset((q_start, 0), mO)
            gO = cute.local_tile(mO, (s.tile_m, d), (m, 0))
            if cutlass.const_expr(s.dq_chunks(d) == 1 or s.dq_tile(d)[1] % 64 == 0):
                # through smem: 16-byte row stores (rows < seqlen) instead of the accumulator layout's 4-byte pairs
                sO_layout = epi.smem_layout(LayoutEnum.ROW_MAJOR, self.dtype, (s.tile_m, d), 1)
                smem = cutlass.memory.SmemAllocator()
                sO = smem.allocate_tensor(self.dtype, sO_layout.outer, byte_alignment=1024, swizzle=sO_layout.inner)
                epi.store_rows_staged(mma_dq, r_o, sO[(None, None, 0)], gO, m * s.tile_m, seqlen, tidx,
                                      128 * s.dq_chunks(d))
            else:  # D = 192's two 96-column halves: no stmatrix partition of the tile; the accumulator's own layout
                g_rows = acc_rows_view(thr.partition_C(gO))
                c_rows = acc_rows_view(thr.partition_C(cute.make_identity_tensor((s.tile_m, d))))
                o_rows = acc_rows_view(r_o)
                row0 = m * s.tile_m
                for r in cutlass.range_constexpr(cute.size(o_rows, mode=[0])):
                    if row0 + c_rows[r, 0][0] < seqlen:
                        for c in cutlass.range_constexpr(cute.size(o_rows, mode=[1])):
                            g_rows[r, c] = o_rows[r, c]
        if cutlass.const_expr(self.varlen):
            if bb == cute.size(mCuQ, mode=[0]) - 1:  # the tail slot: query rows past the last sequence
                zero_tail_rows((mdQ,), mCuQ, h, m, s.tile_m, tidx, 128 * s.dq_chunks(d), self.dtype, d)
