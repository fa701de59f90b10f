"""GPU: RoPE against the fp64 formula within one ulp of the output dtype (both pairings, partial rotary dims, positions
absent / per batch / shared / varlen, int32 / int64), in place (pass-through dims untouched), strided views of a
fused QKV output, awkward layouts, edge sizes, every output element written (poisoned allocator), the backward,
torch.compile and CUDA-graph capture."""

import pytest
import torch

from cute_kernels.rope.ops import rope_reference, rope_tables
from tests.helpers import EPS, poison_empty, randn

pytestmark = pytest.mark.gpu
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _ref64(x, cos, sin, positions, interleaved, r):
    """The rotation in fp64 (no output rounding)."""
    out, _ = rope_reference(x.double(), None, cos.double(), sin.double(), positions, interleaved, r)
    return out


def _within_ulp(out, ref, dtype):
    """|out - ref| <= one ulp of the output dtype at |ref| (fp32: two), plus the fp32 arithmetic's own error on the
    row's magnitude (a rotated pair can cancel: a c - b s near 0 carries the products' rounding)."""
    assert out.dtype == dtype and out.shape == ref.shape
    if not out.numel():
        return
    assert torch.isfinite(out).all(), "an output element was not written (NaN from the poisoned allocator)"
    ulps = 2 if dtype == torch.float32 else 1
    tiny = torch.finfo(dtype).tiny
    err = (out.double() - ref).abs()
    row = ref.abs().amax(-1, keepdim=True)
    bound = ulps * 2 * EPS[dtype] * ref.abs() + tiny + 2 ** -21 * row
    bad = err > bound
    if bad.any():
        i = tuple(bad.nonzero()[0].tolist())
        raise AssertionError(f"{int(bad.sum())} of {err.numel()} elements beyond {ulps} ulp: first at {i}, out "
                             f"{out[i].item():.6g}, ref {ref[i].item():.6g}; worst {err.max().item():.3g}")


def _tables(n, r):
    return rope_tables(n, r, device="cuda")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("r", [128, 64, 96])
def test_rope_matches_fp64(dtype, interleaved, r, monkeypatch):
    import cute_kernels as ck

    poison_empty(monkeypatch)
    b, s, hq, hk, d = 2, 77, 8, 2, 128
    q, k = randn(b, s, hq, d, dtype=dtype), randn(b, s, hk, d, dtype=dtype)
    cos, sin = _tables(4096, r)
    pos = torch.randint(0, 4096, (b, s), device="cuda", dtype=torch.int32)
    qo, ko = ck.rope(q, k, cos, sin, positions=pos, interleaved=interleaved, rotary_dim=r)
    _within_ulp(qo, _ref64(q, cos, sin, pos, interleaved, r), dtype)
    _within_ulp(ko, _ref64(k, cos, sin, pos, interleaved, r), dtype)
    assert torch.equal(qo[..., r:], q[..., r:])


@pytest.mark.parametrize("layout", ["none", "shared", "varlen32", "varlen64"])
def test_positions(layout):
    import cute_kernels as ck

    dt = torch.bfloat16
    cos, sin = _tables(8192, 128)
    if layout.startswith("varlen"):
        lens = [5, 300, 1, 64]
        q, k = randn(sum(lens), 32, 128, dtype=dt), randn(sum(lens), 8, 128, dtype=dt)
        pos = torch.cat([torch.arange(n) + 17 * i for i, n in enumerate(lens)]).cuda()
        pos = pos.to(torch.int32 if layout == "varlen32" else torch.int64)
    else:
        q, k = randn(3, 129, 32, 128, dtype=dt), randn(3, 129, 8, 128, dtype=dt)
        pos = None if layout == "none" else torch.arange(1000, 1129, device="cuda")
    qo, ko = ck.rope(q, k, cos, sin, positions=pos)
    _within_ulp(qo, _ref64(q, cos, sin, pos, False, 128), dt)
    _within_ulp(ko, _ref64(k, cos, sin, pos, False, 128), dt)


@pytest.mark.parametrize("interleaved", [False, True])
def test_in_place_and_fused_qkv_views(interleaved):
    """q, k, v as views of one (T, (H_q + 2 H_k) D) projection output: rotated in place without copies; v and the
    dims past r untouched."""
    import cute_kernels as ck

    t, hq, hk, d, r = 1000, 32, 8, 128, 64
    qkv = randn(t, (hq + 2 * hk) * d, dtype=torch.bfloat16)
    before = qkv.clone()
    q = qkv[:, : hq * d].view(t, hq, d)
    k = qkv[:, hq * d: (hq + hk) * d].view(t, hk, d)
    cos, sin = _tables(t, r)
    pos = torch.arange(t, device="cuda")
    ref_q = _ref64(q, cos, sin, pos, interleaved, r)
    ref_k = _ref64(k, cos, sin, pos, interleaved, r)
    q2, k2 = ck.rope_(q, k, cos, sin, positions=pos, interleaved=interleaved, rotary_dim=r)
    assert q2 is q and k2 is k
    _within_ulp(q, ref_q, torch.bfloat16)
    _within_ulp(k, ref_k, torch.bfloat16)
    after = qkv.view(t, hq + 2 * hk, d)
    assert torch.equal(after[:, hq + hk:], before.view(t, hq + 2 * hk, d)[:, hq + hk:])  # v
    assert torch.equal(after[..., r:], before.view(t, hq + 2 * hk, d)[..., r:])  # pass-through dims


