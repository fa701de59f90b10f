"""GPU: moe_dispatch / moe_combine against the torch reference (`cute_kernels.moe.reference`) on both layouts: skewed
routing (an expert with every token, experts with none), top-k 1 / 2 / 6 / 8, tokens 1 / 7 / 4096, hidden 7168 and
2048 (and an H off the 16-byte vector: the torch path), capacity drops; combine bit-identical over runs; rows no
slot names never read; autograd against the reference's; CUDA-graph capture."""

import pytest
import torch

from cute_kernels.moe import reference as R
from tests.helpers import poison_empty, randn

pytestmark = pytest.mark.gpu

ck = pytest.importorskip("cute_kernels")


def _routing(t, e, k, max_m=None, skew=True, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    logits = torch.randn(t, e, generator=g, device="cuda")
    if skew:
        logits[:, 0] += 8.0  # expert 0 takes every token
        logits[:, 1] -= 50.0  # expert 1 none
    return R.route(logits, k, max_m=max_m)


@pytest.mark.parametrize("t,e,k,h", [(1, 8, 1, 2048), (7, 16, 2, 7168), (4096, 64, 8, 2048), (300, 256, 6, 7168),
                                     (33, 8, 2, 100)])
@pytest.mark.parametrize("layout", ["contiguous", "masked"])
def test_against_reference(t, e, k, h, layout, monkeypatch):
    poison_empty(monkeypatch)
    r = _routing(t, e, k, max_m=max(1, t // 4))
    x = randn(t, h)
    d = ck.moe_dispatch(x, r, layout)
    ref = R.dispatch(x, r, layout)
    src = (r.row_source if layout == "contiguous" else r.masked_source.reshape(-1)) >= 0
    assert torch.equal(d.reshape(-1, h)[src], ref.reshape(-1, h)[src])  # every named row, bit for bit
    y = randn(*d.shape)
    y.reshape(-1, h)[~src] = float("nan")  # rows no slot names: never read
    out = ck.moe_combine(y, r, r.topk_weights, layout)
    want = R.combine(y, r, r.topk_weights, layout)
    assert out.shape == (t, h) and torch.isfinite(out).all()
    # fp32 in slot order, one rounding: the reference's value up to one bf16 step (an FMA may fuse a product; a bf16
    # ulp is 2^-8 to 2^-7 of the value)
    assert ((out.float() - want.float()).abs() <= 2 ** -7 * want.float().abs() + 1e-6).all()
    assert torch.equal(out, ck.moe_combine(y, r, r.topk_weights, layout))


def test_autograd_against_reference():
    t, e, k, h = 64, 16, 4, 256
    r = _routing(t, e, k, skew=False)
    x = randn(t, h).float().requires_grad_()
    w = r.topk_weights.clone().requires_grad_()
    xb = x.detach().bfloat16().requires_grad_()
    wb = w.detach().clone().requires_grad_()
    d = ck.moe_dispatch(xb, r)
    y = d * 2.0 + 1.0  # an "expert" (padding rows are garbage in, garbage out: never combined)
    out = ck.moe_combine(y, r, wb)
    g = randn(t, h)
    out.backward(g)
    ref = R.combine(R.dispatch(x, r).double() * 2.0 + 1.0, r, w.double(), out_dtype=torch.float64)
    ref.backward(g.double())
    assert torch.allclose(xb.grad.float(), x.grad.float(), rtol=2e-2, atol=2e-2)
    assert torch.allclose(wb.grad, w.grad.float(), rtol=2e-2, atol=1e-1)


def test_graph_capture():
    r = _routing(16, 8, 2, skew=False)
    x = randn(16, 2048)
    ck.moe_combine(ck.moe_dispatch(x, r), r, r.topk_weights)  # compile outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = ck.moe_combine(ck.moe_dispatch(x, r), r, r.topk_weights)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, ck.moe_combine(ck.moe_dispatch(x, r), r, r.topk_weights))


def _calc_diff(x, y):
    x, y = x.double(), y.double()
    return (1 - 2 * (x * y).sum() / (x * x + y * y).sum()).item()


def _fp8_experts(e, h, i, seed=1):
    from cute_kernels.quantize.ops import quantize_128x128

    g = torch.Generator(device="cuda").manual_seed(seed)
    w13 = [torch.randn(2 * i, h, generator=g, device="cuda") / h ** 0.5 for _ in range(e)]
    w2 = [torch.randn(h, i, generator=g, device="cuda") / i ** 0.5 for _ in range(e)]
    q13 = [quantize_128x128(w.bfloat16()) for w in w13]
    q2 = [quantize_128x128(w.bfloat16()) for w in w2]
    return (torch.stack([q for q, _ in q13]), torch.stack([s for _, s in q13]), torch.stack([q for q, _ in q2]),
            torch.stack([s for _, s in q2]))


@pytest.mark.parametrize("t", [1, 7, 300])
@pytest.mark.parametrize("layout", ["contiguous", "masked"])
def test_fp8_moe_layer(t, layout):
    """ck.moe against the fp32 per-expert loop over the dequantized weights and the same e4m3 activations: DeepGEMM's
    calc_diff < 1e-3; and the masked path in a CUDA graph."""
    e, h, i, k = 8, 512, 256, 2
    w13, s13, w2, s2 = _fp8_experts(e, h, i)
    x = randn(t, h)
    router = randn(e, h) * 0.05
    out = ck.moe(x, router, w13, s13, w2, s2, k, layout=layout, max_m=t)
    from cute_kernels.moe.ops import moe_reference

    ref = moe_reference(x, router, w13, s13, w2, s2, k, quantize_activations=True)
    assert out.shape == (t, h) and torch.isfinite(out).all()
    assert _calc_diff(out, ref) < 1e-3  # the GEMMs against fp32 on the same e4m3 activations
    # against unquantized activations: the two 1x128 roundings on top (1.04e-3 seen at one token)
    assert _calc_diff(out, moe_reference(x, router, w13, s13, w2, s2, k)) < 3e-3
    if layout == "masked":
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            again = ck.moe(x, router, w13, s13, w2, s2, k, layout=layout, max_m=t)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(again, out)


def test_route_captures_in_a_graph():
    logits = torch.randn(64, 32, device="cuda")
    want = ck.moe_route(logits, 4, max_m=8)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        got = ck.moe_route(logits, 4, max_m=8)
    g.replay()
    torch.cuda.synchronize()
    for a, b in zip(got, want):
        assert torch.equal(a, b)


@pytest.mark.parametrize("t,e,k,h", [(7, 16, 2, 7168), (300, 64, 8, 2048), (5, 8, 2, 2112 - 64)])
@pytest.mark.parametrize("layout", ["contiguous", "masked"])
@pytest.mark.parametrize("row_major_scales", [False, True, "transpose"])
def test_quantizing_dispatch_bitwise(t, e, k, h, layout, row_major_scales, monkeypatch):
    """The fused 1x128 quantization in the dispatch kernel: every named row's e4m3 values and scales are
    quantize_1x128's bits on the same rows (H not a multiple of 128: the unfused path, same bits), with the scales
    stored M-major directly or row-major and then copied (`DISPATCH_ROW_MAJOR_SCALES`) by torch or by the transpose
    kernel (`DISPATCH_SCALES_COPY`); the scales' strides are quantize_1x128's either way."""
    from cute_kernels.moe import ops as moe_ops
    from cute_kernels.quantize.ops import quantize_1x128

    monkeypatch.setattr(moe_ops, "DISPATCH_ROW_MAJOR_SCALES", bool(row_major_scales))
    monkeypatch.setattr(moe_ops, "DISPATCH_SCALES_COPY", "transpose" if row_major_scales == "transpose" else "torch")

    r = _routing(t, e, k, max_m=max(1, t // 2))
    x = randn(t, h)
    q, s = ck.moe_dispatch(x, r, layout, quantize="1x128")
    src = (r.row_source if layout == "contiguous" else r.masked_source.reshape(-1)) >= 0
    wq, ws = quantize_1x128(R.dispatch(x, r, layout).reshape(-1, h))
    assert torch.equal(q.reshape(-1, h)[src].view(torch.uint8), wq[src].view(torch.uint8))
    assert torch.equal(s.reshape(-1, s.shape[-1])[src], ws[src])
    assert s.reshape(-1, s.shape[-1]).stride() == ws.stride()


@pytest.mark.parametrize("cfg", [dict(e=64, k=6), dict(e=256, k=8, scoring="sigmoid", n_groups=8, topk_groups=4,
                                                        bias=True, scale=2.5),
                                 dict(e=8, k=1, dtype=torch.bfloat16), dict(e=16, k=2, renormalize=False),
                                 dict(e=40, k=3, n_groups=4, topk_groups=2)])
def test_route_kernel_against_reference(cfg):
    """The routing kernel's experts and weights against the reference's (fp32 scores: the same experts on random
    logits; weights within fp32 rounding), and the layouts built on them."""
    t, e, k = 1000, cfg["e"], cfg["k"]
    logits = torch.randn(t, e, device="cuda").to(cfg.get("dtype", torch.float32))
    bias = 0.1 * torch.randn(e, device="cuda") if cfg.get("bias") else None
    kw = dict(scoring=cfg.get("scoring", "softmax"), n_groups=cfg.get("n_groups"), topk_groups=cfg.get("topk_groups"),
              renormalize=cfg.get("renormalize", True), bias=bias, routed_scaling_factor=cfg.get("scale", 1.0))
    got = ck.moe_route(logits, k, max_m=64, **kw)
    want = R.route(logits, k, max_m=64, **kw)
    assert torch.equal(got.topk_ids, want.topk_ids)
    assert torch.allclose(got.topk_weights, want.topk_weights, rtol=1e-5, atol=1e-7)
    for a, b in zip(got[2:], want[2:]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("t,e,k,max_m", [(1, 8, 1, 4), (7, 16, 2, None), (4096, 64, 8, 300), (65536, 256, 8, 2048),
                                         (5000, 40, 6, 10)])
def test_layout_kernel_against_reference(t, e, k, max_m, monkeypatch):
    """The `moe.layouts` kernels (`ops.layouts`) give the reference's layouts bit for bit: skewed routing, an expert
    with none, copies routed nowhere (-1, as expert parallelism's), capacity drops. The outputs come from torch.empty
    poisoned here (int32 too): the -1 rows and slots and the zero drop count are the kernels' own fills."""
    from cute_kernels.moe.ops import layouts

    r = _routing(t, e, k, max_m=max_m)
    ids = r.topk_ids.clone()
    ids[::7, 0] = -1  # some copies served elsewhere
    want = R.routing_of(ids, r.topk_weights, e, max_m)
    real = torch.empty

    def poisoned(*args, **kwargs):
        x = real(*args, **kwargs)
        if type(x) is torch.Tensor and x.dtype == torch.int32 and x.numel():
            x.fill_(0x5A5A5A5A)
        return x

    monkeypatch.setattr(torch, "empty", poisoned)
    got = layouts(ids, r.topk_weights, e, max_m)
    for name, a, b in zip(want._fields, got, want):
        assert torch.equal(a.cpu(), b.cpu()), name
