"""Catalogue entries for lessons 3, 8, 9, 11 and 12: GEMV, transposes, SiLU/SwiGLU, ArgMax.

Imported by `cute_kernels.catalog`, which adds `SPECS` to its `KERNELS`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from cute_kernels import dtypes
from cute_kernels.catalog import _SIG_COMMON, KernelSpec, Param, _index_sym
from cute_kernels.jit import fake_stream
from schedules.gemv import TUNED as GEMV_SCHEDULES
from schedules.grid_stride import GridStride
from schedules.row_tiling import TUNED as _ROW_TUNED
from schedules.row_tiling import RowTiling


def _fake(dt, shape, stride, align):
    return cute.runtime.make_fake_tensor(dt, shape, stride=stride, assumed_align=align)


# ---------------------------------------------------------------------------------------------
# Lesson 11: SiLU / SwiGLU (the elementwise map with 1-3 inputs and 1-2 outputs)
# ---------------------------------------------------------------------------------------------
SWIGLU_TUNED = GridStride(threads=128, unroll=4, ctas_per_sm=0, order="cta")


@dataclass(frozen=True, eq=False)
class GatedSpec(KernelSpec):
    def build(self, p):
        from cute_kernels.kernels.swiglu import GatedActivation

        dt = dtypes.cutlass_of(p["dtype"])
        vec = dtypes.vec_of(p["dtype"], p["aligned"])
        sched = GridStride(p["threads"], p["unroll"], p["ctas_per_sm"], p["order"])
        kernel = GatedActivation(self.name.split(".")[1], dt, vec, p["index64"], sched)
        n = _index_sym(p["index64"])
        align = 16 if p["aligned"] else dt.width // 8
        ts = [_fake(dt, (n,), (1,), align) for _ in range(5)]
        return kernel, (*ts, Int32(1), fake_stream())

    def sweep(self):
        return [self.resolve({"dtype": d, "aligned": a, "index64": i})
                for d, a, i in itertools.product(dtypes.FLOAT_NAMES, (True, False), (False, True))]


def _gated(op: str, summary: str) -> GatedSpec:
    t = SWIGLU_TUNED
    return GatedSpec(
        name=f"swiglu.{op}", family="swiglu", lesson=11, summary=summary, ops=("silu", "swiglu"), status="ready",
        params={
            **_SIG_COMMON,
            "threads": Param(t.threads, (128, 256, 512), help="threads per CTA"),
            "unroll": Param(t.unroll, (1, 2, 4, 8), help="128-bit vectors in flight per thread"),
            "ctas_per_sm": Param(t.ctas_per_sm, (0, 1, 2, 4, 8, 16), help="grid cap: CTAs per SM (0: none)"),
            "order": Param(t.order, ("grid", "cta"), help="items of a pass: a grid apart, or CTA-contiguous"),
        },
    )


SILU_FWD = _gated("silu_fwd", "y = x * sigmoid(x); fp32 math")
SILU_BWD = _gated("silu_bwd", "dx = dy * silu'(x)")
SWIGLU_FWD = _gated("swiglu_fwd", "out = silu(gate) * up, fused (3 tensors moved instead of 5)")
SWIGLU_BWD = _gated("swiglu_bwd", "dgate, dup from gate, up, dout in one pass (5 tensors)")


# ---------------------------------------------------------------------------------------------
# Lesson 12: ArgMax
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class ArgMaxSpec(KernelSpec):
    def check(self, p):
        RowTiling(p["threads"], p["threads_per_row"], p["unroll"])
        if p["row_head"] and (p["aligned"] or p["dtype"] == "key"):
            raise ValueError("row_head is for values whose rows are not 16-byte aligned (aligned=False)")

    def _in(self, p):
        keys_in = p["dtype"] == "key"
        dt = cutlass.Int64 if keys_in else dtypes.cutlass_of(p["dtype"])
        vec = 1 if keys_in else dtypes.vec_of(p["dtype"], p["aligned"] or p["row_head"])
        return keys_in, dt, vec

    def build(self, p):
        from cute_kernels.kernels.argmax import ArgMax

        keys_in, dt, vec = self._in(p)
        tiling = RowTiling(p["threads"], p["threads_per_row"], p["unroll"])
        kernel = ArgMax(dt, vec, p["index64"], tiling, keys_in, p["keys_out"], p["row_head"])
        m, n = _index_sym(p["index64"]), _index_sym(p["index64"])
        align = 16 if (p["aligned"] and not keys_in) else dt.width // 8
        x = _fake(dt, (m, n), (_index_sym(p["index64"], 1 if p["row_head"] else vec), 1), align)
        s = _index_sym(p["index64"])
        out = _fake(cutlass.Int64, (m, s), (s, 1), 8)
        return kernel, (x, out, Int32(1), fake_stream())

    def dynamic_smem_bytes(self, p):
        from collectives.reduce import group_smem_slots

        return 8 * group_smem_slots(p["threads"], p["threads_per_row"])

    def representative(self):
        return [self.resolve(), self.resolve({"threads_per_row": 8}), self.resolve({"keys_out": True})]

    def sweep(self):
        out = []
        for d, a, tpr, ko in itertools.product(dtypes.FLOAT_NAMES, (True, False), (4, 32, 128, 512), (False, True)):
            out.append(self.resolve({"dtype": d, "aligned": a, "threads_per_row": tpr, "keys_out": ko}))
        for tpr in (4, 32, 512):
            out.append(self.resolve({"dtype": "key", "aligned": False, "threads_per_row": tpr}))
        for d in dtypes.FLOAT_NAMES:
            out.append(self.resolve({"dtype": d, "index64": True}))
            out.append(self.resolve({"dtype": d, "aligned": False, "row_head": True}))
        return out


ARGMAX = ArgMaxSpec(
    name="argmax.rows", family="argmax", lesson=12,
    summary="argmax over the last dim: (value, index) as ordered Int64 keys, ties -> lowest index, NaN first",
    ops=("argmax",), status="ready",
    params={
        "dtype": Param("bf16", (*dtypes.FLOAT_NAMES, "key"), "signature", "element type ('key': second pass)"),
        "aligned": _SIG_COMMON["aligned"],
        "index64": _SIG_COMMON["index64"],
        "keys_out": Param(False, (True, False), "signature", "write split partials (keys) instead of indices"),
        "row_head": Param(False, (True, False), "signature",
                          "rows not 16-byte aligned: each row's first elements up to a 16-byte boundary scalar, "
                          "the rest in 128-bit vectors (aligned=False)"),
        "threads": Param(_ROW_TUNED["threads"], (128, 256, 512, 1024), help="threads per CTA"),
        "threads_per_row": Param(_ROW_TUNED["threads"], (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
                                 help="threads sharing one row"),
        "unroll": Param(4, (1, 2, 4, 8), help="128-bit vectors in flight per thread"),
    },
)


# ---------------------------------------------------------------------------------------------
# Lessons 8-9: transpose (naive, padded shared memory, swizzled shared memory, TMA)
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class TransposeSpec(KernelSpec):
    def check(self, p):
        if self.name.endswith(".tma") and not p["aligned"]:
            raise ValueError(f"{self.name}: TMA needs 16-byte aligned rows (aligned=True)")

    def build(self, p):
        from cute_kernels.kernels.transpose import Transpose
        from schedules.tile_order import TileOrder

        dt = dtypes.cutlass_of(p["dtype"])
        vec = dtypes.vec_of(p["dtype"], p["aligned"])
        kernel = Transpose(self.name.split(".")[1], dt, vec, p["index64"], p["threads"], p.get("pad", -1),
                           TileOrder(p["order"], p["group"]), p.get("sub", 1), p.get("persistent", False))
        sym = lambda d=1: _index_sym(p["index64"], d)  # noqa: E731
        m, n, b = sym(), sym(), sym()
        align = 16 if p["aligned"] else dt.width // 8
        x = _fake(dt, (m, n, b), (sym(vec), 1, sym(vec)), align)
        out = _fake(dt, (n, m, b), (sym(vec), 1, sym(vec)), align)
        return kernel, (x, out, Int32(1), fake_stream())

    def representative(self):
        return [self.resolve(), self.resolve({"dtype": "fp32"})]

    def sweep(self):
        al = (True,) if self.name.endswith(".tma") else (True, False)
        return [self.resolve({"dtype": d, "aligned": a, "index64": i})
                for d, a, i in itertools.product(dtypes.FLOAT_NAMES, al, (False, True))]


def _transpose(variant: str, summary: str, lesson: int, extra=None) -> TransposeSpec:
    return TransposeSpec(
        name=f"transpose.{variant}", family="transpose", lesson=lesson, summary=summary, ops=("transpose",),
        status="ready",
        params={**_SIG_COMMON, "threads": Param(128, (128, 256), help="threads per CTA (one T x T tile)"),
                "order": Param("grouped", ("grouped", "row", "diagonal"),
                               help="tile order (schedules.tile_order): row = the plain 2-D grid"),
                "group": Param(32, (1, 4, 8, 16, 32, 64, 128), help="tile-rows per group (order=grouped)"),
                **({} if variant == "naive" else
                   {"sub": Param(1, (1, 2), help="T x T tiles per side of a CTA's block (2: 256-byte row runs)")}),
                **(extra or {})},
    )


TRANSPOSE_NAIVE = _transpose("naive", "coalesced 16-byte reads, scattered column writes (the cost of uncoalescing)", 8)
TRANSPOSE_SMEM = _transpose("smem", "tile through padded shared memory: coalesced both ways", 9,
                            {"pad": Param(-1, (-1, 0), help="row padding: -1 = 16 bytes, 0 = none (bank conflicts)")})
TRANSPOSE_SWIZZLE = _transpose("swizzle", "tile through 128-byte-swizzled shared memory (no padding)", 9)
TRANSPOSE_TMA = _transpose("tma", "TMA load of the tile, swizzled smem transpose, TMA store", 9,
                            {"persistent": Param(False, (False, True),
                                                 help="CTAs walk the blocks, the next block's TMA load under this "
                                                      "one's transpose and stores (two stages)")})


# ---------------------------------------------------------------------------------------------
# Lesson 3: GEMV
# ---------------------------------------------------------------------------------------------
GEMV_TUNED = {k: GEMV_SCHEDULES[1][k] for k in ("threads", "unroll")}  # defaults: the B = 1 schedule


@dataclass(frozen=True, eq=False)
class GemvSpec(KernelSpec):
    def check(self, p):
        RowTiling(p["threads"], p["threads_per_row"], p["unroll"])
        if p["row_block"] * p["cols"] > 32:
            raise ValueError(f"row_block * cols must be <= 32, got {p['row_block']} * {p['cols']}")

    def build(self, p):
        from cute_kernels.kernels.gemv import Gemv

        dt = dtypes.cutlass_of(p["dtype"])
        vec = dtypes.vec_of(p["dtype"], p["aligned"])
        tiling = RowTiling(p["threads"], p["threads_per_row"], p["unroll"])
        kernel = Gemv(dt, p["cols"], vec, p["index64"], tiling, p["row_block"])
        sym = lambda d=1: _index_sym(p["index64"], d)  # noqa: E731
        n, k = sym(), sym()
        align = 16 if p["aligned"] else dt.width // 8
        w = _fake(dt, (n, k), (sym(vec), 1), align)
        xt = _fake(dt, (p["cols"], k), (sym(vec), 1), align)
        y = _fake(dt, (n, p["cols"]), (sym(), sym()), dt.width // 8)
        return kernel, (w, xt, y, Int32(1), fake_stream())

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
    ops=("gemv",), status="ready",
    params={
        **_SIG_COMMON,
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
        from cute_kernels.kernels.gemv_mma import GemvMma

        dt = dtypes.cutlass_of(p["dtype"])
        kernel = GemvMma(dt, p["cols"], p["index64"], p["warps"], p["row_blocks"], p["unroll"])
        sym = lambda d=1: _index_sym(p["index64"], d)  # noqa: E731
        n, k = sym(), sym(8)
        w = _fake(dt, (n, k), (sym(8), 1), 16)
        xt = _fake(dt, (p["cols"], k), (sym(8), 1), 16)
        y = _fake(dt, (n, p["cols"]), (sym(), sym()), dt.width // 8)
        return kernel, (w, xt, y, fake_stream())

    def dynamic_smem_bytes(self, p):
        return 4 * 2 * 32 * p["row_blocks"] * p["warps"]

    def representative(self):
        return [self.resolve(), self.resolve({"cols": 2, "dtype": "fp16", "row_blocks": 1, "warps": 8})]

    def sweep(self):
        return [self.resolve({"dtype": d, "cols": c, "row_blocks": r})
                for d, c, r in itertools.product(("bf16", "fp16"), range(1, 9), (1, 2, 4))]


GEMV_MMA = GemvMmaSpec(
    name="gemv.mma", family="gemv", lesson=3,
    summary="y = W x for x of 1-8 columns on tensor cores (mma.sync m16n8k16, x^T as A, 8 rows of W as B)",
    ops=("gemv",), status="ready",
    params={
        "dtype": Param("bf16", ("bf16", "fp16"), "signature", "element type of W, x and y"),
        "index64": _SIG_COMMON["index64"],
        "cols": Param(8, tuple(range(1, 9)), "signature", "columns of x (decode batch)"),
        "warps": Param(4, (2, 4, 8, 16), help="warps per CTA, splitting K in 32-wide chunks"),
        "row_blocks": Param(2, (1, 2, 4), help="8-row blocks of W per CTA (one x load serves them all)"),
        "unroll": Param(2, (1, 2, 4), help="K chunks loaded before their MMAs"),
    },
)

SPECS: tuple[KernelSpec, ...] = (GEMV, GEMV_MMA, SILU_FWD, SILU_BWD, SWIGLU_FWD, SWIGLU_BWD, ARGMAX,
                                 TRANSPOSE_NAIVE, TRANSPOSE_SMEM, TRANSPOSE_SWIZZLE, TRANSPOSE_TMA)
