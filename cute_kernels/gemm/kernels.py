"""Hopper GEMM: D = act(alpha * A @ B + beta * C + bias), bf16/fp16 in, fp32 accumulation
(curriculum lesson 10, the WGMMA rung of the ladder).

Roofline: 2*M*N*K FLOPs over (M*K + K*N + M*N) * bytes; for 8192^3 bf16 that is 1.1 TFLOP over
400 MB, so it is bound by the tensor cores (H200: 989 TFLOP/s dense bf16 by spec; cuBLAS reaches
~680-740 here). Floor at 8192^3: ~1.1 ms at spec, ~1.5 ms at cuBLAS's rate.
Schedule: `schedules.gemm.GemmSchedule` (warp-specialized: one TMA producer warp, two WGMMA consumer
warpgroups, cooperative or ping-pong, persistent with a rasterized static tile walk, clusters with
TMA multicast). Collectives: `tma_pipeline` (loads), `wgmma_mainloop` (math), `epilogue` (fused
math + stmatrix + TMA store). With `wg_epilogue` the cooperative warpgroups store their 64-row
halves separately (per-warpgroup barrier, buffers and store warp, through a one-warpgroup MMA's C
partition), so only the stage ring ties them together.

Operands, as the kernel sees them: A (M, K, L), B (N, K, L), D and C (M, N, L); each may be K- or
M/N-major (the unit-stride mode is a compile-time signature), all other sizes and strides symbolic.

FP8 block-scaled mode (`blockwise=True`, lesson 13, launched by `Gemm.fp8`): A and B are e4m3,
K-major, with fp32 scales sa (M, K/128, L) per 1x128 block and sb (N/128, K/128, L) per 128x128
block (`collectives.block_scales`). The same kernel body runs with tile_k = 128 (one scale block
per stage), the producer adds the tile's sa box to each stage, and the consumers run
`mma_k_tiles_promoted` (two-level accumulation) instead of `mma_k_tiles`.

Grouped FP8 (MoE, `grouping="contiguous"` or `"masked"`, launched by `Gemm.fp8_grouped`): B and sb
hold one expert per batch index, and the tile walk (`schedules.walks.TileWalk.tile`) gives each
tile the expert whose B it multiplies: "contiguous" reads it per M tile from a device vector (tiles
of padding rows are skipped), "masked" walks only the tiles below each expert's valid row count.
Everything else (pipeline, promotion, epilogue) is the blockwise kernel.
"""

from __future__ import annotations

import dataclasses

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

from collectives import block_scales, pdl
from collectives import epilogue as epi
from collectives.epilogue import EpilogueOps
from collectives.tma_pipeline import make_pipeline, operand_smem_layout, operand_tma, produce_k_tiles
from collectives.vector_map import map_vectors
from collectives.wgmma_mainloop import (
    accumulate_mode,
    half_index_map,
    mma_k_tiles,
    mma_k_tiles_promoted,
    mma_k_tiles_promoted_halves,
    mma_k_tiles_promoted_overlap,
)
from schedules.fp8_gemm import GQ_TILE, HALVES_TILE_N, glu_quant_error, halves_only_error
from schedules.gemm import GemmSchedule
from schedules.grid_stride import GridStride
from schedules.hardware import SETMAXNREG_LAUNCH
from schedules.walks import TileWalk

# Split-K's summing pass: 4 fp32 per 128-bit load, 128 threads x 4 vectors per CTA pass, uncapped grid
# (the tuned elementwise "add" schedule).
REDUCE_VEC = 4
REDUCE_SCHEDULE = GridStride(threads=128, unroll=4, ctas_per_sm=0, order="cta")

