"""CPU: the forwards built for one CTA per row tile (`HeldRowPlan.one_tile`, session 20; defaults from session 21). On
the uncapped grid each CTA has one tile, but the kernels traced a tile loop whose carried state took registers: RMSNorm fwd 8k at
512 threads x 16 elements capped at 4 CTAs an SM (torch.compile's Triton geometry: 32 registers, 92 % of warps
active under ncu against our 35 %) spilled 56 B with the loop and fits without it. The plan, its refusals, the
catalogue config and `perf.tune_rows`' twins."""

import dataclasses

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from cute_kernels.rowwise import ONE_TILE_KERNELS, config_of, plan_for_kernel, plan_of
from schedules.row_tiling import HeldRowPlan, RowTiling
from tests.helpers import op_signature, plan_params

T512 = RowTiling(512, 512, 2)


def test_plan_config_and_refusals():
    p = HeldRowPlan(T512, 1, 4, reg_cap=True, one_tile=True)
    assert str(p) == "t512r512u2 c1 rc4 1t"
    c = config_of(p, "rmsnorm.fwd")
    assert c["one_tile"] is True and plan_of(c) == p
    assert "one_tile" not in config_of(dataclasses.replace(p, one_tile=False), "rmsnorm.fwd")
    assert set(ONE_TILE_KERNELS) == {"rmsnorm.fwd", "layernorm.fwd", "softmax.fwd", "log_softmax.fwd"}
    for bad in (dict(resident_grid=True), dict(staging="smem", hold=True, prefetch=True, resident_grid=True)):
        with pytest.raises(ValueError, match="one_tile"):
            HeldRowPlan(T512, 1, 4, one_tile=True, **bad)
    for name in ("cross_entropy.fwd", "rmsnorm.bwd", "softmax.bwd"):
        with pytest.raises(ValueError, match="one_tile"):
            catalog.get(name).resolve(dict(one_tile=True))
    # the defaults that take it (session 21): the norm forwards at 513-1024, 4097-8192 (LayerNorm) and 4097-16384
    # (RMSNorm), softmax / log-softmax at 4097-6144
    for name in ONE_TILE_KERNELS:
        for n in (4096, 65536):
            assert not plan_for_kernel(name, n, 8).one_tile


ENTRIES = [("rmsnorm.fwd", 6144, "t256r256u3 c1 1t"), ("rmsnorm.fwd", 8192, "t256r256u4 c1 1t"),
           ("rmsnorm.fwd", 12288, "t256r256u6 c1 rc3 1t"), ("rmsnorm.fwd", 16384, "t512r512u4 c1 1t"),
           ("layernorm.fwd", 6144, "t256r256u3 c1 rc4 1t"), ("layernorm.fwd", 8192, "t512r512u2 c1 rc4 1t"),
           ("layernorm.fwd", 12288, "t256r256u3 c2 smem mb rg hold pf"), ("softmax.fwd", 8192, "t256r256u4 c1"),
           ("softmax.fwd", 6144, "t256r256u3 c1 rc5 1t"), ("log_softmax.fwd", 6144, "t256r256u3 c1 rc5 1t"),
           ("cross_entropy.fwd", 6144, "t256r256u3 c1"), ("rmsnorm.fwd", 1024, "t256r32u4 c1 1t"),
           ("layernorm.fwd", 1024, "t128r32u4 c1 rc6 1t"), ("softmax.fwd", 1024, "t128r32u4 c1")]


def test_the_one_tile_entries():
    """Session 21's entries (measured on the plain signature, bf16 weights); elsewhere their caps are dropped."""
    import torch

    from cute_kernels.rowwise.launch import kernel_params

    for name, n, plan in ENTRIES:
        assert str(plan_for_kernel(name, n, 8)) == plan, (name, n, plan_for_kernel(name, n, 8))
    sig = dict(weight=True, w_dtype="bf16", residual=False, bias=True)
    kp = kernel_params("layernorm.fwd", torch.bfloat16, 8192, True, **sig)
    assert kp["reg_cap"] is True and kp["one_tile"] is True and kp["ctas_per_sm"] == 4
    for other, i64 in ((dict(residual=True), False), (dict(fp8_out="per_token"), False), (dict(w_dtype="fp32"), False),
                       ({}, True)):
        kp = kernel_params("layernorm.fwd", torch.bfloat16, 8192, True, index64=i64, **{**sig, **other})
        assert "reg_cap" not in kp and kp["one_tile"] is True, (other, i64, kp)
    for name in ("rmsnorm.fwd", "softmax.fwd"):  # fp32 and scalar rows: the register plans before
        for vec in (4, 1):
            assert not plan_for_kernel(name, 6144, vec).one_tile, (name, vec)


SIGS = [dict(), dict(residual=True), dict(fp8_out="per_token"), dict(fp8_out="block128"), dict(w_dtype="fp32"),
        dict(weight=False), dict(residual=True, fp8_out="per_token", index64=True)]


