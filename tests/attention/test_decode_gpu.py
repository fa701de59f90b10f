"""GPU: decode attention (`ck.flash_attn_with_kvcache`) against an fp32 reference built from the gathered pages,
with the forward's rule: max|out - ref| <= 2 max|pt - ref| + 2 ulp-ish (pt: the same attention in the input dtype),
the LSE to 1e-3. Contiguous and paged caches (pages 16 to 256, off-tile lengths, cache_seqlens varying per entry
with 0 and 1), GQA 1-16, q_len 1-16 causal and not, windows, softcap, forced splits 1 / 2 / 7 / max, the in-place
append into a NaN-poisoned cache (exactly its rows written; NaN rows past the lengths never reach O), unwritten
outputs caught by poisoning the allocator, a CUDA-graph-captured decode loop, torch.compile; and the attention-state
merges against an fp64 reference, empty states included."""

import math

import pytest
import torch

from tests.attention._decode_ref import (
    decode_reference,
    dequantize_cache,
    merge_reference,
    quantize_cache,
)
from tests.helpers import poison_empty, randn

pytestmark = pytest.mark.gpu

ck = pytest.importorskip("cute_kernels")


def _bound(out, ref, pt, dtype):
    err_pt = (pt - ref).abs().max().item() if ref.numel() else 0.0
    eps = ((ref.to(dtype) + 0.3 - 0.3).float() - ref).abs().max().item() if ref.numel() else 0.0
    err = (out.float() - ref).abs().max().item() if ref.numel() else 0.0
    assert err <= 2 * err_pt + 2 * eps + 1e-6, f"max err {err} > 2 * {err_pt} + 2 * {eps}"


def _cache(b, length, hk, d, page, dtype, poison=True, seed=None):
    """(k_cache, v_cache, block_table): contiguous (B, length, H, D) for page None, else a shuffled pool of pages
    (with spare pages) and a table mapping each sequence's pages; the unused pages and rows are NaN when `poison`
    (nothing past a sequence's length may reach O)."""
    if page is None:
        k = randn(b, length, hk, d, dtype=dtype, seed=seed)
        v = randn(b, length, hk, d, dtype=dtype, seed=None if seed is None else seed + 1)
        return k, v, None
    per = -(-length // page)
    pool = b * per + 3
    k = randn(pool, page, hk, d, dtype=dtype, seed=seed)
    v = randn(pool, page, hk, d, dtype=dtype, seed=None if seed is None else seed + 1)
    perm = torch.randperm(pool, device="cuda")[: b * per].int()
    return k, v, perm.view(b, per).contiguous()


def _poison_past(k_cache, v_cache, block_table, seqlens, *more):
    """NaN into every cache row at or past each sequence's length (and every page no table row uses); the same rows
    of `more` (per-token scales)."""
    def nan(t, idx):  # (e4m3 has no masked fill: its NaN bits 0x7f through a byte view)
        if t.dtype == torch.float8_e4m3fn:
            t.view(torch.uint8)[idx] = 0x7F
        else:
            t[idx] = float("nan")

    if block_table is None:
        for i, n in enumerate(seqlens.tolist()):
            for t in (k_cache, v_cache, *more):
                nan(t, (i, slice(n, None)))
        return
    page = k_cache.shape[1]
    used = torch.zeros(k_cache.shape[0], page, dtype=torch.bool, device="cuda")
    for i, n in enumerate(seqlens.tolist()):
        for r in range(n):
            used[block_table[i, r // page], r % page] = True
    for t in (k_cache, v_cache, *more):
        nan(t, ~used)


def _run(b=2, q_len=1, hq=32, hk=8, d=128, length=1000, page=None, seqlens=None, causal=False, window=(-1, -1),
         softcap=0.0, dtype=torch.bfloat16, num_splits=None, poison=True, fp8=None, schedule=None):
    """One call against the fp32 reference; `fp8` ("head" / "token"): the cache quantized to e4m3 with its scales,
    the reference built from the dequantized cache (and the torch comparison computing in `dtype` from it).
    `schedule`: a DecodeSchedule forced (the op's implementation called directly), else the op's choice."""
    q = randn(b, q_len, hq, d, dtype=dtype)
    k_cache, v_cache, table = _cache(b, length, hk, d, page, dtype)
    cap = length if page is None else table.shape[1] * page
    if seqlens is None:
        seqlens = torch.randint(0, cap + 1, (b,), device="cuda", dtype=torch.int32)
    seqlens = torch.as_tensor(seqlens, dtype=torch.int32, device="cuda")
    scales = {}
    if fp8:
        (k_cache, ks), (v_cache, vs) = quantize_cache(k_cache, fp8), quantize_cache(v_cache, fp8)
        scales = dict(k_scale=ks, v_scale=vs)
    if poison:
        _poison_past(k_cache, v_cache, table, seqlens, *(scales.values() if fp8 == "token" else ()))
    if schedule is None:
        out, lse = ck.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table,
                                              causal=causal, window=window, softcap=softcap, num_splits=num_splits,
                                              return_lse=True, **scales)
    else:
        from cute_kernels.attention.decode_ops import _flash_attn_with_kvcache_cuda

        left, right = window
        out, lse = _flash_attn_with_kvcache_cuda(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table,
                                                 causal=causal, window_left=left, window_right=right,
                                                 softcap=softcap, num_splits=num_splits, schedule=schedule, **scales)
    if fp8:
        k_cache, v_cache = dequantize_cache(k_cache, scales["k_scale"]), dequantize_cache(v_cache, scales["v_scale"])
    ref, ref_lse = decode_reference(q, k_cache, v_cache, seqlens, table, causal, window, softcap)
    pt, pt_lse = decode_reference(q, k_cache, v_cache, seqlens, table, causal, window, softcap, dtype=dtype)
    assert out.shape == q.shape and out.dtype == dtype and lse.shape == (b, hq, q_len)
    assert torch.isfinite(out).all(), "non-finite output (an unwritten element or a poisoned row reached O)"
    _bound(out, ref, pt, dtype)
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), fin), "keyless rows must get LSE = +inf, the others a finite LSE"
    assert (lse[~fin] == float("inf")).all()
    if fin.any():  # 1e-3, or twice the LSE error of the same computation in `dtype` torch (FP8 caches: K * scale)
        pt_err = (pt_lse.float()[fin] - ref_lse[fin]).abs().max().item()
        assert (lse[fin] - ref_lse[fin]).abs().max().item() < max(1e-3, 2 * pt_err)
    return out, lse


