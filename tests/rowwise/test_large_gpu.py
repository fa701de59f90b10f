"""GPU, large: the row-wise ops on tensors past 2^31 elements (64-bit indexing), at the lengths whose plans differ
there or were changed last. These are the norm backwards' `i64` plans (RMSNorm 64k, LayerNorm 128k) and the held
forwards refilled on the capped grid (LayerNorm 64k-256k, RMSNorm 256k).

The rows past element 2^31 are the ones that need 64-bit offsets. They are checked against fp64 references of the
same rows, with the first rows beside them. Every output element must be written: NaN-poisoned outputs, then no
NaN anywhere. The backwards' dweight is checked over all rows against a chunked fp32 reference."""

import pytest
import torch

import cute_kernels as ck
from tests.helpers import poison_empty, randn

pytestmark = [pytest.mark.gpu, pytest.mark.large]


def _rows(n):
    """Rows of `n` elements that put the tensor just past 2^31 elements; the rows checked (first two, last three)."""
    m = 2**31 // n + 3
    return m, [0, 1, m - 3, m - 2, m - 1]


def _ref_rows(kind, x, w, b):
    xf = x.double()
    if kind == "rms":
        return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    if kind == "layer":
        return torch.nn.functional.layer_norm(xf, x.shape[-1:], w.double(), b.double(), 1e-5)
    return torch.softmax(xf, -1)


def _no_nan(t):
    for i in range(0, t.shape[0], 4096):  # (chunks: isnan of 4 GiB at once would allocate 2 GiB more)
        assert not torch.isnan(t[i: i + 4096]).any(), f"unwritten rows from {i}"


@pytest.mark.parametrize("kind,n", [("layer", 65536), ("layer", 262144), ("rms", 262144), ("softmax", 131072)])
def test_forward_past_2_31(kind, n, monkeypatch):
    poison_empty(monkeypatch)
    m, check_rows = _rows(n)
    x = torch.empty(m, n, dtype=torch.bfloat16, device="cuda").normal_()
    w, b = randn(n), randn(n)
    y = (ck.rms_norm(x, w, 1e-6) if kind == "rms" else ck.layer_norm(x, w, b, 1e-5) if kind == "layer"
         else ck.softmax(x))
    _no_nan(y)
    got = y[check_rows].double()
    ref = _ref_rows(kind, x[check_rows], w, b)
    assert (got - ref).abs().max().item() <= 2e-2 * ref.abs().max().item()


@pytest.mark.parametrize("kind,n", [("rms", 65536), ("layer", 131072), ("layer", 262144)])
def test_backward_past_2_31(kind, n, monkeypatch):
    """The backwards with their 64-bit plans: dx of the checked rows against fp64, dweight over every row."""
    poison_empty(monkeypatch)
    m, check_rows = _rows(n)
    x = torch.empty(m, n, dtype=torch.bfloat16, device="cuda").normal_()
    dy = torch.empty(m, n, dtype=torch.bfloat16, device="cuda").normal_()
    w, b = randn(n), randn(n)
    xg, wg = x.requires_grad_(), w.detach().requires_grad_()
    bg = b.detach().requires_grad_() if kind == "layer" else None
    y = ck.rms_norm(xg, wg, 1e-6) if kind == "rms" else ck.layer_norm(xg, wg, bg, 1e-5)
    grads = torch.autograd.grad(y, [xg, wg], dy)
    del y
    dx, dw = grads
    _no_nan(dx)
    # dx of the checked rows (row-local) against fp64
    xr = x.detach()[check_rows].double().requires_grad_()
    wr = w.double()
    yr = (xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-6) * wr if kind == "rms"
          else torch.nn.functional.layer_norm(xr, (n,), wr, b.double(), 1e-5))
    (dxr,) = torch.autograd.grad(yr, [xr], dy[check_rows].double())
    assert (dx[check_rows].double() - dxr).abs().max().item() <= 2e-2 * dxr.abs().max().item()
    # dweight = sum over rows of dy * xhat, in fp32 chunks
    ref = torch.zeros(n, dtype=torch.float64, device="cuda")
    for i in range(0, m, 2048):
        xc = x.detach()[i: i + 2048].float()
        if kind == "rms":
            xh = xc * torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + 1e-6)
        else:
            mu = xc.mean(-1, keepdim=True)
            xh = (xc - mu) * torch.rsqrt((xc - mu).pow(2).mean(-1, keepdim=True) + 1e-5)
        ref += (dy[i: i + 2048].float() * xh).sum(0).double()
    assert (dw.double() - ref).abs().max().item() <= 1e-2 * ref.abs().max().item() + 1e-3 * m ** 0.5
