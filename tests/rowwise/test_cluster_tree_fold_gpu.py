"""GPU: the cluster's partials folded by a butterfly (`HeldRowPlan.cluster_fold="tree"`, session 18) in every
row-wise kernel, forward and backward through the public ops (autograd), against the production plans with the
rank-order fold and against fp32 references.

Not bitwise the serial fold: the partials are combined in another (fixed) order. So each output is checked against
the reference at the suites' tolerance and is required to stay within a few ulps' worth of the serial plan's
(relative 2e-2 of the row's scale, the bf16 bound), and a second run must repeat the first bit for bit
(deterministic). The production plans of 32k-256k are used as they are (clusters of 2-16, register and staged, held
and refilled, mbarrier-synced), only `cluster_fold` changed; 0 and 1 rows; rows with a stride.

    python3 -m pytest -q -m gpu tests/rowwise/test_cluster_tree_fold_gpu.py
"""

import dataclasses

import pytest
import torch

from tests.helpers import poison_empty, run_with_plans
from tests.rowwise.test_bwd_prefetch_gpu import _check_ref, _inputs, _reference
from tests.rowwise.test_cluster_mbarrier_sync_gpu import _fwd_and_grads

pytestmark = pytest.mark.gpu


def _plan_for(fold):
    from cute_kernels.rowwise import launch as R

    orig = R.plan_for

    def plan_for(name, dtype, n, aligned):
        p = orig(name, dtype, n, aligned)
        if fold == "tree" and p.cluster_n > 1 and p.tiling.threads_per_row >= p.cluster_n:
            p = dataclasses.replace(p, cluster_fold="tree")
        return p

    return plan_for


OPS = ["rms_norm", "rms_norm_res", "layer_norm", "softmax", "log_softmax"]
CASES = [(257, 32768), (133, 65536), (37, 131072), (19, 262144), (0, 65536), (1, 262144)]


@pytest.mark.parametrize("m,n", CASES, ids=[f"{m}x{n}" for m, n in CASES])
@pytest.mark.parametrize("op", OPS)
def test_tree_fold_matches_serial_and_reference(op, m, n, monkeypatch):
    poison_empty(monkeypatch)
    x, dy, w, b, r, ds = _inputs(m, n, strided=(m % 2 == 1))
    args = (op, x, dy, w, b, r, ds)
    serial, _ = run_with_plans(monkeypatch, _plan_for("serial"), lambda: _fwd_and_grads(*args))
    tree, plans = run_with_plans(monkeypatch, _plan_for("tree"), lambda: _fwd_and_grads(*args))
    again, _ = run_with_plans(monkeypatch, _plan_for("tree"), lambda: _fwd_and_grads(*args))
    if m:
        assert any(p.cluster_fold == "tree" for p in plans.values()), plans
    assert len(serial) == len(tree) == len(again) > 0
    for i, (a, c, d) in enumerate(zip(serial, tree, again)):
        assert a.shape == c.shape and a.dtype == c.dtype
        assert torch.equal(c, d), f"{op} output {i}: the tree fold is not deterministic"
        _check_ref(c, a, f"{op} output {i} (tree vs serial fold)")
    nf = len(tree) - len(_reference(*args))
    for i, (o, ref) in enumerate(zip(tree[nf:], _reference(*args))):
        _check_ref(o, ref, f"{op} grad {i} (tree fold)")
