"""GEMV family (lesson 3): y = W x for decode-shaped x of 1-8 columns, on the FMA units (`kernels.py`) or the
tensor cores (`mma.py`).

Files: this catalogue entry, `kernels.py`, `mma.py`, `ops.py`, `bench.py`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from cute_kernels import dtypes
from cute_kernels.catalog import SIG_COMMON, KernelSpec, Param
from cute_kernels.fake import fake_stream, fake_tensor, index_sym
from cute_kernels.lazy import cutlass
from cute_kernels.w4a16 import stream_fakes, stream_plan_params
from schedules.gemv import TUNED as GEMV_SCHEDULES
from schedules.gemv import GemvMmaPlan
from schedules.row_tiling import RowTiling
from schedules.w4a16 import COL_TILES, DENSE_PLAN, W4A16Plan

GEMV_TUNED = {k: GEMV_SCHEDULES[1][k] for k in ("threads", "unroll")}  # defaults: the B = 1 schedule


@dataclass(frozen=True, eq=False)
class GemvSpec(KernelSpec):
    def check(self, p):
        self.schedule_of(p)
        if p["row_block"] * p["cols"] > 32:
            raise ValueError(f"row_block * cols must be <= 32, got {p['row_block']} * {p['cols']}")

    def build(self, p):
        from cute_kernels.gemv.kernels import Gemv

        dt = dtypes.cutlass_of(p["dtype"])
        vec = dtypes.vec_of(p["dtype"], p["aligned"])
        tiling = self.schedule_of(p)
        kernel = Gemv(dt, p["cols"], vec, p["index64"], tiling, p["row_block"])
        sym = lambda d=1: index_sym(p["index64"], d)  # noqa: E731
        n, k = sym(), sym()
        align = 16 if p["aligned"] else dt.width // 8
        w = fake_tensor(dt, (n, k), (sym(vec), 1), align)
        xt = fake_tensor(dt, (p["cols"], k), (sym(vec), 1), align)
        y = fake_tensor(dt, (n, p["cols"]), (sym(), sym()), dt.width // 8)
        return kernel, (w, xt, y, cutlass.Int32(1), fake_stream())

    def dynamic_smem_bytes(self, p):
        from collectives.reduce import group_smem_slots

        return 4 * group_smem_slots(p["threads"], p["threads_per_row"], p["cols"] * p["row_block"])

    def representative(self):
        return [self.resolve(), self.resolve({"cols": 8, "threads_per_row": 64, "threads": 128, "unroll": 1,
                                              "row_block": 4}),
                self.resolve({"cols": 4, "dtype": "fp32", "threads_per_row": 32, "row_block": 2})]

    def sweep(self):
        from schedules.gemv import ROW_BLOCK

        return [self.resolve({"dtype": d, "aligned": a, "cols": c, "threads_per_row": t, "row_block": ROW_BLOCK[c]})
                for d, a, c, t in itertools.product(dtypes.FLOAT_NAMES, (True, False), range(1, 9), (32, 64, 128, 256))]


GEMV = GemvSpec(
    name="gemv.rows", family="gemv", lesson=3,
    summary="y = W x for x of 1-8 columns; row-parallel, fp32 accumulation, bandwidth-bound on W",
    ops=("gemv",), status="ready", schedule=RowTiling,
    params={
        **SIG_COMMON,
        "cols": Param(1, tuple(range(1, 9)), "signature", "columns of x (decode batch)"),
        "threads": Param(GEMV_TUNED["threads"], (128, 256, 512), help="threads per CTA"),
        "threads_per_row": Param(64, (8, 16, 32, 64, 128, 256, 512), help="threads sharing one row of W"),
        "unroll": Param(GEMV_TUNED["unroll"], (1, 2, 4, 8), help="k-vectors in flight per thread (R vectors of W each)"),
        "row_block": Param(1, (1, 2, 4, 8), help="rows of W per thread (register tile R; the op picks it from B)"),
    },
)

@dataclass(frozen=True, eq=False)
class GemvMmaSpec(KernelSpec):
    def build(self, p):
        from cute_kernels.gemv.mma import GemvMma

        dt = dtypes.cutlass_of(p["dtype"])
        kernel = GemvMma(dt, p["cols"], p["index64"], p["warps"], p["row_blocks"], p["unroll"])
        sym = lambda d=1: index_sym(p["index64"], d)  # noqa: E731
        n, k = sym(), sym(8)
        w = fake_tensor(dt, (n, k), (sym(8), 1), 16)
        xt = fake_tensor(dt, (p["cols"], k), (sym(8), 1), 16)
        y = fake_tensor(dt, (n, p["cols"]), (sym(), sym()), dt.width // 8)
        unread = fake_tensor(cutlass.BFloat16, (sym(), sym()), (sym(), sym()), 2)
        return kernel, (w, xt, y, unread, unread, fake_stream())

    def dynamic_smem_bytes(self, p):
        return self.schedule_of(p).reduce_smem_bytes(p["cols"])

    def representative(self):
        return [self.resolve(), self.resolve({"cols": 2, "dtype": "fp16", "row_blocks": 1, "warps": 8})]

    def sweep(self):
        return [self.resolve({"dtype": d, "cols": c, "row_blocks": r})
                for d, c, r in itertools.product(("bf16", "fp16"), range(1, 9), (1, 2, 4))]


GEMV_MMA = GemvMmaSpec(
    name="gemv.mma", family="gemv", lesson=3,
    summary="y = W x for x of 1-8 columns on tensor cores (mma.sync m16n8k16, x^T as A, 8 rows of W as B)",
    ops=("gemv",), status="ready", schedule=GemvMmaPlan,
    params={
        "dtype": Param("bf16", ("bf16", "fp16"), "signature", "element type of W, x and y"),
        "index64": SIG_COMMON["index64"],
        "cols": Param(8, tuple(range(1, 17)), "signature", "columns of x (decode batch; the op takes 1-8, the W4A16 "
                      "GEMM up to 16)"),
        "warps": Param(4, (2, 4, 8, 16), help="warps per CTA, splitting K in 32-wide chunks"),
        "row_blocks": Param(2, (1, 2, 4), help="8-row blocks of W per CTA (one x load serves them all)"),
        "unroll": Param(2, (1, 2, 4), help="K chunks loaded before their MMAs"),
    },
)




@dataclass(frozen=True, eq=False)
class GemvStreamSpec(KernelSpec):
    def build(self, p):
        from cute_kernels.w4a16.kernels import W4A16Stream

        dt = dtypes.cutlass_of(p["dtype"])
        kernel = W4A16Stream(dt, p["col_tiles"], 128, False, self.schedule_of(p), dense=True, source=p["source"],
                             gated=p["gated"])
        w, x, y, part, counter = stream_fakes(dt, dt, 8, p["gated"])
        sym = lambda: index_sym(False)  # noqa: E731
        unread = fake_tensor(dt, (sym(), sym()), (sym(), sym()), dt.width // 8)
        src = fake_tensor(dt, (sym(), sym()), (sym(), sym()), dt.width // 8)  # (M, N), any strides
        return kernel, (w, x, y, unread, unread, part, counter, cutlass.Int32(1), cutlass.Int32(1), src,
                        cutlass.Float32(1.0), cutlass.Float32(1.0), fake_stream())

    def dynamic_smem_bytes(self, p):
        return self.schedule_of(p).smem_bytes(p["col_tiles"], dense=True)

    def representative(self):
        return [self.resolve(), self.resolve({"col_tiles": 2, "dtype": "fp16", "consumer_warps": 4, "stages": 3}),
                self.resolve({"source": True}), self.resolve({"gated": True})]

    def check(self, p):
        super().check(p)
        if p["source"] and p["gated"]:
            raise ValueError(f"{self.name}: the gated epilogue takes no source")


GEMV_STREAM = GemvStreamSpec(
    name="gemv.stream", family="gemv", lesson=3,
    summary="y = x W^T for x of 1-64 rows, W (N, K) 16-bit: the W4A16 streaming kernel's dense mode (W and x by TMA "
            "into a swizzled stage ring, mma.sync with W as A, split K reduced by the last CTA of each tile)",
    ops=("gemm",), status="ready", schedule=W4A16Plan,
    params={
        "dtype": Param("bf16", ("bf16", "fp16"), "signature", "element type of W, x and y"),
        "col_tiles": Param(1, COL_TILES, "signature", "n8 tiles of x's rows (M <= 8 x this)"),
        "source": Param(False, (True, False), "signature", "y = alpha x W^T + beta src (addmm's input: a residual)"),
        "gated": Param(False, (True, False), "signature", "y (M, N / 2) = silu(x W_gate^T) * (x W_up^T), W's rows "
                       "gate / up blocks of 8 (pack_gate_up)"),
        **stream_plan_params(DENSE_PLAN),
    },
)

SPECS = (GEMV, GEMV_MMA, GEMV_STREAM)
