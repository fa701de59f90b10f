"""CPU: a register plan's register cap (`HeldRowPlan.reg_cap`, session 19; measured in session 20: RMSNorm fwd 8k
256 x 32 at 3 CTAs an SM, 1.022x, the default until session 21's one-tile plans): the forwards ask ptxas for the plan's CTAs per SM. LayerNorm
fwd 8k (256 threads x 32 elements, the capped grid) compiles to 126 registers uncapped (2 CTAs an SM) and fits 3 CTAs
without spills; RMSNorm fwd 8k (128 x 64) 168 uncapped, 4 CTAs at 128; log-softmax fwd 8k 74 uncapped (3 CTAs), 4
at 64.
The plan, the catalogue config, the refusals and `perf.tune_rows`' twins."""

import dataclasses
import re

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from cute_kernels.rowwise import REG_CAP_KERNELS, config_of, plan_for_kernel, plan_of
from schedules.row_tiling import HeldRowPlan, RowTiling, plan_held_rows
from tests.helpers import plan_params


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


# the register plans of session 19's 8k entries (since replaced: LayerNorm and log-softmax by staged plans, RMSNorm by
# 256 x 32 capped at 3)
_LN_8K = dict(target_elems=32, max_elems=32, min_threads=128, max_tpr=256, resident_grid=True)
_RMS_8K = dict(target_elems=64, max_elems=64, min_threads=128, max_tpr=128)
_LSM_8K = dict(target_elems=32, max_elems=32, min_threads=256, max_tpr=256)


@pytest.mark.parametrize("name,st,cap,most", [("layernorm.fwd", _LN_8K, 3, 85), ("rmsnorm.fwd", _RMS_8K, 4, 128),
                                               ("log_softmax.fwd", _LSM_8K, 4, 64)])
def test_capped_plans_compile_clean(name, st, cap, most, tmp_path):
    plan = dataclasses.replace(plan_held_rows(8192, 8, **st), reg_cap=True, ctas_per_sm=cap)
    report, files = compile_with_artifacts(catalog.get(name), plan_params(name, plan), str(tmp_path))
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
    assert plan_for_kernel("softmax.fwd", 8192, 8).reg_cap
    ce = plan_for_kernel("cross_entropy.fwd", 8192, 8)
    assert not ce.reg_cap and "reg_cap" not in config_of(ce, "cross_entropy.fwd")


def test_tuner_twins():
    from perf.tune_rows import _twin, reg_cap_twins

    p = plan_held_rows(8192, 8, **_LN_8K)
    twins = reg_cap_twins(p)
    assert [str(q) for q in twins] == ["t256r256u4 c1 rg rc2", "t256r256u4 c1 rg rc3"]
    assert all(_twin(q) == p for q in twins)
    wide = HeldRowPlan(RowTiling(1024, 1024, 1), 1, 2)
    assert [q.ctas_per_sm for q in reg_cap_twins(wide)] == [2]  # 3 x 1024 threads do not fit an SM


def test_the_8k_entries():
    """The 8k entries: RMSNorm and LayerNorm fwd built for one CTA a row tile (session 21; LayerNorm capped at 4 CTAs an
    SM, RMSNorm uncapped), both uncapped beside the 1x128-block FP8 output (session 20: its block amaxes spilled 16-24
    B under RMSNorm's cap then, `ops._rowwise.without_reg_cap`); log-softmax staged (its own family), the softmax's
    register plan kept."""
    import torch

    from cute_kernels.rowwise.launch import kernel_params

    p = plan_for_kernel("rmsnorm.fwd", 8192, 8)
    assert str(p) == "t256r256u4 c1 1t" and not p.reg_cap
    sig = dict(weight=True, w_dtype="bf16", residual=False, bias=True)
    assert kernel_params("layernorm.fwd", torch.bfloat16, 8192, True, **sig)["reg_cap"] is True
    for res in (False, True):
        kp = kernel_params("layernorm.fwd", torch.bfloat16, 8192, True, **dict(sig, residual=res), fp8_out="block128")
        assert "reg_cap" not in kp and kp["threads"] == 512, kp
    assert plan_for_kernel("rmsnorm.fwd", 8192, 4) == plan_held_rows(8192, 4, **_RMS_8K)  # fp32 rows: as before
    assert str(plan_for_kernel("layernorm.fwd", 8192, 8)) == "t512r512u2 c1 rc4 1t"
    assert str(plan_for_kernel("log_softmax.fwd", 8192, 8)) == "t128r128u8 c1 smem"
    assert str(plan_for_kernel("softmax.fwd", 8192, 8)) == "t256r256u4 c1"
    assert plan_for_kernel("log_softmax.fwd", 8192, 4) == plan_held_rows(8192, 4, **_LSM_8K)
    for n in (4096, 16384, 65536, 262144):  # elsewhere the softmax's entries
        assert plan_for_kernel("log_softmax.fwd", n, 8) == plan_for_kernel("softmax.fwd", n, 8), n


def test_fp8_block_output_uncapped_compiles_clean(tmp_path):
    """The LayerNorm fwd 8k signature the cap leaves out compiles without spills."""
    import torch

    from cute_kernels.rowwise.launch import kernel_params

    kp = kernel_params("layernorm.fwd", torch.bfloat16, 8192, True, weight=True, w_dtype="bf16", residual=False,
                       bias=True, fp8_out="block128")
    assert "reg_cap" not in kp
    report, _ = compile_with_artifacts(catalog.get("layernorm.fwd"), catalog.get("layernorm.fwd").resolve(kp),
                                       str(tmp_path))
    assert report.kernels[0].local_bytes == 0, report.format()


def test_tuner_rg_ctas():
    """`perf.tune_rows --rg-ctas`: capped-grid forwards without a cluster on grids of other CTAs per SM (LayerNorm fwd
    8k's staged plan is planned at 8 an SM, where its staged weight and bias let 4 reside)."""
    from perf.tune_rows import plan_candidates
    from schedules.row_tiling import _LN_FWD_8K_STAGED

    d = plan_held_rows(8192, 8, **_LN_FWD_8K_STAGED)  # the 8k default of session 20
    assert d.ctas_per_sm == 8
    ps = plan_candidates("layernorm.fwd", 8192, d, hold="both", fwd_prefetch="both", resident_grid="both",
                         rg_ctas=(4,))
    assert dataclasses.replace(d, ctas_per_sm=4) in ps
    assert all(p.resident_grid and p.cluster_n == 1 for p in ps if p.ctas_per_sm == 4 and p.staging == "smem"
               and p.tiling == d.tiling)
    assert not any(p.ctas_per_sm == 4 for p in plan_candidates("layernorm.fwd", 8192, d, hold="both")
                   if p.tiling == d.tiling and p.staging == "smem")
