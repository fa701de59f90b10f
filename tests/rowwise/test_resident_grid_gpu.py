"""GPU: the norms' backward on a one-wave grid (`HeldRowPlan.resident_grid`: the persistent grid capped at
`ctas_per_sm` x the clusters co-resident, not `ctas_per_sm` x SMs clusters) against the same plans on
the SMs-capped grid and against float64 references.

dx: each row's math is the same whichever CTA walks it, so dx (and the residual gradient) must equal
the SMs-capped plan's bit for bit. dweight/dbias: a CTA folds other rows into its accumulators and the
op sums fewer partial rows, so only the summation order changes: both are checked against float64
autograd on the same (rounded) inputs. Every output of the op comes from a NaN-poisoned `torch.empty`.
Plans: the ops' own (HELD_TUNED) with the flag set on the backward kernels: clusters of 4 and 8
(16k-128k rows), and one CTA (4k, 769: the flag changes nothing); 0, 1 and 769 rows, row counts that
leave a ragged last pass, rows with a stride.

    python3 -m pytest -q -m gpu tests/rowwise/test_resident_grid_gpu.py
"""

import dataclasses

import pytest
import torch

import cute_kernels as ck
from cute_kernels.rowwise import launch as R
from tests.helpers import plans_with, poison_empty, run_with_plans
from tests.rowwise.test_bwd_prefetch_gpu import _bitwise, _grads, _inputs, _reference

pytestmark = pytest.mark.gpu


def _plan_for(resident: bool, direction: str = ".bwd"):
    # (a capped grid walks several tiles a CTA: not a plan built for one tile a CTA, `one_tile`)
    changes = dict(resident_grid=True, one_tile=False) if resident else dict(resident_grid=False)
    return plans_with(lambda name: name.endswith(direction), **changes)


def _close(out, ref, what):
    assert out.shape == ref.shape, what
    if out.numel() == 0:
        return
    assert torch.isfinite(out).all(), f"{what}: non-finite (unwritten?)"
    err = (out.double() - ref).abs().max().item()
    tol = 1e-2 * ref.abs().max().item() + 1e-3  # bf16 outputs: 2^-8 relative rounding
    assert err <= tol, f"{what}: max err {err:.3e} > {tol:.3e}"


OPS = ["rms_norm", "rms_norm_res", "layer_norm"]
# (M, N): clusters of 8 (16k RMSNorm, t128 x 4/SM; 64k LayerNorm), of 4 (64k RMSNorm), of 8 at 128k;
# one CTA at 4k and at 769 (scalar rows); 0 and 1 rows
CASES = [(2100, 16384), (1037, 65536), (769, 65536), (301, 131072), (769, 4096), (769, 769),
         (0, 65536), (1, 65536), (1, 16384)]


@pytest.mark.parametrize("m,n", CASES, ids=[f"{m}x{n}" for m, n in CASES])
@pytest.mark.parametrize("op", OPS)
def test_resident_grid(op, m, n, monkeypatch):
    if op == "layer_norm" and n > 65536:
        pytest.skip("layer_norm backward holds rows up to 65536")
    poison_empty(monkeypatch)
    x, dy, w, b, r, ds = _inputs(m, n, strided=(m % 2 == 1))
    args = (op, x, dy, w, b, r, ds)
    base, _ = run_with_plans(monkeypatch, _plan_for(False), lambda: _grads(*args))
    got, plans = run_with_plans(monkeypatch, _plan_for(True), lambda: _grads(*args))
    kernel = "rmsnorm.bwd" if op.startswith("rms") else "layernorm.bwd"
    if m:
        assert plans[kernel].resident_grid, plans
    ref = _reference(*args, dtype=torch.float64)
    names = {"rms_norm": ("dx", "dw"), "rms_norm_res": ("dx", "dres", "dw"), "layer_norm": ("dx", "dw", "db")}[op]
    for name, a, c, e in zip(names, got, base, ref):
        if name in ("dx", "dres"):
            _bitwise(a, c, f"{op} {name}")
        _close(a, e, f"{op} {m}x{n} {name} (resident grid)")
        _close(c, e, f"{op} {m}x{n} {name} (SMs grid)")


