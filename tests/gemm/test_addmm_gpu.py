"""GPU: `addmm` (beta c + alpha a @ b, c in the epilogue) against fp64, at most 2x the error of torch.addmm in the same
dtype + 1e-4: the streaming kernel's decode shapes (M <= 16, long K) and the GEMM's, c full, broadcast and strided,
batched, beta = 0 ignoring a NaN c, poisoned outputs, autograd against torch.addmm, torch.compile."""

import pytest
import torch

from tests.helpers import poison_empty, randn, rel_err

pytestmark = pytest.mark.gpu

ck = pytest.importorskip("cute_kernels")


def _check(out, c, a, b, beta=1.0, alpha=1.0):
    ref = beta * c.double() + alpha * (a.double() @ b.double())
    same = torch.addmm(c, a, b, beta=beta, alpha=alpha) if a.dim() == 2 else beta * c + alpha * (a @ b)
    assert out.shape == ref.shape and out.dtype == a.dtype
    assert torch.isfinite(out).all(), "unwritten (NaN) elements"
    bound = 2 * rel_err(same, ref) + 1e-4
    assert rel_err(out, ref) <= bound, (rel_err(out, ref), bound)


@pytest.mark.parametrize("m,n,k", [(1, 4096, 14336), (5, 4096, 14336 + 8), (16, 1000, 12288),  # the streaming kernel
                                   (1, 6144, 4096), (769, 2112, 1032), (64, 4096, 4096)])  # the GEMM
@pytest.mark.parametrize("c_kind", ["full", "row", "column", "transposed"])
def test_against_fp64(monkeypatch, m, n, k, c_kind):
    poison_empty(monkeypatch)
    a = randn(m, k, seed=m + k)
    w = randn(n, k, seed=n) * k ** -0.5  # the layer's (N, K) weight, b = w.t()
    c = {"full": lambda: randn(m, n, seed=1), "row": lambda: randn(n, seed=2), "column": lambda: randn(m, 1, seed=3),
         "transposed": lambda: randn(n, m, seed=4).t()}[c_kind]()
    _check(ck.addmm(c, a, w.t()), c, a, w.t())
    _check(ck.addmm(c, a, w.t(), beta=0.5, alpha=2.0), c, a, w.t(), 0.5, 2.0)


def test_stream_fusion_matches_residual_add():
    """At decode shapes the residual is added to the fp32 sum before the one rounding: within an ulp of gemm + add."""
    a, w, r = randn(1, 14336, seed=5), randn(4096, 14336, seed=6) * 14336 ** -0.5, randn(1, 4096, seed=7)
    fused, twice = ck.addmm(r, a, w.t()), ck.gemm(a, w.t()) + r
    assert ((fused.float() - twice.float()).abs() <= 2 * torch.finfo(torch.bfloat16).eps * twice.float().abs()
            + 1e-2).all()
    assert torch.equal(fused, ck.addmm(r, a, w.t()))  # deterministic (split K summed in a fixed order)


def test_batched_beta_zero_and_edges(monkeypatch):
    poison_empty(monkeypatch)
    a, b = randn(3, 70, 256, seed=8), randn(256, 96, seed=9)
    c = randn(70, 96, seed=10)
    _check(ck.addmm(c, a, b), c, a, b)
    nan_c = torch.full((70, 96), float("nan"), dtype=torch.bfloat16, device="cuda")
    out = ck.addmm(nan_c, a[0], b, beta=0.0)  # torch.addmm: beta = 0 ignores c
    assert torch.isfinite(out).all()
    assert ck.addmm(c[:0], a[0, :0], b).shape == (0, 96)
    z = ck.addmm(c, randn(70, 0), torch.empty(0, 96, dtype=torch.bfloat16, device="cuda"))
    assert torch.equal(z, c)


def test_autograd_and_compile():
    a = randn(33, 128, seed=11).requires_grad_()
    b = randn(128, 64, seed=12).requires_grad_()
    c = randn(64, seed=13).requires_grad_()
    g = randn(33, 64, seed=14)
    ck.addmm(c, a, b, beta=0.5, alpha=2.0).backward(g)
    a2, b2, c2 = (t.detach().float().requires_grad_() for t in (a, b, c))
    torch.addmm(c2, a2, b2, beta=0.5, alpha=2.0).backward(g.float())
    for x, y in ((a, a2), (b, b2), (c, c2)):
        assert rel_err(x.grad, y.grad) < 1e-2
    f = torch.compile(lambda c, a, b: ck.addmm(c, a, b), fullgraph=True)
    assert torch.equal(f(c.detach(), a.detach(), b.detach()), ck.addmm(c.detach(), a.detach(), b.detach()))
