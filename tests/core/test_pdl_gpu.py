"""GPU: chains of our kernels launched back to back as programmatic dependents (collectives.pdl) give the same bits as
the same ops with the device synchronized between them, eager and replayed from a CUDA graph. A kernel that reads
its input before its predecessor has finished (a missing or misplaced griddepcontrol.wait) shows here as a
difference: every op in the chain is deterministic, so nothing else can make the bits differ."""

from __future__ import annotations

import pytest
import torch

import cute_kernels as ck
from cute_kernels.w4a16.pack import pack_int4
from tests.helpers import randn

pytestmark = pytest.mark.gpu
H, I, HQ, HK, D = 2048, 5632, 16, 4, 128


@pytest.fixture(scope="module")
def params():
    w1 = randn(2 * I, H, seed=1) * 0.02
    w3 = randn(H, H, seed=3) * 0.02
    return {"wn": randn(H, seed=4), "w1": w1, "w2": pack_int4(randn(H, I, seed=2) * 0.02, 128, symmetric=True),
            "w3": w3, "wqkv": randn((HQ + 2 * HK) * D, H, seed=5) * 0.02, "wo": randn(H, HQ * D, seed=6) * 0.02}


def _mlp_chain(x, p, step):
    """norm -> GEMM (bf16) -> SwiGLU on its strided halves -> W4A16 GEMM -> fused residual norm -> GEMM -> add; `step`
    runs after each op (a device sync, or nothing)."""
    h = ck.rms_norm(x, p["wn"], 1e-5)
    step()
    y = ck.gemm(h, p["w1"].t())
    step()
    g = ck.swiglu(y[:, :I], y[:, I:])
    step()
    z = ck.gemm_w4a16(g, *p["w2"], 128)
    step()
    h2, s = ck.rms_norm(z, p["wn"], 1e-5, residual=x)
    step()
    o = ck.gemm(h2, p["w3"].t())
    step()
    return ck.add(o, s)


def _attn_chain(x, p, cache, step):
    """QKV GEMM -> decode attention over the cache (RoPE, append, split KV and the merge) -> output GEMM."""
    kc, vc, lens, cos, sin = cache
    b = x.shape[0]
    qkv = ck.gemm(x, p["wqkv"].t()).view(b, 1, HQ + 2 * HK, D)
    step()
    o = ck.flash_attn_with_kvcache(qkv[:, :, :HQ], kc, vc, qkv[:, :, HQ:HQ + HK], qkv[:, :, HQ + HK:],
                                   cache_seqlens=lens, causal=True, rotary_cos=cos, rotary_sin=sin)
    step()
    return ck.gemm(o.reshape(b, HQ * D), p["wo"].t())


def _sync():
    torch.cuda.synchronize()


def _nothing():
    pass


def _same_bits(a, b):
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("m", [1, 8, 300, 2048])
def test_mlp_chain_same_bits_as_synchronized(params, m):
    x = randn(m, H, seed=10 + m)
    ref = _mlp_chain(x, params, _sync)
    torch.cuda.synchronize()
    for _ in range(3):
        assert _same_bits(_mlp_chain(x, params, _nothing), ref)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        _mlp_chain(x, params, _nothing)  # warm (allocations) outside the capture
        with torch.cuda.graph(g, stream=s):
            out = _mlp_chain(x, params, _nothing)
    torch.cuda.current_stream().wait_stream(s)
    for _ in range(5):
        out.fill_(float("nan"))
        g.replay()
        assert _same_bits(out, ref)


@pytest.mark.parametrize("b,ctx", [(1, 4000), (4, 700)])
def test_decode_attention_chain_same_bits_as_synchronized(params, b, ctx):
    from cute_kernels.rope.ops import rope_tables

    cos, sin = rope_tables(8192, D, 500000.0, device="cuda")
    kc0, vc0 = randn(b, ctx + 8, HK, D, seed=20), randn(b, ctx + 8, HK, D, seed=21)
    lens = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
    x = randn(b, H, seed=22)

    def run(step):
        kc, vc = kc0.clone(), vc0.clone()
        torch.cuda.synchronize()
        return _attn_chain(x, params, (kc, vc, lens, cos, sin), step), kc, vc

    ref, rk, rv = run(_sync)
    for _ in range(3):
        got, gk, gv = run(_nothing)
        assert _same_bits(got, ref) and _same_bits(gk, rk) and _same_bits(gv, rv)