@pytest.mark.parametrize("n", [16384, 65536, 131072])
def test_grid_is_one_wave(n):
    """The resident grid launches ctas_per_sm x the co-resident clusters (<= SMs / cluster_n per
    CTA per SM), fewer than the SMs-capped grid when there is a cluster."""
    from schedules.hardware import max_active_clusters, num_sms

    dev = torch.device("cuda", torch.cuda.current_device())
    p = dataclasses.replace(R.plan_for("rmsnorm.bwd", torch.bfloat16, n, True), resident_grid=True)
    assert p.cluster_n > 1, p
    rows = 1 << 20
    cap, ctas = R.grid_ctas(rows, p, True, dev)
    clusters = max_active_clusters(p.cluster_n, dev.index)
    assert clusters <= num_sms(dev.index) // p.cluster_n
    assert cap == ctas == p.ctas_per_sm * clusters
    off, _ = R.grid_ctas(rows, dataclasses.replace(p, resident_grid=False), True, dev)
    assert off == p.ctas_per_sm * num_sms(dev.index) > cap


# --- the forwards on a capped grid (`resident_grid` on a forward plan: CTAs walk the row tiles) ---------
FWD_OPS = {
    "rms_norm": lambda x, w, b: ck.rms_norm(x, w, 1e-6),
    "layer_norm": lambda x, w, b: ck.layer_norm(x, w, b, 1e-5),
    "softmax": lambda x, w, b: ck.softmax(x),
    "log_softmax": lambda x, w, b: ck.log_softmax(x),
}
# 1k (LayerNorm: four staged rows a CTA, the weights staged once per CTA), 2k, 4k, 16k (staged, one row),
# 65536 (clusters); 0, 1 and odd row counts, rows with a stride
FWD_CASES = [(4099, 1024), (1037, 2048), (769, 4096), (301, 16384), (129, 65536), (0, 1024), (1, 1024),
             (3, 769)]


@pytest.mark.parametrize("m,n", FWD_CASES, ids=[f"{m}x{n}" for m, n in FWD_CASES])
@pytest.mark.parametrize("op", list(FWD_OPS))
def test_forward_capped_grid_bitwise(op, m, n, monkeypatch):
    """Every output of the forward on the capped grid equals the uncapped launch's bit for bit (each
    row's math is the same whichever CTA walks it), for outputs from NaN-poisoned allocations."""
    poison_empty(monkeypatch)
    g = torch.Generator(device="cuda").manual_seed(m * 7 + n)
    x = torch.randn(m, n + (8 if m % 2 else 0), device="cuda", generator=g).to(torch.bfloat16)[:, :n]
    w = torch.randn(n, device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn(n, device="cuda", generator=g).to(torch.bfloat16)
    f = FWD_OPS[op]
    base, _ = run_with_plans(monkeypatch, _plan_for(False, ".fwd"), lambda: f(x, w, b))
    got, plans = run_with_plans(monkeypatch, _plan_for(True, ".fwd"), lambda: f(x, w, b))
    if m:
        assert all(p.resident_grid for k, p in plans.items() if k.endswith(".fwd")), plans
    base = base if isinstance(base, tuple) else (base,)
    got = got if isinstance(got, tuple) else (got,)
    # LayerNorm's register plans on the capped grid hold the weight and bias in registers (`params_in_regs`, session
    # 19): the compiler then contracts y * w + b into one FMA, so y agrees with the per-tile loads to a bf16 ulp
    held = op == "layer_norm" and m and plans["layernorm.fwd"].staging == "regs"
    for i, (a, c) in enumerate(zip(got, base)):
        assert torch.isfinite(a).all(), f"{op} output {i}: unwritten (NaN) elements"
        if held and i == 0:
            torch.testing.assert_close(a, c, rtol=2 ** -7, atol=1e-2)
        else:
            _bitwise(a, c, f"{op} {m}x{n} output {i} (capped grid)")
