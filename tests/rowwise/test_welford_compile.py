"""CPU: the LayerNorm forward's one-reduction statistics (`HeldRowPlan.welford`: each thread's (count,
mean, M2) merged by Chan's formula, `collectives.reduce.welford_merge`) compile for every kind of plan
the forward uses (registers, staged, held, clusters on the barrier and on mbarriers, fp32 and scalar
rows), without local memory, and a clustered row then meets its peers once per tile instead of twice."""

import dataclasses

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from cute_kernels.rowwise import config_of, plan_for_kernel
from schedules.row_tiling import plan_for_rows

SPEC = catalog.get("layernorm.fwd")
# (N, vec, extra signature): the production plans of these lengths
CASES = [(1024, 8, {}), (4096, 8, {}), (16384, 8, {}), (65536, 8, {}), (131072, 8, {"residual": True}), (262144, 8, {}),
         (8192, 4, {"dtype": "fp32", "w_dtype": "fp32"}), (769, 1, {"aligned": False})]


def _compile(n, vec, extra, welford, tmp_path):
    plan = dataclasses.replace(plan_for_kernel("layernorm.fwd", n, vec), welford=welford)
    p = SPEC.resolve({**config_of(plan), **extra})
    report, files = compile_with_artifacts(SPEC, p, str(tmp_path))
    return plan, report, files["ptx"].read_text()


@pytest.mark.parametrize("n,vec,extra", CASES, ids=[f"{n}-v{v}" for n, v, _ in CASES])
def test_compiles_without_spills(n, vec, extra, tmp_path):
    plan, report, ptx = _compile(n, vec, extra, True, tmp_path / "wf")
    assert "wf" in str(plan).split() and config_of(plan)["welford"] is True
    assert not report.spills and report.ptx_census["ld/st.local"] == 0, report.format()
    if plan.cluster_n > 1:  # one exchange a tile: half the waits of the two-reduction kernel
        _, _, ptx2 = _compile(n, vec, extra, False, tmp_path / "two")
        key = "mbarrier.try_wait" if plan.cluster_sync == "mbarrier" else "barrier.cluster.wait"
        assert 2 * ptx.count(key) <= ptx2.count(key) + (1 if key == "barrier.cluster.wait" else 0), \
            (ptx.count(key), ptx2.count(key))


def test_only_the_layernorm_forward_has_it():
    assert "welford" in SPEC.params
    for name in ("rmsnorm.fwd", "layernorm.bwd", "softmax.fwd"):
        assert "welford" not in catalog.get(name).params
    assert not plan_for_rows("ln_fwd", 65536, 8).welford  # off in the production table until measured
