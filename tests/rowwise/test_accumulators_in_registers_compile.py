"""CPU (sm_90a compile): `HeldRowPlan.acc_regs`, the norm backwards' dweight/dbias accumulators in
registers on any plan. A register-held plan is capped at its CTAs per SM (`.minnctapersm`): LayerNorm
4k t512 u1 with prefetch compiles to 64 registers without spills at 2 per SM (96 uncapped, one CTA
per SM); the shared-memory accumulators' read-modify-writes (LDS/STS per row) are gone from the loop."""

import re

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from cute_kernels.rowwise import config_of, plan_of
from schedules.row_tiling import HeldRowPlan, RowTiling

CASES = [("layernorm.bwd", HeldRowPlan(RowTiling(512, 512, 1), 1, 2, prefetch=True, acc_regs=True), 64),
         ("rmsnorm.bwd", HeldRowPlan(RowTiling(512, 512, 1), 1, 2, prefetch=True, acc_regs=True), 64),
         ("layernorm.bwd", HeldRowPlan(RowTiling(256, 128, 4), 1, 1, acc_regs=True), 255)]


@pytest.mark.parametrize("name,plan,limit", CASES, ids=[f"{n}-{p}" for n, p, _ in CASES])
def test_register_accumulators_compile(name, plan, limit, tmp_path):
    spec = catalog.get(name)
    p = spec.resolve(dict(config_of(plan), dtype="bf16", aligned=True, index64=False))
    assert plan_of(p) == plan  # the config round-trips, CTAs per SM included
    report, files = compile_with_artifacts(spec, p, str(tmp_path))
    assert not report.spills, report.format()
    assert report.kernels[0].registers <= limit, report.format()
    ptx = files["ptx"].read_text()
    assert int(re.search(r"\.minnctapersm (\d+)", ptx).group(1)) == plan.ctas_per_sm


def test_plan_string_and_spec_params():
    p = HeldRowPlan(RowTiling(512, 512, 1), 1, 2, prefetch=True, acc_regs=True)
    assert "accr" in str(p) and config_of(p)["acc_regs"] and config_of(p)["ctas_per_sm"] == 2
    assert "acc_regs" in catalog.get("layernorm.bwd").params and "acc_regs" not in catalog.get("softmax.bwd").params


@pytest.mark.parametrize("n", [16384, 32768, 65536])
def test_layernorm_bwd_production_plans(n, tmp_path):
    """The LayerNorm backward's default plans at 16k-64k (session 12's sweep) keep dweight/dbias in
    registers and compile without spills at their CTAs per SM."""
    import torch

    from cute_kernels.rowwise.launch import plan_for

    plan = plan_for("layernorm.bwd", torch.bfloat16, n, True)
    assert plan.acc_regs and plan.prefetch
    spec = catalog.get("layernorm.bwd")
    p = spec.resolve(dict(config_of(plan), dtype="bf16", aligned=True, index64=False))
    report, _ = compile_with_artifacts(spec, p, str(tmp_path))
    assert not report.spills, report.format()


@pytest.mark.parametrize("name,plan,has_bias", [
    ("rmsnorm.bwd", HeldRowPlan(RowTiling(512, 512, 4), 8, 1, "smem", prefetch=True, resident_grid=True,
                                acc_regs=True), False),
    ("layernorm.bwd", HeldRowPlan(RowTiling(256, 256, 4), 8, 2, "smem", prefetch=True, cluster_sync="mbarrier",
                                  resident_grid=True, acc_regs=True), True),
    ("layernorm.bwd", HeldRowPlan(RowTiling(512, 512, 2), 2, 1, prefetch=True, cluster_sync="mbarrier",
                                  acc_regs=True), True)])
def test_one_row_group_writes_partials_from_registers(name, plan, has_bias, tmp_path):
    """Register accumulators with one row group a CTA (session 15): no shared slots (the spec's shared memory is
    the staging alone), the partial rows stored from the registers, and the launch's CTAs per SM those of the plan
    with the slots (what the sweeps measured)."""
    spec = catalog.get(name)
    p = spec.resolve(dict(config_of(plan), dtype="bf16", aligned=True, index64=False))
    staged = spec.dynamic_smem_bytes(p) or 0
    chunk = plan.tiling.threads_per_row * plan.tiling.unroll * 8
    assert staged == (plan.row_smem_bytes(8, (2, 2), (2,)) if plan.staging == "smem" else 0)
    report, files = compile_with_artifacts(spec, p, str(tmp_path))
    assert not report.spills, report.format()
    assert (report.dynamic_smem_bytes or 0) == staged
    from cutlass import BFloat16

    from cute_kernels.rowwise.norms import NormBwd

    k = NormBwd("layer" if has_bias else "rms", BFloat16, BFloat16, 8, False, plan, True, has_bias, False)
    assert k.direct_partial and k.accumulators == 0
    assert k.residency_smem_bytes() == k.row_smem_bytes() + (1 + has_bias) * 4 * chunk
