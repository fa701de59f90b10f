"""Catalogue entry of the FP8 block-scaled GEMM (lesson 13): the Hopper GEMM kernel in its
`blockwise` mode. Config: the schedule (restricted by `schedules.fp8_gemm`) and the MoE grouping
("none", "contiguous", "masked": `schedules.walks.TileWalk.tile`); signature: the output dtype.
A and B are e4m3 K-major, the scales fp32 (see `collectives.block_scales`)."""

from __future__ import annotations

from dataclasses import dataclass

from cute_kernels import dtypes
from cute_kernels.catalog import KernelSpec, Param
from cute_kernels.fake import fake_stream
from cute_kernels.lazy import cute, cutlass
from schedules.fp8_gemm import (
    EPI_STAGES,
    fp8_schedule,
    glu_quant_error,
    grouped_error,
    halves_error,
    halves_only_error,
    kind_defaults,
    overlap_error,
    sb_smem_error,
    turns_error,
)
from schedules.gemm import GROUPINGS, KINDS, GemmSchedule

OUT_DTYPES = ("bf16", "fp16")


def schedule_of(p):
    """The FP8 GemmSchedule (`schedules.fp8_gemm.fp8_schedule`) of resolved catalogue parameters."""
    return FP8_GEMM.schedule_of(p)


def params_for(schedule, **signature) -> dict:
    """Catalogue parameters of an FP8 `schedule` (a GemmSchedule from `schedules.fp8_gemm`)."""
    return {**FP8_GEMM.config_of(schedule), **signature}


def grouped_params(grouping: str, schedule, **signature) -> dict:
    """Catalogue parameters of a grouped FP8 GEMM ("contiguous" or "masked") with `schedule`."""
    return {**params_for(schedule, **signature), "grouping": grouping}


