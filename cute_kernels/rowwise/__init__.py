"""Catalogue entries of the row-wise kernels (curriculum lessons 4-7): RMSNorm, LayerNorm,
softmax, log-softmax, cross-entropy, forward and backward.

Config: the held-row plan (`schedules.row_tiling.plan_held_rows`): threads per CTA, threads per
row, 128-bit vectors held per thread, cluster size, staging (registers, or shared memory through
cp.async: `collectives.rowwise`). Signature: dtypes, alignment (128-bit vectors
need N, the row stride and the base 16-byte aligned; else the scalar variant), index width, and
which optional operands exist (weight, bias, residual). Row length and count stay symbolic: one
compiled kernel serves every N up to the plan's capacity.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

from cute_kernels import dtypes
from cute_kernels.catalog import SIG_COMMON, KernelSpec, Param
from cute_kernels.fake import fake_stream, index_sym
from cute_kernels.lazy import cute, cutlass
from schedules.row_tiling import (
    CLUSTER_FOLDS,
    CLUSTER_SYNCS,
    SMEM_PER_CTA,
    STAGINGS,
    HeldRowPlan,
    RowTiling,
    bwd_smem_accumulators,
    hold_elems,
    plan_for_rows,
)

_CONFIG = {
    "threads": Param(256, (128, 256, 512, 1024), help="threads per CTA"),
    "threads_per_row": Param(128, (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024), help="threads sharing one row (per CTA)"),
    "vpt": Param(4, tuple(range(1, 65)), help="128-bit vectors of the row each thread holds in registers"),
    "cluster_n": Param(1, (1, 2, 4, 8, 16), help="CTAs of a cluster sharing one row (distributed shared memory; "
                       "16 is a non-portable cluster size: the norm backwards past 128k)"),
    "staging": Param("regs", STAGINGS, help="where the held row lives: registers, or shared memory filled by "
                     "cp.async and read back per pass (aligned rows only)"),
    "cluster_sync": Param("barrier", CLUSTER_SYNCS, help="how a cluster's CTAs exchange row partials: remote "
                          "stores + cluster barrier, or st.async completing an mbarrier (no fence)"),
}

# Kernels whose tile loop pipelines row tiles (`HeldRowPlan.prefetch`): the backward kernels, which
# walk row tiles grid-stride. Only their specs have the `prefetch` parameter.
# ...and the forwards, only with `hold` (their one staging buffer refilled once the held row is read out of it)
PREFETCH_HOLD_ONLY = ("rmsnorm.fwd", "layernorm.fwd", "softmax.fwd", "log_softmax.fwd")
PREFETCH_KERNELS = ("rmsnorm.bwd", "layernorm.bwd", "softmax.bwd", "log_softmax.bwd") + PREFETCH_HOLD_ONLY
_PREFETCH = Param(False, (False, True), help="fetch the next row tile (x/y and dy; registers: a second set, "
                  "smem: a second staging buffer, cp.async wait_group 1) while computing this one")

# Kernels that can hold a staged row in registers after it lands (`HeldRowPlan.hold`): only their
# specs have the `hold` parameter.
HOLD_KERNELS = ("softmax.fwd", "log_softmax.fwd", "rmsnorm.fwd", "layernorm.fwd", "rmsnorm.bwd", "layernorm.bwd")
_HOLD = Param(False, (False, True), help="staging='smem': read the landed row once into registers and compute "
              "from there (one exp per element), instead of re-reading the buffer per pass")

# The norm backwards can hold their dweight/dbias accumulators in registers on any plan
# (`HeldRowPlan.acc_regs`); `ctas_per_sm` is then the register-held plan's register cap.
ACC_REGS_KERNELS = ("rmsnorm.bwd", "layernorm.bwd")
_ACC_REGS = Param(False, (False, True), help="dweight/dbias accumulators in registers (else shared memory, "
                  "except staged plans of few elements); register-held plans are capped to ctas_per_sm per SM")
_CTAS_PER_SM = Param(2, tuple(range(1, 17)), help="with acc_regs (or reg_cap) on a register-held plan: CTAs per SM "
                     "ptxas must fit")
# The forwards' register plans may cap their registers at the plan's CTAs per SM (`HeldRowPlan.reg_cap`; the
# kernels' shared `HeldRowKernel.grid` asks ptxas for them): log-softmax 8k 74 -> 64 registers at 4 CTAs an SM, no spills.
REG_CAP_KERNELS = ("rmsnorm.fwd", "layernorm.fwd", "softmax.fwd", "log_softmax.fwd")
_REG_CAP = Param(False, (False, True), help="staging='regs': ask ptxas for ctas_per_sm CTAs per SM (a register cap)")
# The same forwards built for one CTA per row tile (`HeldRowPlan.one_tile`: no tile loop to carry; the uncapped grid).
ONE_TILE_KERNELS = REG_CAP_KERNELS
_ONE_TILE = Param(False, (False, True), help="one CTA per row tile, the tile loop traced for one trip (not with "
                  "resident_grid or prefetch)")
# The norm forwards on a register plan's capped grid (`HeldRowPlan.resident_grid`, staging "regs": a CTA walks many
# row tiles) load their 16-bit weight and bias once a CTA and hold them in registers across the tiles
# (`cute_kernels.rowwise.norms.NormFwd`); on an uncapped grid each CTA has one tile and loads them in it.
PARAMS_IN_REGS_KERNELS = ("rmsnorm.fwd", "layernorm.fwd")
_PARAMS_IN_REGS = Param(False, (False, True), help="staging='regs' on the capped grid: 16-bit weight/bias loaded once "
                        "a CTA and held in registers across its row tiles (else loaded per tile)")
# The LayerNorm forward can take its statistics in one reduction (`HeldRowPlan.welford`).
WELFORD_KERNELS = ("layernorm.fwd",)
_WELFORD = Param(False, (False, True), help="mean and variance in one row reduction (per-thread count / mean / M2 "
                 "merged by Chan's formula) instead of two")

# Every clustered row-wise kernel can fold its cluster's partials by a butterfly (`HeldRowPlan.cluster_fold`).
_CLUSTER_FOLD = Param("serial", CLUSTER_FOLDS, help="how a clustered row's CTA partials are folded: serial (rank "
                      "order, cluster_n - 1 ops) or tree (a butterfly over cluster_n lanes, log2(cluster_n) ops)")

# Row tensors each kernel stages with staging="smem" (cross-entropy backward holds x without a
# reduction: nothing to overlap, it is not staged).
STAGED_TENSORS = {"rmsnorm.fwd": 1, "layernorm.fwd": 1, "softmax.fwd": 1, "log_softmax.fwd": 1,
                  "softmax.bwd": 2, "log_softmax.bwd": 2, "rmsnorm.bwd": 2, "layernorm.bwd": 2}


def tuning_of(name: str) -> str:
    """Which `HELD_TUNED` family plans kernel `name`."""
    special = {"rmsnorm.fwd": "rms_fwd", "layernorm.fwd": "ln_fwd", "log_softmax.fwd": "lsm_fwd", "rmsnorm.bwd": "rms_bwd",
               "layernorm.bwd": "ln_bwd", "cross_entropy.bwd": "ce_bwd"}
    if name in special:
        return special[name]
    return "bwd" if name.endswith(".bwd") else "fwd"


def plan_of(p) -> HeldRowPlan:
    return HeldRowPlan(RowTiling(p["threads"], p["threads_per_row"], p["vpt"]), p["cluster_n"],
                       staging=p.get("staging", "regs"), prefetch=p.get("prefetch", False),
                       cluster_sync=p.get("cluster_sync", "barrier"), hold=p.get("hold", False),
                       acc_regs=p.get("acc_regs", False), ctas_per_sm=p.get("ctas_per_sm", 2),
                       welford=p.get("welford", False), cluster_fold=p.get("cluster_fold", "serial"),
                       resident_grid=p.get("params_in_regs", False), reg_cap=p.get("reg_cap", False),
                       one_tile=p.get("one_tile", False))


def plan_for_kernel(name: str, n: int, vec: int, staged: bool = True, index64: bool = False) -> HeldRowPlan:
    """The `HELD_TUNED` plan of kernel `name` for rows of `n` elements in `vec`-element vectors:
    `plan_for_rows` of its family (`staged`, `index64`: as there), without `hold` or `reg_cap` for a kernel that does
    not build it (the cross-entropy forward shares the softmax forward's family)."""
    plan = plan_for_rows(tuning_of(name), n, vec, staged, index64)
    if plan.reg_cap and name not in REG_CAP_KERNELS:
        plan = dataclasses.replace(plan, reg_cap=False)
    if plan.one_tile and name not in ONE_TILE_KERNELS:
        plan = dataclasses.replace(plan, one_tile=False)
    # (a held forward's refill, `prefetch`, goes with its `hold`)
    return plan if not plan.hold or name in HOLD_KERNELS else dataclasses.replace(plan, hold=False, prefetch=False)


def config_of(plan: HeldRowPlan, name: str | None = None) -> dict:
    """The catalogue config of `plan` (`prefetch` / `hold` only when set: only PREFETCH_KERNELS /
    HOLD_KERNELS have them) for kernel `name` (`params_in_regs`: PARAMS_IN_REGS_KERNELS on a register plan's
    capped grid; without a name, never)."""
    t = plan.tiling
    out = dict(threads=t.threads, threads_per_row=t.threads_per_row, vpt=t.unroll, cluster_n=plan.cluster_n,
               staging=plan.staging)
    if plan.prefetch:
        out["prefetch"] = True
    if plan.cluster_sync != "barrier":
        out["cluster_sync"] = plan.cluster_sync
    if plan.hold:
        out["hold"] = True
    if plan.acc_regs:  # the CTAs per SM become the kernel's register cap
        out["acc_regs"] = True
        out["ctas_per_sm"] = plan.ctas_per_sm
    if plan.welford:
        out["welford"] = True
    if plan.cluster_fold != "serial":
        out["cluster_fold"] = plan.cluster_fold
    if plan.reg_cap:  # the CTAs per SM become the kernel's register cap
        out["reg_cap"] = True
        out["ctas_per_sm"] = plan.ctas_per_sm
    if plan.one_tile:
        out["one_tile"] = True
    if name in PARAMS_IN_REGS_KERNELS and plan.resident_grid and plan.staging == "regs" and not plan.reg_cap:
        # (not under a register cap: the held weights spilled there, LayerNorm 8k capped at 3 CTAs an SM 152 B)
        out["params_in_regs"] = True
    return out


@dataclass(frozen=True, eq=False)
class RowwiseSpec(KernelSpec):
    """`name` is `<family>.<fwd|bwd>`, family in rmsnorm, layernorm, softmax, log_softmax, cross_entropy. The config is
    a `HeldRowPlan`: its tiling's fields are the parameters threads / threads_per_row / vpt, its options the ones
    of the same name (`resident_grid` is `params_in_regs`, which holds the weights across the capped grid's tiles);
    each kernel has only the options it builds (`config_of`, `plan_of`)."""

    def config_of(self, schedule):
        return config_of(schedule, self.name)

    def schedule_of(self, p):
        return plan_of(p)

    def check(self, p):
        plan = plan_of(p)  # raises on a bad combination
        if plan.prefetch and self.name in PREFETCH_HOLD_ONLY and not plan.hold:
            raise ValueError(f"{self.name}: prefetch needs hold=True (the held row's staging buffer is refilled with "
                             f"the next tile once read); plan {plan}")
        if plan.staging == "smem":
            if self.name not in STAGED_TENSORS:
                raise ValueError(f"{self.name}: staging='smem' is not built for this kernel (plan {plan})")
            if not p["aligned"]:
                raise ValueError(f"{self.name}: staging='smem' needs 16-byte aligned rows (cp.async moves "
                                 f"4-16 bytes); plan {plan} with aligned=False")
            if plan.hold and plan.tiling.unroll * dtypes.vec_of(p["dtype"], p["aligned"]) > hold_elems(self.name):
                raise ValueError(f"{self.name}: hold=True keeps the row in registers: at most {hold_elems(self.name)} "
                                 f"elements per thread (plan {plan})")
            total = self.dynamic_smem_bytes(p)
            if total > SMEM_PER_CTA:
                raise ValueError(f"{self.name}: plan {plan} needs {total} bytes of shared memory per CTA "
                                 f"(staged rows, plus fp32 dweight/dbias accumulators in the norms' backward); "
                                 f"at most {SMEM_PER_CTA}")

    def local_memory_note(self, p):
        if p.get("hold") and self.name.endswith(".fwd"):
            return "the held row's tile-loop trip count: one 8-byte store before the loop, one load per tile"
        return None

    def dynamic_smem_bytes(self, p):
        """The row-sized shared memory of a CTA: staging buffers (staging="smem") and, in the norms'
        backward, the fp32 dweight/dbias accumulators; None when there is none (the reductions'
        few slots come on top)."""
        plan = plan_of(p)
        vec = dtypes.vec_of(p["dtype"], p["aligned"])
        row = dtypes.cutlass_of(p["dtype"]).width // 8
        rows = (row,) * STAGED_TENSORS.get(self.name, 0)
        params, accs = (), 0
        if self.name.startswith(("rmsnorm", "layernorm")):
            w = dtypes.cutlass_of(p["w_dtype"]).width // 8
            has_w, has_b = p["weight"], p.get("bias", False) and self.name.startswith("layernorm")
            if self.name.endswith(".fwd"):
                rows = (row,) * (1 + p["residual"])
                params = (w,) * (int(has_w) + int(has_b))
            else:  # (accumulators in registers, one row group a CTA: no shared slots)
                params, accs = (w,) * int(has_w), bwd_smem_accumulators(plan, vec, int(has_w) + int(has_b))
        return plan.row_smem_bytes(vec, rows, params, accs) or None

    def build(self, p):
        from cute_kernels.rowwise import norms, softmax

        fam, direction = self.name.split(".")
        dt = dtypes.cutlass_of(p["dtype"])
        vec = dtypes.vec_of(p["dtype"], p["aligned"])
        i64 = p["index64"]
        plan = plan_of(p)
        n = index_sym(i64, vec)
        m = index_sym(i64)
        align = 16 if p["aligned"] else dt.width // 8

        def mat(t=dt):
            a = align if t is dt else (16 if p["aligned"] else t.width // 8)
            return cute.runtime.make_fake_tensor(t, (m, n), stride=(index_sym(i64, vec), 1), assumed_align=a)

        def vecn(t):
            # The ops take the vector variant only when every operand, weight and bias included, is
            # 16-byte aligned, so an fp32 weight next to bf16 rows is read as 128-bit vectors too.
            return cute.runtime.make_fake_tensor(t, (n,), stride=(1,), assumed_align=16 if p["aligned"] else t.width // 8)

        def perrow(t=cutlass.Float32):
            return cute.runtime.make_fake_tensor(t, (m,), stride=(1,), assumed_align=4)

        if fam in ("rmsnorm", "layernorm"):
            kind = "rms" if fam == "rmsnorm" else "layer"
            wdt = dtypes.cutlass_of(p["w_dtype"])
            has_w, has_b = p["weight"], p.get("bias", False) and kind == "layer"
            w = vecn(wdt) if has_w else None
            b = vecn(wdt) if has_b else None
            res = p["residual"]
            mean = perrow() if kind == "layer" else None
            if direction == "fwd":
                fp8 = p.get("fp8_out", "none")
                out, scales = mat(), None
                if fp8 != "none":  # e4m3 y and fp32 scales (M, 1) or (M, ceil(N / 128)), any strides
                    out = mat(cutlass.Float8E4M3FN)
                    scales = cute.runtime.make_fake_tensor(cutlass.Float32, (m, index_sym(i64)),
                                                           stride=(index_sym(i64), index_sym(i64)), assumed_align=4)
                k = norms.NormFwd(kind, dt, wdt, dt, vec, i64, plan, has_w, has_b, res, fp8)
                return k, (mat(), w, b, mat() if res else None, out, mat() if res else None, mean, perrow(),
                           scales, cutlass.Float32(1e-6), cutlass.Int32(1), fake_stream())
            k = norms.NormBwd(kind, dt, wdt, vec, i64, plan, has_w, has_b, res)
            c = index_sym(False)

            def partial():
                return cute.runtime.make_fake_tensor(cutlass.Float32, (c, n), stride=(n, 1), assumed_align=16)

            return k, (mat(), w, mat(), mat() if res else None, mean, perrow(), mat(),
                       partial() if has_w else None, partial() if has_b else None, cutlass.Int32(1), fake_stream())
        if fam in ("softmax", "log_softmax"):
            log = fam == "log_softmax"
            if direction == "fwd":
                return softmax.SoftmaxFwd(log, dt, vec, i64, plan), (mat(), mat(), cutlass.Int32(1), fake_stream())
            return softmax.SoftmaxBwd(log, dt, vec, i64, plan), (mat(), mat(), mat(), cutlass.Int32(1), fake_stream())
        # cross_entropy

        tgt = perrow(cutlass.Int64)
        if direction == "fwd":
            k = softmax.CrossEntropyFwd(dt, vec, i64, plan)
            return k, (mat(), tgt, perrow(), perrow(), cutlass.Int32(-100), cutlass.Int32(1), fake_stream())
        k = softmax.CrossEntropyBwd(dt, vec, i64, plan)
        return k, (mat(), tgt, perrow(), perrow(), mat(), cutlass.Int32(-100), cutlass.Int32(1), fake_stream())

    def representative(self):
        """The plans the ops pick for a 4k row (one CTA) and a 64k row (a cluster); the scalar variant
        for odd rows is compiled by tests/rowwise/test_rowwise_compile.py."""
        out = []
        for n, aligned in ((4096, True), (65536, True)):
            vec = dtypes.vec_of("bf16", aligned)
            plan = plan_for_kernel(self.name, n, vec)
            out.append(self.resolve({**config_of(plan, self.name), "aligned": aligned}))
        return out

    def sweep(self):
        out = []
        for d, a, n in itertools.product(dtypes.FLOAT_NAMES, (True, False), (1024, 4096, 16384, 32768, 131072)):
            vec = dtypes.vec_of(d, a)
            try:
                plan = plan_for_kernel(self.name, n, vec)
            except ValueError:
                continue
            out.append(self.resolve({**config_of(plan, self.name), "dtype": d, "aligned": a}))
        return out


def _spec(name: str, lesson: int, summary: str, ops: tuple[str, ...], extra: dict | None = None) -> RowwiseSpec:
    direction = name.split(".")[1]
    params = {**SIG_COMMON, **(extra or {}), **_CONFIG}
    if direction == "bwd":
        params["threads_per_row"] = Param(64, _CONFIG["threads_per_row"].choices, help=_CONFIG["threads_per_row"].help)
    if name in PREFETCH_KERNELS:
        params["prefetch"] = _PREFETCH
    if name in HOLD_KERNELS:
        params["hold"] = _HOLD
    if name in ACC_REGS_KERNELS:
        params["acc_regs"] = _ACC_REGS
        params["ctas_per_sm"] = _CTAS_PER_SM
    if name in WELFORD_KERNELS:
        params["welford"] = _WELFORD
    if name in PARAMS_IN_REGS_KERNELS:
        params["params_in_regs"] = _PARAMS_IN_REGS
    if name in REG_CAP_KERNELS:
        params["reg_cap"] = _REG_CAP
        params["ctas_per_sm"] = _CTAS_PER_SM
    if name in ONE_TILE_KERNELS:
        params["one_tile"] = _ONE_TILE
    if name in STAGED_TENSORS:  # the held-row kernels (their clusters)
        params["cluster_fold"] = _CLUSTER_FOLD
    return RowwiseSpec(name=name, family="rowwise", lesson=lesson, summary=summary, ops=ops, status="ready",
                       params=params, schedule=HeldRowPlan)


_NORM_SIG = {
    "w_dtype": Param("bf16", dtypes.FLOAT_NAMES, "signature", "weight/bias element type"),
    "weight": Param(True, (True, False), "signature", "has a weight (scale)"),
    "residual": Param(False, (True, False), "signature", "fused residual add (fwd) / residual gradient (bwd)"),
}
_LN_SIG = {**_NORM_SIG, "bias": Param(True, (True, False), "signature", "has a bias")}
# Forward only: y written as FP8 e4m3 with fp32 scales per row or per 1x128 block.
_FP8_SIG = {"fp8_out": Param("none", ("none", "per_token", "block128"), "signature",
                             "y as e4m3 + fp32 scales per token or per 1x128 block (the FP8 GEMM's sa)")}

ROWWISE = [
    _spec("rmsnorm.fwd", 4, "RMSNorm forward, row in registers; +weight, +residual (returns the sum), +FP8 e4m3 y",
          ("rms_norm",), {**_NORM_SIG, **_FP8_SIG}),
    _spec("rmsnorm.bwd", 4, "RMSNorm backward: dx, fp32 dweight partials, +residual gradient", ("rms_norm",),
          _NORM_SIG),
    _spec("layernorm.fwd", 5, "LayerNorm forward, two-pass in registers; +weight/bias, +residual, +FP8 e4m3 y",
          ("layer_norm",), {**_LN_SIG, **_FP8_SIG}),
    _spec("layernorm.bwd", 5, "LayerNorm backward: dx, fp32 dweight/dbias partials", ("layer_norm",), _LN_SIG),
    _spec("softmax.fwd", 6, "softmax over the last dim, one (m, l) reduction, one exp per element", ("softmax",)),
    _spec("softmax.bwd", 6, "softmax backward: dx = y * (dy - sum(y * dy))", ("softmax",)),
    _spec("log_softmax.fwd", 7, "log-softmax: x - (m + log l)", ("log_softmax",)),
    _spec("log_softmax.bwd", 7, "log-softmax backward: dx = dy - exp(y) * sum(dy)", ("log_softmax",)),
    _spec("cross_entropy.bwd", 7, "cross-entropy backward: dx = (exp(x - lse) - onehot) * g, recomputed from x",
          ("cross_entropy",)),
]


# ---------------------------------------------------------------------------------------------
# Cross-entropy forward: a streaming row reduction (the row sum's tiling), not a held row.
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class CrossEntropyFwdSpec(KernelSpec):
    """Config: `schedules.row_tiling.plan_rows`'s tiling. Signature: logits dtype, alignment, index
    width, and the pass (`mode`: whole rows, split partials, or the merge of the partials)."""

    def check(self, p):
        self.schedule_of(p)

    def build(self, p):

        from cute_kernels.rowwise.softmax import CrossEntropyFwd

        dt = dtypes.cutlass_of(p["dtype"])
        i64 = p["index64"]
        vec = 2 if p["mode"] == "merge" else dtypes.vec_of(p["dtype"], p["aligned"])
        tiling = self.schedule_of(p)
        m = index_sym(i64)
        x_vec = dtypes.vec_of(p["dtype"], p["aligned"])
        x = cute.runtime.make_fake_tensor(dt, (m, index_sym(i64)), stride=(index_sym(i64, x_vec), 1),
                                          assumed_align=16 if p["aligned"] else dt.width // 8)
        s2 = index_sym(False, 2)
        part = cute.runtime.make_fake_tensor(cutlass.Float32, (index_sym(i64), s2), stride=(s2, 1), assumed_align=8)

        def perrow(t=cutlass.Float32):
            return cute.runtime.make_fake_tensor(t, (m,), stride=(1,), assumed_align=t.width // 8)

        k = CrossEntropyFwd(dt, vec, i64, tiling, p["mode"])
        return k, (x, perrow(cutlass.Int64), part, perrow(), perrow(), cutlass.Int32(-100), cutlass.Int32(1), fake_stream())

    def dynamic_smem_bytes(self, p):
        from collectives.reduce import group_smem_slots

        return 4 * group_smem_slots(p["threads"], p["threads_per_row"], 2)

    def representative(self):
        """The tilings the op picks for 32768 x 4096 (4 rows per CTA), 2048 x 65536 (one row per CTA)
        and the first pass of a long row split over CTAs."""
        from cute_kernels.rowwise.ops import ce_plan

        out = []
        for m, n in ((32768, 4096), (2048, 65536)):
            t = ce_plan(m, n, 8, 132).tiling
            out.append(self.resolve({"threads": t.threads, "threads_per_row": t.threads_per_row, "unroll": t.unroll}))
        out.append(self.resolve({"mode": "partial", "threads_per_row": 128}))
        return out  # the merge pass (64-bit loads of pairs): tests/rowwise/test_cross_entropy_fwd_compile.py

    def sweep(self):
        out = []
        for d, a, mode in itertools.product(dtypes.FLOAT_NAMES, (True, False), ("rows", "partial", "merge")):
            for tpr in (8, 64, 128):
                out.append(self.resolve({"dtype": d, "aligned": a, "mode": mode, "threads_per_row": tpr}))
        for d in dtypes.FLOAT_NAMES:
            out.append(self.resolve({"dtype": d, "index64": True}))
        return out


CE_FWD = CrossEntropyFwdSpec(
    name="cross_entropy.fwd", family="rowwise", lesson=7,
    summary="cross-entropy loss and log-sum-exp per row, streamed (online-softmax fold); probabilities never stored",
    ops=("cross_entropy",), status="ready", schedule=RowTiling,
    params={
        **SIG_COMMON,
        "mode": Param("rows", ("rows", "partial", "merge"), "signature",
                      "whole rows | split partials (m, l) | merge of the partials"),
        "threads": Param(128, (128, 256, 512, 1024), help="threads per CTA"),
        "threads_per_row": Param(64, (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024), help="threads sharing one row"),
        "unroll": Param(8, tuple(range(1, 9)), help="vectors per thread loaded together in a pass (one max, one "
                        "rescale)"),
    },
)
STREAMING = [CE_FWD]

SPECS = (*ROWWISE, *STREAMING)
