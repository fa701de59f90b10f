"""GPU: session 19's plans for rows of 4k-8k elements (`schedules.row_tiling`: `_FWD_8K`, `_RMS_FWD` at 8k,
`_RMS_BWD_8K`, `_LN_FWD_8K`; session 20's `_LN_FWD_8K_STAGED` and RMSNorm capped at 3 CTAs an SM, `_LSM_FWD_8K`,
and vectors per thread that are not a power of two; session 21's one-tile norm forwards at 4097-16384) and the norm
forwards' weight and bias held in registers on a register plan's capped grid (`params_in_regs`), through the public
ops against the fp64 references at issue 3's tolerance (the sweep helpers of tests/rowwise/test_rowwise_gpu.py), with
poisoned outputs. Enough rows that each CTA of the capped grid walks
several row tiles (the held weights reused), 0 and 1 rows, N = 6144 (a short row in the same bucket), fp16.

    python3 -m pytest -q -m gpu tests/rowwise/test_plans_4k_8k_gpu.py
"""

import pytest
import torch

from tests.helpers import poison_empty
from tests.rowwise.test_rowwise_gpu import (
    _check_cross_entropy,
    _check_ln_forward,
    _check_norm_backward,
    _check_rms_forward,
    _check_softmax_backward,
    _check_softmax_forward,
)

pytestmark = pytest.mark.gpu

BF16, FP16 = torch.bfloat16, torch.float16
CASES = [(BF16, 2000, 8192), (BF16, 1, 8192), (BF16, 0, 8192), (BF16, 777, 6144), (FP16, 600, 8192),
         (BF16, 1500, 4096),
         # session 20: vectors per thread that are not a power of two (`plan_held_rows`: 2112 -> 3 of 128 threads,
         # 5120 -> 5 staged / 3, 6144 -> 6 / 3, 7168 -> 7, 12288 -> 3 in clusters of 4 / 12 staged)
         (BF16, 257, 2112), (BF16, 300, 5120), (FP16, 300, 6144), (BF16, 300, 7168), (BF16, 300, 12288),
         # session 21: the norm forwards built for one CTA a row tile (4097-16384), the last tile part-full
         (BF16, 301, 7000), (BF16, 300, 10240), (BF16, 1201, 16384)]
IDS = [f"{str(d)[6:]}-{m}x{n}" for d, m, n in CASES]


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    poison_empty(monkeypatch)


@pytest.mark.parametrize("dtype,m,n", CASES, ids=IDS)
def test_softmax_forward(dtype, m, n):
    _check_softmax_forward(False, dtype, m, n)
    _check_softmax_forward(True, dtype, m, n)


@pytest.mark.parametrize("dtype,m,n", CASES, ids=IDS)
def test_softmax_backward(dtype, m, n):
    _check_softmax_backward(False, dtype, m, n)


@pytest.mark.parametrize("dtype,m,n", CASES, ids=IDS)
def test_cross_entropy(dtype, m, n):
    """The streaming forward's partial pass loads its vectors together since session 20 (`strided_fold`)."""
    _check_cross_entropy(dtype, m, n)


@pytest.mark.parametrize("dtype,m,n", CASES, ids=IDS)
def test_rms_forward(dtype, m, n):
    _check_rms_forward(dtype, m, n, no_weight=False)
    _check_rms_forward(dtype, m, n, no_weight=True)


@pytest.mark.parametrize("dtype,m,n", CASES, ids=IDS)
def test_layer_norm_forward(dtype, m, n):
    """LayerNorm 4k-8k: staged, held and refilled on the capped grid (session 20; the register plan with its weight and
    bias held in registers for fp32 rows)."""
    _check_ln_forward(dtype, m, n, no_affine=False)
    _check_ln_forward(dtype, m, n, no_affine=True)


@pytest.mark.parametrize("dtype,m,n", CASES, ids=IDS)
@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_norm_backward(kind, dtype, m, n):
    _check_norm_backward(kind, dtype, m, n)


