"""GPU: row-wise backward kernels that pipeline row tiles (`HeldRowPlan.prefetch`) against the same
plans without prefetch (bitwise) and against fp32 references.

Bitwise: prefetching changes when a tile's rows are loaded, not the fp32 math, nor the order in
which a CTA folds its tiles into the dweight/dbias accumulators, so dx, dweight, dbias (and the
residual gradient) must equal, bit for bit, those of the prefetch-off plan of the same shape. Both
run through the public ops (autograd) with `cute_kernels.rowwise.launch.plan_for` patched for the
backward kernels only (the forward keeps its own plan). The plans get one CTA per SM, so a CTA
walks several row tiles, and row counts are not multiples of rows-per-CTA x grid (ragged last
wave); staging in registers (a second register set, 16 elements per thread) and in shared memory
(two cp.async buffers); N from 769 (scalar rows: registers) to 65536 (clusters of 8); 0 and 1
rows; rows with a stride.

    python3 -m pytest -q -m gpu tests/rowwise/test_bwd_prefetch_gpu.py
"""

import dataclasses

import pytest
import torch

import cute_kernels as ck
from cute_kernels.rowwise import launch as R
from schedules.row_tiling import plan_held_rows
from tests.helpers import poison_empty, randn, run_with_plans

pytestmark = pytest.mark.gpu

BWD = ("rmsnorm.bwd", "layernorm.bwd", "softmax.bwd", "log_softmax.bwd")
# registers: 16 elements per thread (the second set fits); smem: 32 per thread, two buffers
SETTINGS = {"regs": dict(target_elems=16, max_elems=16, min_threads=256, max_tpr=256),
            "smem": dict(target_elems=32, max_elems=32, min_threads=128, max_tpr=256)}


def _plan_for(staging, prefetch, ctas_per_sm):
    orig = R.plan_for

    def plan_for(name, dtype, n, aligned):
        if name not in BWD:
            return orig(name, dtype, n, aligned)
        vec = 16 // dtype.itemsize if aligned else 1
        p = plan_held_rows(n, vec, **SETTINGS[staging], staging=staging)
        return dataclasses.replace(p, prefetch=prefetch, ctas_per_sm=ctas_per_sm)

    return plan_for


def _run(monkeypatch, staging, prefetch, fn, ctas_per_sm=1):
    return run_with_plans(monkeypatch, _plan_for(staging, prefetch, ctas_per_sm), fn)


def _grads(op, x, dy, w, b, r, ds):
    """Gradients of op's output(s) for cotangents dy (and ds, the residual sum's) wrt its inputs."""
    x, w, b, r = (t.detach().requires_grad_() for t in (x, w, b, r))  # detach keeps the row stride
    if op == "rms_norm":
        ins = [x, w]
        outs, cots = [ck.rms_norm(x, w, 1e-6)], [dy]
    elif op == "rms_norm_res":
        ins = [x, r, w]
        y, s = ck.rms_norm(x, w, 1e-6, residual=r)
        outs, cots = [y, s], [dy, ds]
    elif op == "layer_norm":
        ins = [x, w, b]
        outs, cots = [ck.layer_norm(x, w, b, 1e-5)], [dy]
    else:
        ins = [x]
        outs, cots = [(ck.softmax if op == "softmax" else ck.log_softmax)(x)], [dy]
    return list(torch.autograd.grad(outs, ins, cots))


def _reference(op, x, dy, w, b, r, ds, dtype=torch.float32):
    """torch autograd in `dtype` (fp32; fp64 where a test wants it) of the same math on the same
    (rounded) inputs."""
    n = x.shape[-1]
    xf, wf, bf, rf = (t.detach().to(dtype).requires_grad_() if t is not None else None for t in (x, w, b, r))
    dyf = dy.to(dtype)
    if op == "rms_norm":
        ins, outs, cots = [xf, wf], [torch.nn.functional.rms_norm(xf, (n,), wf, 1e-6)], [dyf]
    elif op == "rms_norm_res":
        s = (xf + rf).to(x.dtype).to(dtype)  # the op normalizes the sum rounded to x's dtype
        ins = [xf, rf, wf]
        outs, cots = [torch.nn.functional.rms_norm(s, (n,), wf, 1e-6), s], [dyf, ds.to(dtype)]
    elif op == "layer_norm":
        ins, outs, cots = [xf, wf, bf], [torch.nn.functional.layer_norm(xf, (n,), wf, bf, 1e-5)], [dyf]
    else:
        ins, outs, cots = [xf], [(torch.softmax if op == "softmax" else torch.log_softmax)(xf, -1)], [dyf]
    return list(torch.autograd.grad(outs, ins, cots, allow_unused=True))


