"""GPU: clustered row-wise kernels synced by mbarrier (`HeldRowPlan.cluster_sync="mbarrier"`: partial
results sent with `st.async`, completing a transaction count on the receiver's mbarrier) against the
same plans synced by the cluster barrier, bit for bit, forward and backward, and against fp32
references.

Bitwise: the sync changes how a CTA learns that its peers' partials have landed, not which values
are folded nor their order (`collectives.reduce.cluster_reduce`), so every output must equal the
barrier plan's. Every op's forward and backward run through the public ops (autograd) with
`cute_kernels.rowwise.launch.plan_for` patched for every kernel: plans with clusters of 2-8 CTAs
(rows of 4k-128k held by 128-512 threads x 16-64 elements), register and shared-memory staged,
backward with and without prefetch; one CTA per SM, so a CTA walks several row tiles and both
mbarriers of a call site go through several phases; 0 and 1 rows; rows with a stride.

    python3 -m pytest -q -m gpu tests/rowwise/test_cluster_mbarrier_sync_gpu.py
"""

import dataclasses

import pytest

from schedules.row_tiling import plan_held_rows
from tests.helpers import poison_empty, run_with_plans
from tests.rowwise.test_bwd_prefetch_gpu import _bitwise, _check_ref, _grads, _inputs, _reference

pytestmark = pytest.mark.gpu


def _settings(staging, n):
    """Small threads-per-row caps force clusters at every width: 16 elements per thread over 128
    threads puts a 4k row on 2 CTAs and a 16k row on 8; past 16k the planner widens rows to 512
    threads (64k: t512 u2 c8), and 128k rows take 32 elements per thread (t512 u4 c8)."""
    return dict(target_elems=16, max_elems=16 if n <= 65536 else 32, min_threads=128 if staging == "regs" else 256,
                max_tpr=128, staging=staging)


def _plan_for(staging, sync, prefetch, ctas_per_sm):
    def plan_for(name, dtype, n, aligned):
        vec = 16 // dtype.itemsize if aligned else 1
        if name.startswith("cross_entropy"):
            return plan_held_rows(n, vec)
        st = _settings(staging, n)
        if name.endswith(".bwd") and staging == "smem":
            st.update(staged_rows=2, staged_regs=128)
        p = plan_held_rows(n, vec, **st)
        return dataclasses.replace(p, cluster_sync=sync, ctas_per_sm=ctas_per_sm,
                                   prefetch=prefetch and name.endswith(".bwd"))

    return plan_for


def _run(monkeypatch, staging, sync, fn, prefetch=False, ctas_per_sm=1):
    return run_with_plans(monkeypatch, _plan_for(staging, sync, prefetch, ctas_per_sm), fn)


def _fwd_and_grads(op, x, dy, w, b, r, ds):
    """The forward outputs and the gradients (each op's forward runs inside `_grads` too, but its
    outputs are not returned there)."""
    import cute_kernels as ck

    fwd = {"rms_norm": lambda: [ck.rms_norm(x, w, 1e-6)], "rms_norm_res": lambda: list(ck.rms_norm(x, w, 1e-6, residual=r)),
           "layer_norm": lambda: [ck.layer_norm(x, w, b, 1e-5)], "softmax": lambda: [ck.softmax(x)],
           "log_softmax": lambda: [ck.log_softmax(x)]}[op]()
    return fwd + _grads(op, x, dy, w, b, r, ds)


OPS = ["rms_norm", "rms_norm_res", "layer_norm", "softmax", "log_softmax"]
CASES = [(531, 4096), (267, 16384), (133, 65536), (37, 131072), (0, 65536), (1, 65536)]


@pytest.mark.parametrize("m,n", CASES, ids=[f"{m}x{n}" for m, n in CASES])
@pytest.mark.parametrize("staging", ["regs", "smem"])
@pytest.mark.parametrize("op", OPS)
def test_mbarrier_equals_barrier_bitwise(op, staging, m, n, monkeypatch):
    if op == "layer_norm" and n > 65536:
        pytest.skip("layer_norm backward holds rows up to 65536")
    poison_empty(monkeypatch)
    x, dy, w, b, r, ds = _inputs(m, n, strided=(m % 2 == 1))
    args = (op, x, dy, w, b, r, ds)
    bar, _ = _run(monkeypatch, staging, "barrier", lambda: _fwd_and_grads(*args))
    mb, plans = _run(monkeypatch, staging, "mbarrier", lambda: _fwd_and_grads(*args))
    if m:
        clustered = [p for p in plans.values() if p.cluster_n > 1]
        assert clustered and all(p.cluster_sync == "mbarrier" for p in plans.values()), plans
    assert len(bar) == len(mb) > 0
    for i, (a, c) in enumerate(zip(bar, mb)):
        _bitwise(a, c, f"{op} {staging} output {i} (mbarrier vs barrier)")
    nf = len(mb) - len(_reference(*args))
    for i, (o, ref) in enumerate(zip(mb[nf:], _reference(*args))):
        _check_ref(o, ref, f"{op} {staging} grad {i}")


@pytest.mark.parametrize("staging", ["regs", "smem"])
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm", "softmax"])
def test_mbarrier_with_prefetch_and_more_ctas(op, staging, monkeypatch):
    """Backward with prefetch, and 1-8 CTAs per SM (fewer tiles per CTA): same bits as the barrier."""
    poison_empty(monkeypatch)
    x, dy, w, b, r, ds = _inputs(411, 65536, False)
    args = (op, x, dy, w, b, r, ds)
    for prefetch, cps in ((True, 1), (False, 8)):
        bar, _ = _run(monkeypatch, staging, "barrier", lambda: _fwd_and_grads(*args), prefetch, cps)
        mb, _ = _run(monkeypatch, staging, "mbarrier", lambda: _fwd_and_grads(*args), prefetch, cps)
        for i, (a, c) in enumerate(zip(bar, mb)):
            _bitwise(a, c, f"{op} {staging} prefetch={prefetch} ctas/SM={cps} output {i}")