def test_awkward_layouts_and_edges():
    import cute_kernels as ck

    cos, sin = _tables(2048, 128)
    # a transposed (B, H, S, D) -> (B, S, H, D) view (head stride < token stride swapped), and a D stride of 2
    x = randn(2, 16, 769, 128, dtype=torch.bfloat16).transpose(1, 2)
    qo, _ = ck.rope(x, None, cos, sin)
    _within_ulp(qo, _ref64(x, cos, sin, None, False, 128), torch.bfloat16)
    y = randn(3, 5, 4, 256, dtype=torch.bfloat16)[..., ::2]
    qo, ko = ck.rope(y, y, cos, sin, interleaved=True)
    _within_ulp(qo, _ref64(y, cos, sin, None, True, 128), torch.bfloat16)
    z = y.clone()
    ck.rope_(z, None, cos, sin)
    _within_ulp(z, _ref64(y, cos, sin, None, False, 128), torch.bfloat16)
    # an odd offset (not 16-byte aligned): a narrower vector
    base = randn(1 + 7 * 3 * 128, dtype=torch.bfloat16)
    w = base[1:].view(7, 3, 128)
    qo, _ = ck.rope(w, None, cos, sin)
    _within_ulp(qo, _ref64(w, cos, sin, None, False, 128), torch.bfloat16)
    # empty and single-token inputs, five heads
    for t in (0, 1):
        a, b = randn(t, 5, 128), randn(t, 1, 128)
        qo, ko = ck.rope(a, b, cos, sin)
        _within_ulp(qo, _ref64(a, cos, sin, None, False, 128), torch.bfloat16)
        _within_ulp(ko, _ref64(b, cos, sin, None, False, 128), torch.bfloat16)


def test_positions_out_of_range():
    import cute_kernels as ck

    cos, sin = _tables(16, 64)
    q = randn(4, 2, 64)
    bad = torch.tensor([0, 3, 16, -1], device="cuda")
    with pytest.raises(ValueError, match=r"positions must lie in \[0, 16\)"):
        ck.rope(q, None, cos, sin, positions=bad, validate=True)
    qo, _ = ck.rope(q, None, cos, sin, positions=bad)  # clamped on the device: no fault
    assert torch.isfinite(qo).all()
    clamped = bad.clamp(0, 15)
    _within_ulp(qo, _ref64(q, cos, sin, clamped, False, 64), torch.bfloat16)


@pytest.mark.parametrize("interleaved", [False, True])
def test_backward(interleaved):
    import cute_kernels as ck

    cos, sin = _tables(512, 96)
    pos = torch.randint(0, 512, (2, 33), device="cuda")
    q = randn(2, 33, 4, 128, dtype=torch.float32).requires_grad_()
    k = randn(2, 33, 2, 128, dtype=torch.float32).requires_grad_()
    dq, dk = randn(2, 33, 4, 128, dtype=torch.float32), randn(2, 33, 2, 128, dtype=torch.float32)
    qo, ko = ck.rope(q, k, cos, sin, positions=pos, interleaved=interleaved, rotary_dim=96)
    gq, gk = torch.autograd.grad((qo, ko), (q, k), (dq, dk))
    q2, k2 = q.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    rq, rk = rope_reference(q2, k2, cos.double(), sin.double(), pos, interleaved, 96)
    eq, ek = torch.autograd.grad((rq, rk), (q2, k2), (dq.double(), dk.double()))
    _within_ulp(gq, eq, torch.float32)
    _within_ulp(gk, ek, torch.float32)


def test_torch_compile_and_cuda_graph():
    import cute_kernels as ck

    cos, sin = _tables(4096, 128)
    q, k = randn(2, 64, 8, 128), randn(2, 64, 2, 128)
    pos = torch.arange(64, device="cuda").expand(2, 64).contiguous()

    def f(q, k, pos):
        qo, ko = ck.rope(q, k, cos, sin, positions=pos)
        q2, k2 = q.clone(), k.clone()
        ck.rope_(q2, k2, cos, sin, positions=pos)
        return qo, ko, q2, k2

    out = torch.compile(f, fullgraph=True)(q, k, pos)
    ref_q, ref_k = _ref64(q, cos, sin, pos, False, 128), _ref64(k, cos, sin, pos, False, 128)
    for o, r in zip(out, (ref_q, ref_k, ref_q, ref_k)):
        _within_ulp(o, r, torch.bfloat16)

    qs, ks, ps = q.clone(), k.clone(), pos.clone()
    ck.rope_(qs.clone(), ks.clone(), cos, sin, positions=ps)  # compile outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ck.rope_(qs, ks, cos, sin, positions=ps)
    q_in, k_in = randn(2, 64, 8, 128), randn(2, 64, 2, 128)
    qs.copy_(q_in)
    ks.copy_(k_in)
    ps.add_(100)
    g.replay()
    _within_ulp(qs, _ref64(q_in, cos, sin, ps, False, 128), torch.bfloat16)
    _within_ulp(ks, _ref64(k_in, cos, sin, ps, False, 128), torch.bfloat16)


@pytest.mark.large
def test_index64():
    """More than 2^31 elements in q: the 64-bit variant."""
    import cute_kernels as ck

    t, h, d = (1 << 31) // (16 * 128) + 8, 16, 128
    q = torch.empty(t, h, d, dtype=torch.bfloat16, device="cuda").normal_()
    cos, sin = _tables(4096, 128)
    pos = torch.randint(0, 4096, (t,), device="cuda", dtype=torch.int32)
    ck.rope_(q[-3:], None, cos, sin, positions=pos[-3:])  # warm the 32-bit variant on a small view
    tail = q[-5:].clone()
    ck.rope_(q, None, cos, sin, positions=pos)
    _within_ulp(q[-5:], _ref64(tail, cos, sin, pos[-5:], False, 128), torch.bfloat16)
