"""W4A16 family (the inference layer): y = x W^T with W in int4 groups along K (scales, optional zero points),
dequantized in registers in front of the tensor cores. Small M (1-16, the decode shapes where the weight bytes
are the whole cost) runs the tensor-core GEMV mainloop of `cute_kernels.gemv.mma` with its int4 units; the packing
(`pack.py`) is chosen for that mainloop's fragments.

Files: this catalogue entry, `pack.py`, `ops.py`, `bench.py`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from cute_kernels import dtypes
from cute_kernels.catalog import SIG_COMMON, KernelSpec, Param
from cute_kernels.fake import fake_stream, fake_tensor, index_sym
from cute_kernels.lazy import cutlass
from schedules.gemv import GemvMmaPlan
from schedules.grid_stride import GridStride
from schedules.w4a16 import COL_TILES, INT4_PLAN, W4A16Plan

GROUPS = (0, 32, 64, 128)  # 0: per channel (one group of K)


@dataclass(frozen=True, eq=False)
class W4A16Spec(KernelSpec):
    def build(self, p):
        from cute_kernels.gemv.mma import GemvMma

        dt = dtypes.cutlass_of(p["dtype"])
        kernel = GemvMma(dt, p["cols"], p["index64"], p["warps"], p["row_blocks"], p["unroll"], int4=True,
                         group=p["group"], zeros=p["zeros"])
        sym = lambda d=1: index_sym(p["index64"], d)  # noqa: E731
        n, k = sym(), sym(32)
        w = fake_tensor(cutlass.Int32, (n, sym(4)), (sym(4), 1), 16)
        xt = fake_tensor(dt, (p["cols"], k), (sym(8), 1), 16)
        y = fake_tensor(dt, (n, p["cols"]), (sym(), sym()), dt.width // 8)
        scales, zeros = (fake_tensor(dt, (n, sym()), (sym(), sym()), dt.width // 8) for _ in range(2))
        return kernel, (w, xt, y, scales, zeros, fake_stream())

    def dynamic_smem_bytes(self, p):
        return self.schedule_of(p).reduce_smem_bytes(p["cols"])

    def representative(self):
        return [self.resolve(), self.resolve({"cols": 16, "zeros": True, "group": 32}),
                self.resolve({"cols": 4, "dtype": "fp16", "group": 0, "row_blocks": 1})]

    def sweep(self):
        return [self.resolve({"dtype": d, "cols": c, "group": g, "zeros": z})
                for d, c, g, z in itertools.product(("bf16", "fp16"), (1, 2, 8, 9, 16), GROUPS, (False, True))]


W4A16_MMA = W4A16Spec(
    name="w4a16.mma", family="w4a16", lesson=0,
    summary="y = x W^T, W int4 in groups along K: the tensor-core GEMV mainloop with int4 units (16 bytes of W a "
            "lane, dequantized by lop3 and packed fma / mul in registers), x of 1-16 rows",
    ops=("gemm_w4a16",), status="ready", schedule=GemvMmaPlan,
    params={
        "dtype": Param("bf16", ("bf16", "fp16"), "signature", "element type of x, the scales and y"),
        "index64": SIG_COMMON["index64"],
        "cols": Param(1, tuple(range(1, 17)), "signature", "rows of x (M)"),
        "group": Param(128, GROUPS, "signature", "group size along K (0: per channel)"),
        "zeros": Param(False, (True, False), "signature", "zero points (else symmetric, zero point 8)"),
        "warps": Param(4, (2, 4, 8, 16), help="warps per CTA, splitting K in 128-wide chunks"),
        "row_blocks": Param(2, (1, 2, 4), help="8-row blocks of W per CTA (one x load serves them all)"),
        "unroll": Param(2, (1, 2, 4), help="K chunks loaded before their MMAs"),
    },
)



def stream_plan_params(default: W4A16Plan) -> dict:
    """The `W4A16Plan` fields as config parameters of a streaming-kernel spec (int4 here, dense in `gemv.stream`),
    defaulting to the op's plan `default`."""
    return {
        "consumer_warps": Param(default.consumer_warps, (2, 4, 8), help="MMA warps per CTA (plus one TMA producer warp)"),
        "m_tiles": Param(default.m_tiles, (1, 2, 4), help="16-row MMA tiles of W per consumer warp"),
        "stages": Param(default.stages, (2, 3, 4, 5, 6), help="stages of the TMA ring"),
        "k_boxes": Param(default.k_boxes, (1, 2, 4), help="256-k boxes of W a stage"),
    }


