"""GPU: SiLU / SwiGLU forward and backward against fp64 and torch at dtype-aware bounds, edge sizes, non-contiguous
inputs, torch.compile."""

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import EPS, randn

pytestmark = pytest.mark.gpu


DTYPES = [torch.bfloat16, torch.float16, torch.float32]


# --- SiLU / SwiGLU -------------------------------------------------------------------------------
def _close(out, ref, dtype, torch_out, scale=None, ulps=None):
    """out against the fp64 `ref`, element by element: within twice torch's own worst error relative to
    `scale` (torch_out vs ref) plus `ulps` ulps of `scale` (default |ref|; for a sum of terms that can
    cancel, pass the magnitude of the terms). One ulp <= 2 * EPS * |x|; below the smallest normal the
    spacing is tiny * 2 * EPS, so `ulps` of that cover subnormal results and exact zeros."""
    assert out.shape == ref.shape and out.dtype == dtype
    if ulps is None:  # bf16/fp16: one rounding of an fp32 result; fp32: fast exp + a few roundings
        ulps = 4 if dtype == torch.float32 else 1
    if ref.numel() == 0:
        return
    scale = ref.abs() if scale is None else scale
    tiny = torch.finfo(dtype).tiny
    err = (out.double() - ref).abs()
    torch_rel = ((torch_out.double() - ref).abs() / (scale + tiny)).max().item()
    bound = (2 * torch_rel + ulps * 2 * EPS[dtype]) * (scale + tiny)
    bad = err > bound
    assert not bad.any(), (f"{int(bad.sum())} of {err.numel()} beyond 2x torch's relative error {torch_rel:.3g} + "
                           f"{ulps} ulps: worst err {err.max().item():.3g}, ours/scale "
                           f"{(err / (scale + tiny)).max().item():.3g}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(0,), (1,), (769,), (5125, 3), (1 << 22) + 3])
def test_silu_swiglu_forward(dtype, shape):
    import cute_kernels as ck

    shape = shape if isinstance(shape, tuple) else (shape,)
    g, u = randn(*shape, dtype=dtype), randn(*shape, dtype=dtype)
    gd, ud = g.double(), u.double()
    sd = torch.sigmoid(gd)
    y = ck.silu(g)
    assert y.shape == g.shape and y.dtype == dtype and not torch.isnan(y).any()
    _close(y, gd * sd, dtype, F.silu(g))
    out = ck.swiglu(g, u)
    assert not torch.isnan(out).any()
    _close(out, gd * sd * ud, dtype, F.silu(g) * u)


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_backward_vs_fp64_and_torch(dtype):
    import cute_kernels as ck

    g = randn(513, 1031, dtype=dtype).requires_grad_()
    u = randn(513, 1031, dtype=dtype).requires_grad_()
    dout = randn(513, 1031, dtype=dtype)
    ck.swiglu(g, u).backward(dout)
    gt, ut = g.detach().clone().requires_grad_(), u.detach().clone().requires_grad_()
    (F.silu(gt) * ut).backward(dout)
    gd, ud, dd = g.double(), u.double(), dout.double()
    s = torch.sigmoid(gd)
    # silu'(g) = s * (1 + g * (1 - s)) cancels near g = -1.28: bound by the terms' magnitude there
    _close(g.grad, dd * ud * s * (1 + gd * (1 - s)), dtype, gt.grad, scale=(dd * ud * s * (1 + (gd * (1 - s)).abs())).abs())
    _close(u.grad, dd * gd * s, dtype, ut.grad)
    x = randn(777, dtype=dtype).requires_grad_()
    dy = dout.view(-1)[:777]
    ck.silu(x).backward(dy)
    xt = x.detach().clone().requires_grad_()
    F.silu(xt).backward(dy)
    xd = x.double()
    sx = torch.sigmoid(xd)
    _close(x.grad, dy.double() * sx * (1 + xd * (1 - sx)), dtype, xt.grad,
           scale=(dy.double() * sx * (1 + (xd * (1 - sx)).abs())).abs())


def test_swiglu_non_contiguous_and_compile():
    import cute_kernels as ck

    h = randn(300, 2 * 1000, dtype=torch.bfloat16)
    g, u = h[:, :1000], h[:, 1000:]  # halves of a fused projection: read in place
    _close(ck.swiglu(g, u), F.silu(g.double()) * u.double(), torch.bfloat16, F.silu(g) * u)
    odd = randn(10001, dtype=torch.float16)[1:]  # misaligned: scalar variant
    _close(ck.silu(odd), F.silu(odd.double()), torch.float16, F.silu(odd))
    f = torch.compile(lambda a, b: ck.swiglu(a, b) + 1, fullgraph=True)
    a, b = randn(64, 4096), randn(64, 4096)
    assert torch.equal(f(a, b), ck.swiglu(a, b) + 1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,cols", [(1, 4096), (7, 769), (513, 1032), (4096, 14336)])
def test_swiglu_strided_halves(dtype, rows, cols):
    """The halves of a fused (rows, 2 cols) projection, read in place with their row stride: 128-bit vectors where
    cols and the stride are whole vectors, the scalar variant otherwise (769); every output element written; the
    backward reads the same views; 3-D halves and a contiguous operand beside a strided one."""
    import cute_kernels as ck

    h = randn(rows, 2 * cols, dtype=dtype)
    g, u = h[:, :cols], h[:, cols:]
    gd, ud = g.double(), u.double()
    out = ck.swiglu(g, u)
    assert out.is_contiguous() and not torch.isnan(out).any()
    _close(out, F.silu(gd) * ud, dtype, F.silu(g) * u)
    uc = u.contiguous()
    _close(ck.swiglu(g, uc), F.silu(gd) * ud, dtype, F.silu(g) * u)
    if rows * cols < 1 << 20:
        h3 = randn(3, rows, 2 * cols, dtype=dtype)
        g3, u3 = h3[..., :cols], h3[..., cols:]
        _close(ck.swiglu(g3, u3), F.silu(g3.double()) * u3.double(), dtype, F.silu(g3) * u3)
        hg = h.detach().clone().requires_grad_()
        dout = randn(rows, cols, dtype=dtype)
        ck.swiglu(hg[:, :cols], hg[:, cols:]).backward(dout)
        ht = h.detach().clone().requires_grad_()
        (F.silu(ht[:, :cols]) * ht[:, cols:]).backward(dout)
        s = torch.sigmoid(gd)
        dd = dout.double()
        _close(hg.grad[:, :cols], dd * ud * s * (1 + gd * (1 - s)), dtype, ht.grad[:, :cols],
               scale=(dd * ud * s * (1 + (gd * (1 - s)).abs())).abs())
        _close(hg.grad[:, cols:], dd * gd * s, dtype, ht.grad[:, cols:])


@pytest.mark.parametrize("m,i", [(1, 2048), (300, 1024), (4096, 2048), (33, 1000)])
def test_swiglu_quantize(m, i):
    """swiglu_quantize against the fp32 product quantized by the torch reference: the scales within fp32 rounding of
    the reference's (the fast sigmoid), the dequantized values within calc_diff 1e-3 (I off 128: the unfused path)."""
    import cute_kernels as ck
    from cute_kernels.quantize.ops import dequantize_1x128, quantize_1x128_reference

    h = torch.randn(m, 2 * i, device="cuda").bfloat16()
    gate, up = h[:, :i], h[:, i:]
    q, s = ck.swiglu_quantize(gate, up)
    ref = torch.nn.functional.silu(gate.float()) * up.float()
    _, rs = quantize_1x128_reference(ref)
    assert torch.allclose(s, rs, rtol=1e-5, atol=0) if i % 128 == 0 else True
    d = dequantize_1x128(q, s).double()
    r = ref.double()
    assert (1 - 2 * (d * r).sum() / (d * d + r * r).sum()).item() < 1e-3