@pytest.mark.parametrize("name,n", [("rmsnorm.fwd", 12288), ("rmsnorm.fwd", 16384), ("layernorm.fwd", 6144),
                                    ("layernorm.fwd", 8192), ("layernorm.fwd", 1024), ("softmax.fwd", 6144),
                                    ("log_softmax.fwd", 6144)], ids=lambda v: str(v))
def test_entries_compile_clean_beside_every_operand(name, n, tmp_path):
    """Capped on the plain signature, uncapped beside the rest (`ops._rowwise.without_reg_cap`): no spills. (Under the
    caps: RMSNorm 12288 80-152 B beside the residual / per-token output / 64-bit indexing, LayerNorm 8192 8 B with an
    fp32 weight; CPU compile, session 21.)"""
    import torch

    from cute_kernels.rowwise.launch import kernel_params

    for i, sig in enumerate(SIGS if "norm" in name else [{}, dict(index64=True)]):
        sig = dict(sig)
        i64 = sig.pop("index64", False)
        kp = kernel_params(name, torch.bfloat16, n, True, index64=i64, **op_signature(name, **sig))
        report, _ = compile_with_artifacts(catalog.get(name), catalog.get(name).resolve(kp), str(tmp_path / str(i)))
        assert report.kernels[0].local_bytes == 0, (sig, report.format())


@pytest.mark.parametrize("name", ["rmsnorm.fwd", "layernorm.fwd", "softmax.fwd", "log_softmax.fwd"])
def test_512_threads_at_4_ctas_an_sm_fit_without_the_loop(name, tmp_path):
    plan = HeldRowPlan(T512, 1, 4, reg_cap=True, one_tile=True)
    report, _ = compile_with_artifacts(catalog.get(name), plan_params(name, plan), str(tmp_path / "one"))
    k = report.kernels[0]
    assert k.registers <= 32 and k.local_bytes == 0, report.format()
    if name == "rmsnorm.fwd":  # with the loop the same cap spills
        report, _ = compile_with_artifacts(catalog.get(name),
                                           plan_params(name, dataclasses.replace(plan, one_tile=False)),
                                           str(tmp_path / "loop"))
        assert report.kernels[0].local_bytes > 0, report.format()


@pytest.mark.parametrize("sig", [dict(residual=True), dict(fp8_out="per_token"), dict(index64=True)],
                         ids=["residual", "fp8", "i64"])
def test_rmsnorm_signatures(sig, tmp_path):
    report, _ = compile_with_artifacts(catalog.get("rmsnorm.fwd"),
                                       plan_params("rmsnorm.fwd", HeldRowPlan(T512, 1, 4, reg_cap=True, one_tile=True),
                                                   **sig), str(tmp_path))
    assert report.kernels[0].local_bytes == 0, report.format()


def test_tuner_twins():
    from perf.tune_rows import _twin, one_tile_twins, plan_candidates

    p = HeldRowPlan(T512, 1, 1)
    twins = one_tile_twins(p)
    assert [str(q) for q in twins] == ["t512r512u2 c1 1t", "t512r512u2 c1 rc2 1t", "t512r512u2 c1 rc3 1t",
                                       "t512r512u2 c1 rc4 1t"]
    assert all(_twin(q) == p for q in twins)
    for q in (dataclasses.replace(p, resident_grid=True), HeldRowPlan(T512, 2, 1),
              HeldRowPlan(T512, 1, 1, "smem")):
        assert one_tile_twins(q) == []
    d = plan_for_kernel("rmsnorm.fwd", 8192, 8)
    ps = plan_candidates("rmsnorm.fwd", 8192, d, one_tile="both")
    assert HeldRowPlan(T512, 1, 4, reg_cap=True, one_tile=True) in ps and len(ps) == len(set(ps))
    assert not any(p.one_tile for p in plan_candidates("rmsnorm.fwd", 8192, d))


def test_tuner_dtype(monkeypatch):
    """`perf.tune_rows --dtype fp16` (session 21): the sweep's catalogue parameters follow the rows' dtype, the norms'
    weight with them (to time fp16's register floors: the softmax bwd 16k plan, log-softmax's 64-element hold)."""
    import torch

    import perf.tune_rows as T

    p = plan_for_kernel("rmsnorm.fwd", 8192, 8)
    assert T.plan_params("rmsnorm.fwd", p)["dtype"] == "bf16"
    monkeypatch.setattr(T, "DTYPE", torch.float16)
    params = T.plan_params("rmsnorm.fwd", p)
    assert params["dtype"] == params["w_dtype"] == "fp16" and params["one_tile"] is True
    params = T.plan_params("layernorm.bwd", plan_for_kernel("layernorm.bwd", 8192, 8))
    assert params["dtype"] == "fp16" and params["bias"] is True
    catalog.get("layernorm.bwd").resolve(params)