def test_layer_norm_params_in_regs_bitwise_per_tile_loads(monkeypatch):
    """The held weights change where they are loaded; with them in registers the compiler contracts y * w + b into
    one FMA (PTX: 32 more fma.rn.f32 and 32 fewer mul / add pairs at this plan), one rounding where the per-tile plan
    has two, so the outputs agree to a bf16 ulp, not bitwise (session 19's H200 run)."""
    import dataclasses

    import cute_kernels as ck
    from cute_kernels.rowwise import launch as R
    from tests.helpers import randn, run_with_plans

    x, w, b = randn(3000, 8192, dtype=BF16), randn(8192, dtype=BF16), randn(8192, dtype=BF16)
    orig = R.plan_for

    def register_plan(name, dtype, n, aligned):  # (the 8k default is a one-tile plan since session 21)
        return R.plan_for_kernel(name, n, 8, staged=False) if name == "layernorm.fwd" else orig(name, dtype, n, aligned)

    def per_tile(name, dtype, n, aligned):  # the same tiling on the uncapped grid: one tile a CTA, loads in it
        return dataclasses.replace(register_plan(name, dtype, n, aligned), resident_grid=False)

    held, plans = run_with_plans(monkeypatch, register_plan, lambda: ck.layer_norm(x, w, b))
    assert plans["layernorm.fwd"].resident_grid
    plain, plans = run_with_plans(monkeypatch, per_tile, lambda: ck.layer_norm(x, w, b))
    assert not plans["layernorm.fwd"].resident_grid
    torch.testing.assert_close(held, plain, rtol=2 ** -7, atol=1e-2)


@pytest.mark.parametrize("n", [6144, 8192, 12288, 16384])
@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_fused_residual_8k(kind, n):
    """Beside a residual: bf16 weight and bias, many rows. Session 21: the one-tile plans without their register caps
    there (`ops._rowwise.without_reg_cap`; under them RMSNorm 12288 spilled 104 B)."""
    import torch.nn.functional as F

    import cute_kernels as ck
    from tests.helpers import randn
    from tests.rowwise.test_rowwise_gpu import _ln_ref, _rms_ref, check

    m = 2000
    x, r, w, b = randn(m, n, dtype=BF16), randn(m, n, dtype=BF16), randn(n, dtype=BF16), randn(n, dtype=BF16)
    if kind == "rms":
        y, s = ck.rms_norm(x, w, 1e-6, residual=r)
    else:
        y, s = ck.layer_norm(x, w, b, 1e-5, residual=r)
    s_torch = x + r
    assert torch.equal(s, s_torch)
    ref = _rms_ref(s_torch, w, 1e-6) if kind == "rms" else _ln_ref(s_torch, w, b, 1e-5)
    tout = (F.rms_norm(s_torch.float(), (n,), w.float(), 1e-6) if kind == "rms" else
            F.layer_norm(s_torch.float(), (n,), w.float(), b.float(), 1e-5)).to(BF16)
    check(y, ref, tout, f"{kind} + residual {n}")


@pytest.mark.parametrize("name,cap", [("layernorm.fwd", 3), ("rmsnorm.fwd", 4)])
def test_register_cap_bitwise(name, cap, monkeypatch):
    """`HeldRowPlan.reg_cap` (session 19, built on the desk): the 8k plans with ptxas capped at `cap` CTAs an SM
    (LayerNorm on the capped grid, so its grid follows) give the uncapped kernels' bits; LayerNorm's uncapped
    reference loads its weights per tile (the cap drops `params_in_regs`: the held weights spilled under it)."""
    import dataclasses

    import cute_kernels as ck
    from cute_kernels.rowwise import launch as R
    from tests.helpers import randn, run_with_plans

    x, w, b = randn(3000, 8192, dtype=BF16), randn(8192, dtype=BF16), randn(8192, dtype=BF16)
    fn = (lambda: ck.layer_norm(x, w, b)) if name == "layernorm.fwd" else (lambda: ck.rms_norm(x, w, 1e-6))
    orig = R.plan_for

    def register_plan(kernel, dtype, n, aligned):  # (LayerNorm 8k's default is staged since session 20)
        return R.plan_for_kernel(kernel, n, 8, staged=False) if kernel == name else orig(kernel, dtype, n, aligned)

    def capped(kernel, dtype, n, aligned):
        p = register_plan(kernel, dtype, n, aligned)
        return dataclasses.replace(p, reg_cap=True, ctas_per_sm=cap) if kernel == name else p

    def per_tile(kernel, dtype, n, aligned):  # the uncapped plan, without the held weights (the capped one's math)
        p = register_plan(kernel, dtype, n, aligned)
        return dataclasses.replace(p, resident_grid=False, reg_cap=False) if kernel == name else p

    out, plans = run_with_plans(monkeypatch, capped, fn)
    assert plans[name].reg_cap and plans[name].ctas_per_sm == cap
    ref, _ = run_with_plans(monkeypatch, per_tile, fn)
    assert torch.equal(out, ref)