@dataclass(frozen=True, eq=False)
class Fp8GemmSpec(KernelSpec):
    def defaults(self, given):
        p = super().defaults(given)
        p.update(kind_defaults(given.get("schedule", p["schedule"])))
        return p

    def make_schedule(self, **fields):
        return fp8_schedule(**fields)  # tile_k 128, split-K's fix-up, stages counted with the scale boxes

    def check(self, p):
        s = schedule_of(p)  # raises ValueError naming an impossible tile / register / smem combination
        err = grouped_error(s, p["grouping"])
        if err:
            raise ValueError(err)
        if s.a_rows and p["grouping"] != "none":
            raise ValueError(f"a_rows {s.a_rows} (A's box cut to a decode batch's rows) is for the dense GEMM: a "
                             f"grouped tile's rows belong to its expert's block (grouping {p['grouping']!r})")
        if p["promote_overlap"]:
            err = overlap_error(s)
            if err:
                raise ValueError(err)
        if p["sb_smem"]:
            err = sb_smem_error(s)
            if err:
                raise ValueError(err)
        if p["wg_turns"]:
            err = turns_error(s, p["promote_overlap"])
            if err:
                raise ValueError(err)
        if p["promote_halves"]:
            err = halves_error(s, p["promote_overlap"], p["wg_turns"])
            if err:
                raise ValueError(err)
        err = halves_only_error(s, p["promote_halves"])
        if err:
            raise ValueError(err)
        if s.k_interleave:
            if p["promote_overlap"] or p["sb_smem"] or p["wg_turns"] or p["promote_halves"]:
                raise ValueError("k_interleave (two warpgroups on a tile's alternate K-blocks) runs the plain "
                                 "promotion (with or without sb_ahead): not with promote_overlap, sb_smem, wg_turns "
                                 "or promote_halves")
            err = s.exchange_error(dtypes.cutlass_of(p["out_dtype"]).width // 8)
            if err:
                raise ValueError(err)
        if p["glu_quant"]:
            err = glu_quant_error(s, True, p["grouping"], False, p["promote_halves"], p["glu_exchange"])
            if err:
                raise ValueError(err)
        if p["sb_ahead"] and (p["sb_smem"] or p["promote_halves"]):
            raise ValueError("sb_ahead=True reads the B scales from global one K-block ahead: not with sb_smem "
                             "or promote_halves")

    def build(self, p):
        from cute_kernels.gemm.kernels import Gemm

        ab = cutlass.Float8E4M3FN
        out = dtypes.cutlass_of(p["out_dtype"])
        s = schedule_of(p)

        def sym(div=1):
            return cute.sym_int32(divisibility=div)

        m, n, k, batch, kb, nb = sym(), sym(), sym(), sym(), sym(), sym()
        a = cute.runtime.make_fake_tensor(ab, (m, k, batch), stride=(sym(16), 1, sym(16)), assumed_align=16)
        b = cute.runtime.make_fake_tensor(ab, (n, k, batch), stride=(sym(16), 1, sym(16)), assumed_align=16)
        d = cute.runtime.make_fake_tensor(out, (m, n, batch), stride=(sym(8), 1, sym(8)), assumed_align=16)
        f32 = cutlass.Float32
        sa = cute.runtime.make_fake_tensor(f32, (m, kb, batch), stride=(1, sym(4), sym(4)), assumed_align=16)
        sb = cute.runtime.make_fake_tensor(f32, (nb, kb, batch), stride=(sym(), sym(), sym()), assumed_align=4)
        if p["glu_quant"]:  # (q, scales) of silu(gate) * up: q (M, I, L) e4m3, the scales (M, I / 128) M-major
            ih, ib = sym(128), sym()
            q = cute.runtime.make_fake_tensor(ab, (m, ih, batch), stride=(sym(16), 1, sym(16)), assumed_align=16)
            qs = cute.runtime.make_fake_tensor(f32, (m, ib), stride=(1, sym(4)), assumed_align=16)
            groups = cute.runtime.make_fake_tensor(cutlass.Int32, (sym(),), stride=(1,), assumed_align=4)
            if p["grouping"] == "contiguous":
                experts = sym()
                b = cute.runtime.make_fake_tensor(ab, (n, k, experts), stride=(sym(16), 1, sym(16)), assumed_align=16)
                sb = cute.runtime.make_fake_tensor(f32, (nb, kb, experts), stride=(sym(), sym(), sym()),
                                                   assumed_align=4)
            kernel = Gemm(ab, out, s, blockwise=True, grouping=p["grouping"], promote_overlap=p["promote_overlap"],
                          sb_smem=p["sb_smem"], wg_turns=p["wg_turns"], sb_ahead=p["sb_ahead"], glu_quant=True,
                          glu_exchange=p["glu_exchange"], promote_halves=p["promote_halves"])
            return kernel.fp8_glu, (a, b, q, sa, sb, qs, groups, cutlass.Int32(1), fake_stream())
        if p["grouping"] == "none":
            kernel = Gemm(ab, out, s, blockwise=True, promote_overlap=p["promote_overlap"], sb_smem=p["sb_smem"],
                          wg_turns=p["wg_turns"], promote_halves=p["promote_halves"], sb_ahead=p["sb_ahead"])
            if s.split_k > 1:  # d (M, Np, 1) and the fp32 workspace (M, Np, S) contiguous; per-tile flags
                npad = sym(8)
                d = cute.runtime.make_fake_tensor(out, (m, npad, batch), stride=(npad, 1, sym(8)), assumed_align=16)
                ws = cute.runtime.make_fake_tensor(f32, (m, npad, sym()), stride=(npad, 1, sym(8)), assumed_align=16)
                flags = cute.runtime.make_fake_tensor(cutlass.Int32, (sym(),), stride=(1,), assumed_align=4)
                return kernel.fp8_split, (a, b, d, sa, sb, ws, flags, cutlass.Int32(1), fake_stream())
            return kernel.fp8, (a, b, d, sa, sb, cutlass.Int32(1), fake_stream())
        # Grouped: B and sb per expert (E); A, sa, d have L = 1 (contiguous) or E (masked), symbolic
        # here; groups is the expert of each row (contiguous, M) or the valid rows per expert (masked, E).
        experts = sym()
        b = cute.runtime.make_fake_tensor(ab, (n, k, experts), stride=(sym(16), 1, sym(16)), assumed_align=16)
        sb = cute.runtime.make_fake_tensor(f32, (nb, kb, experts), stride=(sym(), sym(), sym()), assumed_align=4)
        groups = cute.runtime.make_fake_tensor(cutlass.Int32, (sym(),), stride=(1,), assumed_align=4)
        kernel = Gemm(ab, out, s, blockwise=True, grouping=p["grouping"], promote_overlap=p["promote_overlap"],
                      sb_smem=p["sb_smem"], wg_turns=p["wg_turns"], promote_halves=p["promote_halves"],
                      sb_ahead=p["sb_ahead"])
        return kernel.fp8_grouped, (a, b, d, sa, sb, groups, cutlass.Int32(1), fake_stream())

    def representative(self):
        return [self.resolve(), self.resolve({"schedule": "pingpong", "tile_m": 64})]

    def sweep(self):
        return self.representative() + [
            self.resolve({"tile_n": 64}), self.resolve({"schedule": "pingpong", "tile_m": 64, "tile_n": 64}),
            self.resolve({"cluster_m": 1, "persistent": False}), self.resolve({"out_dtype": "fp16"}),
            *self.grouped()]

    def grouped(self):
        """The MoE variants: contiguous (cooperative, 1x2 clusters), masked (both kinds)."""
        return [self.resolve({"grouping": "contiguous", "cluster_m": 1, "cluster_n": 2}),
                self.resolve({"grouping": "masked"}),
                self.resolve({"grouping": "masked", "schedule": "pingpong", "tile_m": 64})]


FP8_GEMM = Fp8GemmSpec(
    name="fp8_gemm",
    family="fp8_gemm",
    lesson=13,
    summary="FP8 e4m3 GEMM with 1x128 / 128x128 fp32 block scales, two-level (promoted) accumulation, "
            "on the Hopper GEMM's TMA pipeline and warp roles",
    ops=("fp8_gemm", "fp8_gemm_grouped_contiguous", "fp8_gemm_grouped_contiguous_swiglu", "fp8_gemm_grouped_masked",
         "quantize_1x128", "quantize_128x128"),
    status="ready",
    schedule=GemmSchedule,
    params={
        "out_dtype": Param("bf16", OUT_DTYPES, "signature", "output element type"),
        "schedule": Param("cooperative", KINDS, help="consumer warpgroups: split one tile, or alternate tiles"),
        "tile_m": Param(128, (64, 128), help="CTA tile rows (cooperative 128, ping-pong 64)"),
        "tile_n": Param(128, (16, 32, 64, 128, 160, 192, 256),
                        help="CTA tile columns (a scale block or a 1/2-1/8 of one; 160 / 192: cooperative only, "
                             "spanning two scale blocks; 256: cooperative with promote_halves)"),
        "cluster_m": Param(2, (1, 2), help="CTAs per cluster along M (share B by multicast)"),
        "cluster_n": Param(1, (1, 2), help="CTAs per cluster along N (share A by multicast)"),
        "stages": Param(0, tuple([0] + list(range(2, 17))), help="A/B/scale smem stages (0: as many as fit, at most "
                        "8; up to 16 when asked: the narrow small-M tiles)"),
        "epi_stages": Param(4, EPI_STAGES, help="output sub-tile smem buffers (3: room for a 6th stage at "
                                                "128x128)"),
        "raster_group": Param(8, (1, 2, 4, 8, 16), help="cluster-rows per raster group"),
        "persistent": Param(True, (True, False), help="persistent CTAs walking tiles, or one tile each"),
        "grouping": Param("none", GROUPINGS, help="MoE grouped GEMM: none, contiguous (expert per row block), "
                                                  "masked (valid rows per expert)"),
        "promote_overlap": Param(False, (False, True), help="promote K-block k-1 while K-block k's WGMMAs run "
                                                            "(a second temporary accumulator; default off)"),
        "sb_smem": Param(False, (False, True), help="stage the tile's B-scale rows in smem once per tile (one LDS "
                                                    "per K-block instead of an LDG; cooperative, K <= 65536)"),
        "wg_turns": Param(False, (False, True), help="cooperative: the two consumer warpgroups issue each K-block's "
                                                     "WGMMAs in turn (named barriers), so one promotes while the "
                                                     "other's WGMMAs run (default off)"),
        "split_k": Param(1, tuple(range(1, 17)), help="K splits per tile (small M; > 1: each split promotes its own "
                                                      "K-blocks, the last split of a tile sums them: one launch)"),
        "a_rows": Param(0, (0, 8, 16, 32), help="decode M <= a_rows: A's and its scales' TMA boxes of the tile's first "
                        "a_rows rows, none of them past M (0: the whole tile)"),
        "k_interleave": Param(False, (False, True), help="ping-pong 64 x <= 64: both consumer warpgroups on every "
                              "tile, each every other K-block (plain promotion), partials summed through smem"),
        "promote_halves": Param(False, (False, True), help="each K-block's WGMMAs in two column halves: one half is "
                                                           "promoted while the other runs (the overlap without a "
                                                           "second full temporary; default off)"),
        "glu_quant": Param(False, (False, True), help="the SwiGLU + 1x128 e4m3 quantization epilogue: B's row halves "
                                                      "are gate and up, a 1x2 cluster takes a gate and an up tile "
                                                      "(cooperative 128x128), or one CTA both (128x256, "
                                                      "glu_exchange 'local'), and writes (q, scales) of the product"),
        "glu_exchange": Param("halves", ("halves", "full", "local"),
                              help="glu_quant: what the gate / up pair swaps: half its accumulator, then row amax "
                                   "halves (two round trips), or all of it (one; epi_stages 4); 'local': no pair, "
                                   "a 128x256 tile in a 1x1 cluster with promote_halves"),
        "sb_ahead": Param(False, (False, True), help="B scales read from global one K-block ahead (their L2 latency "
                                                     "off the promotion's path; also with promote_overlap; not with "
                                                     "sb_smem or promote_halves; default off)"),
    },
)

SPECS = (FP8_GEMM,)
