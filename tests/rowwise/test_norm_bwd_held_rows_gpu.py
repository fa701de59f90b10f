"""GPU: the norm backwards holding x and dy (`HeldRowPlan.hold` on `NormBwd`, session 16). Once a tile's rows land
they are read out of their staging buffers into registers (16-bit), and the output pass widens them again instead
of re-reading shared memory. With `prefetch` the one buffer per tensor is then refilled with the next tile (where
the double buffer does not fit beside the shared dweight/dbias slots: LayerNorm 256k).

The math is the same, so dx, dweight and dbias are bitwise those of the same staged plan without `hold`. The ops'
plan choice is patched (`cute_kernels.rowwise.launch.plan_for`). Rows are past the resident clusters, so every CTA
walks several tiles; 0 and 1 rows are included, and so is a residual's gradient."""

import dataclasses

import pytest
import torch

import cute_kernels as ck
from tests.helpers import poison_empty, randn, run_with_plans

pytestmark = pytest.mark.gpu

BWD = ("rmsnorm.bwd", "layernorm.bwd")


def _plans(**change):
    from cute_kernels.rowwise import launch as R

    orig = R.plan_for

    def plan_for(name, dtype, n, aligned):
        p = orig(name, dtype, n, aligned)
        if name in BWD:
            if p.staging != "smem":  # (LayerNorm 128k holds its rows in registers: the staged plan of 256k's shape)
                from schedules.row_tiling import HeldRowPlan, RowTiling

                p = HeldRowPlan(RowTiling(512, 512, 4), n // 16384, 1, "smem", resident_grid=True)
            p = dataclasses.replace(p, **{"acc_regs": False, "prefetch": False, "hold": False, **change})
        return p

    return plan_for


CASES = [("layer", 70, 262144), ("rms", 70, 262144), ("layer", 90, 131072), ("layer", 0, 262144),
         ("layer", 1, 262144)]


@pytest.mark.parametrize("kind,m,n", CASES, ids=[f"{k}-{m}x{n}" for k, m, n in CASES])
@pytest.mark.parametrize("mode", ["hold", "refill"])
def test_held_backward_equals_staged_bitwise(kind, m, n, mode, monkeypatch):
    poison_empty(monkeypatch)
    x, w, b, dy = randn(m, n, seed=1), randn(n, seed=2), randn(n, seed=3), randn(m, n, seed=4)

    def grads():
        xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()
        bg = b.detach().requires_grad_() if kind == "layer" else None
        y = ck.rms_norm(xg, wg, 1e-6) if kind == "rms" else ck.layer_norm(xg, wg, bg, 1e-5)
        ins = [xg, wg] + ([bg] if bg is not None else [])
        return torch.autograd.grad(y, ins, dy)

    base, _ = run_with_plans(monkeypatch, _plans(), grads)
    change = dict(hold=True, prefetch=mode == "refill")
    got, plans = run_with_plans(monkeypatch, _plans(**change), grads)
    name = f"{kind}norm.bwd"
    if m:
        assert plans[name].hold and plans[name].prefetch == (mode == "refill"), plans
    for u, v in zip(base, got):
        assert not torch.isnan(v).any()
        assert torch.equal(u.view(torch.uint16), v.view(torch.uint16))
    if m:  # and right: dx against the fp64 reference
        xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
        br = b.double().requires_grad_() if kind == "layer" else None
        yr = (xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-6) * wr if kind == "rms"
              else torch.nn.functional.layer_norm(xr, (n,), wr, br, 1e-5))
        (dxr,) = torch.autograd.grad(yr, [xr], dy.double())
        assert (got[0].double() - dxr).abs().max().item() <= 2e-2 * dxr.abs().max().item()


def test_held_backward_with_residual_gradient(monkeypatch):
    """dres (the gradient reaching the residual-sum output) added per tile beside the refilled rows."""
    poison_empty(monkeypatch)
    m, n = 40, 262144
    x, r, w, b = randn(m, n, seed=5), randn(m, n, seed=6), randn(n, seed=7), randn(n, seed=8)
    dy, ds = randn(m, n, seed=9), randn(m, n, seed=10)

    def grads():
        xg = x.detach().requires_grad_()
        y, s = ck.layer_norm(xg, w, b, 1e-5, residual=r)
        return torch.autograd.grad([y, s], [xg], [dy, ds])

    base, _ = run_with_plans(monkeypatch, _plans(), grads)
    got, plans = run_with_plans(monkeypatch, _plans(hold=True, prefetch=True), grads)
    assert plans["layernorm.bwd"].hold
    assert torch.equal(base[0].view(torch.uint16), got[0].view(torch.uint16))
