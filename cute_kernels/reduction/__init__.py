"""Reduction family (lesson 2): sums over the last dim (and, with a split pass, over all elements), and the
column sums of (C, N) partials that the norms' backward passes launch; fp32 accumulation, deterministic.

Files: this catalogue entry, `kernels.py` (the DSL kernels), `ops.py` (the torch ops), `bench.py` (the suite).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from cute_kernels import dtypes
from cute_kernels.catalog import SIG_COMMON, KernelSpec, Param
from cute_kernels.fake import fake_stream, index_sym
from cute_kernels.lazy import cute, cutlass
from schedules.row_tiling import TUNED as _ROW_TUNED
from schedules.row_tiling import RowTiling


@dataclass(frozen=True, eq=False)
class RowSumSpec(KernelSpec):
    def check(self, p):
        self.schedule_of(p)  # raises on a bad combination

    def build(self, p):
        from cute_kernels.reduction.kernels import RowSum

        dt = dtypes.cutlass_of(p["dtype"])
        out_dt = dtypes.cutlass_of(p["out_dtype"])
        vec = dtypes.vec_of(p["dtype"], p["aligned"])
        tiling = self.schedule_of(p)
        kernel = RowSum(dt, out_dt, vec, p["index64"], tiling)
        m, n = index_sym(p["index64"]), index_sym(p["index64"])
        x = cute.runtime.make_fake_tensor(
            dt, (m, n), stride=(index_sym(p["index64"], vec), 1),
            assumed_align=16 if p["aligned"] else dt.width // 8,
        )
        s = index_sym(p["index64"])
        out = cute.runtime.make_fake_tensor(out_dt, (m, s), stride=(s, 1), assumed_align=out_dt.width // 8)
        return kernel, (x, out, cutlass.Int32(1), fake_stream())

    def dynamic_smem_bytes(self, p):
        from collectives.reduce import group_smem_slots

        return 4 * group_smem_slots(p["threads"], p["threads_per_row"])

    def representative(self):
        return [self.resolve(), self.resolve({"threads_per_row": 8})]

    def sweep(self):
        """Every (dtype, out dtype, alignment, threads-per-row) the ops pick, 32-bit indexing, plus
        the 64-bit variants of the one-CTA-per-row tiling that huge rows use."""
        out = []
        for d, o, a, tpr in itertools.product(dtypes.FLOAT_NAMES, dtypes.FLOAT_NAMES, (True, False), (4, 32, 128, 256)):
            out.append(self.resolve({"dtype": d, "out_dtype": o, "aligned": a, "threads_per_row": tpr}))
        for d, o in itertools.product(dtypes.FLOAT_NAMES, ("fp32",)):
            out.append(self.resolve({"dtype": d, "out_dtype": o, "index64": True}))
        return out


ROW_SUM = RowSumSpec(
    name="reduction.row_sum",
    family="reduction",
    lesson=2,
    summary="sum over the last dim (and, with a split pass, over all elements); fp32 accumulation, deterministic",
    ops=("sum",),
    status="ready",
    schedule=RowTiling,
    params={
        **SIG_COMMON,
        "out_dtype": Param("bf16", dtypes.FLOAT_NAMES, "signature", "output element type"),
        "threads": Param(_ROW_TUNED["threads"], (128, 256, 512, 1024), help="threads per CTA"),
        "threads_per_row": Param(_ROW_TUNED["threads"], (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
                                 help="threads sharing one row"),
        "unroll": Param(_ROW_TUNED["unroll"], (1, 2, 4, 8), help="128-bit vectors in flight per thread"),
    },
)


@dataclass(frozen=True, eq=False)
class ColumnSumSpec(KernelSpec):
    def build(self, p):
        from cute_kernels.reduction.kernels import ColumnSum

        dt, out_dt = dtypes.cutlass_of(p["dtype"]), dtypes.cutlass_of(p["out_dtype"])
        vec = dtypes.vec_of(p["dtype"], p["aligned"])
        c, n = index_sym(False), index_sym(False, vec)
        x = cute.runtime.make_fake_tensor(dt, (c, n), stride=(index_sym(False, vec), 1),
                                          assumed_align=16 if p["aligned"] else dt.width // 8)
        out = cute.runtime.make_fake_tensor(out_dt, (n,), stride=(1,),
                                            assumed_align=vec * out_dt.width // 8 if p["aligned"] else out_dt.width // 8)
        return ColumnSum(dt, out_dt, vec, p["threads"]), (x, out, fake_stream())

    def dynamic_smem_bytes(self, p):
        return 4 * 32 * dtypes.vec_of(p["dtype"], p["aligned"]) * (p["threads"] // 32)

    def representative(self):
        return [self.resolve(), self.resolve({"out_dtype": "fp32", "threads": 256})]

    def sweep(self):
        """The variants the norms' backward launches: fp32 partials into each weight dtype, aligned or not."""
        return [self.resolve({"out_dtype": o, "aligned": a, "threads": t})
                for o, a, t in itertools.product(dtypes.FLOAT_NAMES, (True, False), (128, 256, 512, 1024))]


COL_SUM = ColumnSumSpec(
    name="reduction.col_sum",
    family="reduction",
    lesson=2,
    summary="sum over the first dim of (C, N) partials (the norms' backward weight gradients), cast fused; "
            "fixed order, deterministic",
    ops=("rms_norm", "layer_norm"),
    status="ready",
    params={
        "dtype": Param("fp32", dtypes.FLOAT_NAMES, "signature", "partials' element type"),
        "out_dtype": Param("bf16", dtypes.FLOAT_NAMES, "signature", "output element type"),
        "aligned": Param(True, (True, False), "signature", "16-byte aligned rows (128-bit loads)"),
        "threads": Param(1024, (128, 256, 512, 1024), help="threads per CTA: its warps split the C rows"),
    },
)

SPECS = (ROW_SUM, COL_SUM)
