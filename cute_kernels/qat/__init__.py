"""QAT family (lesson 17): fake-quant with the straight-through estimator (per-tensor, per-channel, per-group;
integer grids and e4m3 emulation), its learnable form (LSQ / LSQ+ scale and zero-point gradients) and the fused
moving-average observer; `QATLinear`, a linear layer with fake-quantized weight and activation around `ck.gemm`.

Files: this catalogue entry, `kernels.py` (the DSL kernels), `reference.py` (the rules in torch), `ops.py` (the
torch ops), `linear.py` (`QATLinear`), `bench.py` (the suite). `cute_kernels.qat.QATLinear` loads torch on first use
(the catalogue's metadata loads neither torch nor cutlass).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from dataclasses import dataclass

from cute_kernels import dtypes
from cute_kernels.catalog import KernelSpec, Param
from cute_kernels.fake import fake_stream, fake_tensor, index_sym
from cute_kernels.lazy import cutlass
from schedules.grid_stride import GridStride
from schedules.row_tiling import RowTiling

# The elementwise kernels' schedule (`perf/lab/qat_tune.py`, H100, 4096 x 8192 and 8192 x 8192): 256 threads, one
# item in flight, uncapped grid, CTA-contiguous. fp32 per-tensor forward 0.93x -> 1.09-1.10x torch, STE backward
# 1.23x -> 1.37x; bf16 within 3 % of the best of the grid (the family's tuned 128 x 4 ran fp32 at 84-87 % of copy).
QAT_MAP = GridStride(threads=256, unroll=1, ctas_per_sm=0, order="cta")
# The per-tensor fake-quant forward ("tensor" mode: the observed fake-quant's quantize pass) walks x from its end down
# (`GridStride.reverse`). The fused observer's reduce pass reads x from the start up (`qat.observe`: its splits
# interleaved a CTA pass apart), so its last-read bytes are still in L2 when the quantize pass starts, and that pass
# meets them first (H100: QATLinear's activation 39.3 -> 38.1 us). Modes that load a scale per item keep the ascending
# walk: descending, bf16 group-128 int4 at 4096x8192 went 48.2 -> 51.2 us (its scale loads are latency-bound).
QAT_QUANTIZE_MAP = dataclasses.replace(QAT_MAP, reverse=True)
MASK_VEC = 8  # (kernels.MASK_VEC, without importing the DSL)
# `schedules.row_tiling.plan_rows` settings of the two row kernels: the learnable backward holds two vectors an item
# and ~25 fp32 operations an element: 128 x 4, 4 CTAs an SM (`perf/lab/qat_tune.py --learnable`, H100: bf16 per
# channel 4096x8192 73.4 -> 69.5 us against 256 x 4, the grid's best; fp32 within 0.3 % of its best); the observer only
# reads: 256 x 4, 4 CTAs an SM (`--observer`, H100: the best of the grid at 4096x4096 and 4096x8192 in bf16 and
# fp32, 1-6 % ahead of 256 x 8 at 8 CTAs an SM)
LEARNABLE_PLAN = dict(threads=128, unroll=4, ctas_per_sm=4)
OBSERVER_PLAN = dict(threads=256, unroll=4, ctas_per_sm=4)


def _map_params(extra: dict, t: GridStride = QAT_MAP) -> dict:
    return {
        "dtype": Param("bf16", dtypes.FLOAT_NAMES, "signature", "x / y element type"),
        "index64": Param(False, (True, False), "signature", "64-bit indexing (>= 2^31 elements)"),
        **extra,
        "threads": Param(t.threads, (128, 256, 512), help="threads per CTA"),
        "unroll": Param(t.unroll, (1, 2, 4, 8), help="8-element items in flight per thread"),
        "ctas_per_sm": Param(t.ctas_per_sm, (0, 1, 2, 4, 8, 16), help="grid cap: CTAs per SM (0: none)"),
        "order": Param(t.order, ("grid", "cta"), help="items of a pass: a grid apart, or CTA-contiguous"),
        "reverse": Param(t.reverse, (True, False), help="CTA b takes CTA G-1-b's items (memory walked end first)"),
    }


def _sym(p, div=1):
    return index_sym(p["index64"], div)


def _flat(p, t, align=4):
    """A fake flat (n,) tensor of element type t for the build of parameters p."""
    return fake_tensor(t, (_sym(p),), (1,), align)


@dataclass(frozen=True, eq=False)
class FakeQuantSpec(KernelSpec):
    def check(self, p):
        super().check(p)
        if p["qtype"] == "e4m3" and p["zp"] != "int":
            raise ValueError(f"{self.name}: e4m3 has no zero point (zp=int, unused)")
        if p["mode"] == "scalar" and p["zp"] != "int":
            raise ValueError(f"{self.name}: the scalar mode's zero point is an integer argument (zp=int)")

    def build(self, p):
        from cute_kernels.qat.kernels import FakeQuant

        dt = dtypes.cutlass_of(p["dtype"])
        kernel = FakeQuant(dt, p["qtype"], p["zp"], p["mode"], p["mask"], p["gated"], p["index64"], self.schedule_of(p))

        flat = functools.partial(_flat, p)

        zp_t = cutlass.Int32 if p["zp"] == "int" else cutlass.Float32
        args = (
            flat(dt, 16),
            flat(dt, 16),
            flat(cutlass.Uint8, 1),
            flat(cutlass.Float32, 4),
            flat(zp_t, 4),
            flat(cutlass.Int64, 8),
            cutlass.Float32(1.0),
            cutlass.Float32(0.0),
            cutlass.Int32(1),
            cutlass.Int32(1),
            cutlass.Float32(-128.0),
            cutlass.Float32(127.0),
            cutlass.Int32(1),
            fake_stream(),
        )
        return kernel, args

    def representative(self):
        return [
            self.resolve(),
            self.resolve({"mode": "vector", "zp": "float"}),
            self.resolve({"qtype": "e4m3", "mode": "tensor", "dtype": "fp16"}),
            self.resolve({"mode": "element", "dtype": "fp32", "mask": False, "zp": "round"}),
            self.resolve({"mode": "tensor", "gated": True}),
        ]

    def sweep(self):
        out = []
        for d, q, z, mode, mask, gated, i64 in itertools.product(
            dtypes.FLOAT_NAMES,
            ("int", "e4m3"),
            ("int", "round", "float"),
            ("scalar", "tensor", "vector", "element"),
            (True, False),
            (False, True),
            (False, True),
        ):
            if (q == "e4m3" or mode == "scalar") and z != "int":
                continue
            out.append(
                self.resolve(
                    {"dtype": d, "qtype": q, "zp": z, "mode": mode, "mask": mask, "gated": gated, "index64": i64}
                )
            )
        return out


FAKE_QUANT = FakeQuantSpec(
    name="qat.fake_quant",
    family="qat",
    lesson=17,
    summary="y = (clamp(rint(x / s) + z) - z) s (or the e4m3 grid) per tensor / channel / group, with the STE mask "
    "packed 8 elements a byte; grid-stride over 8-element items",
    ops=("fake_quant", "fake_quant_learnable", "fake_quant_observed"),
    status="ready",
    schedule=GridStride,
    params=_map_params(
        {
            "qtype": Param("int", ("int", "e4m3"), "signature", "the grid: integers [qmin, qmax], or e4m3 emulation"),
            "zp": Param(
                "int",
                ("int", "round", "float"),
                "signature",
                "zero point: int32; float rounded and clamped (learnable forward); float, fused rint(fma)",
            ),
            "mode": Param(
                "scalar",
                ("scalar", "tensor", "vector", "element"),
                "signature",
                "scale source: kernel arguments, element 0, one per 8-element item, one per element",
            ),
            "mask": Param(True, (True, False), "signature", "store the packed STE mask"),
            "gated": Param(False, (True, False), "signature", "an int64 fake_quant_on flag (0: y = x, mask all 1)"),
        },
        QAT_QUANTIZE_MAP,
    ),
)


@dataclass(frozen=True, eq=False)
class SteBackwardSpec(KernelSpec):
    def build(self, p):
        from cute_kernels.qat.kernels import SteBackward

        dt = dtypes.cutlass_of(p["dtype"])
        kernel = SteBackward(dt, p["index64"], self.schedule_of(p))
        args = (
            fake_tensor(dt, (_sym(p),), (1,), 16),
            fake_tensor(dt, (_sym(p),), (1,), 16),
            fake_tensor(cutlass.Uint8, (_sym(p),), (1,), 1),
            cutlass.Int32(1),
            fake_stream(),
        )
        return kernel, args

    def sweep(self):
        return [
            self.resolve({"dtype": d, "index64": i}) for d, i in itertools.product(dtypes.FLOAT_NAMES, (False, True))
        ]


STE_BWD = SteBackwardSpec(
    name="qat.ste_bwd",
    family="qat",
    lesson=17,
    summary="dx = dy * mask from the packed STE bits (8 elements a byte)",
    ops=("fake_quant", "fake_quant_observed"),
    status="ready",
    schedule=GridStride,
    params=_map_params({}),
)


def _row_params(extra: dict, plan: dict) -> dict:
    return {
        "dtype": Param("bf16", dtypes.FLOAT_NAMES, "signature", "x element type"),
        "aligned": Param(True, (True, False), "signature", "rows of whole 16-byte vectors (else scalar accesses)"),
        "index64": Param(False, (True, False), "signature", "64-bit indexing (>= 2^31 elements)"),
        **extra,
        "merge": Param(
            True,
            (True, False),
            "signature",
            "the last CTA combines the partials (False: one row a channel, one split, finished in place)",
        ),
        "threads": Param(plan["threads"], (128, 256, 512, 1024), help="threads per CTA"),
        "threads_per_row": Param(
            plan["threads"], (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024), help="threads sharing one row"
        ),
        "unroll": Param(plan["unroll"], (1, 2, 4, 8), help="vectors in flight per thread"),
    }


@dataclass(frozen=True, eq=False)
class RowSpec(KernelSpec):
    def check(self, p):
        super().check(p)

    def static_extents(self, p):
        return {2}  # the split partials' pair of sums (partial (rows, splits, 2)), a constant of the kernels

    def dynamic_smem_bytes(self, p):
        from collectives.reduce import group_smem_slots

        width = 3 if self.name == "qat.learnable_bwd" else 2  # (kernels.LearnableBackward.width / Observer's)
        return 4 * group_smem_slots(p["threads"], p["threads_per_row"], width) + (16 if p["merge"] else 0)

    def _rows_args(self, p, dt):
        vec = dtypes.vec_of(p["dtype"], p["aligned"])
        align = 16 if p["aligned"] else dt.width // 8

        def rows():
            return fake_tensor(dt, (_sym(p), _sym(p)), (_sym(p, vec), 1), align)

        vec1 = functools.partial(_flat, p)

        partial = fake_tensor(cutlass.Float32, (_sym(p), _sym(p), 2), (_sym(p, 2), 2, 1), 8)
        return vec, rows, vec1, partial


@dataclass(frozen=True, eq=False)
class LearnableBackwardSpec(RowSpec):
    def build(self, p):
        from cute_kernels.qat.kernels import LearnableBackward

        dt = dtypes.cutlass_of(p["dtype"])
        vec, rows, vec1, partial = self._rows_args(p, dt)
        f32 = cutlass.Float32
        kernel = LearnableBackward(dt, vec, p["index64"], p["zp"], p["merge"], self.schedule_of(p))
        args = (
            rows(),
            rows(),
            rows(),
            vec1(f32),
            vec1(f32),
            partial,
            vec1(f32),
            vec1(f32),
            vec1(cutlass.Int32),
            cutlass.Int32(1),
            cutlass.Int32(1),
            f32(-128.0),
            f32(127.0),
            f32(1.0),
            cutlass.Int32(1),
            fake_stream(),
        )
        return kernel, args

    def representative(self):
        return [
            self.resolve(),
            self.resolve({"zp": "round", "merge": False, "threads_per_row": 64, "dtype": "fp32"}),
            self.resolve({"dtype": "fp16", "threads_per_row": 8}),
        ]

    def sweep(self):
        return [
            self.resolve({"dtype": d, "aligned": a, "zp": z, "merge": m, "threads_per_row": t})
            for d, a, z, m, t in itertools.product(
                dtypes.FLOAT_NAMES,
                (True, False),
                ("half_up", "round"),
                (True, False),
                (8, 64, LEARNABLE_PLAN["threads"]),
            )
        ] + [self.resolve({"index64": True, "dtype": d}) for d in dtypes.FLOAT_NAMES]


LEARNABLE_BWD = LearnableBackwardSpec(
    name="qat.learnable_bwd",
    family="qat",
    lesson=17,
    summary="LSQ / LSQ+ backward: dx = dy * mask and the per-scale sums of the scale and zero-point gradient terms, "
    "rows split over CTAs, the last CTA combining the partials (deterministic)",
    ops=("fake_quant_learnable",),
    status="ready",
    schedule=RowTiling,
    params=_row_params(
        {
            "zp": Param(
                "half_up",
                ("half_up", "round"),
                "signature",
                "the backward's zero point: trunc(zp + 0.5) (torch per-tensor) or rint(zp)",
            )
        },
        LEARNABLE_PLAN,
    ),
)


@dataclass(frozen=True, eq=False)
class ObserverSpec(RowSpec):
    def build(self, p):
        from cute_kernels.qat.kernels import Observer

        dt = dtypes.cutlass_of(p["dtype"])
        vec, rows, vec1, partial = self._rows_args(p, dt)
        f32, i32, i64 = cutlass.Float32, cutlass.Int32, cutlass.Int64
        kernel = Observer(dt, vec, p["index64"], p["symmetric"], p["merge"], self.schedule_of(p))
        args = (
            rows(),
            vec1(i64, 8),
            vec1(i64, 8),
            vec1(f32),
            vec1(f32),
            vec1(f32),
            vec1(i32),
            partial,
            vec1(i32),
            i32(1),
            f32(0.01),
            i32(0),
            i32(255),
            i32(1),
            fake_stream(),
        )
        return kernel, args

    def representative(self):
        return [self.resolve(), self.resolve({"symmetric": True, "merge": False, "threads_per_row": 64})]

    def sweep(self):
        return [
            self.resolve({"dtype": d, "aligned": a, "symmetric": s, "merge": m, "threads_per_row": t})
            for d, a, s, m, t in itertools.product(
                dtypes.FLOAT_NAMES, (True, False), (False, True), (True, False), (8, 64, OBSERVER_PLAN["threads"])
            )
        ] + [self.resolve({"index64": True, "dtype": d}) for d in dtypes.FLOAT_NAMES]


OBSERVE = ObserverSpec(
    name="qat.observe",
    family="qat",
    lesson=17,
    summary="the fused observer's reduce pass: per-tensor / per-channel min and max, the moving average and the "
    "qparams (torch's ChooseQuantizationParams) in the same launch, by the rows' owners or the last CTA",
    ops=("fake_quant_observed",),
    status="ready",
    schedule=RowTiling,
    params=_row_params({"symmetric": Param(False, (True, False), "signature", "symmetric qparams")}, OBSERVER_PLAN),
)

# The one-pass per-channel observer + fake-quant (`kernels.ObservedRows`): a row staged in shared memory (cp.async:
# every byte in flight at once, and no register holds it across the qparams' fp64 work; held in registers,
# 4096-element bf16 rows took 105-118 registers, 2 CTAs an SM), planned by `schedules.row_tiling.plan_held_rows`
# with about 64 bytes a thread and at most 128 (256 threads a row: a 512-thread CTA would get one CTA an SM at the
# register floor below), one CTA a row. Longer rows take the two passes.
OBSERVED_ROWS_PLAN = dict(min_threads=256, max_tpr=256, max_cluster=1, staging="smem")
# The next row's copies in flight while a CTA finishes this one (`HeldRowPlan.prefetch`: two staging buffers); the
# kernel walks ~10 rows a CTA at QATLinear's 4096 x 4096 (H100: its weight 31.6 -> 28.7 us). `ops.OBSERVE_ROWS_PREFETCH`
# False is the single-buffer kernel (the A/B of `perf/lab/qat_linear_ab.py`).
OBSERVED_ROWS_PREFETCH = True
OBSERVED_TARGET_BYTES, OBSERVED_MAX_BYTES = 64, 128


def observed_row_max(element_bytes: int) -> int:
    """The longest row (elements) `qat.observe_rows` holds."""
    return OBSERVED_ROWS_PLAN["max_tpr"] * OBSERVED_MAX_BYTES // element_bytes


def observed_rows_regs(held_bytes: int) -> int:
    """The register floor (ptxas is asked for the CTAs per SM it allows) of `qat.observe_rows` with `held_bytes` of
    the row a thread: the quantize pass and the qparams' fp64 work spilled 8-24 B at 64 registers and fit 80 up to
    64 bytes (3 CTAs of 256 threads an SM); 96-128 bytes spilled 8-16 B at 80 (CPU compile)."""
    return 72 if held_bytes <= OBSERVED_TARGET_BYTES else 96


@functools.lru_cache(maxsize=1024)
def observed_rows_plan(n: int, element_bytes: int = 2, prefetch: bool = OBSERVED_ROWS_PREFETCH):
    """The `schedules.row_tiling.HeldRowPlan` of `qat.observe_rows` for rows of n elements of `element_bytes` (2 or
    4), with or without `prefetch`; ValueError past `observed_row_max`."""
    from schedules.row_tiling import plan_held_rows

    vec = 16 // element_bytes
    sizes = dict(target_elems=OBSERVED_TARGET_BYTES // element_bytes, max_elems=OBSERVED_MAX_BYTES // element_bytes)
    plan = plan_held_rows(n, vec, **OBSERVED_ROWS_PLAN, **sizes, prefetch=prefetch)
    regs = observed_rows_regs(plan.tiling.unroll * 16)
    return plan_held_rows(n, vec, **OBSERVED_ROWS_PLAN, **sizes, prefetch=prefetch, staged_regs=regs)


@dataclass(frozen=True, eq=False)
class ObservedRowsSpec(KernelSpec):
    def check(self, p):
        super().check(p)
        vec = dtypes.vec_of(p["dtype"], True)
        if p["unroll"] * 16 > OBSERVED_MAX_BYTES:
            raise ValueError(f"{self.name}: at most {OBSERVED_MAX_BYTES} bytes of the row a thread held")
        if vec * p["threads_per_row"] < MASK_VEC:
            raise ValueError(f"{self.name}: fp32 rows need threads_per_row >= 2 (a mask byte spans two lanes)")

    def dynamic_smem_bytes(self, p):
        from collectives.reduce import group_smem_slots

        # a 16-byte slot a held vector, two buffers with prefetch
        staged = p["threads"] * p["unroll"] * 16 * (2 if p["prefetch"] else 1) if p["staging"] == "smem" else 0
        return staged + 4 * group_smem_slots(p["threads"], p["threads_per_row"], 4)

    def build(self, p):
        from cute_kernels.qat.kernels import ObservedRows

        dt = dtypes.cutlass_of(p["dtype"])
        f32, i32, i64 = cutlass.Float32, cutlass.Int32, cutlass.Int64
        kernel = ObservedRows(dt, p["symmetric"], p["mask"], p["index64"], self.schedule_of(p), p["staging"],
                              p["prefetch"])

        def rows():
            return fake_tensor(dt, (_sym(p), _sym(p, MASK_VEC)), (_sym(p, MASK_VEC), 1), 16)

        vec1 = functools.partial(_flat, p)

        args = (
            rows(),
            rows(),
            vec1(cutlass.Uint8, 1),
            vec1(i64, 8),
            vec1(i64, 8),
            vec1(f32),
            vec1(f32),
            vec1(f32),
            vec1(i32),
            f32(0.01),
            i32(-128),
            i32(127),
            i32(1),
            fake_stream(),
        )
        return kernel, args

    def representative(self):
        return [
            self.resolve(),
            self.resolve({"symmetric": False, "mask": False, "dtype": "fp16", "unroll": 8}),
            self.resolve({"staging": "regs"}),
            self.resolve({"dtype": "fp32", "unroll": 8}),
            self.resolve({"prefetch": False}),
        ]

    def sweep(self):
        return [
            self.resolve(
                {"dtype": d, "symmetric": s, "mask": m, "threads_per_row": t, "unroll": u, "index64": i, "staging": g,
                 "prefetch": f}
            )
            for d, s, m, (t, u), i, g, f in itertools.product(
                dtypes.FLOAT_NAMES,
                (True, False),
                (True, False),
                ((32, 1), (128, 4), (256, 8)),
                (False, True),
                ("smem", "regs"),
                (True, False),
            )
        ]


OBSERVE_ROWS = ObservedRowsSpec(
    name="qat.observe_rows",
    family="qat",
    lesson=17,
    summary="the per-channel fused observer and fake-quant in one pass: each row staged in shared memory (or held in "
    "registers), its min / max, moving average and qparams, then y and the STE mask from the held row (x read once)",
    ops=("fake_quant_observed",),
    status="ready",
    schedule=RowTiling,
    params={
        "dtype": Param("bf16", dtypes.FLOAT_NAMES, "signature", "x / y element type"),
        "index64": Param(False, (True, False), "signature", "64-bit indexing (>= 2^31 elements)"),
        "symmetric": Param(True, (True, False), "signature", "symmetric qparams"),
        "mask": Param(True, (True, False), "signature", "store the packed STE mask"),
        "threads": Param(256, (128, 256, 512, 1024), help="threads per CTA"),
        "threads_per_row": Param(128, (1, 2, 4, 8, 16, 32, 64, 128, 256, 512), help="threads holding one row"),
        "unroll": Param(4, (1, 2, 3, 4, 5, 6, 7, 8), help="16-byte vectors of the row a thread holds"),
        "staging": Param("smem", ("smem", "regs"), help="where the row is held: shared memory (cp.async) or registers"),
        "prefetch": Param(OBSERVED_ROWS_PREFETCH, (True, False), help="the next row's loads in flight under this one"),
    },
)

SPECS = (FAKE_QUANT, STE_BWD, LEARNABLE_BWD, OBSERVE, OBSERVE_ROWS)


def __getattr__(name):
    if name == "QATLinear":
        from cute_kernels.qat.linear import QATLinear

        return QATLinear
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