def _inputs(m, n, strided, dtype=torch.bfloat16):
    pad = 64 if strided else 0

    def rows(seed):
        return randn(m, n + pad, dtype=dtype, seed=seed)[:, :n]

    x, dy, r, ds = rows(1), rows(4), rows(5), rows(6)
    w = randn(n, dtype=dtype, seed=2)
    b = randn(n, dtype=dtype, seed=3)
    return x, dy, w, b, r, ds


def _bitwise(a, c, what):
    assert a.shape == c.shape and a.dtype == c.dtype, what
    assert torch.equal(a.view(torch.uint8), c.view(torch.uint8)), f"{what} differs from prefetch off"


def _check_ref(out, ref, what):
    if out.numel() == 0:
        return
    out, ref = out.float(), ref.float()
    assert torch.isfinite(out).all(), f"{what}: non-finite (unwritten?)"
    tol = 2e-2 * ref.abs().max().item() + 1e-2
    err = (out - ref).abs().max().item()
    assert err <= tol, f"{what}: max err {err:.3e} > {tol:.3e}"


OPS = ["rms_norm", "rms_norm_res", "layer_norm", "softmax", "log_softmax"]
# (M, N): M not a multiple of rows-per-CTA x 132 CTAs (several tiles per CTA, ragged last wave)
CASES = [(1589, 1024), (531, 4096), (267, 16384), (133, 65536), (701, 769), (0, 4096), (1, 4096), (1, 65536)]


@pytest.mark.parametrize("m,n", CASES, ids=[f"{m}x{n}" for m, n in CASES])
@pytest.mark.parametrize("staging", ["regs", "smem"])
@pytest.mark.parametrize("strided", [False, True], ids=["contig", "strided"])
@pytest.mark.parametrize("op", OPS)
def test_prefetch_equals_no_prefetch_bitwise(op, staging, m, n, strided, monkeypatch):
    poison_empty(monkeypatch)
    x, dy, w, b, r, ds = _inputs(m, n, strided)
    args = (op, x, dy, w, b, r, ds)
    off, _ = _run(monkeypatch, staging, False, lambda: _grads(*args))
    on, plans = _run(monkeypatch, staging, True, lambda: _grads(*args))
    if m:
        used = [p for name, p in plans.items() if name in BWD]
        assert used and all(p.prefetch for p in used), plans
        if staging == "smem" and n % 8 == 0:
            assert all(p.staging == "smem" for p in used)
    names = {"rms_norm": ("dx", "dweight"), "rms_norm_res": ("dx", "dresidual", "dweight"),
             "layer_norm": ("dx", "dweight", "dbias")}.get(op, ("dx",))
    assert len(on) == len(off) == len(names)
    for a, c, what in zip(off, on, names):
        _bitwise(a, c, f"{op} {what}")
    for o, ref, what in zip(on, _reference(*args), names):
        _check_ref(o, ref, f"{op} {what}")


@pytest.mark.parametrize("ctas_per_sm", [2, 8])
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm", "softmax"])
def test_other_grid_caps(op, ctas_per_sm, monkeypatch):
    """More CTAs per SM: fewer tiles per CTA (down to one), same bits as prefetch off."""
    poison_empty(monkeypatch)
    x, dy, w, b, r, ds = _inputs(3001, 4096, False)
    args = (op, x, dy, w, b, r, ds)
    for staging in ("regs", "smem"):
        off, _ = _run(monkeypatch, staging, False, lambda: _grads(*args), ctas_per_sm)
        on, _ = _run(monkeypatch, staging, True, lambda: _grads(*args), ctas_per_sm)
        for i, (a, c) in enumerate(zip(off, on)):
            _bitwise(a, c, f"{op} {staging} output {i}")


def test_fp32_rows(monkeypatch):
    """fp32 rows (4-element vectors) through both stagings."""
    poison_empty(monkeypatch)
    x, dy, w, b, r, ds = _inputs(777, 4096, False, torch.float32)
    for op in ("rms_norm", "layer_norm", "softmax"):
        args = (op, x, dy, w, b, r, ds)
        for staging in ("regs", "smem"):
            off, _ = _run(monkeypatch, staging, False, lambda: _grads(*args))
            on, _ = _run(monkeypatch, staging, True, lambda: _grads(*args))
            for i, (a, c) in enumerate(zip(off, on)):
                _bitwise(a, c, f"{op} {staging} fp32 output {i}")
            for i, (o, ref) in enumerate(zip(on, _reference(*args))):
                _check_ref(o, ref, f"{op} {staging} fp32 output {i}")

