"""CPU: clustered row-wise kernels synced by mbarrier (`HeldRowPlan.cluster_sync="mbarrier"`,
`collectives.reduce.cluster_reduce`). The partials go out with `st.async ... mbarrier::complete_tx`,
one thread per CTA arms its barrier with the expected bytes, every thread waits on it with
`mbarrier.try_wait.parity`; the only cluster barrier left is the one before the tile loop, and the
SASS loses the `MEMBAR.ALL.GPU` the barrier's release puts in front of every tile's reduction (it
waits for the previous tile's global stores to drain). The plan, catalogue and cache key carry the
choice; the barrier variant's PTX is what it was."""

import re

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from cute_kernels.rowwise import config_of, plan_of
from schedules.row_tiling import HeldRowPlan, RowTiling

# (kernel, threads, threads_per_row, vpt, cluster_n, staging): the default clustered plans at
# 64k (bf16) and a few more, all of which compile without spills in both syncs
CASES = [
    ("rmsnorm.fwd", (256, 256, 8, 4, "smem")), ("layernorm.fwd", (256, 256, 8, 4, "smem")),
    ("softmax.fwd", (256, 256, 8, 4, "regs")), ("log_softmax.fwd", (256, 256, 16, 2, "smem")),
    ("layernorm.bwd", (512, 512, 2, 8, "regs")), ("softmax.bwd", (512, 512, 4, 4, "regs")),
]


def _params(name, shape, sync, **extra):
    t, tpr, vpt, cn, staging = shape
    return catalog.get(name).resolve(dict(threads=t, threads_per_row=tpr, vpt=vpt, cluster_n=cn, staging=staging,
                                          cluster_sync=sync, **extra))


def _compile(name, p, tmp_path):
    report, files = compile_with_artifacts(catalog.get(name), p, str(tmp_path))
    assert not report.spills, report.format()
    sass = files["sass"].read_text() if "sass" in files else None
    return report, files["ptx"].read_text(), sass


@pytest.mark.parametrize("name,shape", CASES, ids=[f"{n}-{s[3]}x{s[4]}" for n, s in CASES])
def test_mbarrier_sync_replaces_the_cluster_barrier(name, shape, tmp_path):
    _, ptx, sass = _compile(name, _params(name, shape, "mbarrier"), tmp_path / "mb")
    assert "st.async.shared::cluster.mbarrier::complete_tx::bytes.f32" in ptx
    assert "mbarrier.try_wait.parity" in ptx and "mbarrier.arrive.expect_tx" in ptx
    assert "mbarrier.init" in ptx
    # the cluster barrier survives only before the loop (every CTA started before remote stores)
    assert len(re.findall(r"barrier\.cluster\.arrive\.relaxed", ptx)) == 1
    assert len(re.findall(r"barrier\.cluster\.arrive;", ptx)) == 0
    _, ptx_bar, sass_bar = _compile(name, _params(name, shape, "barrier"), tmp_path / "bar")
    assert "st.async" not in ptx_bar and re.search(r"barrier\.cluster\.arrive;", ptx_bar)
    if sass is not None and sass_bar is not None:
        assert "MEMBAR.ALL.GPU" in sass_bar and "MEMBAR.ALL.GPU" not in sass


def test_sites_with_their_own_mbarriers(tmp_path):
    """RMSNorm forward with per-token FP8 output reduces at two sites (sum of squares, amax); LayerNorm
    at two (mean, variance): each site has its own pair of mbarriers."""
    for i, (name, extra) in enumerate([("rmsnorm.fwd", dict(fp8_out="per_token")), ("layernorm.fwd", {})]):
        _, ptx, _ = _compile(name, _params(name, (256, 256, 8, 4, "regs"), "mbarrier", **extra), tmp_path / str(i))
        assert ptx.count("mbarrier.init") >= 1 and ptx.count("st.async") >= 2


def test_plan_catalogue_and_key():
    spec = catalog.get("rmsnorm.fwd")
    a = _params("rmsnorm.fwd", (256, 256, 8, 4, "smem"), "barrier")
    b = _params("rmsnorm.fwd", (256, 256, 8, 4, "smem"), "mbarrier")
    assert spec.key(a) != spec.key(b) and "cluster_sync=mbarrier" in spec.key(b).config
    plan = plan_of(b)
    assert plan.cluster_sync == "mbarrier" and str(plan).endswith("smem mb")
    assert config_of(plan)["cluster_sync"] == "mbarrier" and "cluster_sync" not in config_of(plan_of(a))
    with pytest.raises(ValueError, match="cluster_sync"):
        HeldRowPlan(RowTiling(256, 256, 8), 4, cluster_sync="fence")
    with pytest.raises(ValueError, match="cluster_sync"):
        catalog.get("softmax.fwd").resolve({"cluster_sync": "fence"})


def test_the_defaults_that_sync_by_mbarrier():
    """The production plans sync by mbarrier where the H200 sweep chose it (the staged norm forwards
    at 32k-128k and the softmax forward's hold plans, 16-bit rows), and keep the cluster barrier everywhere else, fp32 rows included."""
    import torch

    from cute_kernels.rowwise import launch as R

    mb = {("rmsnorm.fwd", 65536), ("layernorm.fwd", 65536), ("layernorm.fwd", 131072),
          ("softmax.fwd", 65536), ("softmax.fwd", 131072),  # softmax: the hold plans (session 6)
          ("rmsnorm.bwd", 65536),  # session 15: register accumulators, clusters of 8 on mbarriers (session 11: staged)
          ("layernorm.bwd", 65536),  # session 12: the same plan with register dweight/dbias
          ("rmsnorm.fwd", 131072)}  # session 14: 16-CTA clusters (and at 256k, which this test does not walk)
    for name in ("rmsnorm.fwd", "layernorm.fwd", "softmax.fwd", "rmsnorm.bwd", "layernorm.bwd", "softmax.bwd"):
        for n in (4096, 65536, 131072):
            for dtype in (torch.bfloat16, torch.float32):
                try:
                    p = R.plan_for(name, dtype, n, True)
                except ValueError:
                    continue
                want = "mbarrier" if (name, n) in mb and dtype == torch.bfloat16 else "barrier"
                assert p.cluster_sync == want, (name, n, dtype, p)
                assert p.cluster_sync == "barrier" or (p.cluster_n > 1 and (p.staging == "smem" or p.acc_regs))
