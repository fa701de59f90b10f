"""GPU: the cross-entropy backward (`kernels.softmax.CrossEntropyBwd`: a row's vectors loaded
together from one base, target/lse/dloss loaded with them, a 32-bit one-hot compare, a long row cut
over grid y without a cluster) under its default plan (HELD_TUNED["ce_bwd"]) and every plan
`perf.tune_rows --kernels cross_entropy.bwd` times (`ce_bwd_candidates`), against fp64 torch.
dx is NaN-poisoned (`torch.empty` filled) before each launch; edge shapes (0, 1, 769 rows; 1, 7,
769, 4097 columns), ignore_index (the default and a class index), targets out of range, int32
targets, the target in the first and last column and in every position of a vector, row strides
that are and are not multiples of the vector, 64-bit indexing."""

import pytest
import torch

from tests.helpers import EPS, poison_empty, randn, run_with_plans

pytestmark = pytest.mark.gpu

CE = "cross_entropy.bwd"


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    poison_empty(monkeypatch)


def _ref(x, t, dloss, ignore_index=-100):
    """fp64 dx: (softmax(x) - onehot(t)) * dloss, 0 on rows whose target is ignore_index; a target
    outside [0, N) (not ignore_index) subtracts nothing (the kernel's documented behaviour)."""
    return _ref_parts(x, t, dloss, ignore_index)[0]


def _ref_parts(x, t, dloss, ignore_index=-100):
    """(fp64 dx, |softmax(x) * dloss|: the size of the fp32 math's error, relative to the probability)."""
    p = torch.softmax(x.double(), dim=-1)
    n = x.shape[1]
    t = t.long()
    inside = (t >= 0) & (t < n)
    rows = torch.nonzero(inside & (t != ignore_index)).flatten()
    p[rows, t[rows]] -= 1.0
    g = torch.where(t == ignore_index, torch.zeros_like(dloss.double()), dloss.double())
    scale = (torch.softmax(x.double(), dim=-1) * g[:, None]).abs()
    return p * g[:, None], scale


def _lse(x):
    return torch.logsumexp(x.double(), dim=-1).float()


def _bwd(x, t, dloss, lse, ignore_index=-100):
    import cute_kernels  # noqa: F401  (registers torch.ops.cute_kernels)

    return torch.ops.cute_kernels.cross_entropy_bwd(x, t, dloss, lse, ignore_index)


def _check(dx, x, t, dloss, ignore_index=-100):
    ref, scale = _ref_parts(x, t, dloss, ignore_index)
    assert dx.shape == x.shape and dx.dtype == x.dtype
    assert torch.isfinite(dx).all(), "unwritten (NaN-poisoned) or non-finite elements"
    # one rounding to dx's dtype (relative to dx); the fp32 math: the fp32 lse and x - lse (each 2^-24
    # relative of up to ~30 in the exponent), ex2.approx: a few 1e-6 relative to the probability term
    # (at the target, p - 1 may cancel); fp16's floor: its denormals.
    tol = 2 * EPS[dx.dtype] * ref.abs() + 2.0**-17 * scale + (2.0**-24 if dx.dtype == torch.float16 else 1e-30)
    err = (dx.double() - ref).abs()
    bad = err > tol
    assert not bad.any(), f"{int(bad.sum())} elements off; worst {err.max().item():.3e}"
    ignored = t.long() == ignore_index
    assert (dx[ignored] == 0).all()


def _plan_cases():
    """(m, n, plan): every candidate `perf.tune_rows` times at the widths it is run at, the default first."""
    from perf.tune_rows import ce_bwd_candidates
    from schedules.row_tiling import plan_for_rows

    out = []
    for m, n in ((769, 4096), (1, 4096), (40, 16384), (24, 65536)):
        plans = [plan_for_rows("ce_bwd", n, 8)]
        plans += [p for p in ce_bwd_candidates(n) if p != plans[0]]
        out += [(m, n, p) for p in plans]
    return out


def _with_plan(monkeypatch, plan, fn):
    from cute_kernels.rowwise import launch as R

    orig = R.plan_for

    def plan_for(name, dtype, n, aligned):
        return plan if name == CE and aligned else orig(name, dtype, n, aligned)

    out, used = run_with_plans(monkeypatch, plan_for, fn)
    assert used.get(CE) == plan  # the plan under test ran
    return out