def stream_fakes(dt, w_dt, k_div: int, gated: bool = False):
    """Fake (w, x, y, part, counter) of a streaming-kernel compile: W (N, its K / 8 packed words, or K) of `w_dt`
    (int32 / `dt`), x (M, K) with K a multiple of `k_div`, y (M, N) (the gated epilogue's (M, N / 2): a width of its
    own), the split workspace and counters with their own symbols (one split passes placeholders of other shapes);
    rows 16-byte aligned."""
    sym = lambda d=1: index_sym(False, d)  # noqa: E731
    n, m, k = sym(), sym(), sym(k_div)
    vec = 16 // (w_dt.width // 8)  # elements of 16 bytes
    w = fake_tensor(w_dt, (n, sym(vec if w_dt.width == 16 else k_div // 8)), (sym(vec), 1), 16)
    x = fake_tensor(dt, (m, k), (sym(8), 1), 16)
    y = fake_tensor(dt, (m, sym() if gated else n), (sym(), sym()), dt.width // 8)
    part = fake_tensor(cutlass.Float32, (sym(), sym(), sym()), (sym(), sym(), 1), 4)
    counter = fake_tensor(cutlass.Int32, (sym(),), (1,), 4)
    return w, x, y, part, counter


@dataclass(frozen=True, eq=False)
class W4A16StreamSpec(KernelSpec):
    def build(self, p):
        from cute_kernels.w4a16.kernels import W4A16Stream

        dt = dtypes.cutlass_of(p["dtype"])
        kernel = W4A16Stream(dt, p["col_tiles"], p["group"], p["zeros"], self.schedule_of(p), source=p["source"],
                             gated=p["gated"])
        w, x, y, part, counter = stream_fakes(dt, cutlass.Int32, 32, p["gated"])
        n = w.shape[0]
        sym = lambda: index_sym(False)  # noqa: E731
        scales, zeros = (fake_tensor(dt, (n, sym()), (sym(), sym()), dt.width // 8) for _ in range(2))
        src = fake_tensor(dt, (sym(), sym()), (sym(), sym()), dt.width // 8)  # (M, N), any strides
        return kernel, (w, x, y, scales, zeros, part, counter, cutlass.Int32(1), cutlass.Int32(1), src,
                        cutlass.Float32(1.0), cutlass.Float32(1.0), fake_stream())

    def check(self, p):
        super().check(p)
        if p["source"] and p["gated"]:
            raise ValueError(f"{self.name}: the gated epilogue takes no source")

    def dynamic_smem_bytes(self, p):
        return self.schedule_of(p).smem_bytes(p["col_tiles"])

    def representative(self):
        return [self.resolve(), self.resolve({"col_tiles": 2, "zeros": True, "group": 32, "consumer_warps": 4,
                                              "m_tiles": 2, "stages": 3}),
                self.resolve({"col_tiles": 8, "dtype": "fp16", "group": 0, "consumer_warps": 8, "m_tiles": 1,
                              "stages": 3}),
                self.resolve({"gated": True, "consumer_warps": 4, "m_tiles": 2, "stages": 3}),
                self.resolve({"source": True})]

    def sweep(self):
        return [self.resolve({"dtype": d, "col_tiles": c, "group": g, "zeros": z})
                for d, c, g, z in itertools.product(("bf16", "fp16"), (1, 2), GROUPS, (False, True))]


W4A16_STREAM = W4A16StreamSpec(
    name="w4a16.stream", family="w4a16", lesson=0,
    summary="y = x W^T, W int4 in groups along K, x of 1-64 rows: W and x streamed by TMA into a swizzled stage ring, "
            "the weight dequantized into mma.sync's A fragments (lop3 + packed fma; scales on the fp32 sums for "
            "groups >= 128), split K with a deterministic last-CTA reduction",
    ops=("gemm_w4a16", "gemm_w4a16_swiglu"), status="ready", schedule=W4A16Plan,
    params={
        "dtype": Param("bf16", ("bf16", "fp16"), "signature", "element type of x, the scales and y"),
        "col_tiles": Param(1, COL_TILES, "signature", "n8 tiles of x's rows (M <= 8 x this)"),
        "group": Param(128, GROUPS, "signature", "group size along K (0: per channel)"),
        "zeros": Param(False, (True, False), "signature", "zero points (else symmetric, zero point 8)"),
        "source": Param(False, (True, False), "signature", "y = x W^T + src (a residual)"),
        "gated": Param(False, (True, False), "signature", "y (M, N / 2) = silu(x W_gate^T) * (x W_up^T), W's rows "
                       "gate / up blocks of 8 (pack_gate_up)"),
        **stream_plan_params(INT4_PLAN),
    },
)



@dataclass(frozen=True, eq=False)
class DequantSpec(KernelSpec):
    def build(self, p):
        from cute_kernels.w4a16.kernels import Int4Dequant

        dt = dtypes.cutlass_of(p["dtype"])
        kernel = Int4Dequant(dt, p["group"], p["zeros"], self.schedule_of(p))
        sym = lambda d=1: index_sym(False, d)  # noqa: E731
        n = sym()
        w = fake_tensor(cutlass.Int32, (n, sym(4)), (sym(4), 1), 16)
        out = fake_tensor(dt, (n, sym(32)), (sym(8), 1), 16)
        scales, zeros = (fake_tensor(dt, (n, sym()), (sym(), sym()), dt.width // 8) for _ in range(2))
        return kernel, (w, scales, zeros, out, cutlass.Int32(1), fake_stream())

    def representative(self):
        return [self.resolve(), self.resolve({"zeros": True, "group": 32, "dtype": "fp16"})]


DEQUANT_TUNED = GridStride(threads=256, unroll=2, ctas_per_sm=8, order="cta")

W4A16_DEQUANT = DequantSpec(
    name="w4a16.dequant", family="w4a16", lesson=0,
    summary="the packed int4 weight dequantized to (N, K) in one pass ((q - z) s rounded once, unpack_int4's "
            "values): a 16-byte span of 32 k a work item, four 16-byte stores; the prefill path's first half",
    ops=("gemm_w4a16",), status="ready", schedule=GridStride,
    params={
        "dtype": Param("bf16", ("bf16", "fp16"), "signature", "element type of the scales and the output"),
        "group": Param(128, GROUPS, "signature", "group size along K (0: per channel)"),
        "zeros": Param(False, (True, False), "signature", "zero points (else symmetric, zero point 8)"),
        "threads": Param(DEQUANT_TUNED.threads, (128, 256, 512), help="threads per CTA"),
        "unroll": Param(DEQUANT_TUNED.unroll, (1, 2, 4), help="spans a thread loads before it stores"),
        "ctas_per_sm": Param(DEQUANT_TUNED.ctas_per_sm, (0, 4, 8, 16), help="grid cap per SM (0: one pass)"),
        "order": Param(DEQUANT_TUNED.order, ("grid", "cta"), help="how one pass lays out its spans"),
    },
)

SPECS = (W4A16_MMA, W4A16_STREAM, W4A16_DEQUANT)