def _ring_state(stages: int, pos):
    """The consumer's pipeline state at ring position `pos` (K-blocks since the start): stage pos mod stages,
    phase (pos div stages) mod 2."""
    return pipeline.PipelineState(stages, pos, pos % stages, (pos // stages) % 2)


# Named barrier ids (0 is __syncthreads).
_EPI_BAR = 1  # cooperative: both consumer warpgroups; ping-pong and wg_epilogue: 1 + warpgroup
_ORDER_BAR = 3  # ping-pong mainloop turns, FP8 `wg_turns` K-block turns: 3 + warpgroup
_SCALE_BAR = 5  # FP8 sb_smem: both consumer warpgroups, the tile's B-scale row is in smem
_XCHG_BAR = 6  # ping-pong k_interleave: 6 = warpgroup 1's partial is in smem, 7 = warpgroup 0 has read it


class Gemm:
    def __init__(self, ab_dtype, out_dtype, schedule: GemmSchedule, ops: EpilogueOps = EpilogueOps(),
                 blockwise: bool = False, grouping: str = "none", promote_overlap: bool = False,
                 sb_smem: bool = False, wg_turns: bool = False, promote_halves: bool = False,
                 sb_ahead: bool = False, glu_quant: bool = False, glu_exchange: str = "halves"):
        self.ab_dtype, self.out_dtype = ab_dtype, out_dtype
        self.s, self.ops = schedule, ops
        self.acc_dtype = Float32
        self.blockwise = blockwise  # FP8 1x128 / 128x128 block scales, promoted accumulation
        self.grouping = grouping  # MoE grouped walk ("none", "contiguous", "masked"; FP8 only)
        # FP8: promote K-block k-1 while K-block k's WGMMAs run (a second temporary accumulator)
        self.promote_overlap = promote_overlap
        if promote_overlap and not blockwise:
            raise ValueError("promote_overlap is an option of the FP8 block-scaled mode (blockwise=True)")
        # FP8: the tile's B-scale rows staged in smem once per tile (one LDS per K-block, no LDG)
        self.sb_smem = sb_smem
        if sb_smem and (not blockwise or schedule.kind != "cooperative"):
            raise ValueError("sb_smem is an option of the FP8 block-scaled mode (blockwise=True) with "
                             "schedule='cooperative'")
        # FP8 cooperative: the two consumer warpgroups issue each K-block's WGMMAs in turn, so one's
        # promotion runs under the other's WGMMAs (`mma_k_tiles_promoted`'s `turns`)
        self.wg_turns = wg_turns
        if wg_turns and (not blockwise or schedule.kind != "cooperative" or promote_overlap):
            raise ValueError("wg_turns is an option of the FP8 block-scaled mode (blockwise=True) with "
                             "schedule='cooperative', without promote_overlap")
        # FP8: each K-block's WGMMAs in two column halves (two groups), one half promoted while the
        # other runs (`mma_k_tiles_promoted_halves`: the overlap in acc + one temporary's registers)
        self.promote_halves = promote_halves
        # the 128 x 256 tile promotes its halves one after the other through one half-width temporary
        self.halves_seq = promote_halves and schedule.tile_n == HALVES_TILE_N
        if blockwise and halves_only_error(schedule, promote_halves):
            raise ValueError(halves_only_error(schedule, promote_halves))
        if promote_halves and (not blockwise or promote_overlap or wg_turns or schedule.tile_n % 16
                               or schedule.split_k > 1):
            raise ValueError("promote_halves is an option of the FP8 block-scaled mode (blockwise=True), without "
                             "promote_overlap, wg_turns or split-K, for tile_n a multiple of 16")
        # FP8, B scales from global: K-block k+1's loads issued during K-block k (`mma_k_tiles_promoted`'s
        # `sb_ahead`), so their L2 latency is off the promotion's critical path
        self.sb_ahead = sb_ahead
        if sb_ahead and (not blockwise or sb_smem or promote_halves):
            raise ValueError("sb_ahead is an option of the FP8 block-scaled mode (blockwise=True) with the B scales "
                             "read from global memory: not with sb_smem or promote_halves")
        self.split = schedule.split_k > 1
        self.fixup = schedule.split_fixup  # split-K in one launch: the last split of a tile sums and stores it
        # gated epilogue (SwiGLU over interleaved gate / up column blocks): D's tile is half of the accumulator's
        self.gated = ops.gated
        if self.gated and (schedule.gated_error() or grouping != "none"):
            raise ValueError(schedule.gated_error() or "the gated (swiglu) epilogue is not for the grouped modes")
        # FP8 SwiGLU + 1x128 quantization over a gate / up CTA pair (`glu_quant_error`, `collectives.epilogue`)
        self.glu_quant, self.glu_exchange = glu_quant, glu_exchange
        self.glu_pair = glu_quant and glu_exchange != "local"  # a 1x2 cluster's gate / up CTAs swap through smem
        if glu_quant:
            err = glu_quant_error(schedule, blockwise, grouping, ops.gated, promote_halves, glu_exchange)
            if err:
                raise ValueError(err)
        self.out_tile_n = schedule.tile_n // 2 if self.gated or glu_quant else schedule.tile_n
        if self.split and (grouping != "none" or blockwise and not self.fixup):
            raise ValueError("split_k > 1 is for the bf16/fp16 GEMM and the dense FP8 GEMM with split_fixup "
                             "(not the grouped modes)")
        if self.split and ops.source:
            raise ValueError("split_k > 1 does not fuse beta * C (source); use split_k=1")
        if schedule.wg_epilogue and blockwise:
            raise ValueError("wg_epilogue is an option of the bf16/fp16 GEMM (the FP8 sb_smem row re-joins the "
                             "warpgroups every tile)")

    def _sb_blocks(self) -> int:
        """B-scale blocks a tile covers (sb_smem's rows): 2 for tiles wider than or straddling a block."""
        return 2 if block_scales.wide_tile(self.s.tile_n) or self.s.tile_n > block_scales.BLOCK else 1

    @cute.jit
    def __call__(
        self,
        a: cute.Tensor,
        b: cute.Tensor,
        d: cute.Tensor,
        c: cute.Tensor,
        bias: cute.Tensor,
        alpha: Float32,
        beta: Float32,
        max_clusters: Int32,
        stream,
    ):
        self._launch(a, b, d, c, bias, alpha, beta, max_clusters, stream)

    @cute.jit
    def split_k(self, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, ws: cute.Tensor, bias: cute.Tensor,
                alpha: Float32, max_clusters: Int32, reduce_ctas: Int32, stream):
        """Split-K (`schedule.split_k` = S > 1): d (M, Np, L) = act(alpha * sum_s partial_s + bias) in two
        kernels on `stream`. The GEMM writes each (tile, split) unit's fp32 partial into ws
        (M, Np, L * S), batch s * L + l; the second pass sums the S partials in order 0..S-1 (no
        atomics: the result is bitwise reproducible) and applies the fused ops. d and ws are
        contiguous ((L, M, Np) and (S, L, M, Np) in memory) with Np a multiple of 8; bias has N = size(b, 0)
        elements (columns N..Np of d get act(alpha * 0) and are the caller's padding)."""
        self._launch(a, b, d, d, bias, alpha, Float32(0.0), max_clusters, stream, ws=ws)
        self._reduce_launch(ws, d, bias, alpha, cute.size(b, mode=[0]), reduce_ctas, stream)

    @cute.jit
    def split_k_fixup(self, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, ws: cute.Tensor, flags: cute.Tensor,
                      bias: cute.Tensor, alpha: Float32, max_clusters: Int32, stream):
        """Split-K in one launch (`schedule.split_fixup`): each (tile, split) unit writes its fp32 partial into
        ws as `split_k` does, then counts itself on the tile's int32 flag (one atomic, after a GPU-scope
        release fence); the unit that arrives last resets the flag to 0, sums the tile's partials in split
        order 0..S-1 (the summing pass's order: bitwise the same result) and runs the normal epilogue
        (fused ops, TMA store). flags: (tiles_m * tiles_n * L,) int32, all zero before the launch (and
        after it). d, ws as `split_k`."""
        self._launch(a, b, d, d, bias, alpha, Float32(0.0), max_clusters, stream, ws=ws, flags=flags)

    @cute.jit
    def fp8_split(self, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, sa: cute.Tensor, sb: cute.Tensor,
                  ws: cute.Tensor, flags: cute.Tensor, max_clusters: Int32, stream):
        """`fp8` with split-K in one launch (`schedule.split_fixup`): each split promotes its own K-blocks
        (two-level accumulation per 128-deep block, as unsplit), stores the fp32 partial into ws and the
        last split of a tile sums them (`split_k_fixup`). d (M, Np, 1), ws (M, Np, S)."""
        self._launch(a, b, d, d, d, Float32(1.0), Float32(0.0), max_clusters, stream, sa, sb, ws=ws, flags=flags)

    @cute.jit
    def fp8(self, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, sa: cute.Tensor, sb: cute.Tensor,
            max_clusters: Int32, stream):
        """D = (A * sa) @ (B * sb)^T with block scales (`blockwise=True`): a (M, K, L) and b (N, K, L)
        e4m3 K-major, sa (M, KB, L) fp32 unit stride along M, sb (NB, KB, L) fp32, d (M, N, L)."""
        self._launch(a, b, d, d, d, Float32(1.0), Float32(0.0), max_clusters, stream, sa, sb)

    @cute.jit
    def fp8_grouped(self, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, sa: cute.Tensor, sb: cute.Tensor,
                    groups: cute.Tensor, max_clusters: Int32, stream):
        """Grouped (MoE) `fp8`: b (N, K, E) and sb (NB, KB, E) per expert. "contiguous": a, sa, d with
        L = 1 and groups (M,) int32 the expert of each row (-1: padding); "masked": a (max_m, K, E),
        sa, d likewise per expert and groups (E,) int32 the valid rows of each expert."""
        self._launch(a, b, d, d, d, Float32(1.0), Float32(0.0), max_clusters, stream, sa, sb, groups)

    @cute.jit
    def fp8_glu(self, a: cute.Tensor, b: cute.Tensor, q: cute.Tensor, sa: cute.Tensor, sb: cute.Tensor,
                qs: cute.Tensor, groups: cute.Tensor, max_clusters: Int32, stream):
        """`glu_quant=True`: (q, qs) = the 1x128 e4m3 quantization of silu(gate) * up, gate and up the two row halves
        of B's product, `fp8` (grouping "none", groups ignored; one batch) or `fp8_grouped` ("contiguous"): b (2I, K,
        E) with the gate rows first, sb (2I / 128, KB, E), a and sa as `fp8`'s with L = 1, q (M, I, 1) e4m3, qs (M,
        I / 128) fp32 with unit stride along M (`quantize_1x128`'s layouts). Bit for bit the bf16 output of the plain
        GEMM through `swiglu_quantize`."""
        self._launch(a, b, q, q, q, Float32(1.0), Float32(0.0), max_clusters, stream, sa, sb, groups, qs=qs)

    @cute.jit
    def _launch(self, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, c: cute.Tensor, bias: cute.Tensor,
                alpha: Float32, beta: Float32, max_clusters: Int32, stream, sa: cute.Tensor = None,
                sb: cute.Tensor = None, groups: cute.Tensor = None, ws: cute.Tensor = None,
                flags: cute.Tensor = None, qs: cute.Tensor = None):
        """Host side of the entry points (runs while they are traced): layouts, TMA atoms, launch."""
        s = self.s
        if cutlass.const_expr(self.glu_quant):
            # B's rows seen in gate / up pairs: N block 2 j + h is rows [h I + 128 j, + 128) (h 0: gate, 1: up), and
            # its scale block h I / 128 + j; a 1x2 cluster's two CTAs take the pair, or ("local") one CTA's 256-column
            # tile holds both
            tn = GQ_TILE
            pairs = cute.size(b, mode=[0]) // (2 * tn)
            rs = b.stride[0]
            b = cute.make_tensor(b.iterator, cute.make_layout(
                ((tn, 2, pairs), cute.size(b, mode=[1]), cute.size(b, mode=[2])),
                stride=((rs, pairs * tn * rs, tn * rs), b.stride[1], b.stride[2])))
            bs = sb.stride[0]
            sb = cute.make_tensor(sb.iterator, cute.make_layout(
                ((2, pairs), cute.size(sb, mode=[1]), cute.size(sb, mode=[2])),
                stride=((pairs * bs, bs), sb.stride[1], sb.stride[2])))
        a_major, b_major, d_major = LayoutEnum.from_tensor(a), LayoutEnum.from_tensor(b), LayoutEnum.from_tensor(d)
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            self.ab_dtype, self.ab_dtype, a_major.sm90_mma_major_mode(), b_major.sm90_mma_major_mode(),
            self.acc_dtype, s.mma_atoms, tiler_mn=(64, s.tile_n))
        ab_bytes, out_bytes = self.ab_dtype.width // 8, self.out_dtype.width // 8
        stages = s.num_stages(ab_bytes, out_bytes)
        epi_buffers = s.epi_buffers
        # wg_epilogue: each warpgroup stores its 64 rows through a one-warpgroup MMA's C partition
        # (register for register the same as its part of the two-warpgroup one; tests/gemm/_probe.py)
        self.epi_majors = (a_major.sm90_mma_major_mode(), b_major.sm90_mma_major_mode())
        sA_layout = operand_smem_layout(a_major, self.ab_dtype, s.tile_m, s.tile_k, stages)
        sB_layout = operand_smem_layout(b_major, self.ab_dtype, s.tile_n, s.tile_k, stages)
        sC_layout = None
        if cutlass.const_expr(not self.glu_quant):  # (glu_quant: its exchange region in the buffers' place, or none)
            sC_layout = epi.smem_layout(d_major, self.out_dtype, s.epi_tile, epi_buffers)
        # `a_rows` (small M): A's box is the stage's first a_rows rows, a (a_rows, tile_k, stages * a_step) view of the
        # same ring (one swizzle atom along K: the short box's stage a_step * i is the first rows of stage i)
        a_step = s.a_step
        sA_box_layout = sA_layout
        if cutlass.const_expr(a_step > 1):
            sA_box_layout = operand_smem_layout(a_major, self.ab_dtype, s.a_rows, s.tile_k, stages * a_step)
        tma_a, tma_ga = operand_tma(a, sA_box_layout, s.tile_m // a_step, s.tile_k, s.cluster_n)
        tma_b, tma_gb = operand_tma(b, sB_layout, s.tile_n, s.tile_k, s.cluster_m)
        tma_d = None
        if cutlass.const_expr((not self.split or self.fixup) and not self.glu_quant):  # split-K stores fp32 partials
            tma_d, tma_gd = epi.store_tma(d, sC_layout, s.epi_tile)  # from registers; glu_quant its own vectors
        else:
            tma_gd = d

        scale_args = ()
        sS_box_layout = None
        sS_layout = None
        if cutlass.const_expr(self.blockwise):
            sS_layout = block_scales.smem_layout(s.tile_m, stages)
            # (`a_rows`: the A scales' box is the stage's first a_rows rows too, a view of the same ring as A's)
            sS_box_layout = sS_layout
            if cutlass.const_expr(a_step > 1):
                sS_box_layout = block_scales.smem_layout(s.a_rows, stages * a_step)
            tma_s, tma_gs = operand_tma(sa, sS_box_layout, s.tile_m // a_step, 1, 1)
        sb_elems = self._sb_blocks() * block_scales.SB_SMEM_MAX_KB if self.blockwise and self.sb_smem else 0

        @cute.struct
        class Storage:
            bars: cute.struct.MemRange[cutlass.Int64, stages * 2]
            last: cute.struct.MemRange[Int32, 2]  # split_fixup's per-group "arrived last" (in the barrier pad)
            sA: cute.struct.Align[cute.struct.MemRange[self.ab_dtype, cute.cosize(sA_layout)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[self.ab_dtype, cute.cosize(sB_layout)], 1024]
            if cutlass.const_expr(self.glu_pair):  # the pair's exchange region (`glu_quant_bytes`), two mbarriers
                gq: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, s.epi_bytes(2)], 1024]
                gq_bars: cute.struct.MemRange[cutlass.Int64, 2]
            elif cutlass.const_expr(not self.glu_quant):
                sC: cute.struct.Align[cute.struct.MemRange[self.out_dtype, cute.cosize(sC_layout)], 1024]
            if cutlass.const_expr(self.blockwise):  # the A scales' ring
                sS: cute.struct.Align[cute.struct.MemRange[Float32, cute.cosize(sS_layout)], 128]
            if cutlass.const_expr(sb_elems > 0):  # `sb_smem`: the B scales staged
                sSB: cute.struct.Align[cute.struct.MemRange[Float32, sb_elems], 16]

        self.storage = Storage
        if cutlass.const_expr(self.blockwise):
            scale_args = (tma_s, tma_gs, sb, sS_layout)
            if cutlass.const_expr(self.grouping != "none"):
                scale_args += (groups,)
        if cutlass.const_expr(self.split):
            if cutlass.const_expr(self.blockwise):  # FP8 split: the scale boxes, then the workspace
                scale_args = scale_args + (None, ws)
            else:
                scale_args = (None, None, None, None, None, ws)
            if cutlass.const_expr(self.fixup):
                scale_args += (None, None, flags)
        if cutlass.const_expr(self.promote_halves):  # the kernel's `half_mma`: WGMMAs tile_n / 2 wide
            half_mma, half_set = (sm90_utils.make_trivial_tiled_mma(
                self.ab_dtype, self.ab_dtype, a_major.sm90_mma_major_mode(), b_major.sm90_mma_major_mode(),
                self.acc_dtype, s.mma_atoms, tiler_mn=(64, s.tile_n // 2)) for _ in range(2))
            scale_args = scale_args + ((None,) if self.grouping == "none" else ()) + (None, half_mma, half_set)
        tiles_m = (cute.size(d, mode=[0]) + s.tile_m - 1) // s.tile_m
        tiles_n = (cute.size(d, mode=[1]) + self.out_tile_n - 1) // self.out_tile_n
        batch = cute.size(d, mode=[2])
        clusters = ((tiles_m + s.cluster_m - 1) // s.cluster_m) * ((tiles_n + s.cluster_n - 1) // s.cluster_n) * batch
        if cutlass.const_expr(self.split):
            clusters = clusters * s.split_k
        clusters = cutlass.max(cutlass.min(clusters, max_clusters), 1)
        self.kernel(tiled_mma, tma_a, tma_ga, tma_b, tma_gb, tma_d, tma_gd, c, bias, alpha, beta,
                    sA_layout, sB_layout, sC_layout, d_major, *scale_args, sA_box_layout=sA_box_layout,
                    sS_box_layout=sS_box_layout, mQS=qs).launch(
            grid=[s.cluster_m, s.cluster_n, clusters], block=[s.threads, 1, 1],
            cluster=[s.cluster_m, s.cluster_n, 1], stream=stream, use_pdl=pdl.LAUNCH, **self._reg_bound())

    def _reg_bound(self) -> dict:
        """`SETMAXNREG_LAUNCH` where it is needed: `promote_halves` at 128x160 spilled 176 B without it (C7508); the
        default configurations already get the full count."""
        return dict(SETMAXNREG_LAUNCH) if self.promote_halves else {}

    @cute.kernel
    def kernel(
        self,
        tiled_mma: cute.TiledMma,
        tma_a: cute.CopyAtom,
        mA: cute.Tensor,
        tma_b: cute.CopyAtom,
        mB: cute.Tensor,
        tma_d: cute.CopyAtom,
        mD: cute.Tensor,
        mC: cute.Tensor,
        bias: cute.Tensor,
        alpha: Float32,
        beta: Float32,
        sA_layout: cute.ComposedLayout,
        sB_layout: cute.ComposedLayout,
        sC_layout: cute.ComposedLayout,
        d_major: cutlass.Constexpr,
        tma_s: cute.CopyAtom = None,
        mSA: cute.Tensor = None,
        mSB: cute.Tensor = None,
        sS_layout: cute.Layout = None,
        groups: cute.Tensor = None,
        mW: cute.Tensor = None,
        half_mma: cute.TiledMma = None,
        half_set: cute.TiledMma = None,
        flags: cute.Tensor = None,
        sA_box_layout: cute.ComposedLayout = None,
        sS_box_layout: cute.Layout = None,
        mQS: cute.Tensor = None,
    ):
        s = self.s
        a_step = s.a_step  # (`a_rows`: A's short box, see `_launch`)
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = warp // 4
        if warp == 0:
            cpasync.prefetch_descriptor(tma_a)
            cpasync.prefetch_descriptor(tma_b)
            if cutlass.const_expr((not self.split or self.fixup) and not self.glu_quant):
                cpasync.prefetch_descriptor(tma_d)
            if cutlass.const_expr(self.blockwise):
                cpasync.prefetch_descriptor(tma_s)

        cluster_layout = cute.make_layout((s.cluster_m, s.cluster_n, 1))
        rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        cta_m, cta_n, _ = cluster_layout.get_flat_coord(rank)
        mask_a = cute.make_layout_image_mask(cluster_layout, (cta_m, cta_n, 0), mode=1) if s.cluster_n > 1 else 0
        mask_b = cute.make_layout_image_mask(cluster_layout, (cta_m, cta_n, 0), mode=0) if s.cluster_m > 1 else 0

        smem = cutlass.memory.SmemAllocator()
        st = smem.allocate(self.storage)
        last_flag = None
        if cutlass.const_expr(self.fixup):  # per storing group: "this unit arrived last" (see `split_k_fixup`)
            last_flag = st.last.get_tensor(cute.make_layout(2))
        tx_bytes = cute.size_in_bytes(self.ab_dtype, cute.slice_(sA_box_layout, (None, None, 0))) + cute.size_in_bytes(
            self.ab_dtype, cute.slice_(sB_layout, (None, None, 0)))
        if cutlass.const_expr(self.blockwise):
            tx_bytes += cute.size_in_bytes(Float32, cute.slice_(sS_box_layout, (None, None, 0)))
        pipe = make_pipeline(st.bars.data_ptr(), cute.size(sA_layout, mode=[2]), tx_bytes,
                             (s.cluster_m, s.cluster_n), 4 * s.consumers_per_tile)
        gq_bars = None
        if cutlass.const_expr(self.glu_pair):  # the pair's two exchanges (one arrival each, bytes from the peer)
            gq_bars = st.gq_bars.data_ptr()
            if warp == 0:
                if tidx == 0:
                    cute.arch.mbarrier_init(gq_bars, 1)  # the peer's words: one arrival + their bytes
                    # "halves": the amax halves (one arrival + bytes); "full": the peer has read (a warp each)
                    cute.arch.mbarrier_init(gq_bars + 1, 1 if self.glu_exchange == "halves" else 8)
                cute.arch.mbarrier_init_fence()
        pipeline.pipeline_init_arrive(cluster_shape_mn=(s.cluster_m, s.cluster_n), is_relaxed=True)

        sA = st.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = st.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        sC = None
        if cutlass.const_expr(not self.glu_quant):
            sC = st.sC.get_tensor(sC_layout.outer, swizzle=sC_layout.inner)

        # Global tiles: (tile, tile_k, tiles_m/n, tiles_k, L) for A/B, (tile_m, tile_n, tiles_m, tiles_n, L) for D.
        gA = cute.local_tile(mA, (s.tile_m, s.tile_k), (None, None, None))
        gB = cute.local_tile(mB, (s.tile_n, s.tile_k), (None, None, None))
        gD = cute.local_tile(mD, (s.tile_m, self.out_tile_n), (None, None, None))  # (gated: half of B's tile_n)
        sA_box, gA_box = sA, gA
        if cutlass.const_expr(a_step > 1):  # box i of the tile's rows is tile i * a_step of a_rows rows
            sA_box = st.sA.get_tensor(sA_box_layout.outer, swizzle=sA_box_layout.inner)
            gA_box = cute.local_tile(mA, (s.a_rows, s.tile_k), (None, None, None))
        tAsA, tAgA = cpasync.tma_partition(tma_a, cta_n, cute.make_layout(s.cluster_n),
                                           cute.group_modes(sA_box, 0, 2), cute.group_modes(gA_box, 0, 2))
        tBsB, tBgB = cpasync.tma_partition(tma_b, cta_m, cute.make_layout(s.cluster_m),
                                           cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2))
        sS = tSsS = tSgS = None
        if cutlass.const_expr(self.blockwise):
            sS = st.sS.get_tensor(sS_layout)
            sS_box = sS
            if cutlass.const_expr(a_step > 1):  # as A's: box i of the tile's rows is tile i * a_step of a_rows rows
                sS_box = st.sS.get_tensor(sS_box_layout)
            gS = cute.local_tile(mSA, (s.tile_m // a_step, 1), (None, None, None))
            tSsS, tSgS = cpasync.tma_partition(tma_s, 0, cute.make_layout(1),
                                               cute.group_modes(sS_box, 0, 2), cute.group_modes(gS, 0, 2))
        k_tiles = cute.size(gA, mode=[3])
        tiles_m = cute.size(gD, mode=[2])
        tiles_n = cute.size(gD, mode=[3])
        if cutlass.const_expr(self.grouping == "none"):
            if warp == 0:  # B's first K-blocks of this cluster's first unit into L2 while the previous kernel ends
                self._prefetch_b(tma_b, tBgB, TileWalk.create(tiles_m, tiles_n, cute.size(gD, mode=[4]), s),
                                 k_tiles, cta_m, cta_n, cute.size(sA_layout, mode=[2]))
        pdl.enter()  # launched as a programmatic dependent (collectives.pdl): nothing an earlier kernel wrote is
        # read before this (the masked walk below reads the expert counts)
        walk = TileWalk.create_grouped(tiles_m, tiles_n, cute.size(gD, mode=[4]), s, self.grouping, groups)
        experts = cute.size(mB, mode=[2]) if cutlass.const_expr(self.grouping == "contiguous") else None
        n_tiles = walk.count()

        pipeline.pipeline_init_wait(cluster_shape_mn=(s.cluster_m, s.cluster_n))

        if wg == 0:
            # ---- producer: one warp streams A/B K-blocks for every tile this cluster visits ----
            cute.arch.setmaxregister_decrease(s.producer_regs)
            if warp == 0:
                state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, cute.size(sA_layout, mode=[2]))
                for i in cutlass.range(n_tiles, unroll=1):
                    tm, tn, tl, te, valid = walk.tile(i, cta_m, cta_n, s, self.grouping, groups, experts)
                    if cutlass.const_expr(self.split):  # this unit's K-blocks only
                        k0, kn = walk.k_range(i, k_tiles, s)
                        split_box = (tma_s, tSgS[(None, tm * a_step, None, tl)], tSsS) if self.blockwise else ()
                        state = produce_k_tiles(pipe, state, kn,
                                                tma_a, tAgA[(None, tm * a_step, None, tl)], tAsA, mask_a,
                                                tma_b, tBgB[(None, tn, None, te)], tBsB, mask_b, *split_box,
                                                k_first=k0, a_step=a_step)
                    else:
                        if valid:  # B's batch index is the tile's expert (te is tl without grouping)
                            scale_box = (tma_s, tSgS[(None, tm * a_step, None, tl)], tSsS) if self.blockwise else ()
                            state = produce_k_tiles(pipe, state, k_tiles,
                                                    tma_a, tAgA[(None, tm * a_step, None, tl)], tAsA, mask_a,
                                                    tma_b, tBgB[(None, tn, None, te)], tBsB, mask_b, *scale_box,
                                                    a_step=a_step)
                pipe.producer_tail(state)
        else:
            # ---- consumers: WGMMA mainloop + epilogue ----
            cute.arch.setmaxregister_increase(s.consumer_regs)
            stages = cute.size(sA_layout, mode=[2])
            cwg = wg - 1  # 0 or 1
            epi_mma = tiled_mma
            if cutlass.const_expr(s.kind == "cooperative"):
                tid = tidx - 128  # 0..255 over both warpgroups
                first, step = 0, 1
                epi_tid = tid
                if cutlass.const_expr(s.wg_epilogue):  # each warpgroup stores its own 64 rows
                    epi_tid = tidx % 128
                    epi_bar = pipeline.NamedBarrier(barrier_id=_EPI_BAR + cwg, num_threads=128)
                    buf0 = cwg * s.epi_stages
                    is_store_warp = warp % 4 == 0
                    epi_mma = sm90_utils.make_trivial_tiled_mma(
                        self.ab_dtype, self.ab_dtype, self.epi_majors[0], self.epi_majors[1], self.acc_dtype,
                        (1, 1, 1), tiler_mn=(64, s.tile_n))
                else:
                    epi_bar = pipeline.NamedBarrier(barrier_id=_EPI_BAR, num_threads=256)
                    buf0 = 0
                    is_store_warp = warp == 4
            else:
                tid = tidx % 128
                epi_tid = tid
                first, step = (0, 1) if s.k_interleave else (cwg, 2)  # k_interleave: both on every tile
                epi_bar = pipeline.NamedBarrier(barrier_id=_EPI_BAR + cwg, num_threads=128)
                buf0 = cwg * s.epi_stages
                is_store_warp = warp % 4 == 0
            thr_mma = tiled_mma.get_slice(tid)
            tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
            tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
            tCcC = thr_mma.partition_C(cute.make_identity_tensor((s.tile_m, s.tile_n)))
            acc = cute.make_rmem_tensor(tCcC.shape, self.acc_dtype)
            glu = None
            if cutlass.const_expr(self.gated):
                # the epilogue's MMA layout at half the width (one warpgroup's 64 rows under wg_epilogue, register for
                # register its part of the full one), the products' registers, and where each product's gate and
                # up columns sit in the accumulator
                wg_rows = s.wg_epilogue and s.kind == "cooperative"
                atoms, rows = ((1, 1, 1), 64) if wg_rows else (s.mma_atoms, s.tile_m)
                glu_mma, glu_full = (sm90_utils.make_trivial_tiled_mma(
                    self.ab_dtype, self.ab_dtype, self.epi_majors[0], self.epi_majors[1], self.acc_dtype, atoms,
                    tiler_mn=(64, tn_)) for tn_ in (s.tile_n // 2, s.tile_n))
                gacc = cute.make_rmem_tensor(glu_mma.get_slice(0).partition_C(
                    cute.make_identity_tensor((rows, s.tile_n // 2))).shape, self.acc_dtype)
                glu = (glu_mma, gacc, epi.glu_pairs(glu_full, glu_mma, rows, s.tile_n))
            temp = temp2 = halves_args = None  # the promoted mainloops' temporaries (`_mainloop`)
            if cutlass.const_expr(self.blockwise):
                if cutlass.const_expr(self.promote_halves):
                    # two half-width temporaries and their operands: B's column halves [0, N/2), [N/2, N)
                    hn = s.tile_n // 2
                    thr_h = half_mma.get_slice(tid)
                    tCrA_h = half_mma.make_fragment_A(thr_h.partition_A(sA))
                    tCrB_h = tuple(half_mma.make_fragment_B(thr_h.partition_B(
                        cute.local_tile(sB, (hn, s.tile_k), (h, 0, None)))) for h in range(2))
                    c_half = thr_h.partition_C(cute.make_identity_tensor((s.tile_m, hn)))
                    # one register array, the two halves views of it (the sequential halves: both views one half)
                    views = 1 if self.halves_seq else 2
                    both = cute.make_rmem_tensor(cute.make_layout(views * cute.size(c_half)), self.acc_dtype)
                    hl = cute.make_layout(c_half.shape)
                    halves = tuple(cute.make_tensor(both.iterator + (h % views) * cute.size(c_half), hl)
                                   for h in range(2))
                    to_acc = half_index_map(tiled_mma, half_mma, s.tile_m, s.tile_n)
                    halves_args = (half_mma, half_set, halves, tCrA_h, tCrB_h, to_acc)
                    accumulate_mode(half_mma)
                    half_set.set(warpgroup.Field.ACCUMULATE, False)  # each K-block's first WGMMA overwrites
                else:
                    temp = cute.make_rmem_tensor(acc.shape, self.acc_dtype)
                if cutlass.const_expr(self.promote_overlap):
                    temp2 = cute.make_rmem_tensor(acc.shape, self.acc_dtype)
                slots = block_scales.element_slots(tiled_mma, s.tile_m, s.tile_n)
                sSB = scale_bar = None
                if cutlass.const_expr(self.sb_smem):
                    sSB = st.sSB.get_tensor(block_scales.sb_smem_layout(self._sb_blocks()))
                    scale_bar = pipeline.NamedBarrier(barrier_id=_SCALE_BAR, num_threads=256)

            accumulate_mode(tiled_mma)
            read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, stages)
            release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, stages)
            my_turn = pipeline.NamedBarrier(barrier_id=_ORDER_BAR + cwg, num_threads=256)
            their_turn = pipeline.NamedBarrier(barrier_id=_ORDER_BAR + 1 - cwg, num_threads=256)
            xready = xfree = xbuf = None
            kbase = Int32(0)  # k_interleave: the ring position of the tile's first K-block
            if cutlass.const_expr(s.k_interleave):
                # warpgroup 1's partial goes to warpgroup 0 through warpgroup 1's half of the epilogue buffers
                # (it stores nothing itself), as [value i][thread]: each store and load a full warp's 128 B
                xready = pipeline.NamedBarrier(barrier_id=_XCHG_BAR, num_threads=256)
                xfree = pipeline.NamedBarrier(barrier_id=_XCHG_BAR + 1, num_threads=256)
                half = s.epi_stages * s.epi_tile[0] * s.epi_tile[1]  # elements of one warpgroup's buffers
                xptr = cute.recast_ptr(st.sC.data_ptr() + half, dtype=self.acc_dtype)
                xbuf = cute.make_tensor(xptr, cute.make_layout((cute.size(acc), 128), stride=(128, 1)))
                if cwg == 0:
                    xfree.arrive()  # the buffer starts free
            elif cutlass.const_expr(s.kind == "pingpong"):
                # The producer fills the ring tile after tile; warpgroup 2's first tile starts after
                # tile 0's K-blocks, and each warpgroup skips the other's tiles (below).
                if cutlass.const_expr(self.split):  # split-K units differ in K-blocks by one
                    read.advance(cwg * walk.k_range(0, k_tiles, s)[1])
                    release.advance(cwg * walk.k_range(0, k_tiles, s)[1])
                else:
                    read.advance(cwg * k_tiles)
                    release.advance(cwg * k_tiles)
            store_pipe = pipeline.PipelineTmaStore.create(
                num_stages=s.epi_stages,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 128 * s.store_wgs))
            turns = None
            if cutlass.const_expr(self.wg_turns):
                # warpgroup 0 issues first; afterwards each warpgroup's last arrive of a tile opens the
                # other's first turn of the next (one arrive stays pending at the exit: harmless)
                turns = (my_turn, their_turn)
                if cwg == 0:
                    my_turn.arrive()
            counter = Int32(0)
            gq_regs = None
            if cutlass.const_expr(self.glu_quant):
                gq_regs = epi.glu_quant_regs(tiled_mma, s.tile_m, s.tile_n, self.glu_pair)
            for i in cutlass.range(first, n_tiles, step, unroll=1):
                # valid is False only for padding tiles of the contiguous grouping (cooperative only:
                # the ping-pong turn-taking assumes every tile is computed).
                tm, tn, tl, te, valid = walk.tile(i, cta_m, cta_n, s, self.grouping, groups, experts)
                if cutlass.const_expr(s.k_interleave):
                    # both warpgroups on this tile, no turns: warpgroup w reads the ring positions of parity w (from
                    # kbase + k0, every other one), so with the even ring (`GemmSchedule.k_interleave`) each stage
                    # belongs to one warpgroup on every tile, odd K-block counts included (kbase then changes parity
                    # from tile to tile, and warpgroup 1 may start the next tile before warpgroup 0 ends this one)
                    k0 = (cwg - kbase) & 1  # this warpgroup's first K-block of the tile
                    read = _ring_state(stages, kbase + k0)
                    release = _ring_state(stages, kbase + k0)
                    mine = (k_tiles - k0 + 1) // 2  # the odd K-block of an odd count: whoever owns its parity
                    if cutlass.const_expr(self.blockwise):
                        scales = block_scales.BlockScales.create(tCcC, slots, sS, mSB, tn * s.tile_n, te, None, tid,
                                                                 None, k0)
                        if cutlass.const_expr(self.sb_ahead):  # read-aheads past the tile's last K-block: clamped
                            scales = dataclasses.replace(scales, k_last=cute.size(mSB, mode=[1]) - 1)
                    else:
                        scales = None
                    self._mainloop(tiled_mma, acc, temp, temp2, halves_args, tCrA, tCrB, pipe, read, release, mine,
                                   scales, None, 2)
                    kbase = kbase + k_tiles
                    if cwg == 1:
                        xfree.arrive_and_wait()  # warpgroup 0 has added the previous tile's partial
                        for v in cutlass.range_constexpr(cute.size(acc)):
                            xbuf[v, tid] = acc[v]
                        xready.arrive()
                    else:
                        xready.arrive_and_wait()
                        for v in cutlass.range_constexpr(cute.size(acc)):
                            acc[v] = acc[v] + xbuf[v, tid]
                        xfree.arrive()
                        epi.apply_ops(self.ops, acc, tCcC, tm * s.tile_m, tn * s.tile_n, tl, mC, bias, alpha, beta)
                        counter = epi.store_tile(epi_mma, acc, epi_tid, sC, buf0, s.epi_stages, counter, tma_d,
                                                 gD[(None, None, tm, tn, tl)], s.epi_tile, self.out_dtype, d_major,
                                                 epi_bar, is_store_warp, store_pipe)
                else:
                    if cutlass.const_expr(s.kind == "pingpong"):
                        if i > 0:
                            my_turn.wait()  # the other warpgroup has issued its mainloop
                    if cutlass.const_expr(self.split):
                        k0, kn = walk.k_range(i, k_tiles, s)
                        if cutlass.const_expr(self.blockwise):  # this split's K-blocks, promoted as unsplit
                            scales = block_scales.BlockScales.create(tCcC, slots, sS, mSB, tn * s.tile_n, te, sSB, tid,
                                                                     scale_bar, k0)
                        else:
                            scales = None
                        read, release = self._mainloop(tiled_mma, acc, temp, temp2, halves_args, tCrA, tCrB, pipe,
                                                       read, release, kn, scales, turns)
                        if cutlass.const_expr(s.kind == "pingpong"):
                            their_turn.arrive()
                            _, k_next = walk.k_range(i + 1, k_tiles, s)  # the other warpgroup's next unit
                            read.advance(k_next)
                            release.advance(k_next)
                        epi.store_partial(acc, tCcC, mW, tm * s.tile_m, tn * s.tile_n,
                                          walk.split(i, s) * cute.size(gD, mode=[4]) + tl)
                        if cutlass.const_expr(self.fixup):
                            counter = self._fixup(acc, tCcC, mW, flags, last_flag, tm, tn, tl, tiles_m, tiles_n,
                                                  cute.size(gD, mode=[4]), epi_tid, epi_bar, cwg, epi_mma, sC, buf0,
                                                  counter, tma_d, gD, d_major, is_store_warp, store_pipe, mC, bias,
                                                  alpha, beta)
                    else:
                        if valid:
                            if cutlass.const_expr(self.blockwise):
                                scales = block_scales.BlockScales.create(tCcC, slots, sS, mSB, tn * s.tile_n, te,
                                                                         sSB, tid, scale_bar)
                            else:
                                scales = None
                            read, release = self._mainloop(tiled_mma, acc, temp, temp2, halves_args, tCrA, tCrB, pipe,
                                                           read, release, k_tiles, scales, turns)
                            if cutlass.const_expr(s.kind == "pingpong"):
                                their_turn.arrive()  # hand the tensor cores over; our epilogue overlaps their mainloop
                                read.advance(k_tiles)
                                release.advance(k_tiles)
                            epi.apply_ops(self.ops, acc, tCcC, tm * s.tile_m, tn * s.tile_n, tl, mC, bias, alpha, beta)
                            gD_tile = gD[(None, None, tm, tn, tl)]
                            if cutlass.const_expr(s.wg_epilogue):  # this warpgroup's rows of the tile
                                gD_tile = cute.local_tile(gD_tile, (64, self.out_tile_n), (cwg, 0))
                            if cutlass.const_expr(self.glu_quant and not self.glu_pair):  # gate and up here
                                epi.glu_quant_store_local(acc, tCcC, gq_regs, tid, mD[None, None, tl], mQS,
                                                          tm * s.tile_m, tn * self.out_tile_n, tn)
                            elif cutlass.const_expr(self.glu_quant):  # with the peer CTA: (q, scales) of the pair
                                glu_store = epi.glu_quant_store if self.glu_exchange == "halves" else \
                                    epi.glu_quant_store_full
                                glu_store(acc, tCcC, gq_regs, cta_n, 1 - cta_n, tid, st.gq.data_ptr(), gq_bars,
                                          gq_bars + 1, counter % 2, mD[None, None, tl], mQS, tm * s.tile_m,
                                          tn * self.out_tile_n, tn // 2)
                                counter = counter + 1  # (the exchanges' phase parity)
                            elif cutlass.const_expr(self.gated):  # silu(gate) * up into the half-width tile
                                epi.glu_fold(acc, glu[1], glu[2][0], glu[2][1], self.out_dtype.width == 16)
                                counter = epi.store_tile(glu[0], glu[1], epi_tid, sC, buf0, s.epi_stages, counter,
                                                         tma_d, gD_tile, s.epi_tile, self.out_dtype, d_major,
                                                         epi_bar, is_store_warp, store_pipe)
                            else:
                                counter = epi.store_tile(epi_mma, acc, epi_tid, sC, buf0, s.epi_stages, counter, tma_d,
                                                         gD_tile, s.epi_tile, self.out_dtype, d_major,
                                                         epi_bar, is_store_warp, store_pipe)
            store_pipe.producer_tail()
        if cutlass.const_expr(self.glu_quant and self.glu_exchange == "full"):
            # the last tile's "read" arrivals land in the peer before either CTA exits
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()

    def _mainloop(self, tiled_mma, acc, temp, temp2, halves_args, tCrA, tCrB, pipe, read, release, k_count, scales,
                  turns, k_step: int = 1):
        """acc over `k_count` K-blocks of the ring from `read` / `release`: the bf16 mainloop, or the FP8 promoted
        one this kernel was built with (halves, overlap, or plain with `turns` / `sb_ahead`); every K-block path
        (a tile, a split-K unit, a `k_interleave` warpgroup's share: `k_step`) calls this one choice. Returns the
        advanced (read, release)."""
        if cutlass.const_expr(not self.blockwise):
            return mma_k_tiles(tiled_mma, acc, tCrA, tCrB, pipe, read, release, k_count, 1, k_step)
        if cutlass.const_expr(self.promote_halves):
            half_mma, half_set, halves, tCrA_h, tCrB_h, to_acc = halves_args
            return mma_k_tiles_promoted_halves(half_mma, half_set, acc, halves, tCrA_h, tCrB_h, pipe, read, release,
                                               k_count, scales, to_acc, self.halves_seq)
        if cutlass.const_expr(self.promote_overlap):
            return mma_k_tiles_promoted_overlap(tiled_mma, acc, temp, temp2, tCrA, tCrB, pipe, read, release, k_count,
                                                scales, self.sb_ahead)
        return mma_k_tiles_promoted(tiled_mma, acc, temp, tCrA, tCrB, pipe, read, release, k_count, scales, turns,
                                    self.sb_ahead, k_step)

    @cute.jit
    def _fixup(self, acc: cute.Tensor, tCcC: cute.Tensor, mW: cute.Tensor, flags: cute.Tensor, last_flag: cute.Tensor,
               tm, tn, tl, tiles_m, tiles_n, batch, epi_tid, epi_bar, cwg, epi_mma, sC, buf0, counter, tma_d,
               gD: cute.Tensor, d_major: cutlass.Constexpr, is_store_warp, store_pipe, mC, bias, alpha, beta):
        """`split_k_fixup`'s end of a unit, after its partial is stored: count the unit on the tile's flag;
        the last of the tile's splits sums the partials (split order) into acc and stores the tile.
        Returns the epilogue's store counter."""
        s = self.s
        slot = cwg if cutlass.const_expr(s.kind == "pingpong") else 0
        cute.arch.fence_acq_rel_gpu()  # this thread's partial stores before the arrival (release)
        epi_bar.arrive_and_wait()
        tile = (tl * tiles_m + tm) * tiles_n + tn
        # A cluster rounds the tile grid up (tiles_n = 9 on a 1x2 cluster runs a 10th column of CTAs):
        # such a tile stores nothing and must not arrive, or it counts on the flag of the tile its
        # index aliases (tile (tm + 1, 0)) and lets that tile sum before all its partials are written.
        inside = tm < tiles_m and tn < tiles_n
        if epi_tid == 0 and inside:
            old = cute.arch.atomic_add((flags.iterator + tile).llvm_ptr, Int32(1), sem="acq_rel", scope="gpu")
            is_last = Int32(0)
            if old == s.split_k - 1:
                flags[tile] = Int32(0)  # for the next launch (stream-ordered: nothing else touches it now)
                is_last = Int32(1)
            last_flag[slot] = is_last
        epi_bar.arrive_and_wait()
        if last_flag[slot] == 1 and inside:
            cute.arch.fence_acq_rel_gpu()  # the other splits' partials (acquire)
            rows = cute.size(mW, mode=[0])
            cols = cute.size(mW, mode=[1])
            m0, n0 = tm * s.tile_m, tn * s.tile_n
            for i in cutlass.range_constexpr(cute.size(acc)):
                m = m0 + tCcC[i][0]
                n = n0 + tCcC[i][1]
                if m < rows and n < cols:
                    v = mW[m, n, tl]
                    for sp in cutlass.range_constexpr(1, s.split_k):
                        v = v + mW[m, n, sp * batch + tl]
                    acc[i] = v
            epi.apply_ops(self.ops, acc, tCcC, m0, n0, tl, mC, bias, alpha, beta)
            counter = epi.store_tile(epi_mma, acc, epi_tid, sC, buf0, s.epi_stages, counter, tma_d,
                                     gD[(None, None, tm, tn, tl)], s.epi_tile, self.out_dtype, d_major,
                                     epi_bar, is_store_warp, store_pipe)
        return counter

    @cute.jit
    def _prefetch_b(self, tma_b: cute.CopyAtom, tBgB: cute.Tensor, walk, k_tiles, cta_m, cta_n, stages):
        """TMA prefetches into L2 of the first `stages` K-blocks of B for this cluster's first unit (an L2 prefetch
        is only a hint: issued before the PDL wait it cannot read stale data). Decode-sized GEMMs stream B, the
        weight, and their first loads then hit L2."""
        s = self.s
        if walk.count() > 0:
            _, tn, batch, _, _ = walk.tile(0, cta_m, cta_n, s)
            k0, kn = walk.k_range(0, k_tiles, s)
            for j in cutlass.range(cutlass.min(kn, stages), unroll=1):
                cute.prefetch(tma_b, tBgB[(None, tn, k0 + j, batch)])

    @cute.jit
    def _reduce_launch(self, ws: cute.Tensor, d: cute.Tensor, bias: cute.Tensor, alpha: Float32, n_cols,
                       ctas: Int32, stream):
        self.reduce_kernel(ws, d, bias, alpha).launch(grid=[cutlass.max(ctas, 1), 1, 1],
                                                      block=[REDUCE_SCHEDULE.threads, 1, 1], stream=stream,
                                                      use_pdl=pdl.LAUNCH)

    @cute.kernel
    def reduce_kernel(self, ws: cute.Tensor, d: cute.Tensor, bias: cute.Tensor, alpha: Float32):
        """Split-K's second pass, an elementwise map (`map_vectors`) over the flat output: sum the
        S fp32 partials of each element in the fixed order 0, 1, ..., S-1, then the fused ops
        (`epilogue.apply_ops` on the vector, its column from the flat index), then the output dtype."""
        total = cute.size(d)  # M * Np * L: one split's slab of ws
        cols = cute.size(d, mode=[1])
        out = cute.make_tensor(d.iterator, cute.make_layout(total))
        planes = tuple(cute.make_tensor(ws.iterator + p * total, cute.make_layout(total))
                       for p in range(self.s.split_k))

        def f(idx, *vals):
            acc = vals[0]
            for v in vals[1:]:
                acc = acc + v
            if cutlass.const_expr(self.ops.fused):
                r = cute.make_rmem_tensor(acc.shape, Float32)
                r.store(acc)
                coords = cute.make_identity_tensor((1, cute.size(r)))
                epi.apply_ops(self.ops, r, coords, 0, idx % cols, 0, bias, bias, alpha, Float32(0.0))
                acc = r.load()
            return (acc.to(self.out_dtype),)

        map_vectors(planes, (out,), f, REDUCE_VEC, REDUCE_SCHEDULE, False, with_index=True)
