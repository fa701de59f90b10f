"""GPU: the KV-append kernel and the fused decode RoPE + append. Appended rows equal the torch path bit for bit (bf16,
FP8 per head and per token, contiguous and paged) and nothing else in the cache changes; with RoPE, q and k are the
fp64 rotation within one ulp (FP8: the torch quantization of the fp32 rotation, at most one e4m3 step apart in a few
elements); `flash_attn_with_kvcache(rotary_cos=...)` matches rotating first; torch.compile and CUDA-graph capture."""

import pytest
import torch

from cute_kernels.attention.decode_ops import FP8_KV, _append_torch, fp8_scale, to_fp8
from cute_kernels.rope.ops import rope_reference, rope_tables
from tests.helpers import EPS, randn

pytestmark = pytest.mark.gpu


def _cache(b, hk, d, paged, fp8, cap=512, page=64):
    """(k_cache, v_cache, block_table or None) filled with random values; pages shuffled."""
    dt = FP8_KV if fp8 else torch.bfloat16
    if paged:
        per = cap // page
        n = b * per + 3
        kc = randn(n, page, hk, d).to(dt)
        vc = randn(n, page, hk, d).to(dt)
        table = torch.randperm(n, device="cuda")[: b * per].view(b, per).to(torch.int32)
        return kc, vc, table
    return randn(b, cap, hk, d).to(dt), randn(b, cap, hk, d).to(dt), None


def _scales(kind, kc):
    if kind == "none":
        return None, None
    if kind == "head":
        return (torch.rand(kc.shape[2], device="cuda") + 0.01, torch.rand(kc.shape[2], device="cuda") + 0.01)
    return (torch.rand(kc.shape[:3], device="cuda") + 0.01, torch.rand(kc.shape[:3], device="cuda") + 0.01)


def _same(a, b):
    if a.dtype == FP8_KV:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    return torch.equal(a, b)


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("kind", ["none", "head", "token"])
@pytest.mark.parametrize("q_len", [1, 5])
def test_append_matches_torch_bitwise(paged, kind, q_len):
    from cute_kernels.attention.decode_ops import append_kv

    b, hk, d = 3, 8, 128
    kc, vc, table = _cache(b, hk, d, paged, kind != "none")
    ks, vs = _scales(kind, kc)
    lens = torch.tensor([0, 17, 500 - q_len], dtype=torch.int32, device="cuda")
    k, v = randn(b, q_len, hk, d), randn(b, q_len, hk, d)
    k[0, 0, 1] = 0.0  # an all-zero row gets scale 1
    ref = [t.clone() for t in (kc, vc)] + [None if s is None else s.clone() for s in (ks, vs)]
    _append_torch(ref[0], ref[1], k, v, lens, table, ref[2], ref[3])
    append_kv(kc, vc, k, v, lens, table, ks, vs)
    assert _same(kc, ref[0]) and _same(vc, ref[1])
    if kind == "token":
        assert torch.equal(ks, ref[2]) and torch.equal(vs, ref[3])


def _rot64(x, cos, sin, pos, interleaved, r):
    out, _ = rope_reference(x.double(), None, cos.double(), sin.double(), pos, interleaved, r)
    return out


def _within_ulp(out, ref, dtype=torch.bfloat16):
    err = (out.double() - ref).abs()
    bound = 2 * EPS[dtype] * ref.abs() + torch.finfo(dtype).tiny
    assert not (err > bound).any(), f"worst {err.max().item():.3g}"


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("r", [128, 64])
@pytest.mark.parametrize("q_len", [1, 4])
def test_rope_kv_append_bf16(paged, interleaved, r, q_len):
    import cute_kernels as ck

    b, hq, hk, d = 3, 32, 8, 128
    kc, vc, table = _cache(b, hk, d, paged, False)
    before = (kc.clone(), vc.clone())
    cos, sin = rope_tables(4096, r, device="cuda")
    lens = torch.tensor([0, 100, 511 - q_len], dtype=torch.int32, device="cuda")
    q, k, v = randn(b, q_len, hq, d), randn(b, q_len, hk, d), randn(b, q_len, hk, d)
    qo = ck.rope_kv_append(q, k, v, kc, vc, lens, cos, sin, block_table=table, interleaved=interleaved,
                           rotary_dim=r)
    pos = lens.long()[:, None] + torch.arange(q_len, device="cuda")
    _within_ulp(qo, _rot64(q, cos, sin, pos, interleaved, r))
    # the rotated k rounded once in the appended rows, v as given, every other row as before
    rows = _rows(pos, table, kc)
    _within_ulp(kc[rows], _rot64(k, cos, sin, pos, interleaved, r))
    assert torch.equal(vc[rows], v)
    mask = torch.ones(kc.shape[:3], dtype=torch.bool, device="cuda")
    mask[rows] = False
    assert torch.equal(kc[mask], before[0][mask]) and torch.equal(vc[mask], before[1][mask])


