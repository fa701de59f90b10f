"""CPU: a register plan's register cap (`HeldRowPlan.reg_cap`, session 19, unmeasured): the forwards ask ptxas for
the plan's CTAs per SM. LayerNorm fwd 8k (256 threads x 32 elements, the capped grid) compiles to 126 registers
uncapped (2 CTAs an SM) and fits 3 CTAs without spills; RMSNorm fwd 8k (128 x 64) 168 uncapped, 4 CTAs at 128;
log-softmax fwd 8k 74 uncapped (3 CTAs), 4 at 64.
The plan, the catalogue config, the refusals and `perf.tune_rows`' twins."""

import dataclasses
import re

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from cute_kernels.specs_rowwise import REG_CAP_KERNELS, config_of, plan_for_kernel, plan_of
from schedules.row_tiling import HeldRowPlan, RowTiling


def _params(name, plan, **sig):
    base = dict(dtype="bf16", aligned=True, index64=False)
    if name.startswith(("rmsnorm", "layernorm")):
        base.update(weight=True, w_dtype="bf16", residual=False)
    if name == "layernorm.fwd":
        base["bias"] = True
    return catalog.get(name).resolve({**base, **config_of(plan, name), **sig})


def test_plan_config_and_refusals():
    t = RowTiling(256, 256, 4)
    p = HeldRowPlan(t, 1, 3, reg_cap=True)
    assert str(p).endswith(" rc3")
    c = config_of(p, "layernorm.fwd")
    assert c["reg_cap"] is True and c["ctas_per_sm"] == 3 and plan_of(c) == p
    # under a cap the weights are not held in registers (they spilled: 152 B at 3 CTAs an SM)
    assert "params_in_regs" not in config_of(dataclasses.replace(p, resident_grid=True), "layernorm.fwd")
    assert set(REG_CAP_KERNELS) == {"rmsnorm.fwd", "layernorm.fwd", "softmax.fwd", "log_softmax.fwd"}
    with pytest.raises(ValueError, match="reg_cap"):
        HeldRowPlan(t, 1, 3, "smem", reg_cap=True)  # staged plans get their CTAs per SM from shared memory already
    with pytest.raises(ValueError, match="reg_cap"):
        HeldRowPlan(t, 1, 3, acc_regs=True, reg_cap=True)
    with pytest.raises(ValueError, match="reg_cap"):
        catalog.get("cross_entropy.fwd").resolve(dict(reg_cap=True))


@pytest.mark.parametrize("name,n,cap,most", [("layernorm.fwd", 8192, 3, 85), ("rmsnorm.fwd", 8192, 4, 128),
                                              ("log_softmax.fwd", 8192, 4, 64)])
def test_capped_plans_compile_clean(name, n, cap, most, tmp_path):
    plan = dataclasses.replace(plan_for_kernel(name, n, 8), reg_cap=True, ctas_per_sm=cap)
    report, files = compile_with_artifacts(catalog.get(name), _params(name, plan), str(tmp_path))
    k = report.kernels[0]
    assert k.registers <= most and k.local_bytes == 0, report.format()
    m = re.search(r"\.minnctapersm (\d+)", files["ptx"].read_text())
    assert m and int(m.group(1)) == cap


def test_a_family_entry_with_the_cap_leaves_the_cross_entropy_forward_uncapped(monkeypatch):
    """The cross-entropy forward shares the softmax forward's family ("fwd") but has no cap: `plan_for_kernel` drops
    it there, as it drops `hold`."""
    from schedules import row_tiling as RT

    entries = tuple((most, dict(st, reg_cap=True, regs_per_thread=64) if most == 8192 else st)
                    for most, st in RT.HELD_TUNED["fwd"])
    monkeypatch.setitem(RT.HELD_TUNED, "fwd", entries)
    assert plan_for_kernel("log_softmax.fwd", 8192, 8).reg_cap
    ce = plan_for_kernel("cross_entropy.fwd", 8192, 8)
    assert not ce.reg_cap and "reg_cap" not in config_of(ce, "cross_entropy.fwd")


def test_tuner_twins():
    from perf.tune_rows import _twin, reg_cap_twins

    p = plan_for_kernel("layernorm.fwd", 8192, 8)
    twins = reg_cap_twins(p)
    assert [str(q) for q in twins] == ["t256r256u4 c1 rg rc2", "t256r256u4 c1 rg rc3"]
    assert all(_twin(q) == p for q in twins)
    wide = HeldRowPlan(RowTiling(1024, 1024, 1), 1, 2)
    assert [q.ctas_per_sm for q in reg_cap_twins(wide)] == [2]  # 3 x 1024 threads do not fit an SM