@pytest.fixture(autouse=True)
def _poisoned(monkeypatch):
    poison_empty(monkeypatch)


@pytest.mark.parametrize("page", [None, 16, 64, 256, 48])
@pytest.mark.parametrize("q_len,causal", [(1, False), (4, True), (16, True), (3, False)])
def test_contiguous_and_paged(page, q_len, causal):
    _run(b=3, q_len=q_len, length=1000, page=page, seqlens=[0, 1, 777] if q_len == 1 else None, causal=causal)


@pytest.mark.parametrize("hq,hk", [(8, 8), (16, 1), (32, 8), (12, 4), (40, 8)])
def test_gqa_ratios(hq, hk):
    _run(b=2, q_len=2, hq=hq, hk=hk, length=700, page=32, causal=True)


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_head_dims_and_dtypes(d, dtype):
    _run(b=2, q_len=1, d=d, length=2049, page=None, dtype=dtype, seqlens=[2049, 1300])
    _run(b=2, q_len=5, d=d, length=513, page=64, dtype=dtype, causal=True)


@pytest.mark.parametrize("window,causal", [((100, -1), False), ((64, 0), False), ((0, 0), False), ((300, -1), True),
                                           ((-1, 2), False)])
def test_windows(window, causal):
    _run(b=2, q_len=4, length=1500, page=16, window=window, causal=causal, seqlens=[1500, 333])


def test_softcap():
    _run(b=2, q_len=2, length=900, page=64, softcap=30.0, causal=True)
    _run(b=1, q_len=1, length=900, page=None, softcap=5.0)


def test_forced_splits_agree():
    """Splits 1, 2, 7 and the most there are tiles for: each within the rule, and within a few bf16 ulps of
    the one-split answer."""
    torch.manual_seed(0)
    outs = []
    for splits in (1, 2, 7, 64):
        torch.manual_seed(0)
        outs.append(_run(b=2, q_len=2, length=8000, page=64, seqlens=[8000, 3001], num_splits=splits,
                         causal=True)[0].float())
    for o in outs[1:]:
        assert (o - outs[0]).abs().max().item() <= 2 ** -6


