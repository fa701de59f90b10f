"""GPU: the softmax forward holding its staged row (`HeldRowPlan.hold`: cp.async lands the row in shared
memory, it is read once into registers, one exp per element) against the re-reading staged plan of
the same shape and against fp32 references.

Bitwise: holding changes where the row lives after it lands and that the exps are kept instead of
recomputed, not the math (the max of 16-bit values is exact in their own type, the exps take the same
inputs, the reductions the same tree), so softmax and log-softmax must equal, bit for bit, the staged
plan without `hold`. Both run through the public ops with `cute_kernels.rowwise.launch.plan_for`
patched (the hold plan for the forward kernels only). Rows: 16k-128k (clusters of 1-8), 4099 (scalar
rows: the plan falls back to registers), 0 and 1 rows, rows with a stride; bf16, fp16 and fp32
(16 fp32 vectors: 64 elements per thread); both cluster syncs.
"""

import pytest
import torch

import cute_kernels as ck
from tests.helpers import poison_empty, randn, run_with_plans

pytestmark = pytest.mark.gpu

# 64 elements per thread, 256-thread CTAs: 16k in one CTA, 64k in clusters of 4, 128k of 8.
SETTINGS = dict(target_elems=64, max_elems=64, min_threads=256, max_tpr=256, staging="smem")
HOLD_KERNELS = ("softmax.fwd", "log_softmax.fwd")


def _plan(hold: bool, sync: str):
    from schedules.row_tiling import plan_held_rows

    def plan_for(name, dtype, n, aligned):
        vec = 16 // dtype.itemsize if aligned else 1
        return plan_held_rows(n, vec, **SETTINGS, cluster_sync=sync, hold=hold and name in HOLD_KERNELS)

    return plan_for


CASES = [(64, 16384), (32, 65536), (8, 131072), (33, 4099), (0, 65536), (1, 65536), (3, 65536 + 8)]


@pytest.mark.parametrize("m,n", CASES, ids=[f"{m}x{n}" for m, n in CASES])
@pytest.mark.parametrize("strided", [False, True], ids=["contig", "strided"])
@pytest.mark.parametrize("sync", ["barrier", "mbarrier"])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_hold_equals_staged_bitwise(op, sync, m, n, strided, monkeypatch):
    if n > 65536 + 8 and strided:
        pytest.skip("one 128k case is enough")
    poison_empty(monkeypatch)
    f = getattr(ck, op)
    pad = 64 if strided else 0
    x = randn(m, n + pad, dtype=torch.bfloat16, seed=1)[:, :n]
    staged, _ = run_with_plans(monkeypatch, _plan(False, sync), lambda: f(x))
    held, plans = run_with_plans(monkeypatch, _plan(True, sync), lambda: f(x))
    if n % 8 == 0 and m:
        assert plans[f"{op}.fwd"].hold, plans
    assert torch.equal(staged.view(torch.uint16), held.view(torch.uint16))
    if m:
        ref = getattr(torch, op)(x.float(), -1)
        assert not torch.isnan(held).any()
        tol = 2e-2 * ref.abs().max().item() + 1e-2
        assert (held.float() - ref).abs().max().item() <= tol


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_hold_other_dtypes(op, dtype, monkeypatch):
    poison_empty(monkeypatch)
    f = getattr(ck, op)
    x = randn(16, 65536, dtype=dtype, seed=5)
    staged, _ = run_with_plans(monkeypatch, _plan(False, "mbarrier"), lambda: f(x))
    held, plans = run_with_plans(monkeypatch, _plan(True, "mbarrier"), lambda: f(x))
    assert plans[f"{op}.fwd"].hold
    assert torch.equal(staged, held)
    ref = getattr(torch, op)(x.double(), -1)
    tol = (1e-5 if dtype == torch.float32 else 1e-2) * ref.abs().max().item() + 1e-5
    assert (held.double() - ref).abs().max().item() <= tol


def test_hold_rows_tied_extremes(monkeypatch):
    """Rows of one repeated value (every exp 1: probability exactly 1/n), one -inf-free spike, and a
    row whose max sits in the last vector of the last CTA."""
    poison_empty(monkeypatch)
    n = 65536
    x = torch.zeros(4, n, device="cuda", dtype=torch.bfloat16)
    x[0] = 3.0
    x[1, 12345] = 60.0
    x[2, -1] = 20.0
    x[3] = randn(n, dtype=torch.bfloat16, seed=9)
    held, _ = run_with_plans(monkeypatch, _plan(True, "mbarrier"), lambda: ck.softmax(x))
    staged, _ = run_with_plans(monkeypatch, _plan(False, "mbarrier"), lambda: ck.softmax(x))
    assert torch.equal(held, staged)
    assert torch.equal(held[0].float(), torch.full((n,), 1.0 / n, device="cuda").to(torch.bfloat16).float())
    assert held[1, 12345].item() == 1.0 and held[2, -1].item() == 1.0


# 128 elements a thread (`schedules.row_tiling.WIDE_HOLD_ELEMS`, session 18: QuACK's 16k geometry, the exps held in
# fp32 at 168 registers): 128-thread CTAs, 16k in one CTA, 32k in clusters of 2.
WIDE = dict(target_elems=128, max_elems=128, min_threads=128, max_tpr=128, staging="smem")
WIDE_CASES = [(300, 16384), (40, 32768), (5, 16384 - 8), (1, 16384), (0, 16384)]