def _rows(pos, table, kc):
    """The cache (page, row) index tensors of tokens at positions `pos` (B, q_len)."""
    if table is None:
        return (torch.arange(pos.shape[0], device="cuda")[:, None].expand_as(pos), pos)
    page = kc.shape[1]
    return (table.long().gather(1, pos // page), pos % page)


@pytest.mark.parametrize("kind", ["head", "token"])
def test_rope_kv_append_fp8(kind):
    import cute_kernels as ck

    b, hq, hk, d, q_len = 2, 16, 4, 128, 2
    kc, vc, table = _cache(b, hk, d, True, True)
    ks, vs = _scales(kind, kc)
    cos, sin = rope_tables(4096, d, device="cuda")
    lens = torch.tensor([3, 200], dtype=torch.int32, device="cuda")
    q, k, v = randn(b, q_len, hq, d), randn(b, q_len, hk, d), randn(b, q_len, hk, d)
    ck.rope_kv_append(q, k, v, kc, vc, lens, cos, sin, block_table=table, k_scale=ks, v_scale=vs)
    pos = lens.long()[:, None] + torch.arange(q_len, device="cuda")
    kr = _rot64(k, cos, sin, pos, False, d).float()  # the fp32 rotation, quantized without a bf16 rounding
    rows = _rows(pos, table, kc)
    if kind == "head":
        exp = to_fp8(kr, ks[None, None, :, None])
    else:
        s_tok = fp8_scale(kr.abs().amax(dim=-1))
        torch.testing.assert_close(ks[rows], s_tok, rtol=1e-6, atol=0)
        exp = to_fp8(kr, s_tok[..., None])
    got = kc[rows].float()
    steps = (got - exp.float()).abs() / (exp.float().abs() * 2 ** -3 + 2 ** -9)
    assert (steps <= 1.01).all() and (got != exp.float()).float().mean() < 0.01
    exp_v = to_fp8(v, vs[None, None, :, None]) if kind == "head" else to_fp8(v, fp8_scale(v.float().abs().amax(-1))[..., None])
    assert torch.equal(vc[rows].view(torch.uint8), exp_v.view(torch.uint8))


def test_kvcache_rotary_matches_rotating_first():
    import cute_kernels as ck

    b, hq, hk, d, q_len = 2, 32, 8, 128, 1
    kc, vc, table = _cache(b, hk, d, True, False, cap=1024)
    kc2, vc2 = kc.clone(), vc.clone()
    cos, sin = rope_tables(2048, d, 500000.0, device="cuda")
    lens = torch.tensor([37, 900], dtype=torch.int32, device="cuda")
    q, k, v = randn(b, q_len, hq, d), randn(b, q_len, hk, d), randn(b, q_len, hk, d)
    out = ck.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, block_table=table, causal=True,
                                     rotary_cos=cos, rotary_sin=sin)
    pos = lens.long()[:, None] + torch.arange(q_len, device="cuda")
    qr, kr = ck.rope(q, k, cos, sin, positions=pos)
    ref = ck.flash_attn_with_kvcache(qr, kc2, vc2, kr, v, cache_seqlens=lens, block_table=table, causal=True)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


def test_decode_step_compiles_and_captures():
    import cute_kernels as ck

    b, hq, hk, d = 4, 32, 8, 128
    kc, vc, _ = _cache(b, hk, d, False, False, cap=256)
    cos, sin = rope_tables(256, d, device="cuda")
    lens = torch.tensor([1, 5, 9, 100], dtype=torch.int32, device="cuda")

    def step(q, k, v, lens):
        qr = ck.rope_kv_append(q, k, v, kc, vc, lens, cos, sin)
        return ck.flash_attn_with_kvcache(qr, kc, vc, cache_seqlens=lens + 1)

    q, k, v = randn(b, 1, hq, d), randn(b, 1, hk, d), randn(b, 1, hk, d)
    kc0, vc0 = kc.clone(), vc.clone()
    eager = step(q, k, v, lens)
    kc.copy_(kc0)
    vc.copy_(vc0)
    comp = torch.compile(step, fullgraph=True)(q, k, v, lens)
    torch.testing.assert_close(comp, eager, rtol=0, atol=0)
    kc.copy_(kc0)
    vc.copy_(vc0)
    qs, ks_, vs_, ls = q.clone(), k.clone(), v.clone(), lens.clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = step(qs, ks_, vs_, ls)
    kc.copy_(kc0)
    vc.copy_(vc0)
    g.replay()
    torch.testing.assert_close(out, eager, rtol=0, atol=0)
