"""GPU: the norm and softmax forwards with `prefetch` on a held row (`HeldRowPlan.prefetch` + `hold`, session 15): each CTA
walks its row tiles on the capped grid (`resident_grid`), and once a tile's row is read out of its staging buffer
the next tile's copies go into that buffer. Only where the loads are issued changes, not the math: bitwise the
same plan without prefetch, through the public ops (`cute_kernels.rowwise.launch.plan_for` patched). Rows from
the production plans' staged lengths (16k-256k), enough of them that every CTA walks several tiles, plus 0, 1 and
a row count that leaves the last tiles of some CTAs empty; a fused residual (its sum output) and LayerNorm's
statistics (the autograd path saves them) included."""

import dataclasses

import pytest
import torch

import cute_kernels as ck
from tests.helpers import poison_empty, randn, run_with_plans

pytestmark = pytest.mark.gpu

FWD = ("rmsnorm.fwd", "layernorm.fwd", "softmax.fwd", "log_softmax.fwd")


def _plans(prefetch: bool):
    from cute_kernels.rowwise import launch as R

    orig = R.plan_for

    def plan_for(name, dtype, n, aligned):
        p = orig(name, dtype, n, aligned)
        if name in FWD and _holdable(p, name):
            p = dataclasses.replace(p, hold=True, resident_grid=True, prefetch=prefetch)
        return p

    return plan_for


def _holdable(p, name) -> bool:
    """A staged plan whose row a thread's registers hold (`hold_elems(name)` bf16 elements)."""
    from schedules.row_tiling import hold_elems

    return p.staging == "smem" and p.tiling.unroll * 8 <= hold_elems(name)


def _production_holdable(name, n) -> bool:
    from cute_kernels.rowwise import plan_for_kernel

    return _holdable(plan_for_kernel(name, n, 8), name)


CASES = [(700, 16384), (300, 65536), (97, 131072), (70, 262144), (0, 65536), (1, 262144)]


@pytest.mark.parametrize("m,n", CASES, ids=[f"{m}x{n}" for m, n in CASES])
@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_prefetch_equals_held_bitwise(kind, m, n, monkeypatch):
    if not _production_holdable(f"{kind}norm.fwd", n):
        pytest.skip("the production plan's row is more than a thread's registers hold")
    poison_empty(monkeypatch)
    x, w, b = randn(m, n, seed=1), randn(n, seed=2), randn(n, seed=3)
    f = (lambda x: ck.rms_norm(x, w, 1e-6)) if kind == "rms" else (lambda x: ck.layer_norm(x, w, b, 1e-5))
    held, _ = run_with_plans(monkeypatch, _plans(False), lambda: f(x))
    got, plans = run_with_plans(monkeypatch, _plans(True), lambda: f(x))
    name = f"{kind}norm.fwd"
    if m:
        assert plans[name].prefetch and plans[name].hold, plans
        assert not torch.isnan(got).any()
    assert torch.equal(held.view(torch.uint16), got.view(torch.uint16))
    if m:
        xf = x.double()
        ref = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double() if kind == "rms"
               else torch.nn.functional.layer_norm(xf, (n,), w.double(), b.double(), 1e-5))
        assert (got.double() - ref).abs().max().item() <= 2e-2 * ref.abs().max().item()


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_prefetch_with_residual_and_grad(kind, monkeypatch):
    """The residual's row fetched beside x into its own buffer, the sum output, and the training path (LayerNorm's
    mean and rstd saved per row by the forward, then the backward from them)."""
    poison_empty(monkeypatch)
    m, n = 150, 65536
    x, r, w, b = randn(m, n, seed=4), randn(m, n, seed=5), randn(n, seed=6), randn(n, seed=7)

    def f():
        xg = x.detach().requires_grad_()
        y, s = (ck.rms_norm(xg, w, 1e-6, residual=r) if kind == "rms" else ck.layer_norm(xg, w, b, 1e-5, residual=r))
        (g,) = torch.autograd.grad(y.float().square().sum(), xg)
        return y, s, g

    a, _ = run_with_plans(monkeypatch, _plans(False), f)
    got, plans = run_with_plans(monkeypatch, _plans(True), f)
    assert plans[f"{kind}norm.fwd"].prefetch
    for u, v in zip(a, got):
        assert torch.equal(u.view(torch.uint16), v.view(torch.uint16))


@pytest.mark.parametrize("m,n", CASES, ids=[f"{m}x{n}" for m, n in CASES])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_prefetch_equals_held_bitwise(op, m, n, monkeypatch):
    if not _production_holdable(f"{op}.fwd", n):  # (16k: one staged row of 128 elements a thread)
        pytest.skip("the production plan's row is more than a thread's registers hold")
    poison_empty(monkeypatch)
    f = getattr(ck, op)
    x = randn(m, n, seed=8) * 4
    held, _ = run_with_plans(monkeypatch, _plans(False), lambda: f(x))
    got, plans = run_with_plans(monkeypatch, _plans(True), lambda: f(x))
    if m:
        assert plans[f"{op}.fwd"].prefetch and plans[f"{op}.fwd"].hold, plans
        assert not torch.isnan(got).any()
        ref = getattr(torch, op)(x.double(), -1)
        assert (got.double() - ref).abs().max().item() <= 2e-2 * ref.abs().max().item() + 1e-2
    assert torch.equal(held.view(torch.uint16), got.view(torch.uint16))
