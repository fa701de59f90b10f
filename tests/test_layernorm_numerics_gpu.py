"""GPU: LayerNorm forward statistics in one exchange (`RowReducer.moments`, `collectives.reduce.
merge_moments`) against fp64.

The forward reduces each warp's share of a row two-pass (its sum, then its squared deviations about
its own mean) and merges the warps' and the cluster CTAs' (count, sum, shift, m2) parts exactly
(Chan's update), so the mean and the variance cost one shared-memory and one cluster exchange. The
tests aim where that can go wrong: rows of mean 1e3 and a spread of 1 or 0.1 (a one-pass
sum(x^2) - n mean^2 would lose 6 % or all of the variance in fp32), a row whose first column is a
massive outlier (a one-pass sum shifted by the first element would cancel there), constant rows
(variance 0: never negative, no NaN), row lengths that leave warps and CTAs partly or wholly empty
(7, 769, 5125: the scalar variant; 4096, 65536: 128-bit vectors, a cluster at 64k), 0/1/769 rows,
and forced plans of 1, 2, 4, 16 and 32 warps per row, several rows per CTA and clusters of 2-8
CTAs synced by barrier or mbarrier, register and shared-memory staged. Checked: y against the fp64
reference (the row-wise tests' bound), and the saved mean and rstd themselves (what the backward
reads), plus the backward of large-mean rows through autograd.

    python3 -m pytest -q -m gpu tests/test_layernorm_numerics_gpu.py
"""

import pytest
import torch
import torch.nn.functional as F

import cute_kernels as ck
from schedules.row_tiling import HeldRowPlan, RowTiling
from tests.helpers import poison_empty, randn, run_with_plans
from tests.test_rowwise_gpu import check

pytestmark = pytest.mark.gpu

BF16, FP32 = torch.bfloat16, torch.float32
EPS = 1e-5


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    poison_empty(monkeypatch)


def _rows(m, n, dtype, mean=0.0, spread=1.0, outlier=None, seed=None):
    """(m, n) rows of `mean` + `spread` * randn in `dtype` (the reference reads the rounded values);
    `outlier`: column 0 set to it."""
    x = (mean + spread * randn(m, n, dtype=FP32, seed=seed)).to(dtype)
    if outlier is not None and m and n:
        x[:, 0] = outlier
    return x


def _stats(x, w, b):
    """(y, mean, rstd) of the op's forward (the saved statistics are its third and fourth outputs)."""
    y, _, mean, rstd = torch.ops.cute_kernels.layer_norm(x, w, b, None, EPS)
    return y, mean, rstd


def _check_stats(x, w, b, what):
    y, mean, rstd = _stats(x, w, b)
    xd = x.double()
    var, mu = torch.var_mean(xd, dim=-1, unbiased=False)
    ref_rstd = torch.rsqrt(var + EPS)
    n = x.shape[-1]
    check(y, F.layer_norm(xd, (n,), None if w is None else w.double(), None if b is None else b.double(), EPS),
          F.layer_norm(x, (n,), w, b, EPS), what)
    if x.shape[0] == 0:
        assert mean.numel() == 0 and rstd.numel() == 0
        return
    assert torch.isfinite(mean).all() and torch.isfinite(rstd).all(), f"{what}: non-finite statistics"
    # fp32 sums of n values: the mean within a few ulps of max|x| times log2(n); the variance within
    # 1e-4 of its value (a cancelling one-pass variance misses by 6e-2 and more at mean 1e3)
    scale = xd.abs().amax(dim=-1).clamp_min(1e-30)
    mean_err = ((mean.double() - mu).abs() / scale).max().item()
    assert mean_err <= 2e-6, f"{what}: mean off by {mean_err:.2e} of max|x|"
    rstd_err = ((rstd.double() - ref_rstd).abs() / ref_rstd).max().item()
    assert rstd_err <= 1e-4, f"{what}: rstd off by {rstd_err:.2e} (relative)"


ROWS = [0, 1, 769]
COLS = [7, 769, 4096, 5125, 65536]


@pytest.mark.parametrize("n", COLS)
@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize("dtype", [BF16, FP32])
def test_default_plans(dtype, m, n):
    """The ops' own plans: plain rows (mean 0), large-mean rows, an outlier in column 0."""
    if m * n > 769 * 8192:
        m = 129  # keep the fp64 references small
    w, b = randn(n, dtype=dtype), randn(n, dtype=dtype)
    _check_stats(_rows(m, n, dtype), w, b, "mean 0")
    if dtype == FP32:  # bf16 has 3 significant digits: 1e3 + 0.1 is 1e3
        _check_stats(_rows(m, n, dtype, mean=1e3, spread=1.0), w, b, "mean 1e3, spread 1")
        _check_stats(_rows(m, n, dtype, mean=1e3, spread=0.1), w, b, "mean 1e3, spread 0.1")
        _check_stats(_rows(m, n, dtype, mean=-3e3, spread=1.0), None, None, "mean -3e3, no affine")
    else:
        _check_stats(_rows(m, n, dtype, mean=1e3, spread=32.0), w, b, "mean 1e3, spread 32 (bf16)")
    _check_stats(_rows(m, n, dtype, outlier=1e4), w, b, "outlier 1e4 in column 0")


