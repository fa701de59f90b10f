"""GPU: shared-memory staged rows (`staging="smem"`) against the register path of the same plan shape
and against fp32 references.

Bitwise: staging changes where a thread's vectors live, not the fp32 math (same operations in the
same order, the same reduction tree for the same plan shape), so every output of a staged plan must
equal, bit for bit, that of the register plan with the same threads / threads per row / vectors per
thread / cluster. Both run through the public ops with `cute_kernels.rowwise.launch.plan_for`
patched. Rows: N in {16384, 65536, 131072} (clusters of 2-8), 1024 and 2048 (several staged rows per
CTA), 4099 and 769 (odd: scalar rows,
which stay in registers: the staged request falls back), 0 and 1 rows, and rows with a stride.
"""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import cute_kernels as ck
from tests.helpers import poison_empty, randn, run_with_plans

pytestmark = pytest.mark.gpu

# Staged plan shapes: 32 elements per thread, 128-512 threads, clusters as the row needs.
SETTINGS = dict(target_elems=32, max_elems=32, min_threads=128, max_tpr=256)


def _plan(staging):
    from schedules.row_tiling import plan_held_rows

    def plan_for(name, dtype, n, aligned):
        vec = 16 // dtype.itemsize if aligned else 1
        return plan_held_rows(n, vec, **SETTINGS, staging=staging)

    return plan_for


def _run(monkeypatch, staging, fn):
    return run_with_plans(monkeypatch, _plan(staging), fn)[0]


def _flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out for t in _flat(o)] if isinstance(out, (tuple, list)) else []


def _ops(n):
    w = randn(n, dtype=torch.bfloat16, seed=2)
    b = randn(n, dtype=torch.bfloat16, seed=3)

    def with_grad(f):
        def run(x, dy):
            xg = x.detach().requires_grad_()
            y = f(xg)
            y0 = y[0] if isinstance(y, tuple) else y
            return (y, torch.autograd.grad(y0, xg, dy)[0])
        return run

    return {
        "rms_norm": with_grad(lambda x: ck.rms_norm(x, w, 1e-6)),
        "rms_norm_res": lambda x, dy: ck.rms_norm(x, w, 1e-6, residual=dy),
        "layer_norm": with_grad(lambda x: ck.layer_norm(x, w, b, 1e-5)),
        "softmax": with_grad(ck.softmax),
        "log_softmax": with_grad(ck.log_softmax),
    }, w, b


def _ref(op, x, w, b, dy):
    xf = x.float()
    n = x.shape[-1]
    if op == "rms_norm_res":  # the op normalizes x + residual (dy here), rounded to x's dtype
        xf = (xf + dy.float()).to(x.dtype).float()
    if op.startswith("rms_norm"):
        return F.rms_norm(xf, (n,), w.float(), 1e-6)
    if op == "layer_norm":
        return F.layer_norm(xf, (n,), w.float(), b.float(), 1e-5)
    return (torch.softmax if op == "softmax" else torch.log_softmax)(xf, -1)


# 1024 / 2048: four / two staged rows per CTA (t128 r32 u4, t128 r64 u4: `perf.tune_rows.small_staged_candidates`)
CASES = [(64, 16384), (32, 65536), (8, 131072), (33, 4099), (65, 769), (0, 65536), (1, 65536), (1, 769),
         (129, 1024), (33, 2048)]


@pytest.mark.parametrize("m,n", CASES, ids=[f"{m}x{n}" for m, n in CASES])
@pytest.mark.parametrize("strided", [False, True], ids=["contig", "strided"])
@pytest.mark.parametrize("op", ["rms_norm", "rms_norm_res", "layer_norm", "softmax", "log_softmax"])
def test_staged_equals_registers_bitwise(op, m, n, strided, monkeypatch):
    if op == "layer_norm" and n > 65536:
        pytest.skip("layer_norm backward holds rows up to 65536")
    poison_empty(monkeypatch)
    ops, w, b = _ops(n)
    pad = 64 if strided else 0
    x = randn(m, n + pad, dtype=torch.bfloat16, seed=1)[:, :n]
    dy = randn(m, n + pad, dtype=torch.bfloat16, seed=4)[:, :n]
    regs = _flat(_run(monkeypatch, "regs", lambda: ops[op](x, dy)))
    smem = _flat(_run(monkeypatch, "smem", lambda: ops[op](x, dy)))
    assert len(regs) == len(smem) > 0
    for i, (a, c) in enumerate(zip(regs, smem)):
        assert a.shape == c.shape and a.dtype == c.dtype
        assert torch.equal(a.view(torch.uint8) if a.dtype.is_floating_point else a,
                           c.view(torch.uint8) if c.dtype.is_floating_point else c), f"output {i} differs"
    if m:
        y = smem[0].float()
        ref = _ref(op, x, w, b, dy)
        tol = 2e-2 * ref.abs().max().item() + 1e-2
        assert (y - ref).abs().max().item() <= tol


def test_staged_plan_is_used(monkeypatch):
    """The staged request reaches the kernel: the compiled variant's key says staging=smem."""
    x = randn(4, 65536, dtype=torch.bfloat16, seed=1)
    _, by_name = run_with_plans(monkeypatch, _plan("smem"), lambda: ck.softmax(x))
    plans = list(by_name.values())
    assert plans and all(p.staging == "smem" for p in plans)
    assert dataclasses.replace(plans[0], staging="regs") != plans[0]
