"""GPU: the forwards built for one CTA per row tile (`HeldRowPlan.one_tile`, session 20, written on the desk) give the
looping kernels' bits: each default plan off the capped grid with and without it, and RMSNorm / LayerNorm / softmax at
512 threads x 16 elements capped at 4 CTAs an SM (the plan the loop's registers kept from fitting) against the same
tiling uncapped. NaN-poisoned outputs; 0 and 1 rows; unaligned rows.

    python3 -m pytest -q -m gpu tests/rowwise/test_one_tile_gpu.py
"""

import dataclasses

import pytest
import torch

import cute_kernels as ck
from schedules.row_tiling import HeldRowPlan, RowTiling
from tests.helpers import poison_empty, randn, run_with_plans

pytestmark = pytest.mark.gpu

BF16 = torch.bfloat16
OPS = {
    "rmsnorm.fwd": lambda x, w, b: ck.rms_norm(x, w, 1e-6),
    "layernorm.fwd": lambda x, w, b: ck.layer_norm(x, w, b, 1e-5),
    "softmax.fwd": lambda x, w, b: ck.softmax(x),
    "log_softmax.fwd": lambda x, w, b: ck.log_softmax(x),
}
SHAPES = [(0, 8192), (1, 8192), (3000, 8192), (777, 6144), (1029, 1024), (300, 16384), (5, 769)]


def _inputs(m, n):
    return randn(m, n, dtype=BF16), randn(n, dtype=BF16), randn(n, dtype=BF16)


def _plans(name, one_tile, tiling=None, cap=None):
    from cute_kernels.rowwise import launch as R

    orig = R.plan_for

    def plan_for(kernel, dtype, n, aligned):
        p = orig(kernel, dtype, n, aligned)
        if kernel != name:
            return p
        p = dataclasses.replace(p, resident_grid=False, prefetch=False)  # the uncapped grid: one tile a CTA
        if tiling is not None:
            p = HeldRowPlan(tiling, 1, cap or 1, reg_cap=cap is not None)
        return dataclasses.replace(p, one_tile=one_tile)

    return plan_for


@pytest.mark.parametrize("m,n", SHAPES, ids=[f"{m}x{n}" for m, n in SHAPES])
@pytest.mark.parametrize("name", list(OPS))
def test_one_tile_bitwise(name, m, n, monkeypatch):
    poison_empty(monkeypatch)
    x, w, b = _inputs(m, n)
    loop, _ = run_with_plans(monkeypatch, _plans(name, False), lambda: OPS[name](x, w, b))
    one, plans = run_with_plans(monkeypatch, _plans(name, True), lambda: OPS[name](x, w, b))
    if m:
        assert plans[name].one_tile, plans
    assert torch.isfinite(one).all() and torch.equal(one, loop)


@pytest.mark.parametrize("m,n", [(3000, 8192), (1, 8192), (0, 8192)], ids=["3000x8192", "1x8192", "0x8192"])
@pytest.mark.parametrize("name", ["rmsnorm.fwd", "layernorm.fwd", "softmax.fwd"])
def test_512_threads_capped_at_4(name, m, n, monkeypatch):
    poison_empty(monkeypatch)
    x, w, b = _inputs(m, n)
    t = RowTiling(512, 512, 2)
    loop, _ = run_with_plans(monkeypatch, _plans(name, False, t), lambda: OPS[name](x, w, b))
    one, plans = run_with_plans(monkeypatch, _plans(name, True, t, 4), lambda: OPS[name](x, w, b))
    if m:
        assert str(plans[name]) == "t512r512u2 c1 rc4 1t", plans
    assert torch.isfinite(one).all() and torch.equal(one, loop)
