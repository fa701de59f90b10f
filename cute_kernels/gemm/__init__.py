"""Catalogue entry of the Hopper GEMM (lesson 10): its schedule parameters (config) and what the data
is (signature: dtypes, operand majors, fused epilogue)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from cute_kernels import dtypes
from cute_kernels.catalog import KernelSpec, Param
from cute_kernels.fake import fake_stream
from cute_kernels.lazy import cute, cutlass
from schedules.gemm import KINDS, GemmSchedule

AB_DTYPES = ("bf16", "fp16")


def schedule_of(p) -> GemmSchedule:
    """The GemmSchedule of resolved catalogue parameters."""
    return GEMM.schedule_of(p)


def params_for(schedule: GemmSchedule, **signature) -> dict:
    """Catalogue parameters for `schedule` plus signature overrides."""
    return {**GEMM.config_of(schedule), **signature}


def ops_of(p):
    from collectives.epilogue import EpilogueOps

    return EpilogueOps(p["activation"], p["bias"], p["source"], p["scale"])


@dataclass(frozen=True, eq=False)
class GemmSpec(KernelSpec):
    def defaults(self, given):
        p = super().defaults(given)
        p.update(GemmSchedule.kind_defaults(given.get("schedule", p["schedule"])))
        return p

    def check(self, p):
        s = schedule_of(p)  # raises on an impossible tile/cluster/register combination
        ops_of(p)
        err = s.build_error(dtypes.elem_bytes(p["dtype"]), dtypes.elem_bytes(p["out_dtype"]), p["source"],
                            p["a_major"] == "k", p["activation"] == "swiglu")
        if err:
            raise ValueError(err)

    def build(self, p):
        from cute_kernels.gemm.kernels import Gemm

        ab = dtypes.cutlass_of(p["dtype"])
        out = dtypes.cutlass_of(p["out_dtype"])
        s = schedule_of(p)

        def sym(div=1):
            return cute.sym_int32(divisibility=div)

        m, n, k, batch = sym(), sym(), sym(), sym()

        def operand(dt, rows, cols, rows_major):
            v = 16 // (dt.width // 8)  # TMA: non-unit strides are multiples of 16 bytes
            stride = (1, sym(v), sym(v)) if rows_major else (sym(v), 1, sym(v))
            return cute.runtime.make_fake_tensor(dt, (rows, cols, batch), stride=stride, assumed_align=16)

        a = operand(ab, m, k, p["a_major"] == "m")
        b = operand(ab, n, k, p["b_major"] == "n")
        nd = sym() if p["activation"] == "swiglu" else n  # D's (and C's) columns: gated, half of B's N
        d = operand(out, m, nd, False)
        c = cute.runtime.make_fake_tensor(out, (m, nd, batch), stride=(sym(), sym(), sym()), assumed_align=out.width // 8)
        bias = cute.runtime.make_fake_tensor(out, (sym(),), stride=(sym(),), assumed_align=out.width // 8)
        if s.split_k > 1:
            # d (M, Np, L) and the fp32 workspace (M, Np, L * S), both contiguous, Np a multiple of 8.
            npad = sym(8)
            d = cute.runtime.make_fake_tensor(out, (m, npad, batch), stride=(npad, 1, sym(8)), assumed_align=16)
            ws = cute.runtime.make_fake_tensor(cutlass.Float32, (m, npad, sym()), stride=(npad, 1, sym(8)), assumed_align=16)
            if s.split_fixup:  # one launch: a per-tile int32 arrival count, zero before and after the launch
                flags = cute.runtime.make_fake_tensor(cutlass.Int32, (sym(),), stride=(1,), assumed_align=4)
                return Gemm(ab, out, s, ops_of(p)).split_k_fixup, (a, b, d, ws, flags, bias, cutlass.Float32(1.0), cutlass.Int32(1),
                                                                   fake_stream())
            return Gemm(ab, out, s, ops_of(p)).split_k, (a, b, d, ws, bias, cutlass.Float32(1.0), cutlass.Int32(1), cutlass.Int32(1),
                                                         fake_stream())
        return Gemm(ab, out, s, ops_of(p)), (a, b, d, c, bias, cutlass.Float32(1.0), cutlass.Float32(0.0), cutlass.Int32(1), fake_stream())

    def representative(self):
        return [self.resolve(), self.resolve({"schedule": "pingpong", "tile_n": 128}),
                self.resolve({"schedule": "pingpong", "tile_n": 192, "activation": "swiglu"})]

    def sweep(self):
        out = []
        for kind, am, bm in itertools.product(KINDS, ("k", "m"), ("k", "n")):
            over = {"schedule": kind, "a_major": am, "b_major": bm}
            if kind == "pingpong":
                over["tile_n"] = 128
            out.append(self.resolve(over))
        for act, bias in itertools.product(("relu", "gelu", "silu"), (True, False)):
            out.append(self.resolve({"activation": act, "bias": bias}))
        out.append(self.resolve({"activation": "swiglu"}))
        out.append(self.resolve({"activation": "swiglu", "wg_epilogue": True}))
        out.append(self.resolve({"activation": "swiglu", "schedule": "pingpong", "tile_m": 64, "tile_n": 128,
                                 "a_rows": 16}))
        out.append(self.resolve({"source": True, "scale": True}))
        out.append(self.resolve({"dtype": "fp16", "out_dtype": "fp16"}))
        return out


_d = GemmSchedule()
GEMM = GemmSpec(
    name="gemm",
    family="gemm",
    lesson=10,
    summary="TMA + WGMMA GEMM, warp-specialized (cooperative | ping-pong), persistent, clusters, fused epilogue",
    ops=("gemm", "addmm", "gemm_swiglu"),
    status="ready",
    schedule=GemmSchedule,
    params={
        "dtype": Param("bf16", AB_DTYPES, "signature", "A and B element type"),
        "out_dtype": Param("bf16", AB_DTYPES + ("fp32",), "signature", "output (and C, bias) element type"),
        "a_major": Param("k", ("k", "m"), "signature", "A (M, K): unit stride along K (row-major) or M"),
        "b_major": Param("k", ("k", "n"), "signature", "B as (N, K): unit stride along K (B col-major) or N"),
        "activation": Param("none", ("none", "relu", "gelu", "silu", "swiglu"), "signature",
                            "fused activation (swiglu: silu(gate) * up of B's interleaved 8-column blocks, D half as "
                            "wide)"),
        "bias": Param(False, (True, False), "signature", "fused + bias[n]"),
        "source": Param(False, (True, False), "signature", "fused + beta * C"),
        "scale": Param(False, (True, False), "signature", "fused alpha * acc"),
        "schedule": Param(_d.kind, KINDS, help="consumer warpgroups: split one tile, or alternate tiles"),
        "tile_m": Param(_d.tile_m, (64, 128, 256), help="CTA tile rows"),
        "tile_n": Param(_d.tile_n, (32, 64, 96, 128, 160, 192, 224, 256), help="CTA tile columns (ping-pong's default: 128; at most 192 there)"),
        "tile_k": Param(_d.tile_k, (32, 64, 128), help="K-block per pipeline stage"),
        "cluster_m": Param(_d.cluster_m, (1, 2, 4), help="CTAs per cluster along M (share B by multicast)"),
        "cluster_n": Param(_d.cluster_n, (1, 2, 4), help="CTAs per cluster along N (share A by multicast)"),
        "stages": Param(_d.stages, tuple([0] + list(range(2, 17))), help="A/B smem stages (0: as many as fit, at most "
                        "8; more only when asked: small tiles, latency-bound grids)"),
        "raster_group": Param(_d.raster_group, (1, 2, 4, 8, 16), help="cluster-rows per raster group"),
        "persistent": Param(_d.persistent, (True, False), help="persistent CTAs walking tiles, or one tile each"),
        "split_k": Param(_d.split_k, tuple(range(1, 17)),
                         help="K splits per tile (> 1: fp32 partials + a deterministic summing pass)"),
        "split_fixup": Param(_d.split_fixup, (False, True),
                             help="split-K: the last split of a tile sums the partials in split order and "
                                  "stores it (one launch, per-tile arrival flags) instead of a summing pass"),
        "epi_stages": Param(_d.epi_stages, (2, 3, 4), help="output sub-tile smem buffers per storing group "
                                                           "(2: a 5th stage at 128x192)"),
        "wg_epilogue": Param(_d.wg_epilogue, (True, False), help="cooperative: each consumer warpgroup stores "
                                                                 "its own rows (no shared epilogue barrier)"),
        "k_interleave": Param(_d.k_interleave, (False, True), help="ping-pong 64 x <= 64: both consumer warpgroups "
                              "on every tile, each every other K-block, partials summed through smem"),
        "a_rows": Param(_d.a_rows, (0, 8, 16, 32), help="small M (M <= a_rows): A's TMA box of the tile's first "
                        "a_rows rows, none of it past M (0: the whole tile)"),
    },
)


# --- the SIMT rungs of the ladder (shared-memory tiled, register tiled) --------------------------
@dataclass(frozen=True, eq=False)
class GemmSimtSpec(KernelSpec):
    def check(self, p):
        self.tiling(p)

    @staticmethod
    def tiling(p):
        from cute_kernels.gemm.simt import SimtTiling

        return SimtTiling(p["tile_m"], p["tile_n"], p["tile_k"], p["thr_m"], p["thr_n"])

    def build(self, p):
        from cute_kernels.gemm.simt import SimtGemm

        ab, out = dtypes.cutlass_of(p["dtype"]), dtypes.cutlass_of(p["out_dtype"])
        m, n, k = cute.sym_int32(), cute.sym_int32(), cute.sym_int32()

        def mat(dt, rows, cols):
            return cute.runtime.make_fake_tensor(dt, (rows, cols), stride=(cute.sym_int32(), 1),
                                                 assumed_align=dt.width // 8)

        return SimtGemm(ab, out, self.tiling(p)), (mat(ab, m, k), mat(ab, k, n), mat(out, m, n), fake_stream())

    def representative(self):
        return [self.resolve(RUNGS["smem"]), self.resolve(RUNGS["register"])]


RUNGS = {
    "smem": {"tile_m": 32, "tile_n": 32, "tile_k": 32, "thr_m": 1, "thr_n": 1},
    "register": {"tile_m": 128, "tile_n": 128, "tile_k": 8, "thr_m": 8, "thr_n": 8},
}

GEMM_SIMT = GemmSimtSpec(
    name="gemm.simt",
    family="gemm",
    lesson=10,
    summary="GEMM ladder on CUDA cores: shared-memory tiled (1 output/thread) and register tiled (8x8/thread)",
    ops=("gemm_ladder",),
    status="ready",
    params={
        "dtype": Param("bf16", ("bf16", "fp16", "fp32"), "signature", "A and B element type"),
        "out_dtype": Param("bf16", ("bf16", "fp16", "fp32"), "signature", "C element type"),
        "tile_m": Param(128, (16, 32, 64, 128), help="CTA tile rows"),
        "tile_n": Param(128, (16, 32, 64, 128), help="CTA tile columns (ping-pong's default: 128; at most 192 there)"),
        "tile_k": Param(8, (8, 16, 32), help="K slice per shared-memory stage"),
        "thr_m": Param(8, (1, 2, 4, 8), help="output rows per thread (register tile)"),
        "thr_n": Param(8, (1, 2, 4, 8), help="output columns per thread (register tile)"),
    },
)

SPECS = (GEMM, GEMM_SIMT)