def test_long_sequence_default_splits():
    _run(b=1, q_len=1, length=32768, page=None, seqlens=[32768])
    _run(b=1, q_len=1, length=32768, page=64, seqlens=[32000])


def test_append_writes_exactly_its_rows():
    """k / v appended at cache_seqlens .. + q_len in place (contiguous and paged), nothing else of the cache
    changed (NaN rows included, compared bit for bit), then attended with the new length."""
    for page in (None, 16, 64):
        b, q_len, hq, hk, d, length = 3, 4, 16, 4, 128, 300
        q = randn(b, q_len, hq, d)
        k_cache, v_cache, table = _cache(b, length, hk, d, page, torch.bfloat16)
        seqlens = torch.tensor([0, 17, 296], dtype=torch.int32, device="cuda")
        after = seqlens + q_len
        _poison_past(k_cache, v_cache, table, seqlens)
        k_new, v_new = randn(b, q_len, hk, d), randn(b, q_len, hk, d)
        k_before, v_before = k_cache.clone(), v_cache.clone()
        out, lse = ck.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens,
                                              block_table=table, causal=True, return_lse=True)
        assert torch.equal(seqlens, torch.tensor([0, 17, 296], dtype=torch.int32, device="cuda")), "modified"
        k_want, v_want = k_before.clone(), v_before.clone()
        for i in range(b):
            for t in range(q_len):
                p = int(seqlens[i]) + t
                if page is None:
                    k_want[i, p], v_want[i, p] = k_new[i, t], v_new[i, t]
                else:
                    k_want[table[i, p // page], p % page] = k_new[i, t]
                    v_want[table[i, p // page], p % page] = v_new[i, t]
        assert torch.equal(k_cache.view(torch.int16), k_want.view(torch.int16))
        assert torch.equal(v_cache.view(torch.int16), v_want.view(torch.int16))
        ref, _ = decode_reference(q, k_cache, v_cache, after, table, causal=True)
        pt, _ = decode_reference(q, k_cache, v_cache, after, table, causal=True, dtype=torch.bfloat16)
        assert torch.isfinite(out).all()
        _bound(out, ref, pt, torch.bfloat16)


# --- FP8 KV ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fp8", ["head", "token"])
@pytest.mark.parametrize("page,q_len,causal", [(None, 1, False), (64, 4, True), (16, 3, False), (48, 16, True)])
def test_fp8_kv(fp8, page, q_len, causal):
    _run(b=3, q_len=q_len, length=1000, page=page, seqlens=[0, 1, 777] if q_len == 1 else None, causal=causal,
         fp8=fp8)


@pytest.mark.parametrize("fp8", ["head", "token"])
@pytest.mark.parametrize("d,dtype", [(64, torch.bfloat16), (256, torch.float16), (128, torch.float16)])
def test_fp8_kv_head_dims(fp8, d, dtype):
    _run(b=2, q_len=2, hq=16, hk=2, d=d, length=2049, page=None, dtype=dtype, seqlens=[2049, 1300], causal=True,
         fp8=fp8)


@pytest.mark.parametrize("fp8", ["head", "token"])
def test_fp8_kv_window_softcap_splits(fp8):
    _run(b=2, q_len=4, length=1500, page=32, window=(300, 0), softcap=20.0, seqlens=[1500, 333], fp8=fp8)
    outs = []
    for sp in (1, 7, 40):
        torch.manual_seed(0)  # the same inputs for every split count
        outs.append(_run(b=1, q_len=1, length=6000, page=None, seqlens=[5999], num_splits=sp, fp8=fp8)[0].float())
    for o in outs[1:]:
        assert (o - outs[0]).abs().max().item() <= 2 ** -6


@pytest.mark.parametrize("fp8", ["head", "token"])
@pytest.mark.parametrize("page,q_len", [(None, 1), (64, 4)])
def test_fp8_kv_rows_in_m(fp8, page, q_len):
    """The FP8 path that widens K and V into fp16 smem tiles (rows in M), forced where the op would swap."""
    from schedules.decode import DecodeSchedule

    _run(b=3, q_len=q_len, length=1000, page=page, seqlens=[0, 1, 777] if q_len == 1 else None, causal=True,
         fp8=fp8, schedule=DecodeSchedule())


# --- swapped operands (keys in M, packed rows in N) -----------------------------------------------------------------
@pytest.mark.parametrize("fp8", [None, "head", "token"])
@pytest.mark.parametrize("swap,page,q_len,hq,hk,causal", [
    (8, None, 1, 32, 8, False), (8, 64, 2, 16, 4, True), (16, 16, 4, 32, 8, True), (16, 48, 1, 16, 1, False),
    (16, None, 3, 20, 4, True), (8, 256, 1, 8, 8, False)])
def test_swapped_operands(fp8, swap, page, q_len, hq, hk, causal):
    from schedules.decode import DecodeSchedule

    _run(b=3, q_len=q_len, hq=hq, hk=hk, length=1000, page=page, seqlens=[0, 1, 777] if q_len == 1 else None,
         causal=causal, fp8=fp8, schedule=DecodeSchedule(swap_rows=swap))


@pytest.mark.parametrize("fp8,d,dtype", [(None, 64, torch.bfloat16), (None, 256, torch.float16),
                                         ("head", 256, torch.bfloat16), ("token", 256, torch.float16),
                                         ("token", 128, torch.float16)])
def test_swapped_operands_head_dims(fp8, d, dtype):
    from schedules.decode import DecodeSchedule

    _run(b=2, q_len=2, hq=16, hk=2, d=d, length=2049, page=None, dtype=dtype, seqlens=[2049, 1300], causal=True,
         fp8=fp8, schedule=DecodeSchedule(tile_n=128 if d <= 128 else 64, swap_rows=16))


@pytest.mark.parametrize("fp8", [None, "head", "token"])
def test_swapped_operands_window_softcap_splits(fp8):
    from schedules.decode import DecodeSchedule

    _run(b=2, q_len=4, length=1500, page=32, window=(300, 0), softcap=20.0, seqlens=[1500, 333], fp8=fp8,
         schedule=DecodeSchedule(swap_rows=16))
    outs = []
    for sp in (1, 7, 40):
        torch.manual_seed(0)
        outs.append(_run(b=1, q_len=1, length=6000, page=None, seqlens=[5999], num_splits=sp, fp8=fp8,
                         schedule=DecodeSchedule(swap_rows=8))[0].float())
    for o in outs[1:]:
        assert (o - outs[0]).abs().max().item() <= 2 ** -6
    # the fused last-CTA merge
    _run(b=2, q_len=1, length=3000, page=64, seqlens=[3000, 10], num_splits=5, fp8=fp8,
         schedule=DecodeSchedule(swap_rows=8, fused_merge=True))


def test_swapped_operands_rows_bound():
    """A forced swap_rows narrower than q_len x g is refused with a named error."""
    from cute_kernels.attention.decode_ops import _flash_attn_with_kvcache_cuda
    from schedules.decode import DecodeSchedule

    q = randn(1, 4, 32, 128)
    k, v, _ = _cache(1, 256, 8, 128, None, torch.bfloat16)
    with pytest.raises(ValueError, match="swap_rows=8"):
        _flash_attn_with_kvcache_cuda(q, k, v, schedule=DecodeSchedule(swap_rows=8))


@pytest.mark.parametrize("fp8", ["head", "token"])
@pytest.mark.parametrize("page", [None, 64])
def test_fp8_append(fp8, page):
    """bf16 k / v appended into an FP8 cache: quantized with the per-head scale, or with a fresh per-token scale
    (amax / 448) written into the scale tensors at those rows; nothing else of the cache or the scales changed."""
    b, q_len, hq, hk, d, length = 3, 2, 16, 4, 128, 300
    q = randn(b, q_len, hq, d)
    k16, v16, table = _cache(b, length, hk, d, page, torch.bfloat16)
    (kc, ks), (vc, vs) = quantize_cache(k16, fp8), quantize_cache(v16, fp8)
    seqlens = torch.tensor([0, 17, 298], dtype=torch.int32, device="cuda")
    k_new, v_new = randn(b, q_len, hk, d) * 3, randn(b, q_len, hk, d)
    before = [t.clone() for t in (kc, vc, ks, vs)]
    out = ck.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=seqlens, block_table=table, k_scale=ks,
                                     v_scale=vs, causal=True)
    want = [t.clone() for t in before]
    for i in range(b):
        for t in range(q_len):
            p = int(seqlens[i]) + t
            row = (i, p) if page is None else (int(table[i, p // page]), p % page)
            for c, sc, new in ((0, 2, k_new), (1, 3, v_new)):
                x = new[i, t].float()
                if fp8 == "token":
                    s = x.abs().amax(-1) / 448.0
                    want[sc][row] = s
                else:
                    s = want[sc][:, None]
                want[c][row] = (x / (s[:, None] if fp8 == "token" else s)).clamp(-448, 448).to(torch.float8_e4m3fn)
    for got, w in zip((kc, vc), want[:2]):
        assert torch.equal(got.view(torch.uint8), w.view(torch.uint8))
    for got, w in zip((ks, vs), want[2:]):
        assert torch.equal(got, w)
    after = seqlens + q_len
    kd, vd = dequantize_cache(kc, ks), dequantize_cache(vc, vs)
    ref, _ = decode_reference(q, kd, vd, after, table, causal=True)
    pt, _ = decode_reference(q, kd, vd, after, table, causal=True, dtype=torch.bfloat16)
    _bound(out, ref, pt, torch.bfloat16)


def test_fp8_kv_graph_and_compile():
    """An FP8 per-token decode step with append, captured in a CUDA graph and under torch.compile: the eager bits."""
    b, hq, hk, d, page = 2, 16, 4, 128, 64
    k16, v16, table = _cache(b, 512, hk, d, page, torch.bfloat16, poison=False)
    (kc, ks), (vc, vs) = quantize_cache(k16, "token"), quantize_cache(v16, "token")
    lens = torch.tensor([100, 400], dtype=torch.int32, device="cuda")
    q, k_new, v_new = randn(b, 1, hq, d), randn(b, 1, hk, d), randn(b, 1, hk, d)
    state = [t.clone() for t in (kc, vc, ks, vs)]

    def step(kc, vc, ks, vs):
        return ck.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens, block_table=table, k_scale=ks,
                                          v_scale=vs)

    eager = step(*state)
    for fresh in (True, False):
        st = [t.clone() for t in (kc, vc, ks, vs)]
        if fresh:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                step(*[t.clone() for t in st])
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                got = step(*st)
            g.replay()
            torch.cuda.synchronize()
        else:
            got = torch.compile(step, fullgraph=True)(*st)
        assert torch.equal(got, eager)
        for a, e in zip(st, state):
            assert torch.equal(a.view(torch.uint8), e.view(torch.uint8))


def test_no_seqlens_means_full_cache():
    q = randn(2, 1, 8, 128)
    k, v, _ = _cache(2, 500, 2, 128, None, torch.bfloat16)
    out = ck.flash_attn_with_kvcache(q, k, v)
    full = torch.full((2,), 500, dtype=torch.int32, device="cuda")
    ref, _ = decode_reference(q, k, v, full)
    pt, _ = decode_reference(q, k, v, full, dtype=torch.bfloat16)
    _bound(out, ref, pt, torch.bfloat16)


def test_strided_q():
    """q as a slice of a wider tensor (a fused QKV projection's output): read in place."""
    qkv = randn(2, 1, 48, 128)
    q = qkv[:, :, :32]
    k, v, table = _cache(2, 640, 8, 128, 64, torch.bfloat16)
    lens = torch.tensor([640, 100], dtype=torch.int32, device="cuda")
    out = ck.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table)
    ref, _ = decode_reference(q, k, v, lens, table)
    pt, _ = decode_reference(q, k, v, lens, table, dtype=torch.bfloat16)
    _bound(out, ref, pt, torch.bfloat16)


def test_cuda_graph_decode_loop():
    """Four decode steps (append one token, attend, advance the lengths on the device) captured once and
    replayed: the same outputs as the eager loop."""
    b, hq, hk, d, page = 4, 16, 4, 128, 64
    k_cache, v_cache, table = _cache(b, 1024, hk, d, page, torch.bfloat16, poison=False)
    lens0 = torch.tensor([5, 100, 700, 1000], dtype=torch.int32, device="cuda")
    qs = [randn(b, 1, hq, d) for _ in range(4)]
    ks = [randn(b, 1, hk, d) for _ in range(4)]
    vs = [randn(b, 1, hk, d) for _ in range(4)]

    def loop(kc, vc, lens, outs):
        for i in range(4):
            outs[i].copy_(ck.flash_attn_with_kvcache(qs[i], kc, vc, ks[i], vs[i], cache_seqlens=lens,
                                                     block_table=table, causal=True))
            lens.add_(1)

    kc, vc, lens = k_cache.clone(), v_cache.clone(), lens0.clone()
    eager = [torch.empty(b, 1, hq, d, dtype=torch.bfloat16, device="cuda") for _ in range(4)]
    loop(kc, vc, lens, eager)
    kc2, vc2, lens2 = k_cache.clone(), v_cache.clone(), lens0.clone()
    graphed = [torch.empty(b, 1, hq, d, dtype=torch.bfloat16, device="cuda") for _ in range(4)]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up (compiles) outside the capture, then restore the state
        loop(kc2, vc2, lens2, graphed)
    torch.cuda.current_stream().wait_stream(s)
    kc2.copy_(k_cache)
    vc2.copy_(v_cache)
    lens2.copy_(lens0)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        loop(kc2, vc2, lens2, graphed)
    kc2.copy_(k_cache)
    vc2.copy_(v_cache)
    lens2.copy_(lens0)
    g.replay()
    torch.cuda.synchronize()
    for a, e in zip(graphed, eager):
        assert torch.equal(a, e)
    assert torch.equal(lens2, lens0 + 4)


def test_torch_compile():
    q = randn(2, 1, 16, 128)
    k, v, table = _cache(2, 512, 4, 128, 32, torch.bfloat16, poison=False)
    lens = torch.tensor([512, 30], dtype=torch.int32, device="cuda")

    @torch.compile(fullgraph=True)
    def f(q, k, v, lens):
        return ck.flash_attn_with_kvcache(q * 2, k, v, cache_seqlens=lens, block_table=table) + 1

    out = f(q, k, v, lens)
    want = ck.flash_attn_with_kvcache(q * 2, k, v, cache_seqlens=lens, block_table=table) + 1
    assert torch.equal(out, want)


def test_validate():
    q = randn(1, 1, 8, 64)
    k, v, table = _cache(1, 128, 2, 64, 16, torch.bfloat16, poison=False)
    bad = table.clone()
    bad[0, 3] = 10_000
    with pytest.raises(ValueError, match=r"block_table\[0, 3\]"):
        ck.flash_attn_with_kvcache(q, k, v, cache_seqlens=torch.tensor([128], dtype=torch.int32, device="cuda"),
                                   block_table=bad, validate=True)
    with pytest.raises(ValueError, match="cache_seqlens"):
        ck.flash_attn_with_kvcache(q, k, v, cache_seqlens=torch.tensor([129], dtype=torch.int32, device="cuda"),
                                   block_table=table, validate=True)


# --- the merges ---------------------------------------------------------------------------------------------------
def _states(n, b, s, h, d, dtype=torch.float32, empties=True):
    o = randn(n, b, s, h, d, dtype=dtype)
    lse = randn(n, b, h, s, dtype=torch.float32) * 3
    if empties:
        lse[0, 0, 0, :] = float("inf")  # empty states of both signs
        lse[-1, 0, 1, :] = float("-inf")
        lse[:, -1, -1, -1] = float("inf")  # one row with only empty states
        o[0, 0, :, 0] = float("nan")  # an empty state's O is never read
    return o, lse


def _check_merge(out, out_lse, o, lse):
    ref, ref_lse = merge_reference(o, lse)
    tol = 1e-5 if out.dtype == torch.float32 else 2 ** -7
    assert torch.isfinite(out).all()
    assert (out.double() - ref).abs().max().item() <= tol * max(1.0, ref.abs().max().item())
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(out_lse), fin) and (out_lse[~fin] == float("inf")).all()
    assert (out_lse[fin].double() - ref_lse[fin]).abs().max().item() < 1e-5


@pytest.mark.parametrize("n", [1, 2, 5, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_merge_many(n, dtype):
    o, lse = _states(n, 3, 7, 4, 128, dtype)
    out, out_lse = ck.merge_attention_states_many(o, lse)
    assert out.dtype == dtype and out.shape == (3, 7, 4, 128) and out_lse.shape == (3, 4, 7)
    _check_merge(out, out_lse, o, lse)


@pytest.mark.parametrize("lanes,chunk", [(1, 1), (1, 8), (2, 8), (4, 2), (8, 4), (32, 1)])
@pytest.mark.parametrize("n", [3, 37])
def test_merge_schedules(lanes, chunk, n):
    """Every (lanes, chunk) merge schedule, with fewer states than lanes x chunk and with a ragged last chunk,
    rows past the last CTA's end included (7 x 5 x 3 rows)."""
    from cute_kernels.attention import MERGE_STATES
    from schedules.decode import MergeSchedule

    o, lse = _states(n, 7, 5, 3, 128)
    out = torch.full((7, 5, 3, 128), float("nan"), device="cuda")
    out_lse = torch.full((7, 3, 5), float("nan"), device="cuda")
    fn = MERGE_STATES.compiled(MergeSchedule(lanes=lanes, chunk=chunk), in_dtype="fp32", out_dtype="fp32",
                               head_dim=128)
    fn(o, lse, out, out_lse)
    _check_merge(out, out_lse, o, lse)


@pytest.mark.parametrize("d", [64, 96, 256])
def test_merge_two_strided(d):
    """Two states in flash_attn's layouts, from transposed (B, H, S, D) tensors and a transposed LSE."""
    o, lse = _states(2, 2, 9, 6, d)
    oa = o[0].transpose(1, 2).contiguous().transpose(1, 2)
    la = lse[0].transpose(1, 2).contiguous().transpose(1, 2)
    out, out_lse = ck.merge_attention_states(oa, la, o[1], lse[1])
    _check_merge(out, out_lse, o, lse)


def test_merge_is_the_attention_of_the_union():
    """Two halves of the keys, each attended by flash_attn with its LSE, merged: the attention over all keys."""
    q, k, v = randn(2, 33, 8, 128), randn(2, 1000, 8, 128), randn(2, 1000, 8, 128)
    o1, l1 = ck.flash_attn(q, k[:, :400], v[:, :400], return_lse=True)
    o2, l2 = ck.flash_attn(q, k[:, 400:], v[:, 400:], return_lse=True)
    out, lse = ck.merge_attention_states(o1.float(), l1, o2.float(), l2)
    full, full_lse = ck.flash_attn(q, k, v, return_lse=True)
    assert (out - full.float()).abs().max().item() < 2e-2
    assert (lse - full_lse).abs().max().item() < 1e-3


def test_merge_empty_inputs():
    o = torch.empty(0, 2, 3, 4, 64, device="cuda")
    out, lse = ck.merge_attention_states_many(o, torch.empty(0, 2, 4, 3, device="cuda"))
    assert (out == 0).all() and (lse == math.inf).all()


@pytest.mark.parametrize("page", [None, 32])
def test_merge_kernel_schedule_matches_fused(page):
    """The split kernel's fused last-CTA merge (`fused_merge=True`) against the default merge kernel: the same merge
    code (folding the states in chunks of another size: equal within rounding)."""
    from cute_kernels.attention.decode_ops import _flash_attn_with_kvcache_cuda
    from schedules.decode import DecodeSchedule

    q = randn(3, 3, 32, 128)
    k, v, table = _cache(3, 4000, 8, 128, page, torch.bfloat16)
    lens = torch.tensor([4000, 0, 2500], dtype=torch.int32, device="cuda")
    _poison_past(k, v, table, lens)
    a = _flash_attn_with_kvcache_cuda(q, k, v, cache_seqlens=lens, block_table=table, causal=True, num_splits=6)
    b = _flash_attn_with_kvcache_cuda(q, k, v, cache_seqlens=lens, block_table=table, causal=True, num_splits=6,
                                      schedule=DecodeSchedule(fused_merge=True))
    assert (a[0].float() - b[0].float()).abs().max().item() <= 2 ** -8 * a[0].float().abs().max().item()
    fin = torch.isfinite(a[1])
    assert torch.equal(fin, torch.isfinite(b[1])) and torch.equal(a[1][~fin], b[1][~fin])
    assert (a[1][fin] - b[1][fin]).abs().max().item() < 1e-5
    ref, _ = decode_reference(q, k, v, lens, table, causal=True)
    pt, _ = decode_reference(q, k, v, lens, table, causal=True, dtype=torch.bfloat16)
    _bound(a[0], ref, pt, torch.bfloat16)