def _targets(m, n, ignore_index=-100):
    t = torch.randint(0, n, (m,), device="cuda")
    if m > 5:
        t[1] = ignore_index
        t[2] = n + 5  # out of range
        t[3] = n - 1  # the last column
        t[4] = 0  # the first column
        t[5] = -1  # negative, not ignore_index
    return t


@pytest.mark.parametrize("m,n,plan", _plan_cases(), ids=lambda v: str(v))
def test_plans_match_fp64(monkeypatch, m, n, plan):
    x = randn(m, n, dtype=torch.bfloat16) * 3
    t = _targets(m, n)
    dloss = randn(m, dtype=torch.float32)
    lse = _lse(x)
    dx = _with_plan(monkeypatch, plan, lambda: _bwd(x, t, dloss, lse))
    _check(dx, x, t, dloss)
    again = _with_plan(monkeypatch, plan, lambda: _bwd(x, t, dloss, lse))
    assert torch.equal(again, dx)  # deterministic


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("m,n", [(0, 4096), (1, 1), (1, 7), (769, 7), (769, 769), (769, 4097), (769, 4096),
                                 (1, 4096), (3, 262144)])
def test_default_plan_edge_shapes(dtype, m, n):
    x = randn(m, n, dtype=dtype) * 3
    t = _targets(m, n)
    dloss = randn(m, dtype=torch.float32)
    dx = _bwd(x, t, dloss, _lse(x))
    assert dx.shape == (m, n)
    if m:
        _check(dx, x, t, dloss)
    if n == 1:  # probability exactly 1 at the target: the gradient is exactly 0
        assert (dx == 0).all()


def test_target_in_every_position_of_every_vector():
    """4k bf16 rows (64 threads x 8 vectors of 8): row r's target at vector r % 8 of its thread,
    element r // 8 % 8, so every (vector, element) compare of the one-hot is exercised."""
    m, n = 512, 4096
    r = torch.arange(m, device="cuda")
    lane = r % 64
    t = ((r % 8) * 64 + lane) * 8 + (r // 8) % 8
    x = randn(m, n, dtype=torch.bfloat16)
    dloss = randn(m, dtype=torch.float32)
    _check(_bwd(x, t, dloss, _lse(x)), x, t, dloss)


def test_custom_ignore_index_and_int32_targets():
    """ignore_index a class index (7): its rows are zero; -100 is then an out-of-range target (no
    one-hot). Through autograd with int32 targets (the op widens them)."""
    import cute_kernels as ck

    m, n = 64, 4096
    x = randn(m, n, dtype=torch.bfloat16) * 2
    t = _targets(m, n, ignore_index=7).to(torch.int32)
    t[9] = -100
    dloss = randn(m, dtype=torch.float32)
    dx = _bwd(x, t, dloss, _lse(x), ignore_index=7)
    _check(dx, x, t, dloss, ignore_index=7)
    xg = x.detach().requires_grad_()
    loss = ck.cross_entropy(xg, t, reduction="none", ignore_index=7)  # NaN where the target is out of range
    (g,) = torch.autograd.grad(loss, xg, dloss)
    _check(g, x, t, dloss, ignore_index=7)


@pytest.mark.parametrize("n,pad", [(4096, 8), (4096, 3), (65536, 8), (769, 5)])
def test_strided_rows(n, pad):
    """Rows of a wider tensor: a row stride that is a multiple of the vector (128-bit variant, dx
    contiguous with another stride) or not (the scalar variant)."""
    m = 300
    base = randn(m, n + pad, dtype=torch.bfloat16) * 2
    x = base[:, :n]
    t = _targets(m, n)
    dloss = randn(m, dtype=torch.float32)
    dx = _bwd(x, t, dloss, _lse(x))
    assert dx.is_contiguous()
    _check(dx, x, t, dloss)


@pytest.mark.large
def test_index64_rows():
    """More than 2^31 elements (64-bit indexing): the last rows, the one-hot and ignore_index there."""
    n = 65536
    m = (2**31) // n + 3
    if torch.cuda.get_device_properties(0).total_memory < 4 * m * n * 2:
        pytest.skip("needs ~18 GB of GPU memory")
    x = randn(m, n, dtype=torch.bfloat16)
    t = torch.randint(0, n, (m,), device="cuda")
    t[-2] = -100
    dloss = randn(m, dtype=torch.float32)
    lse = torch.logsumexp(x.float(), dim=-1)
    dx = _bwd(x, t, dloss, lse)
    rows = torch.tensor([0, m // 2, m - 3, m - 2, m - 1], device="cuda")
    _check(dx[rows], x[rows], t[rows], dloss[rows])
    del dx, x
