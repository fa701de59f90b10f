"""The catalogue: every kernel of the curriculum, its parameters and how to compile it.

A kernel's parameters split into its *config* (schedule choices: threads, unroll, tiling) and its
*signature* (what the data is: dtypes, whether operands are 16-byte aligned, 32- or 64-bit
indexing). Both name the compiled artifact in the cache key; neither includes a size, which stays
symbolic. `representative()` is what the CPU test-suite compiles for every kernel, `sweep()` the
full set behind `-m sweep`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable

import cutlass.cute as cute
from cutlass import Float32, Int32

from cute_kernels import dtypes
from cute_kernels.jit import CacheKey, default_cache, fake_stream
from schedules.bulk_chunks import CHUNKS as _BULK_CHUNKS
from schedules.bulk_chunks import PIECES as _BULK_PIECES
from schedules.bulk_chunks import BulkChunks
from schedules.grid_stride import TUNED as _EW_TUNED
from schedules.grid_stride import GridStride
from schedules.row_tiling import TUNED as _ROW_TUNED
from schedules.row_tiling import RowTiling


@dataclass(frozen=True)
class Param:
    default: Any
    choices: tuple = ()
    role: str = "config"  # "config" or "signature"
    help: str = ""

    def parse(self, text: str):
        value = type(self.default)(text) if not isinstance(self.default, bool) else text in ("1", "true", "True")
        if self.choices and value not in self.choices:
            raise ValueError(f"must be one of {self.choices}, got {text!r}")
        return value


_SIG_COMMON = {
    "dtype": Param("bf16", dtypes.FLOAT_NAMES, "signature", "element type"),
    "aligned": Param(True, (True, False), "signature", "operands 16-byte aligned (128-bit vectors)"),
    "index64": Param(False, (True, False), "signature", "64-bit indexing (>= 2^31 elements)"),
}


@dataclass(frozen=True, eq=False)
class KernelSpec:
    name: str
    family: str
    lesson: int
    summary: str
    ops: tuple[str, ...] = ()
    status: str = "planned"
    params: dict[str, Param] = field(default_factory=dict)

    # --- parameters -----------------------------------------------------------------------------
    def resolve(self, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        p = {k: v.default for k, v in self.params.items()}
        for k, v in (overrides or {}).items():
            if k not in self.params:
                raise ValueError(f"{self.name}: unknown parameter {k!r}; known: {sorted(self.params)}")
            try:
                p[k] = self.params[k].parse(v) if isinstance(v, str) else v
            except ValueError as e:
                raise ValueError(f"{self.name}: parameter {k}: {e}") from None
            if self.params[k].choices and p[k] not in self.params[k].choices:
                raise ValueError(f"{self.name}: parameter {k} must be one of {self.params[k].choices}, got {v!r}")
        self.check(p)
        return p

    def check(self, p: dict[str, Any]) -> None:
        pass

    def key(self, p: dict[str, Any]) -> CacheKey:
        def frag(role):
            return ",".join(f"{k}={p[k]}" for k, v in self.params.items() if v.role == role)

        return CacheKey(self.name, frag("config"), frag("signature"))

    # --- compiling ------------------------------------------------------------------------------
    def build(self, p: dict[str, Any]) -> tuple[Callable, tuple]:
        raise NotImplementedError(f"{self.name} is {self.status}")

    def dynamic_smem_bytes(self, p: dict[str, Any]) -> int | None:
        return None

    def compiled(self, **overrides):
        """The compiled callable for these parameters, through the process-wide cache."""
        p = self.resolve(overrides)
        return default_cache().get(self.key(p), lambda: self.build(p))

    def representative(self) -> list[dict[str, Any]]:
        return [self.resolve()]

    def sweep(self) -> list[dict[str, Any]]:
        return self.representative()


def _index_sym(index64: bool, divisibility: int = 1):
    return cute.sym_int64(divisibility=divisibility) if index64 else cute.sym_int32(divisibility=divisibility)


# ---------------------------------------------------------------------------------------------
# Lesson 1: elementwise
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class ElementwiseSpec(KernelSpec):
    def check(self, p):
        if p.get("mode") == "bulk" and not p["aligned"]:
            raise ValueError(f"{self.name}: mode=bulk needs 16-byte aligned operands (aligned=True)")

    def build(self, p):
        from cute_kernels.kernels.elementwise import BulkCopy, Elementwise

        dt = dtypes.cutlass_of(p["dtype"])
        vec = dtypes.vec_of(p["dtype"], p["aligned"])
        if p.get("mode") == "bulk":  # copy only: threads/unroll/ctas_per_sm/order do not apply
            kernel = BulkCopy(dt, p["index64"], BulkChunks(p["chunk_bytes"], p["pieces"]))
        else:
            sched = GridStride(p["threads"], p["unroll"], p["ctas_per_sm"], p["order"])
            kernel = Elementwise(self.name.split(".")[1], dt, vec, p["index64"], sched)
        n = _index_sym(p["index64"])
        align = 16 if p["aligned"] else dt.width // 8

        def t():
            return cute.runtime.make_fake_tensor(dt, (n,), stride=(1,), assumed_align=align)

        return kernel, (t(), t(), t(), Float32(1.0), Float32(1.0), Int32(1), fake_stream())

    def dynamic_smem_bytes(self, p):
        return p["chunk_bytes"] + 8 * p["pieces"] if p.get("mode") == "bulk" else None

    def sweep(self):
        return [
            self.resolve({"dtype": d, "aligned": a, "index64": i})
            for d, a, i in itertools.product(dtypes.FLOAT_NAMES, (True, False), (False, True))
        ]


def _elementwise(op: str, summary: str, ops: tuple[str, ...]) -> ElementwiseSpec:
    tuned = _EW_TUNED[op]
    return ElementwiseSpec(
        name=f"elementwise.{op}",
        family="elementwise",
        lesson=1,
        summary=summary,
        ops=ops,
        status="ready",
        params={
            **_SIG_COMMON,
            "threads": Param(tuned.threads, (128, 256, 512), help="threads per CTA"),
            "unroll": Param(tuned.unroll, (1, 2, 4, 8), help="128-bit vectors in flight per thread"),
            "ctas_per_sm": Param(tuned.ctas_per_sm, (0, 1, 2, 4, 8, 16), help="grid cap: CTAs per SM (0: none)"),
            "order": Param(tuned.order, ("grid", "cta"), help="items of a pass: a grid apart, or CTA-contiguous"),
            **(_BULK_PARAMS if op == "copy" else {}),
        },
    )


# copy's TMA variant (schedules/bulk_chunks.py): one CTA per chunk, cp.async.bulk in and out. Not the
# op's default; `schedules.bulk_chunks.SIZE_CLASSES` says where the op takes it.
_BULK_PARAMS = {
    "mode": Param("grid", ("grid", "bulk"), help="grid: grid-stride vectors; bulk: TMA bulk copy per chunk"),
    "chunk_bytes": Param(8192, _BULK_CHUNKS, help="mode=bulk: bytes per CTA"),
    "pieces": Param(1, _BULK_PIECES, help="mode=bulk: bulk loads per chunk, each stored as it lands"),
}


# ---------------------------------------------------------------------------------------------
# Lesson 2: reduction
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class RowSumSpec(KernelSpec):
    def check(self, p):
        RowTiling(p["threads"], p["threads_per_row"], p["unroll"])  # raises on a bad combination

    def build(self, p):
        from cute_kernels.kernels.reduction import RowSum

        dt = dtypes.cutlass_of(p["dtype"])
        out_dt = dtypes.cutlass_of(p["out_dtype"])
        vec = dtypes.vec_of(p["dtype"], p["aligned"])
        tiling = RowTiling(p["threads"], p["threads_per_row"], p["unroll"])
        kernel = RowSum(dt, out_dt, vec, p["index64"], tiling)
        m, n = _index_sym(p["index64"]), _index_sym(p["index64"])
        x = cute.runtime.make_fake_tensor(
            dt, (m, n), stride=(_index_sym(p["index64"], vec), 1),
            assumed_align=16 if p["aligned"] else dt.width // 8,
        )
        s = _index_sym(p["index64"])
        out = cute.runtime.make_fake_tensor(out_dt, (m, s), stride=(s, 1), assumed_align=out_dt.width // 8)
        return kernel, (x, out, Int32(1), fake_stream())

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
    params={
        **_SIG_COMMON,
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
        from cute_kernels.kernels.reduction import ColumnSum

        dt, out_dt = dtypes.cutlass_of(p["dtype"]), dtypes.cutlass_of(p["out_dtype"])
        vec = dtypes.vec_of(p["dtype"], p["aligned"])
        c, n = _index_sym(False), _index_sym(False, vec)
        x = cute.runtime.make_fake_tensor(dt, (c, n), stride=(_index_sym(False, vec), 1),
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

COPY = _elementwise("copy", "out = x, grid-stride over 128-bit vectors", ("copy",))
ADD = _elementwise("add", "out = x + y (fp32 math, rounded once)", ("add",))
AXPBY = _elementwise("axpby", "out = a*x + b*y (fp32 math, rounded once)", ("axpby",))


# ---------------------------------------------------------------------------------------------
# The rest of the curriculum: listed with its status so `cute-kernels list` shows the whole map.
# ---------------------------------------------------------------------------------------------
_PLANNED = [
    ("moe_dispatch", "moe", 14, "MoE dispatch/combine (described only)"),
    ("flow_matching", "solver", 15, "flow-matching solver steps (described only)"),
    ("voxelize", "pointcloud", 16, "point-cloud voxelization (described only)"),
    ("fake_quant", "quant", 17, "QAT fake-quant with STE (described only)"),
]

KERNELS: dict[str, KernelSpec] = {s.name: s for s in (COPY, ADD, AXPBY, ROW_SUM, COL_SUM)}
for _name, _fam, _lesson, _summary in _PLANNED:
    KERNELS[_name] = KernelSpec(_name, _fam, _lesson, _summary)


def get(name: str) -> KernelSpec:
    try:
        return KERNELS[name]
    except KeyError:
        close = [k for k in KERNELS if name in k]
        hint = f"; did you mean {close}?" if close else ""
        raise KeyError(f"unknown kernel {name!r}{hint} (see `cute-kernels list`)") from None


def ready() -> list[KernelSpec]:
    return [s for s in KERNELS.values() if s.status == "ready"]


def register(*specs: KernelSpec) -> None:
    for spec in specs:
        KERNELS[spec.name] = spec


# Families whose specs live in modules of their own (imported last: they build on KernelSpec).
from cute_kernels.specs_gemm import GEMM, GEMM_SIMT  # noqa: E402

register(GEMM, GEMM_SIMT)


# Lessons 3, 8, 9, 11, 12: GEMV, transposes, SiLU/SwiGLU, ArgMax (specs in their own module).
from cute_kernels.specs_misc3 import SPECS as _MISC3  # noqa: E402

KERNELS.update({s.name: s for s in _MISC3})


# Lessons 4-7: row-wise kernels held in registers (norms, softmax, cross-entropy).
from cute_kernels.specs_rowwise import ROWWISE, STREAMING  # noqa: E402

KERNELS.update({s.name: s for s in ROWWISE + STREAMING})


# Lesson 13: FP8 block-scaled GEMM (the GEMM kernel's blockwise mode).
from cute_kernels.specs_fp8 import FP8_GEMM  # noqa: E402

register(FP8_GEMM)


# Issue 6: FlashAttention forward on Hopper (FA3 warp-specialized); backward and split-KV decoding planned.
from cute_kernels.specs_attention import FLASH_ATTN  # noqa: E402

register(FLASH_ATTN)


# Issue 5: FP8 e4m3 quantizers feeding the FP8 GEMM (1x128 activations, 128x128 weights).
from cute_kernels.specs_quant import QUANT  # noqa: E402

register(*QUANT)
