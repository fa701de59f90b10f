"""GPU: `fp8_gemm_grouped_contiguous_swiglu` (the grouped FP8 GEMM with SwiGLU and the 1x128 e4m3 quantization in
its epilogue, a gate and an up CTA a cluster) bit for bit against the two ops it fuses: the bf16 grouped GEMM, then
`swiglu_quantize` of its halves. Every valid row compared (q as bytes, the scales exactly): experts with 0 rows,
odd counts, whole padding blocks, one and several column pairs, K = 128, both exchanges ("halves", "full") and no
exchange ("local": a 128 x 256 tile a CTA), B scales staged in smem and read from global, the fallback where I is off the 128-column block; the MoE layer's output
unchanged by the fusion."""

import pytest
import torch

from tests.helpers import randn

pytestmark = pytest.mark.gpu

ck = pytest.importorskip("cute_kernels")
from cute_kernels.fp8_gemm.ops import _contiguous_cuda, _glu_contiguous_cuda, contiguous_layout  # noqa: E402


def _inputs(rows_per_expert, i, k, extra_padding_blocks=0, seed=0):
    torch.manual_seed(seed)
    idx, _ = contiguous_layout(rows_per_expert)
    idx = torch.cat([idx, torch.full((128 * extra_padding_blocks,), -1, dtype=torch.int32)]).cuda()
    a, sa = ck.quantize_1x128(randn(idx.numel(), k))
    qs = [ck.quantize_128x128(randn(2 * i, k) * (1 + e)) for e in range(len(rows_per_expert))]
    return a, sa, torch.stack([q for q, _ in qs]), torch.stack([s for _, s in qs]), idx


def _unfused(a, sa, b, sb, idx):
    i = b.shape[1] // 2
    h = _contiguous_cuda(a, sa, b, sb, idx)
    return ck.swiglu_quantize(h[:, :i], h[:, i:])


def _same(got, want, idx):
    rows = idx >= 0
    (q, s), (q0, s0) = got, want
    assert q.shape == q0.shape and q.dtype == torch.float8_e4m3fn
    assert s.shape == s0.shape and s.stride() == s0.stride()
    assert torch.equal(s[rows], s0[rows]), "scales differ"
    qb, q0b = q.view(torch.uint8)[rows], q0.view(torch.uint8)[rows]
    bad = (qb != q0b).sum().item()
    assert bad == 0, f"{bad} of {qb.numel()} e4m3 bytes differ"


@pytest.mark.parametrize("exchange", ["halves", "full", "local"])
@pytest.mark.parametrize("rows,i,k", [([256, 128], 128, 512), ([130, 0, 257, 64], 256, 1024),
                                      ([1024] * 2, 2048, 7168), ([1, 3, 500], 384, 384), ([700] * 3, 256, 128)])
def test_bitwise_against_unfused(rows, i, k, exchange):
    """K = 128 (one K-block a tile) included: the shortest time between a peer's reuse of the exchange region."""
    a, sa, b, sb, idx = _inputs(rows, i, k)
    _same(_glu_contiguous_cuda(a, sa, b, sb, idx, exchange=exchange), _unfused(a, sa, b, sb, idx), idx)


@pytest.mark.parametrize("exchange", ["halves", "local"])
@pytest.mark.parametrize("sb_smem", [False, True])
def test_b_scales_staged_or_global(sb_smem, exchange, monkeypatch):
    import importlib

    ops = importlib.import_module("cute_kernels.fp8_gemm.ops")

    monkeypatch.setattr(ops, "GROUPED_SB_SMEM_DEFAULT", sb_smem)
    a, sa, b, sb, idx = _inputs([600, 300], 256, 2048, extra_padding_blocks=2, seed=1)
    _same(_glu_contiguous_cuda(a, sa, b, sb, idx, exchange=exchange), _unfused(a, sa, b, sb, idx), idx)


def test_fallback_off_block():
    """I = 192: not a whole number of 128-column blocks, the op runs the two ops it fuses."""
    a, sa, b, sb, idx = _inputs([200, 50], 192, 256)
    _same(ck.fp8_gemm_grouped_contiguous_swiglu(a, sa, b, sb, idx), _unfused(a, sa, b, sb, idx), idx)


def test_repeatable_and_graph_safe():
    a, sa, b, sb, idx = _inputs([512, 384], 256, 1024, seed=2)
    q1, s1 = ck.fp8_gemm_grouped_contiguous_swiglu(a, sa, b, sb, idx)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        q2, s2 = ck.fp8_gemm_grouped_contiguous_swiglu(a, sa, b, sb, idx)
    g.replay()
    torch.cuda.synchronize()
    rows = idx >= 0
    assert torch.equal(q1.view(torch.uint8)[rows], q2.view(torch.uint8)[rows]) and torch.equal(s1[rows], s2[rows])


def test_moe_layer_uses_it_unchanged():
    """ck.moe (contiguous layout) through the fused first GEMM equals the unfused experts' path bit for bit."""
    from cute_kernels.moe import ops as moe_ops
    from cute_kernels.moe.bench import _experts

    t, h, i, e, topk = 512, 512, 256, 8, 2
    w13, s13, w2, s2 = _experts(e, h, i)
    router = (randn(e, h, seed=4) * 0.05).bfloat16()
    x = randn(t, h, seed=5)
    fused = ck.moe(x, router, w13, s13, w2, s2, topk)
    saved = moe_ops.FUSED_GLU
    try:
        moe_ops.FUSED_GLU = False
        plain = ck.moe(x, router, w13, s13, w2, s2, topk)
    finally:
        moe_ops.FUSED_GLU = saved
    assert torch.equal(fused, plain)
