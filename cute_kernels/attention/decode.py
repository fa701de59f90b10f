"""Decode attention on Hopper (flash decoding): a few query rows per sequence against a long KV cache, contiguous
or paged, split across CTAs along the keys.

One CTA per (row tile, batch x KV head, split) (`schedules.decode`): the q_len x g query rows that read KV head hk
(g = H_q / H_kv; packed row r is query position t = r // g of query head hk g + r % g) fill the 64 rows of one
WGMMA M (GQA packing), so a KV head's keys are read once for all its query heads. The split's key tiles are
[first, last) of the sequence's ceil(L / tile_n) (`split_range`), L = cache_seqlens[b] + the appended tokens,
read on the device.

Warp roles (160 threads): warp 4 is the producer: it issues TMA loads of K (tile_n, D) and V^T (D, tile_n) tiles
into `stages` swizzled buffers on the stage ring's mbarriers. Warpgroup 1 is the consumer: it gathers its 64
packed Q rows into a swizzled smem tile (rows past q_len x g are zeros), then per tile S = Q K^T (WGMMA, both from
smem), softcap, mask, the online softmax (`collectives.online_softmax`), O += P V (P as the register A operand),
and at the end O / l and LSE. Rows are masked per their query position: key j of a row at position t is
visible when j < L and, bottom-right aligned as FlashAttention, L - q_len + t - left <= j <= L - q_len + t + right
(causal: right = 0).

Paged KV: the cache is (num_pages, page_size, H_kv, D) and block_table[b, i] is the page holding keys
[i page_size, (i + 1) page_size) of sequence b. The kernel sees K as (page_size, D, H_kv, num_pages) and V^T as
(D, page_size, H_kv, num_pages); a contiguous cache (B, L_max, H_kv, D) is the same with page_size = L_max and
sequence b's only page b (no table read). A tile is filled by `boxes` TMA boxes of box_rows = gcd(page_size,
tile_n) keys each (one box when pages are at least a tile), each from its own page, into consecutive rows of the
stage: the K-major (and V's MN-major) 128-byte-swizzled tile keeps 8 x 128-byte atoms whole for any box of a
multiple of 8 rows, so a box lands where the full-tile box would have put those rows. A box past the sequence's
last key re-reads the last box that holds keys (its page exists; its keys are masked), so no table entry past
the sequence's pages is read.

Keys past L in the last tile are masked in S (their K may be anything: the masked value replaces it). Their V
rows are zeroed in smem before that tile's P V: P is 0 there, but 0 x NaN would poison O, and a cache's unwritten
rows may hold anything.

Outputs: with `split` (more than one split), the partial O (splits, B, q_len, H_q, D) and LSE (splits, B, H_q,
q_len) in fp32, merged by `merge.MergeStates`: by the merge kernel, launched behind this one as a programmatic
dependent, or with `fused_merge` by the last split of each cell to finish. A split with no tiles writes LSE = -inf
(and O = 0, which the merge does not read). Without `split`: O (1, B, q_len, H_q, D) in the input dtype and LSE
(1, B, H_q, q_len) directly. A row that sees no key gets O = 0 and LSE = +inf (the forward's convention).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

from collectives import pdl
from collectives.attention_mask import MaskKind, apply_softcap
from collectives.online_softmax import (
    NEG_INF,
    acc_cols_view,
    acc_rows_view,
    empty_rows,
    finalize_rows,
    softmax_rows,
    update_rows,
)
from collectives.reduce import column_smem_slots, warpgroup_column_reduce
from collectives.split_counter import last_split
from collectives.tma_pipeline import make_pipeline, operand_smem_layout
from collectives.wgmma_mainloop import (
    acc_as_a_operand,
    e4m3x2_to_f16x2,
    fence_operand,
    mma_blocks,
    permute_bytes,
    stage_of,
)
from cute_kernels.attention.merge import MergeStates
from schedules.decode import MERGE_MAX_CHUNK, MERGE_VEC, ROWS_PER_TILE, DecodeSchedule, MergeSchedule

_Q_BAR = 1  # named barrier: the consumer warpgroup's Q tile (and zeroed V rows) written before its WGMMAs
_Q_VEC = 8  # Q elements per gathered vector (16 bytes)


def box_rows(page_size: int, tile_n: int) -> int:
    """Keys per TMA box: the whole tile for a contiguous cache (page_size 0), else gcd(page_size, tile_n)."""
    return tile_n if page_size == 0 else math.gcd(page_size, tile_n)


KV_SCALES = ("none", "head", "token")


def frag_word(j: int, l: int, mb: int, ks: int, m_blocks: int) -> int:
    """The 32-bit word of a WGMMA register A fragment ((2, 2, 2), m_blocks, k_blocks) holding the element pair
    (row 8 j, columns 8 l + (0, 1)) of m64 block mb and k16 block ks: fragments are compact, the pair fastest."""
    return j + 2 * l + 4 * (mb + m_blocks * ks)


class FlashDecode:
    def __init__(self, dtype, head_dim: int, schedule: DecodeSchedule, page_size: int = 0,
                 mask: MaskKind = MaskKind(), softcap: bool = False, split: bool = False, kv_scale: str = "none"):
        self.dtype, self.d, self.s = dtype, head_dim, schedule
        self.page_size, self.mask, self.softcap, self.split = page_size, mask, softcap, split
        if kv_scale not in KV_SCALES:
            raise ValueError(f"decode: kv_scale must be one of {KV_SCALES}, got {kv_scale!r}")
        # an FP8 KV cache: e4m3 K/V tiles staged by TMA, widened to fp16 in smem by the consumer (K, V times their
        # per-token scales there; per-head scales folded into the softmax scale and O), Q and P in fp16
        self.kv_scale = kv_scale
        self.kv8 = kv_scale != "none"
        # swapped operands (keys in M, packed rows in N = swap_rows): K and V loaded from the stage ring into the
        # A operand's registers (an FP8 cache widened there), V staged like K
        self.swap = schedule.swap_rows
        self.v_like_k = self.kv8 or bool(self.swap)
        if self.swap and self.kv8 and head_dim < 128:
            raise ValueError(f"decode: swapped operands (swap_rows={self.swap}) with an FP8 cache need head_dim >= 128 "
                             f"(a key's V part is D / 32 bytes, one 32-bit load), got {head_dim}")
        self.kv_dtype = cutlass.Float8E4M3FN if self.kv8 else dtype
        self.mma_dtype = cutlass.Float16 if self.kv8 else dtype
        # FP8: the 16-element vectors of a K or V tile each consumer thread widens (one key each)
        self.widen_steps = schedule.tile_n * head_dim // 16 // 128
        self.box = box_rows(page_size, schedule.tile_n)
        if self.box % 8:
            raise ValueError(f"decode: page_size {page_size} and tile_n {schedule.tile_n} give {self.box}-key TMA "
                             "boxes; a page must be a multiple of 16 keys")
        self.boxes = schedule.tile_n // self.box

    @cute.jit
    def __call__(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, o: cute.Tensor, lse: cute.Tensor,
                 o_final: cute.Tensor, lse_final: cute.Tensor, counter: cute.Tensor, seqlens: cute.Tensor,
                 block_table: cute.Tensor, k_scale: cute.Tensor, v_scale: cute.Tensor, seqlen_add: Int32, splits: Int32,
                 scale_log2: Float32, scale_lse: Float32, scale_over_cap: Float32, cap: Float32, window_left: Int32,
                 window_right: Int32, stream):
        """q (B, q_len, H_q, D); K (page rows, D, H_kv, pages), V^T (D, page rows, H_kv, pages); O (splits or 1, B,
        q_len, H_q, D), LSE (splits or 1, B, H_q, q_len); seqlens (B,) int32; block_table (B, max_pages) int32
        (unread for a contiguous cache); seqlen_add: keys past seqlens[b] that count (the appended tokens).
        `fused_merge` (with `split`): the last split of each (row tile, KV head, batch) to finish merges the partials
        into O (B, q_len, H_q, D) and LSE (B, H_q, q_len) = o_final / lse_final; `counter` (int32 (B, H_kv, row
        tiles), zero before the launch and after it) counts the finished splits. Unread otherwise.
        FP8 KV: K and V both (page rows, D, H_kv, pages) e4m3; k_scale / v_scale (pages, page rows, H_kv) fp32 per
        token, or per head (1, 1, H_kv); unread without FP8."""
        s, d, dt = self.s, self.d, self.mma_dtype
        kt = self.kv_dtype
        k_major, mn_major = cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN
        if cutlass.const_expr(self.swap):
            # S^T = K Q^T and O^T = V^T P^T: one MMA shape, A (K or V^T) from registers, B (Q^T or P^T) K-major
            tiled_mma_qk = sm90_utils.make_trivial_tiled_mma(dt, dt, k_major, k_major, Float32, (1, 1, 1),
                                                             tiler_mn=(64, self.swap),
                                                             a_source=warpgroup.OperandSource.RMEM)
            tiled_mma_pv = tiled_mma_qk
        else:
            tiled_mma_qk = sm90_utils.make_trivial_tiled_mma(dt, dt, k_major, k_major, Float32, (1, 1, 1),
                                                             tiler_mn=(ROWS_PER_TILE, s.tile_n))
            tiled_mma_pv = sm90_utils.make_trivial_tiled_mma(dt, dt, k_major, mn_major, Float32, (1, 1, 1),
                                                             tiler_mn=(ROWS_PER_TILE, d),
                                                             a_source=warpgroup.OperandSource.RMEM)
        stages = s.num_stages(d, kt.width // 8)
        # the MMA's operand tiles: the stage ring itself, or with FP8 KV one widened fp16 K and V tile beside the
        # ring of e4m3 (keys, D) tiles the TMA fills; with swapped operands none (K and V go to registers)
        mma_stages = 1 if self.kv8 else stages
        sQ_layout = operand_smem_layout(LayoutEnum.ROW_MAJOR, dt, s.rows_per_tile, d, 1)
        sK_layout = operand_smem_layout(LayoutEnum.ROW_MAJOR, dt, s.tile_n, d, mma_stages)
        sV_layout = operand_smem_layout(LayoutEnum.COL_MAJOR, dt, d, s.tile_n, mma_stages)
        # swapped operands: P^T (swap_rows, tile_n), K-major
        sP_layout = operand_smem_layout(LayoutEnum.ROW_MAJOR, dt, self.swap or 8, s.tile_n, 1)
        # FP8 or swapped operands: K and V both staged as (keys, D) tiles of one layout
        sK8_layout = (operand_smem_layout(LayoutEnum.ROW_MAJOR, kt, s.tile_n, d, stages) if self.v_like_k
                      else sK_layout)
        sV8_layout = sK8_layout if self.v_like_k else sV_layout
        # one box: the first box_rows keys of a stage (K: rows of the K-major tile; V^T: columns of the MN-major one)
        k_box = cute.make_composed_layout(sK8_layout.inner, 0, cute.composition(
            cute.slice_(sK8_layout.outer, (None, None, 0)), cute.make_layout((self.box, d), stride=(1, s.tile_n))))
        tma_k, tma_gk = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), k, k_box, (self.box, d))
        if cutlass.const_expr(self.v_like_k):
            tma_v, tma_gv = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), v, k_box, (self.box, d))
        else:
            v_box = cute.make_composed_layout(sV_layout.inner, 0, cute.composition(
                cute.slice_(sV_layout.outer, (None, None, 0)), cute.make_layout((d, self.box), stride=(1, d))))
            tma_v, tma_gv = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), v, v_box, (d, self.box))

        # with FP8 KV or swapped operands the (keys, D) stage ring beside the MMA's tiles; unused fields are 16-byte
        # placeholders (a struct's fields cannot be conditional)
        ring8 = (cute.cosize(sK8_layout), 1024) if self.v_like_k else (16, 16)
        mma_k = (cute.cosize(sK_layout), 1024) if not self.swap else (16, 16)
        mma_v = (cute.cosize(sV_layout), 1024) if not self.swap else (16, 16)
        swap_p = (cute.cosize(sP_layout), 1024) if self.swap else (16, 16)
        swap_red = column_smem_slots(self.swap // 4) if self.swap else 4

        @cute.struct
        class Storage:
            k_bars: cute.struct.MemRange[cutlass.Int64, stages * 2]
            v_bars: cute.struct.MemRange[cutlass.Int64, stages * 2]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dt, mma_k[0]], mma_k[1]]
            sV: cute.struct.Align[cute.struct.MemRange[dt, mma_v[0]], mma_v[1]]
            merge_slot: cute.struct.MemRange[Int32, 1]  # the finished-split count the counter's add returned
            red: cute.struct.Align[cute.struct.MemRange[Float32, swap_red], 16]  # the column reduction's slots
            sP: cute.struct.Align[cute.struct.MemRange[dt, swap_p[0]], swap_p[1]]
            sK8: cute.struct.Align[cute.struct.MemRange[kt, ring8[0]], ring8[1]]
            sV8: cute.struct.Align[cute.struct.MemRange[kt, ring8[0]], ring8[1]]

        self.storage = Storage
        q_len = cute.size(q, mode=[1])
        group = cute.size(q, mode=[2]) // cute.size(k, mode=[2])
        m_tiles = (q_len * group + s.rows_per_tile - 1) // s.rows_per_tile
        grid = [m_tiles, cute.size(k, mode=[2]) * splits, cute.size(q, mode=[0])]
        self.kernel(tiled_mma_qk, tiled_mma_pv, tma_k, tma_gk, tma_v, tma_gv, q, o, lse, o_final, lse_final, counter,
                    seqlens, block_table, k_scale, v_scale,
                    seqlen_add, splits, scale_log2, scale_lse, scale_over_cap, cap, window_left, window_right,
                    sQ_layout, sK_layout, sV_layout, sK8_layout, sV8_layout, sP_layout).launch(
                        grid=grid, block=[s.threads, 1, 1], stream=stream, use_pdl=pdl.LAUNCH)

    @cute.kernel
    def kernel(self, tiled_mma_qk: cute.TiledMma, tiled_mma_pv: cute.TiledMma, tma_k: cute.CopyAtom, mK: cute.Tensor,
               tma_v: cute.CopyAtom, mV: cute.Tensor, mQ: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
               mOFinal: cute.Tensor, mLSEFinal: cute.Tensor, mCounter: cute.Tensor, mSeqlens: cute.Tensor,
               mBT: cute.Tensor, mKS: cute.Tensor, mVS: cute.Tensor, seqlen_add: Int32, splits: Int32,
               scale_log2: Float32, scale_lse: Float32, scale_over_cap: Float32, cap: Float32, window_left: Int32,
               window_right: Int32, sQ_layout: cute.ComposedLayout, sK_layout: cute.ComposedLayout,
               sV_layout: cute.ComposedLayout, sK8_layout: cute.ComposedLayout, sV8_layout: cute.ComposedLayout,
               sP_layout: cute.ComposedLayout):
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp == 4:
            cpasync.prefetch_descriptor(tma_k)
            cpasync.prefetch_descriptor(tma_v)
        smem = cutlass.memory.SmemAllocator()
        st = smem.allocate(self.storage)
        stages = cute.size(sK8_layout, mode=[2])
        kv_bytes = cute.size_in_bytes(self.kv_dtype, cute.slice_(sK8_layout, (None, None, 0)))
        pipe_k = make_pipeline(st.k_bars.data_ptr(), stages, kv_bytes, (1, 1), 4)
        pipe_v = make_pipeline(st.v_bars.data_ptr(), stages, kv_bytes, (1, 1), 4)
        pipeline.pipeline_init_arrive(cluster_shape_mn=(1, 1), is_relaxed=True)
        sQ = st.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        # the TMA's stage ring: the operand tiles themselves, or the FP8 tiles the consumer widens into them, or
        # with swapped operands the tiles it loads into registers
        if cutlass.const_expr(self.swap):
            sK = st.sP.get_tensor(sP_layout.outer, swizzle=sP_layout.inner)  # (P^T in the operand tile's place)
            sV = st.red.get_tensor(cute.make_layout(column_smem_slots(self.swap // 4)))
        else:
            sK = st.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
            sV = st.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        sK8, sV8 = sK, sV
        if cutlass.const_expr(self.v_like_k):
            sK8 = st.sK8.get_tensor(sK8_layout.outer, swizzle=sK8_layout.inner)
            sV8 = st.sV8.get_tensor(sV8_layout.outer, swizzle=sV8_layout.inner)
        pipeline.pipeline_init_wait(cluster_shape_mn=(1, 1))
        m_tile, by, b = cute.arch.block_idx()
        kv_heads = cute.size(mK, mode=[2])
        hk = by % kv_heads
        split = by // kv_heads
        q_len = cute.size(mQ, mode=[1])
        if warp == 4:  # the split's first K / V tiles into L2 while the previous kernel (the append) ends
            early_first, early_count = self.split_range(mSeqlens[b] + seqlen_add, q_len, window_left, split, splits)
            self.prefetch_kv(tma_k, mK, sK8, tma_v, mV, sV8, mBT, b, hk, mSeqlens[b] + seqlen_add, early_first,
                             early_count, stages)
        # programmatic dependent launch: the set-up above overlaps the previous kernel's tail (the append, the last
        # layer); nothing it wrote is read before this wait but the prefetches' addresses (cache_seqlens, the block
        # table: a stale value only wastes a prefetch, `prefetch_kv`). The merge behind this kernel may launch now: its CTAs
        # wait (griddepcontrol.wait) for this grid's completion and its memory, sitting beside these CTAs meanwhile
        # (a split grid is one wave), so its launch latency is off the path.
        pdl.enter()

        seqlen_k = mSeqlens[b] + seqlen_add
        first, count = self.split_range(seqlen_k, q_len, window_left, split, splits)

        if warp == 4:
            self.produce(tma_k, mK, sK8, tma_v, mV, sV8, pipe_k, pipe_v, mBT, b, hk, seqlen_k, first, count)
        elif warp < 4:
            fin = SimpleNamespace(o=mOFinal, lse=mLSEFinal, counter=mCounter, splits=splits,
                                  slot=st.merge_slot.get_tensor(cute.make_layout(1)))
            kv8 = SimpleNamespace(sK=sK8, sV=sV8, ks=mKS, vs=mVS, bt=mBT)
            if cutlass.const_expr(self.swap):
                self.consume_swapped(tiled_mma_qk, mQ, sQ, sK, sV, pipe_k, pipe_v, mO, mLSE, b, hk,
                                     cute.size(mQ, mode=[2]) // kv_heads, split, seqlen_k, first, count, scale_log2,
                                     scale_lse, scale_over_cap, cap, window_left, window_right, fin, kv8)
            else:
                self.consume(tiled_mma_qk, tiled_mma_pv, mQ, sQ, sK, sV, pipe_k, pipe_v, mO, mLSE, b, hk,
                             cute.size(mQ, mode=[2]) // kv_heads, m_tile, split, seqlen_k, first, count, scale_log2,
                             scale_lse, scale_over_cap, cap, window_left, window_right, fin, kv8)

    @cute.jit
    def split_range(self, seqlen_k: Int32, q_len: Int32, left: Int32, split: Int32, splits: Int32):
        """(first tile, tile count) of this split: the sequence's tiles that any row may see ([the left edge of the
        lowest row's window, the last key]) cut into `splits` runs of equal length, the last ones shorter or empty."""
        s = self.s
        n_hi = (seqlen_k + s.tile_n - 1) // s.tile_n
        n_lo = Int32(0)
        if cutlass.const_expr(self.mask.left):
            n_lo = cutlass.max(seqlen_k - q_len - left, 0) // s.tile_n
        total = cutlass.max(n_hi - n_lo, 0)
        per = (total + splits - 1) // splits
        first = n_lo + split * per
        count = cutlass.max(cutlass.min(first + per, n_hi) - first, 0)
        return first, count

    # --- the producer warp --------------------------------------------------------------------------------------
    @cute.jit
    def kv_boxes(self, tma_k: cute.CopyAtom, mK: cute.Tensor, sK: cute.Tensor, tma_v: cute.CopyAtom, mV: cute.Tensor,
                 sV: cute.Tensor, hk: Int32):
        """KV head hk's TMA partitions: (tKsK, tKgK, tVsV, tVgV), the stage ring's boxes and the cache's."""
        d = self.d
        # global: (box, D) boxes of (page rows, D, pages) / (D, box) of (D, page rows, pages); smem: the boxes of a stage
        gK = cute.flat_divide(mK[(None, None, hk, None)], (self.box, d))  # (box, D, page boxes, 1, pages)
        # V^T: (D, box, 1, page boxes, pages); FP8 V (or with swapped operands) is staged like K
        gV = cute.flat_divide(mV[(None, None, hk, None)], (self.box, d) if self.v_like_k else (d, self.box))
        sKb = cute.flat_divide(sK, (self.box, d))  # (box, D, boxes, 1, stages)
        sVb = cute.flat_divide(sV, (self.box, d) if self.v_like_k else (d, self.box))  # (D, box, 1, boxes, stages)
        tKsK, tKgK = cpasync.tma_partition(tma_k, 0, cute.make_layout(1), cute.group_modes(sKb, 0, 2),
                                           cute.group_modes(gK, 0, 2))
        tVsV, tVgV = cpasync.tma_partition(tma_v, 0, cute.make_layout(1), cute.group_modes(sVb, 0, 2),
                                           cute.group_modes(gV, 0, 2))
        return tKsK, tKgK, tVsV, tVgV

    @cute.jit
    def v_box(self, tVgV: cute.Tensor, pbox: Int32, page: Int32):
        """The cache's V box `pbox` of `page` (V^T's boxes, or K's layout for an FP8 / swapped V)."""
        if cutlass.const_expr(self.v_like_k):
            return tVgV[(None, pbox, 0, page)]
        return tVgV[(None, 0, pbox, page)]

    @cute.jit
    def prefetch_kv(self, tma_k: cute.CopyAtom, mK: cute.Tensor, sK: cute.Tensor, tma_v: cute.CopyAtom,
                    mV: cute.Tensor, sV: cute.Tensor, mBT: cute.Tensor, b: Int32, hk: Int32, seqlen_k: Int32,
                    first: Int32, count: Int32, tiles: Int32):
        """L2 prefetches (TMA) of the split's first `tiles` K and V tiles, issued before the PDL wait so the cache's
        bytes stream in while the previous kernel (the append) ends. A prefetch is only a hint and L2 is where every
        write lands, so the appended rows cannot be read stale. seqlen_k may itself be stale here (written by the
        previous kernel): box indices are clamped to the block table's columns, and TMA drops boxes outside the
        cache."""
        _, tKgK, _, tVgV = self.kv_boxes(tma_k, mK, sK, tma_v, mV, sV, hk)
        last_box = cutlass.max(seqlen_k - 1, 0) // self.box
        if cutlass.const_expr(self.page_size != 0):
            last_box = cutlass.min(last_box, cute.size(mBT, mode=[1]) * (self.page_size // self.box) - 1)
        for i in cutlass.range(cutlass.min(count, tiles), unroll=1):
            for j in cutlass.range_constexpr(self.boxes):
                page, pbox = self.box_source(mBT, b, cutlass.min((first + i) * self.boxes + j, last_box))
                cute.prefetch(tma_k, tKgK[(None, pbox, 0, page)])
                cute.prefetch(tma_v, self.v_box(tVgV, pbox, page))

    @cute.jit
    def produce(self, tma_k: cute.CopyAtom, mK: cute.Tensor, sK: cute.Tensor, tma_v: cute.CopyAtom, mV: cute.Tensor,
                sV: cute.Tensor, pipe_k, pipe_v, mBT: cute.Tensor, b: Int32, hk: Int32, seqlen_k: Int32, first: Int32,
                count: Int32):
        tKsK, tKgK, tVsV, tVgV = self.kv_boxes(tma_k, mK, sK, tma_v, mV, sV, hk)
        last_box = cutlass.max(seqlen_k - 1, 0) // self.box  # the sequence's last box that holds keys
        kv = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, cute.size(sK, mode=[2]))
        for i in cutlass.range(count, unroll=1):
            n = first + i
            pipe_k.producer_acquire(kv)
            for j in cutlass.range_constexpr(self.boxes):
                page, pbox = self.box_source(mBT, b, cutlass.min(n * self.boxes + j, last_box))
                cute.copy(tma_k, tKgK[(None, pbox, 0, page)], tKsK[(None, j, 0, kv.index)],
                          tma_bar_ptr=pipe_k.producer_get_barrier(kv))
            pipe_k.producer_commit(kv)
            pipe_v.producer_acquire(kv)
            for j in cutlass.range_constexpr(self.boxes):
                page, pbox = self.box_source(mBT, b, cutlass.min(n * self.boxes + j, last_box))
                if cutlass.const_expr(self.v_like_k):
                    cute.copy(tma_v, self.v_box(tVgV, pbox, page), tVsV[(None, j, 0, kv.index)],
                              tma_bar_ptr=pipe_v.producer_get_barrier(kv))
                else:
                    cute.copy(tma_v, self.v_box(tVgV, pbox, page), tVsV[(None, 0, j, kv.index)],
                              tma_bar_ptr=pipe_v.producer_get_barrier(kv))
            pipe_v.producer_commit(kv)
            kv.advance()
        pipe_k.producer_tail(kv.clone())
        pipe_v.producer_tail(kv)

    @cute.jit
    def box_source(self, mBT: cute.Tensor, b: Int32, key_box: Int32):
        """(page, box within the page) of the sequence's `key_box`-th box of keys."""
        return self.locate(mBT, b, key_box, self.page_size // self.box)

    @cute.jit
    def locate(self, mBT: cute.Tensor, b: Int32, index: Int32, per_page: cutlass.Constexpr[int]):
        """(page, index within the page) of the sequence's `index`-th unit (box or key) of `per_page` a page: through
        the block table, or for a contiguous cache page b itself."""
        if cutlass.const_expr(self.page_size == 0):
            return b, index
        return mBT[b, index // per_page], index % per_page

    # --- the consumer warpgroup ---------------------------------------------------------------------------------
    @cute.jit
    def load_q(self, mQ: cute.Tensor, sQ: cute.Tensor, b: Int32, hk: Int32, g: Int32, m_tile: Int32, tid: Int32):
        """The tile's 64 packed rows of Q into smem by the warpgroup's threads, a 16-byte vector each step; rows
        past q_len x g are zeros (their scores are computed and dropped)."""
        d = self.d
        rows = cute.size(mQ, mode=[1]) * g
        per_row = d // _Q_VEC
        for it in cutlass.range_constexpr(ROWS_PER_TILE * per_row // 128):
            idx = tid + it * 128
            r = idx // per_row
            c = idx % per_row
            pr = m_tile * ROWS_PER_TILE + r
            dst = cute.logical_divide(sQ[(r, None, 0)], cute.make_layout(_Q_VEC))[(None, c)]
            if pr < rows:
                src = cute.make_tensor(mQ[(b, pr // g, hk * g + pr % g, None)].iterator,
                                       cute.make_layout((_Q_VEC, per_row), stride=(1, _Q_VEC)))[(None, c)]
                dst.store(src.load().to(self.mma_dtype))
            else:
                dst.fill(0.0)

    @cute.jit
    def consume(self, tiled_mma_qk: cute.TiledMma, tiled_mma_pv: cute.TiledMma, mQ: cute.Tensor, sQ: cute.Tensor,
                sK: cute.Tensor, sV: cute.Tensor, pipe_k, pipe_v, mO: cute.Tensor, mLSE: cute.Tensor, b: Int32,
                hk: Int32, g: Int32, m_tile: Int32, split: Int32, seqlen_k: Int32, first: Int32, count: Int32,
                scale_log2: Float32, scale_lse: Float32, scale_over_cap: Float32, cap: Float32, left: Int32,
                right: Int32, fin: SimpleNamespace, kv8: SimpleNamespace):
        s, d, dt = self.s, self.d, self.mma_dtype
        tidx, _, _ = cute.arch.thread_idx()
        tid = tidx % 128
        scale_log2, scale_lse, scale_over_cap, v_head = self.head_scales(kv8, hk, scale_log2, scale_lse,
                                                                         scale_over_cap)
        self.load_q(mQ, sQ, b, hk, g, m_tile, tid)
        cute.arch.fence_view_async_shared()
        q_bar = pipeline.NamedBarrier(barrier_id=_Q_BAR, num_threads=128)
        q_bar.arrive_and_wait()

        thr_qk = tiled_mma_qk.get_slice(tid)
        thr_pv = tiled_mma_pv.get_slice(tid)
        tSrQ = tiled_mma_qk.make_fragment_A(thr_qk.partition_A(sQ))[(None, None, None, 0)]
        tSrK = tiled_mma_qk.make_fragment_B(thr_qk.partition_B(sK))
        tOrV = tiled_mma_pv.make_fragment_B(thr_pv.partition_B(sV))
        acc_s = cute.make_rmem_tensor(thr_qk.partition_shape_C((ROWS_PER_TILE, s.tile_n)), Float32)
        acc_o = cute.make_rmem_tensor(thr_pv.partition_shape_C((ROWS_PER_TILE, d)), Float32)
        tScS = thr_qk.partition_C(cute.make_identity_tensor((ROWS_PER_TILE, s.tile_n)))
        tOcO = thr_pv.partition_C(cute.make_identity_tensor((ROWS_PER_TILE, d)))
        s_rows = acc_rows_view(acc_s)
        o_rows = acc_rows_view(acc_o)
        c_rows = acc_rows_view(tScS)
        rows = cute.size(o_rows, mode=[0])
        row_max, row_sum = empty_rows(rows)
        acc_o.fill(0.0)
        tiled_mma_pv.set(warpgroup.Field.ACCUMULATE, True)

        q_len = cute.size(mQ, mode=[1])
        # each of the thread's rows: the last key it sees (its query position's diagonal + right, or the end) and
        # the first (the window's left edge)
        hi = cute.make_rmem_tensor((rows,), Int32)
        lo = cute.make_rmem_tensor((rows,), Int32)
        for r in cutlass.range_constexpr(rows):
            t = cutlass.min((m_tile * ROWS_PER_TILE + c_rows[r, 0][0]) // g, q_len - 1)
            diag = seqlen_k - q_len + t
            hi[r] = seqlen_k - 1
            if cutlass.const_expr(self.mask.right):
                hi[r] = cutlass.min(diag + right, seqlen_k - 1)
            lo[r] = Int32(0)
            if cutlass.const_expr(self.mask.left):
                lo[r] = diag - left
        # a tile needs the mask when it reaches past the lowest row's last key or below the highest row's first
        hi_min = seqlen_k - 1
        if cutlass.const_expr(self.mask.right):
            hi_min = cutlass.min(seqlen_k - q_len + right, seqlen_k - 1)
        lo_max = Int32(0)
        if cutlass.const_expr(self.mask.left):
            lo_max = seqlen_k - 1 - left

        stages = cute.size(kv8.sK, mode=[2])
        kv = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, stages)
        # FP8 per-token scales: this thread's rows of the next tile, loaded a tile ahead
        ks_next = cute.make_rmem_tensor((self.widen_steps,), Float32)
        vs_next = cute.make_rmem_tensor((self.widen_steps,), Float32)

        def widen_key(it):  # the key (within its tile) of the thread's widen step `it`
            return (tid + it * 128) // (d // 16)
        # FP8: the widening overlaps the WGMMAs. K of tile n is widened while P V of tile n - 1 runs, V of tile n
        # while S of tile n runs; each fp16 tile is rewritten only after a barrier that follows every warp's wait
        # for the WGMMA that read it.
        if cutlass.const_expr(self.kv8):
            if count > 0:  # (a sequence without keys may have no page to look up)
                if cutlass.const_expr(self.kv_scale == "token"):
                    self.load_token_scales(kv8, ks_next, vs_next, b, hk, first, seqlen_k, widen_key)
                pipe_k.consumer_wait(kv)
                self.widen(kv8.sK, kv.index, sK, ks_next, s.tile_n, tid, False)
                pipe_k.consumer_release(kv)
        for i in cutlass.range(count, unroll=1):
            n = first + i
            vs_cur = cute.make_rmem_tensor((self.widen_steps,), Float32)
            if cutlass.const_expr(self.kv_scale == "token"):
                for e in cutlass.range_constexpr(self.widen_steps):
                    vs_cur[e] = vs_next[e]
                self.load_token_scales(kv8, ks_next, vs_next, b, hk, n + 1, seqlen_k, widen_key)
            key0 = n * s.tile_n
            if cutlass.const_expr(self.kv8):
                warpgroup.fence()
                mma_blocks(tiled_mma_qk, acc_s, tSrQ, stage_of(tSrK, 0), zero_first=True)
                warpgroup.commit_group()
                pipe_v.consumer_wait(kv)
                # keys past the end widen to 0 (their P is 0, but 0 x NaN is not)
                self.widen(kv8.sV, kv.index, sV, vs_cur, cutlass.min(seqlen_k - key0, s.tile_n), tid, True)
                pipe_v.consumer_release(kv)
                warpgroup.wait_group(0)
            else:
                pipe_k.consumer_wait(kv)
                warpgroup.fence()
                mma_blocks(tiled_mma_qk, acc_s, tSrQ, stage_of(tSrK, kv.index), zero_first=True)
                warpgroup.commit_group()
                warpgroup.wait_group(0)
                pipe_k.consumer_release(kv)
            if cutlass.const_expr(self.softcap):
                apply_softcap(acc_s, scale_over_cap, cap)
            needs = key0 + s.tile_n - 1 > hi_min
            if cutlass.const_expr(self.mask.left):
                needs = needs | (key0 < lo_max)
            if needs:
                for r in cutlass.range_constexpr(rows):
                    for c in cutlass.range_constexpr(cute.size(s_rows, mode=[1])):
                        j = key0 + c_rows[r, c][1]
                        if (j > hi[r]) | (j < lo[r]):
                            s_rows[r, c] = Float32(NEG_INF)
            update_rows(s_rows, o_rows, row_max, row_sum, scale_log2)
            p = acc_as_a_operand(acc_s, dt)
            if cutlass.const_expr(self.kv8):
                warpgroup.fence()
                mma_blocks(tiled_mma_pv, acc_o, p, stage_of(tOrV, 0))
                warpgroup.commit_group()
                if i + 1 < count:
                    kv_next = kv.clone()
                    kv_next.advance()
                    pipe_k.consumer_wait(kv_next)
                    self.widen(kv8.sK, kv_next.index, sK, ks_next, s.tile_n, tid, False)
                    pipe_k.consumer_release(kv_next)
                warpgroup.wait_group(0)
            else:
                pipe_v.consumer_wait(kv)
                if key0 + s.tile_n > seqlen_k:
                    self.zero_v_tail(sV, kv.index, seqlen_k - key0, tid)
                warpgroup.fence()
                mma_blocks(tiled_mma_pv, acc_o, p, stage_of(tOrV, kv.index))
                warpgroup.commit_group()
                warpgroup.wait_group(0)
                pipe_v.consumer_release(kv)
            kv.advance()

        # ---- epilogue: O / l and the LSE, straight from the registers ----
        lse = cute.make_rmem_tensor((rows,), Float32)
        finalize_rows(o_rows, row_max, row_sum, lse, scale_lse)
        if cutlass.const_expr(self.kv_scale == "head"):
            for e in cutlass.range_constexpr(cute.size(acc_o)):
                acc_o[e] = acc_o[e] * v_head
        packed = q_len * g
        oc_rows = acc_rows_view(tOcO)
        slot = split if cutlass.const_expr(self.split) else 0
        for r in cutlass.range_constexpr(rows):
            pr = m_tile * ROWS_PER_TILE + oc_rows[r, 0][0]
            if pr < packed:
                t = pr // g
                h = hk * g + pr % g
                out_lse = lse[r]
                if cutlass.const_expr(self.split):
                    if count == 0:
                        out_lse = Float32(NEG_INF)  # an empty split: the merge skips it (and its O)
                if oc_rows[r, 0][1] == 0:
                    mLSE[slot, b, h, t] = out_lse
                g_row = mO[(slot, b, t, h, None)]
                for c in cutlass.range_constexpr(cute.size(o_rows, mode=[1])):
                    g_row[oc_rows[r, c][1]] = o_rows[r, c].to(mO.element_type)
        if cutlass.const_expr(self.split and self.s.fused_merge):
            self.merge_if_last(mO, mLSE, fin, b, hk, g, m_tile, packed, tid)

    @cute.jit
    def head_scales(self, kv8: SimpleNamespace, hk: Int32, scale_log2: Float32, scale_lse: Float32,
                    scale_over_cap: Float32):
        """FP8 per-head scales (x = x8 * s per KV head): K's folded into the softmax scale (or, with a softcap,
        into the scale before its tanh); returns those and V's, which multiplies every output (1 otherwise)."""
        v_head = Float32(1.0)
        if cutlass.const_expr(self.kv_scale == "head"):
            k_head = kv8.ks[0, 0, hk]
            v_head = kv8.vs[0, 0, hk]
            if cutlass.const_expr(self.softcap):
                scale_over_cap = scale_over_cap * k_head
            else:
                scale_log2 = scale_log2 * k_head
                scale_lse = scale_lse * k_head
        return scale_log2, scale_lse, scale_over_cap, v_head

    # --- the consumer warpgroup with swapped operands (DecodeSchedule.swap_rows) ------------------------------
    # S^T (tile_n, R) = K Q^T and O^T (D, R) = V^T P^T, R = swap_rows packed query rows in the WGMMA's N. A is
    # loaded from the stage ring into registers in the WGMMA's A-fragment order: thread (warp w, lane 4 r + q) of
    # an m64 block holds rows w 16 + r (+ 8) and columns 2 q (+ 1, + 8, + 9) of each k16 block. Any consistent
    # permutation of a contraction index is free, and so is one of M where we write the output ourselves:
    # - K (M = keys, k = D): the thread's D / 4 columns of a key are made one contiguous run, elements
    #   [q D / 4, (q + 1) D / 4): WGMMA column 16 ks + 8 l + 2 q + i holds element q D / 4 + 4 ks + 2 l + i (Q^T is
    #   stored in smem with the same permutation). A key's part is D / 64 16-byte loads.
    # - V^T (M = D, k = keys): row m = 64 mb + 16 w + r + 8 j holds element D / 32 (8 w + r) + 2 mb + j, so a key's
    #   part is one D / 32-element load (4 bytes at FP8 D = 128); O is written back through the same map.
    # On the 128-byte-swizzled (keys, D) stage both are free of bank conflicts at FP8 D = 128: the lanes of one
    # load cover eight 16-byte chunks of distinct swizzle phases.
    @cute.jit
    def load_q_swapped(self, mQ: cute.Tensor, sQ: cute.Tensor, b: Int32, hk: Int32, g: Int32, tid: Int32):
        """Q^T's (R, D) K-major tile: packed row n's elements in the K fragments' order (element q D / 4 + 4 ks +
        2 l + i at column 16 ks + 8 l + 2 q + i), converted to the MMA's type; rows past q_len x g are zeros."""
        d, nr, dt = self.d, self.swap, self.mma_dtype
        rows = cute.size(mQ, mode=[1]) * g
        per_row = d // _Q_VEC
        total = nr * per_row
        for it in cutlass.range_constexpr((total + 127) // 128):
            idx = tid + it * 128
            if idx < total:
                n = idx // per_row
                p0 = (idx % per_row) * _Q_VEC  # the vector's first element (a multiple of 8)
                quad = p0 // (d // 4)
                e0 = p0 % (d // 4)
                vec = cute.make_rmem_tensor((_Q_VEC,), dt)
                vec.fill(0.0)
                if n < rows:
                    src = cute.make_tensor(mQ[(b, n // g, hk * g + n % g, None)].iterator + p0,
                                           cute.make_layout(_Q_VEC))
                    vec.store(src.load().to(dt))
                for t in cutlass.range_constexpr(_Q_VEC):
                    col = 4 * e0 + 2 * quad + 16 * (t // 4) + 8 * ((t // 2) % 2) + t % 2
                    sQ[(n, col, 0)] = vec[t]

    @cute.jit
    def load_k_frags(self, sK: cute.Tensor, stage: Int32, fk: cute.Tensor, warp: Int32, r8: Int32, quad: Int32):
        """K's A fragments of tile `stage` into registers, in the MMA's type: key 64 mb + 16 warp + r8 + 8 j, the
        thread's D / 4 elements from quad D / 4 in 16-byte loads. Fragment word (j, l, mb, ks) (`frag_word`) holds
        elements 4 ks + 2 l (+ 1): one word of the loads (16-bit types), or half of one widened (e4m3)."""
        d, kt = self.d, self.kv_dtype
        vec = 16 // (kt.width // 8)
        words = cute.recast_tensor(fk, Int32)
        mbs = self.s.tile_n // 64
        for mb in cutlass.range_constexpr(self.s.tile_n // 64):
            for j in cutlass.range_constexpr(2):
                row = cute.logical_divide(sK[(mb * 64 + warp * 16 + r8 + 8 * j, None, stage)], cute.make_layout(vec))
                for c in cutlass.range_constexpr(d // 4 // vec):
                    raw = cute.make_rmem_tensor((vec,), kt)
                    raw.store(row[(None, quad * (d // 4 // vec) + c)].load())
                    w = cute.recast_tensor(raw, Int32)
                    for t in cutlass.range_constexpr(4):
                        if cutlass.const_expr(self.kv8):  # elements 16 c + 4 t ..: ks = 4 c + t, l = the half
                            for half in cutlass.range_constexpr(2):
                                words[frag_word(j, half, mb, 4 * c + t, mbs)] = e4m3x2_to_f16x2(w[t], half == 1)
                        else:  # elements 8 c + 2 t, + 1: ks = 2 c + t // 2, l = t % 2
                            words[frag_word(j, t % 2, mb, 2 * c + t // 2, mbs)] = w[t]

    @cute.jit
    def load_v_frags(self, sV: cute.Tensor, stage: Int32, fv: cute.Tensor, warp: Int32, r8: Int32, quad: Int32,
                     valid: Int32):
        """V^T's A fragments of tile `stage` into registers, in the MMA's type: the thread's D / 32 elements from
        D / 32 (8 warp + r8) of keys A = 16 ks + 8 l + 2 quad and A + 1, one load each. Fragment word (j, l, mb,
        ks) (`frag_word`) pairs element e = j + 2 mb of key A (low half) and of key A + 1 (high), gathered by
        byte permutes. Keys from `valid` on read as 0 (their P is 0, but 0 x NaN is not, and a cache's unwritten rows
        may hold anything)."""
        d, kt = self.d, self.kv_dtype
        per_key = d // 32
        nw = per_key * (kt.width // 8) // 4  # 32-bit words of a key's part
        words = cute.recast_tensor(fv, Int32)
        for ks in cutlass.range_constexpr(self.s.tile_n // 16):
            for l in cutlass.range_constexpr(2):
                key = ks * 16 + 8 * l + 2 * quad
                pair = []
                for i in cutlass.range_constexpr(2):
                    raw = cute.make_rmem_tensor((per_key,), kt)
                    raw.store(cute.logical_divide(sV[(key + i, None, stage)],
                                                  cute.make_layout(per_key))[(None, warp * 8 + r8)].load())
                    w = cute.recast_tensor(raw, Int32)
                    ok = key + i < valid
                    pair.append([Int32(cutlass.select_(ok, w[t], Int32(0))) for t in range(nw)])
                for t in cutlass.range_constexpr(nw):
                    if cutlass.const_expr(self.kv8):  # bytes e = 4 t .. 4 t + 3 of both keys
                        for h in cutlass.range_constexpr(2):
                            both = permute_bytes(pair[0][t], pair[1][t], 0x5140 if h == 0 else 0x7362)
                            for half in cutlass.range_constexpr(2):
                                e = 4 * t + 2 * h + half
                                words[frag_word(e % 2, l, e // 2, ks, d // 64)] = e4m3x2_to_f16x2(both, half == 1)
                    else:  # 16-bit elements e = 2 t, 2 t + 1
                        for half in cutlass.range_constexpr(2):
                            e = 2 * t + half
                            words[frag_word(e % 2, l, e // 2, ks, d // 64)] = permute_bytes(
                                pair[0][t], pair[1][t], 0x5410 if half == 0 else 0x7632)

    @cute.jit
    def consume_swapped(self, mma: cute.TiledMma, mQ: cute.Tensor, sQ: cute.Tensor, sP: cute.Tensor,
                        red: cute.Tensor, pipe_k, pipe_v, mO: cute.Tensor, mLSE: cute.Tensor, b: Int32, hk: Int32,
                        g: Int32, split: Int32, seqlen_k: Int32, first: Int32, count: Int32, scale_log2: Float32,
                        scale_lse: Float32, scale_over_cap: Float32, cap: Float32, left: Int32, right: Int32,
                        fin: SimpleNamespace, kv8: SimpleNamespace):
        """Per tile: K's fragments loaded (and widened) from the stage, which is released at once; S^T = K Q^T
        issued; V's fragments loaded under it (after the previous P V, which read them, completed); the softmax
        down each column (a row of the attention), its max across the warpgroup (`warpgroup_column_reduce`); P^T
        (times V's per-token scales) into smem; O^T += V^T P^T issued and left running under the next tile's K."""
        s, d, dt, nr = self.s, self.d, self.mma_dtype, self.swap
        tn = s.tile_n
        tidx, _, _ = cute.arch.thread_idx()
        tid = tidx % 128
        warp = tid // 32
        r8 = (tid % 32) // 4
        quad = tid % 4
        scale_log2, scale_lse, scale_over_cap, v_head = self.head_scales(kv8, hk, scale_log2, scale_lse,
                                                                         scale_over_cap)
        self.load_q_swapped(mQ, sQ, b, hk, g, tid)
        cute.arch.fence_view_async_shared()
        bar = pipeline.NamedBarrier(barrier_id=_Q_BAR, num_threads=128)
        bar.arrive_and_wait()

        thr = mma.get_slice(tid)
        tSrQ = mma.make_fragment_B(thr.partition_B(sQ))[(None, None, None, 0)]
        tOrP = mma.make_fragment_B(thr.partition_B(sP))[(None, None, None, 0)]
        fk = cute.make_rmem_tensor(thr.partition_shape_A((tn, d)), dt)
        fv = cute.make_rmem_tensor(thr.partition_shape_A((d, tn)), dt)
        acc_s = cute.make_rmem_tensor(thr.partition_shape_C((tn, nr)), Float32)
        acc_o = cute.make_rmem_tensor(thr.partition_shape_C((d, nr)), Float32)
        s_cols = acc_cols_view(acc_s)  # (the thread's query rows, its keys)
        o_cols = acc_cols_view(acc_o)  # (the thread's query rows, its D / 32 elements)
        c_cols = acc_cols_view(thr.partition_C(cute.make_identity_tensor((tn, nr))))
        cols = cute.size(s_cols, mode=[0])
        keys = cute.size(s_cols, mode=[1])
        row_max, row_sum = empty_rows(cols)
        corr = cute.make_rmem_tensor((cols,), Float32)
        acc_o.fill(0.0)
        mma.set(warpgroup.Field.ACCUMULATE, True)

        def col_max(t):
            warpgroup_column_reduce(t, cute.arch.fmax, red, _Q_BAR)

        def col_sum(t):
            warpgroup_column_reduce(t, lambda x, y: x + y, red, _Q_BAR)

        q_len = cute.size(mQ, mode=[1])
        hi = cute.make_rmem_tensor((cols,), Int32)
        lo = cute.make_rmem_tensor((cols,), Int32)
        for c in cutlass.range_constexpr(cols):
            t = cutlass.min(c_cols[c, 0][1] // g, q_len - 1)
            diag = seqlen_k - q_len + t
            hi[c] = seqlen_k - 1
            if cutlass.const_expr(self.mask.right):
                hi[c] = cutlass.min(diag + right, seqlen_k - 1)
            lo[c] = Int32(0)
            if cutlass.const_expr(self.mask.left):
                lo[c] = diag - left
        hi_min = seqlen_k - 1
        if cutlass.const_expr(self.mask.right):
            hi_min = cutlass.min(seqlen_k - q_len + right, seqlen_k - 1)
        lo_max = Int32(0)
        if cutlass.const_expr(self.mask.left):
            lo_max = seqlen_k - 1 - left

        stages = cute.size(kv8.sK, mode=[2])
        kv = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, stages)
        # per-token scales of the thread's keys (its S^T rows, the same keys for K and for P), a tile ahead
        ks_next = cute.make_rmem_tensor((keys,), Float32)
        vs_next = cute.make_rmem_tensor((keys,), Float32)

        def acc_key(k):  # the thread's k-th key within a tile: 64 mb + 16 warp + r8 + 8 j for k = j + 2 mb
            return c_cols[0, k][0]

        # K of the walk's first tile; each later tile's K is loaded while the previous tile's P V runs
        if count > 0:  # (a sequence without keys may have no page to look up)
            if cutlass.const_expr(self.kv_scale == "token"):
                self.load_token_scales(kv8, ks_next, vs_next, b, hk, first, seqlen_k, acc_key, True)
            pipe_k.consumer_wait(kv)
            self.load_k_frags(kv8.sK, kv.index, fk, warp, r8, quad)
            pipe_k.consumer_release(kv)
        for i in cutlass.range(count, unroll=1):
            n = first + i
            key0 = n * tn
            ks_cur = cute.make_rmem_tensor((keys,), Float32)
            vs_cur = cute.make_rmem_tensor((keys,), Float32)
            if cutlass.const_expr(self.kv_scale == "token"):
                for k in cutlass.range_constexpr(keys):
                    ks_cur[k] = ks_next[k]
                    vs_cur[k] = vs_next[k]
                self.load_token_scales(kv8, ks_next, vs_next, b, hk, n + 1, seqlen_k, acc_key, True)
            acc_s.fill(0.0)
            fence_operand(fk)
            fence_operand(acc_s)
            warpgroup.fence()
            mma_blocks(mma, acc_s, fk, tSrQ)
            warpgroup.commit_group()
            pipe_v.consumer_wait(kv)
            self.load_v_frags(kv8.sV, kv.index, fv, warp, r8, quad, seqlen_k - key0)
            pipe_v.consumer_release(kv)
            fence_operand(fv)
            warpgroup.wait_group(0)
            if cutlass.const_expr(self.kv_scale == "token"):
                for c in cutlass.range_constexpr(cols):
                    for k in cutlass.range_constexpr(keys):
                        s_cols[c, k] = s_cols[c, k] * ks_cur[k]
            if cutlass.const_expr(self.softcap):
                apply_softcap(acc_s, scale_over_cap, cap)
            needs = key0 + tn - 1 > hi_min
            if cutlass.const_expr(self.mask.left):
                needs = needs | (key0 < lo_max)
            if needs:
                for c in cutlass.range_constexpr(cols):
                    for k in cutlass.range_constexpr(keys):
                        j = key0 + c_cols[c, k][0]
                        if (j > hi[c]) | (j < lo[c]):
                            s_cols[c, k] = Float32(NEG_INF)
            softmax_rows(s_cols, row_max, row_sum, corr, scale_log2, o_rows=o_cols, reduce_max=col_max)
            for c in cutlass.range_constexpr(cols):
                for k in cutlass.range_constexpr(keys):
                    p = s_cols[c, k]
                    if cutlass.const_expr(self.kv_scale == "token"):
                        p = p * vs_cur[k]
                    sP[(c_cols[c, k][1], c_cols[c, k][0], 0)] = p.to(dt)
            cute.arch.fence_view_async_shared()
            bar.arrive_and_wait()
            fence_operand(acc_o)
            warpgroup.fence()
            mma_blocks(mma, acc_o, fv, tOrP)
            warpgroup.commit_group()
            kv.advance()
            if i + 1 < count:  # the next tile's K, under this P V
                pipe_k.consumer_wait(kv)
                self.load_k_frags(kv8.sK, kv.index, fk, warp, r8, quad)
                pipe_k.consumer_release(kv)
            warpgroup.wait_group(0)

        # ---- epilogue: O / l and the LSE; the thread's D / 32 elements of a row are contiguous in O ----
        lse = cute.make_rmem_tensor((cols,), Float32)
        finalize_rows(o_cols, row_max, row_sum, lse, scale_lse, reduce_sum=col_sum)
        if cutlass.const_expr(self.kv_scale == "head"):
            for e in cutlass.range_constexpr(cute.size(acc_o)):
                acc_o[e] = acc_o[e] * v_head
        packed = q_len * g
        slot = split if cutlass.const_expr(self.split) else 0
        for c in cutlass.range_constexpr(cols):
            pr = c_cols[c, 0][1]
            if pr < packed:
                t = pr // g
                h = hk * g + pr % g
                out_lse = lse[c]
                if cutlass.const_expr(self.split):
                    if count == 0:
                        out_lse = Float32(NEG_INF)  # an empty split: the merge skips it (and its O)
                if tid < 4:
                    mLSE[slot, b, h, t] = out_lse
                g_row = cute.logical_divide(mO[(slot, b, t, h, None)], cute.make_layout(d // 32))
                g_row[(None, warp * 8 + r8)].store(o_cols[c, None].load().to(mO.element_type))
        if cutlass.const_expr(self.split and self.s.fused_merge):
            self.merge_if_last(mO, mLSE, fin, b, hk, g, Int32(0), packed, tid)

    @cute.jit
    def merge_if_last(self, mO: cute.Tensor, mLSE: cute.Tensor, fin: SimpleNamespace, b: Int32, hk: Int32, g: Int32,
                      m_tile: Int32, packed: Int32, tid: Int32):
        """The last split of this (row tile, KV head, batch) to finish merges every split's partial into the final O
        and LSE (`merge.MergeStates.merge_row`, D / 4 threads a row); which split is last: `collectives.split_counter`."""
        bar = pipeline.NamedBarrier(barrier_id=_Q_BAR, num_threads=128)
        if last_split(fin.counter, (b, hk, m_tile), fin.splits, fin.slot, bar, tid == 0):
            self.merge_rows(mO, mLSE, fin, b, hk, g, m_tile, packed, tid)

    @cute.jit
    def merge_rows(self, mO: cute.Tensor, mLSE: cute.Tensor, fin: SimpleNamespace, b: Int32, hk: Int32, g: Int32,
                   m_tile: Int32, packed: Int32, tid: Int32):
        """The tile's packed rows merged over the splits by the warpgroup, 128 / (D / 4) rows at a time."""
        tpr = self.d // MERGE_VEC
        per_pass = 128 // tpr
        for it in cutlass.range_constexpr((ROWS_PER_TILE + per_pass - 1) // per_pass):
            r = it * per_pass + tid // tpr
            pr = m_tile * ROWS_PER_TILE + r
            if (tid < per_pass * tpr) & (r < ROWS_PER_TILE) & (pr < packed):
                # (every chunk of states' loads issued together: two round trips at 16 splits, not four)
                MergeStates(self.dtype, self.d, MergeSchedule(chunk=MERGE_MAX_CHUNK)).merge_row(mO, mLSE, fin.o, fin.lse, b, pr // g, hk * g + pr % g,
                                                          tid % tpr, Int32(0), r < ROWS_PER_TILE)

    @cute.jit
    def widen(self, src: cute.Tensor, stage: Int32, dst: cute.Tensor, scales: cute.Tensor, valid: Int32, tid: Int32,
              is_v: cutlass.Constexpr[bool]):
        """FP8 KV: the e4m3 (tile_n, D) tile `stage` of `src` widened into the fp16 operand tile `dst` (K: (tile_n,
        D) K-major; V: V^T (D, tile_n) MN-major, D contiguous in both), 16 elements of one key a step, times the
        key's per-token scale (`scales`, this thread's rows in step order); keys from `valid` on written as 0. The
        warpgroup's writes are made visible to the WGMMA (async proxy) before any thread goes on; a barrier first: every
        warp has waited for the WGMMA that last read `dst`."""
        d = self.d
        per_row = d // 16
        pipeline.NamedBarrier(barrier_id=_Q_BAR, num_threads=128).arrive_and_wait()
        for it in cutlass.range_constexpr(self.widen_steps):
            idx = tid + it * 128
            r = idx // per_row
            c = idx % per_row
            x = cute.logical_divide(src[(r, None, stage)], cute.make_layout(16))[(None, c)].load().to(self.mma_dtype)
            if cutlass.const_expr(self.kv_scale == "token"):
                x = x * self.mma_dtype(scales[it])
            row = dst[(None, r, 0)] if cutlass.const_expr(is_v) else dst[(r, None, 0)]
            out = cute.logical_divide(row, cute.make_layout(16))[(None, c)]
            if cutlass.const_expr(not is_v):
                out.store(x)
            elif r < valid:
                out.store(x)
            else:
                out.fill(0.0)
        cute.arch.fence_view_async_shared()
        pipeline.NamedBarrier(barrier_id=_Q_BAR, num_threads=128).arrive_and_wait()

    @cute.jit
    def load_token_scales(self, kv8: SimpleNamespace, ks: cute.Tensor, vs: cute.Tensor, b: Int32, hk: Int32,
                          n: Int32, seqlen_k: Int32, key_of, block_pairs: cutlass.Constexpr[bool] = False):
        """The per-token K and V scales of the thread's keys of tile n (`key_of(i)`: the i-th within the tile), each
        key clamped to the sequence's last (no page past the sequence is looked up). `block_pairs`: keys 2u and
        2u + 1 lie in one aligned block of 16 (so in one page, clamped or not): one block-table lookup a pair."""
        last = cutlass.max(seqlen_k - 1, 0)
        step = 2 if cutlass.const_expr(block_pairs) else 1
        for u in cutlass.range_constexpr(cute.size(ks) // step):
            key = cutlass.min(n * self.s.tile_n + key_of(step * u), last)
            page, row = self.locate(kv8.bt, b, key, self.page_size)
            ks[step * u] = kv8.ks[page, row, hk]
            vs[step * u] = kv8.vs[page, row, hk]
            if cutlass.const_expr(block_pairs):
                row2 = row + cutlass.min(n * self.s.tile_n + key_of(step * u + 1), last) - key
                ks[step * u + 1] = kv8.ks[page, row2, hk]
                vs[step * u + 1] = kv8.vs[page, row2, hk]

    @cute.jit
    def zero_v_tail(self, sV: cute.Tensor, stage: Int32, valid: Int32, tid: Int32):
        """V^T's columns (keys) valid .. tile_n - 1 of `stage` set to 0 by the warpgroup, made visible to the
        WGMMA (async proxy) before any thread goes on."""
        d = self.d
        n = (self.s.tile_n - valid) * d
        for idx in cutlass.range((n + 127 - tid) // 128, unroll=1):
            e = tid + idx * 128
            sV[(e % d, valid + e // d, stage)] = self.dtype(0.0)
        cute.arch.fence_view_async_shared()
        pipeline.NamedBarrier(barrier_id=_Q_BAR, num_threads=128).arrive_and_wait()