@pytest.mark.parametrize("m,n", WIDE_CASES, ids=[f"{m}x{n}" for m, n in WIDE_CASES])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_hold_128_elements_bitwise(op, dtype, m, n, monkeypatch):
    from schedules.row_tiling import plan_held_rows

    def plan(hold):
        return lambda name, dtype, n, aligned: plan_held_rows(n, 16 // dtype.itemsize if aligned else 1, **WIDE,
                                                               hold=hold and name in HOLD_KERNELS)

    poison_empty(monkeypatch)
    f = getattr(ck, op)
    x = randn(m, n, dtype=dtype, seed=11) * 3
    staged, _ = run_with_plans(monkeypatch, plan(False), lambda: f(x))
    held, plans = run_with_plans(monkeypatch, plan(True), lambda: f(x))
    if m:
        assert plans[f"{op}.fwd"].hold and plans[f"{op}.fwd"].tiling.unroll == 16, plans
        assert not torch.isnan(held).any()
        ref = getattr(torch, op)(x.double(), -1)
        assert (held.double() - ref).abs().max().item() <= 2e-2 * ref.abs().max().item() + 1e-2
    assert torch.equal(staged.view(torch.uint16), held.view(torch.uint16))


NORM_CASES = [(64, 16384), (32, 65536), (8, 131072), (3, 65536 + 8), (1, 65536), (0, 65536)]


def _norm_plan(hold: bool, wide: bool = False):
    """RMSNorm / LayerNorm forward staged at 64 elements per thread (LayerNorm: 32, its 64-element
    hold takes 111-128 registers), mbarrier sync; the backward keeps its own plan."""
    from cute_kernels.rowwise.launch import plan_for as default_plan
    from schedules.row_tiling import plan_held_rows

    def plan_for(name, dtype, n, aligned):
        if name not in ("rmsnorm.fwd", "layernorm.fwd"):
            return default_plan(name, dtype, n, aligned)
        vec = 16 // dtype.itemsize if aligned else 1
        if wide:  # QuACK's 16k geometry: 128 threads x 128 elements
            return plan_held_rows(n, vec, target_elems=128, max_elems=128, min_threads=128, max_tpr=128,
                                  staging="smem", hold=hold)
        e = 64 if name == "rmsnorm.fwd" else 32
        return plan_held_rows(n, vec, target_elems=e, max_elems=e, min_threads=256, max_tpr=256, staging="smem",
                              cluster_sync="mbarrier", hold=hold)

    return plan_for


WIDE_NORM_CASES = [(300, 16384), (40, 32768), (5, 16384 - 8), (1, 16384), (0, 16384)]


@pytest.mark.parametrize("m,n,wide", [(m, n, False) for m, n in NORM_CASES] + [(m, n, True) for m, n in WIDE_NORM_CASES],
                         ids=[f"{m}x{n}" for m, n in NORM_CASES] + [f"{m}x{n}_128elems" for m, n in WIDE_NORM_CASES])
@pytest.mark.parametrize("op", ["rms_norm", "rms_norm_res", "layer_norm"])
def test_norm_hold_equals_staged_bitwise(op, m, n, wide, monkeypatch):
    """Norm forwards holding the landed x (and residual) in 16 bits, widened again per pass
    (`vector_io.widen_again`): y, the residual sum, rstd and mean bit for bit the re-reading plan's. `wide`: 128
    elements a thread (RMSNorm only: LayerNorm beside a residual spills there)."""
    if op == "layer_norm" and n > 65536 + 8:
        pytest.skip("one long LayerNorm row is enough")
    if wide and op == "layer_norm":
        pytest.skip("128 held elements: RMSNorm only")
    poison_empty(monkeypatch)
    x = randn(m, n, dtype=torch.bfloat16, seed=1)
    r = randn(m, n, dtype=torch.bfloat16, seed=4)
    w = randn(n, dtype=torch.bfloat16, seed=2)
    b = randn(n, dtype=torch.bfloat16, seed=3)
    f = {"rms_norm": lambda: ck.rms_norm(x, w, 1e-6), "rms_norm_res": lambda: ck.rms_norm(x, w, 1e-6, residual=r),
         "layer_norm": lambda: ck.layer_norm(x, w, b, 1e-5)}[op]
    staged, _ = run_with_plans(monkeypatch, _norm_plan(False, wide), f)
    held, plans = run_with_plans(monkeypatch, _norm_plan(True, wide), f)
    if n % 8 == 0 and m:
        assert any(p.hold for p in plans.values()), plans
    a = [staged] if isinstance(staged, torch.Tensor) else list(staged)
    c = [held] if isinstance(held, torch.Tensor) else list(held)
    assert len(a) == len(c)
    for i, (u, v) in enumerate(zip(a, c)):
        assert torch.equal(u, v), f"output {i} differs"
    if m:
        y = c[0].float()
        xf = (x.float() + r.float()).to(torch.bfloat16).float() if op == "rms_norm_res" else x.float()
        ref = (torch.nn.functional.rms_norm(xf, (n,), w.float(), 1e-6) if op.startswith("rms")
               else torch.nn.functional.layer_norm(xf, (n,), w.float(), b.float(), 1e-5))
        assert (y - ref).abs().max().item() <= 2e-2 * ref.abs().max().item() + 1e-2