@pytest.mark.parametrize("n", [7, 769, 4096, 65536])
def test_constant_rows(n):
    """Variance 0: rstd = 1 / sqrt(eps) (never a negative variance, no NaN), y = bias."""
    x = torch.full((5, n), 0.75, device="cuda", dtype=FP32)
    w, b = randn(n, dtype=FP32), randn(n, dtype=FP32)
    y, mean, rstd = _stats(x, w, b)
    # the mean is sum * rcp.approx(n): within an ulp of 0.75, so x - mean is 0 or an ulp (6e-8)
    torch.testing.assert_close(mean, torch.full_like(mean, 0.75), rtol=2e-7, atol=0)
    torch.testing.assert_close(rstd, torch.full_like(rstd, EPS ** -0.5), rtol=1e-6, atol=0)
    torch.testing.assert_close(y, b.expand_as(y), rtol=0, atol=1e-4)


def _forced(tiling, cluster=1, staging="regs", sync="barrier"):
    """A `plan_for` that gives the LayerNorm forward this plan (one CTA per SM in the capped grid, so
    CTAs walk several row tiles) and every other kernel its own."""
    from cute_kernels.ops._rowwise import plan_for as own

    plan = HeldRowPlan(tiling, cluster, ctas_per_sm=1, staging=staging, cluster_sync=sync)

    def plan_for(name, dtype, n, aligned):
        return plan if name == "layernorm.fwd" else own(name, dtype, n, aligned)

    return plan_for


# (threads, threads per row, vectors per thread, cluster, staging, sync), bf16 (8-element vectors)
FORCED = [
    ((256, 32, 16), 1, "regs", "barrier"),     # one warp per row, 8 rows per CTA: no merge stage
    ((256, 64, 8), 1, "regs", "barrier"),      # 2 warps per row, 4 rows per CTA
    ((256, 128, 4), 1, "regs", "barrier"),     # 4 warps per row, 2 rows per CTA
    ((512, 512, 1), 1, "regs", "barrier"),     # 16 warps per row
    ((1024, 1024, 1), 1, "smem", "barrier"),   # 32 warps per row, staged
    ((128, 128, 2), 2, "regs", "barrier"),     # a 2-CTA cluster
    ((128, 128, 2), 2, "regs", "mbarrier"),
    ((256, 128, 1), 4, "smem", "mbarrier"),    # 2 rows per CTA over a 4-CTA cluster
    ((128, 64, 1), 8, "regs", "barrier"),      # 2 warps x 8 CTAs per row
]


@pytest.mark.parametrize("n", [4096, 3000])
@pytest.mark.parametrize("forced", FORCED, ids=lambda f: f"t{f[0][0]}r{f[0][1]}u{f[0][2]}c{f[1]}-{f[2]}-{f[3]}")
def test_forced_plans(forced, n, monkeypatch):
    """Every merge shape: 1-32 warps per row, several rows per CTA, clusters of 2-8 (barrier and
    mbarrier), register and shared-memory staging; 4096 fills every thread, 3000 leaves warps and
    CTAs empty past the row's end. 1000 rows on one CTA (cluster) per SM: most walk several tiles."""
    (t, tpr, vpt), cluster, staging, sync = forced
    tiling = RowTiling(t, tpr, vpt)
    if tpr * vpt * 8 * cluster < n:
        pytest.skip("the plan does not hold the row")
    x = _rows(1000, n, BF16, mean=1e3, spread=32.0)
    w, b = randn(n), randn(n)

    def run():
        _check_stats(x, w, b, f"forced {forced}")
        _check_stats(_rows(1000, n, BF16, outlier=1e4), w, b, f"forced {forced}, outlier")
        return []

    _, plans = run_with_plans(monkeypatch, _forced(tiling, cluster, staging, sync), run)
    assert str(plans["layernorm.fwd"]).startswith(str(tiling)), plans


@pytest.mark.parametrize("n", [4096, 65536])
def test_large_mean_backward(n):
    """Gradients of rows of mean 1e3 (fp32): the backward reads the saved mean and rstd."""
    m = 65
    x = _rows(m, n, FP32, mean=1e3, spread=1.0).requires_grad_()
    w, b = randn(n, dtype=FP32).requires_grad_(), randn(n, dtype=FP32).requires_grad_()
    dy = randn(m, n, dtype=FP32)
    ours = torch.autograd.grad(ck.layer_norm(x, w, b, EPS), (x, w, b), dy)
    xd, wd, bd = (t.detach().double().requires_grad_() for t in (x, w, b))
    ref = torch.autograd.grad(F.layer_norm(xd, (n,), wd, bd, EPS), (xd, wd, bd), dy.double())
    theirs = torch.autograd.grad(F.layer_norm(x, (n,), w, b, EPS), (x, w, b), dy)
    for o, r, t, name in zip(ours, ref, theirs, ("dx", "dw", "db")):
        check(o, r, t, f"large-mean backward {name}")
