"""GPU: FlashAttention backward (dq, dk, dv) against FA's rule. With ref = the gradients of the attention computed in
fp32 from the same bf16/fp16 inputs and pt = the same computation by torch in the input dtype,

    max|grad - ref| <= 2 * max|pt - ref| + 2 * max|(ref + 0.3 - 0.3) - ref|   (the last in the input dtype)

per gradient, for masks (none, causal bottom-right, windows, band), GQA / MQA, head dims 64 / 96 / 128, fp16,
softcap, lengths 1 .. 4097 and S_q != S_k both ways, varlen with empty sequences, a gradient into the LSE,
zero-stride dO (`.sum().backward()`); deterministic mode bitwise over three runs. Gradients are poisoned (NaN)
through the allocator: an unwritten element fails the finiteness check."""

import math

import pytest
import torch

from tests.helpers import randn

pytestmark = pytest.mark.gpu

ck = pytest.importorskip("cute_kernels")


def _poison(nbytes):
    torch.cuda.empty_cache()
    torch.full((nbytes // 2 + 4096,), float("nan"), dtype=torch.bfloat16, device="cuda")
    torch.cuda.synchronize()


def _attn(q, k, v, left, right, scale, softcap, dtype):
    """(out, lse) with every op in `dtype`, differentiable; q (B, S_q, H, D), k / v (B, S_k, H_kv, D)."""
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    qh = q.to(dtype).transpose(1, 2)
    kh = k.to(dtype).repeat_interleave(hq // hk, 2).transpose(1, 2)
    vh = v.to(dtype).repeat_interleave(hq // hk, 2).transpose(1, 2)
    s = (qh @ kh.transpose(-1, -2)) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(sk, device=q.device)[None, :]
    off = sk - sq
    ok = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if right >= 0:
        ok &= j <= i + off + right
    if left >= 0:
        ok &= j >= i + off - left
    s = s.masked_fill(~ok, float("-inf"))
    lse = torch.logsumexp(s.float(), -1)
    p = torch.softmax(s.float(), -1).to(dtype)
    p = torch.where(ok.any(-1)[:, None], p, torch.zeros_like(p))
    out = (p @ vh).transpose(1, 2)
    return out, lse


def _grads(q, k, v, do, dlse, left, right, scale, softcap, dtype):
    qq, kk, vv = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    out, lse = _attn(qq, kk, vv, left, right, scale, softcap, dtype)
    loss = (out.float() * do.float()).sum()
    if dlse is not None:
        fin = torch.isfinite(lse)
        loss = loss + (torch.where(fin, lse, 0) * dlse).sum()
    return [g.float() for g in torch.autograd.grad(loss, (qq, kk, vv))]


def _bound(ref, pt, dtype):
    ref_lp = ref.to(dtype)
    atol = 2 * ((ref_lp + 0.3 - 0.3) - ref_lp).abs().max().item()
    return 2 * (pt - ref).abs().max().item() + atol + 1e-6


def _assert_grads(got, ref, pt, dtype):
    """Every element written and finite; each gradient within FA's bound of the fp32 reference."""
    for name, g, r, p in zip(("dq", "dk", "dv"), got, ref, pt):
        assert torch.isfinite(g).all(), f"{name}: unwritten (NaN) or overflowed elements"
        err = (g - r).abs().max().item()
        bound = _bound(r, p, dtype)
        assert err <= bound, f"{name}: max error {err:.3e} > bound {bound:.3e} (torch {dtype}: {(p - r).abs().max():.3e})"


def _check(b, sq, sk, hq, hk, d, causal=False, window=(-1, -1), softcap=0.0, dtype=torch.bfloat16, with_lse=False,
           deterministic=False, zero_stride=False):
    torch.manual_seed(sq * 7 + sk + d + hq)
    torch.backends.cuda.matmul.allow_tf32 = False
    q = randn(b, sq, hq, d, dtype=dtype).requires_grad_()
    k = randn(b, sk, hk, d, dtype=dtype).requires_grad_()
    v = randn(b, sk, hk, d, dtype=dtype).requires_grad_()
    out, lse = ck.flash_attn(q, k, v, causal=causal, window=window, softcap=softcap, return_lse=True,
                             deterministic=deterministic)
    do = torch.ones_like(out) if zero_stride else randn(*out.shape, dtype=dtype)
    dlse = randn(*lse.shape, dtype=torch.float32) if with_lse else None
    _poison(3 * q.numel() * 2 + 2 * k.numel() * 4)
    if zero_stride:
        out.float().sum().backward()
        got = [q.grad.float(), k.grad.float(), v.grad.float()]
    else:
        outs = (out, lse) if with_lse else (out,)
        grads = (do, dlse) if with_lse else (do,)
        got = [g.float() for g in torch.autograd.grad(outs, (q, k, v), grads)]
    left, right = window[0], 0 if causal else window[1]
    scale = 1 / math.sqrt(d)
    ref = _grads(q, k, v, do, dlse, left, right, scale, softcap, torch.float32)
    pt = _grads(q, k, v, do, dlse, left, right, scale, softcap, dtype)
    _assert_grads(got, ref, pt, dtype)
    return got


@pytest.mark.parametrize("seq", [1, 17, 128, 1000, 4097])
@pytest.mark.parametrize("causal", [False, True])
def test_lengths_d128(seq, causal):
    _check(1 if seq > 1000 else 2, seq, seq, 2, 2, 128, causal=causal)


@pytest.mark.parametrize("sq,sk", [(100, 300), (300, 100), (1, 129), (513, 64)])
@pytest.mark.parametrize("causal", [False, True])
def test_seqlen_q_ne_k(sq, sk, causal):
    _check(2, sq, sk, 2, 2, 128, causal=causal)


# a pairwise cover of head dim x dtype x mask x softcap x GQA ratio (every pair of values in some case)
PAIRWISE = [
    (64, torch.bfloat16, "none", 0.0, 1),
    (64, torch.float16, "causal", 30.0, 2),
    (64, torch.bfloat16, "window", 0.0, 4),
    (64, torch.float16, "band", 0.0, 8),
    (96, torch.bfloat16, "causal", 0.0, 8),
    (96, torch.float16, "none", 0.0, 4),
    (96, torch.bfloat16, "band", 30.0, 1),
    (96, torch.float16, "window", 30.0, 2),
    (128, torch.float16, "none", 30.0, 8),
    (128, torch.bfloat16, "causal", 0.0, 4),
    (128, torch.float16, "window", 0.0, 1),
    (128, torch.bfloat16, "band", 0.0, 2),
    (128, torch.bfloat16, "causal", 0.0, 16),  # MQA (16 query heads, one K/V head)
    (192, torch.bfloat16, "causal", 0.0, 2),
    (192, torch.float16, "band", 30.0, 1),
    (256, torch.float16, "none", 30.0, 1),
    (256, torch.bfloat16, "window", 0.0, 4),
    (256, torch.bfloat16, "causal", 0.0, 8),
]


@pytest.mark.parametrize("d,dtype,mask,softcap,ratio", PAIRWISE)
def test_pairwise(d, dtype, mask, softcap, ratio):
    causal = mask == "causal"
    window = {"none": (-1, -1), "causal": (-1, -1), "window": (100, 37), "band": (64, 0)}[mask]
    _check(2, 333, 401, 2 * ratio if ratio < 16 else 16, 2 if ratio < 16 else 1, d, causal=causal, window=window,
           softcap=softcap, dtype=dtype)


def test_grad_into_lse():
    _check(2, 200, 257, 4, 2, 128, causal=True, with_lse=True)


def test_zero_stride_dout():
    _check(1, 130, 130, 2, 1, 64, zero_stride=True)


@pytest.mark.parametrize("d", [192, 256])
@pytest.mark.parametrize("seq", [17, 1000])
def test_head_dim_split(d, seq):
    _check(1, seq, seq + 3, 2, 1, d, causal=seq > 100)


@pytest.mark.parametrize("d,causal", [(128, True), (64, False), (256, True)])
def test_deterministic_bitwise(d, causal):
    runs = [_check(2, 1000, 1000, 4, 2, d, causal=causal, deterministic=True) for _ in range(3)]
    for g in range(3):
        assert torch.equal(runs[0][g], runs[1][g]) and torch.equal(runs[0][g], runs[2][g]), ("dq", "dk", "dv")[g]


@pytest.mark.parametrize("causal", [False, True])
def test_deterministic_long(causal):
    """Deterministic mode at 16384 rows (256 query blocks of 64 rows, 128 key blocks, four heads): every element written,
    the gradients those of the nondeterministic backward of the same inputs up to summation order (its own accuracy is
    tested above), and twice bitwise."""
    from cute_kernels.attention.ops import _flash_attn_bwd_cuda

    b, s, h, d = 1, 16384, 4, 128
    torch.manual_seed(5)
    q, k, v = (randn(b, s, h, d) for _ in range(3))
    out, lse = ck.flash_attn(q, k, v, causal=causal, return_lse=True)
    do = randn(*out.shape)
    ref = _flash_attn_bwd_cuda(do, q, k, v, out, lse, None, causal)
    runs = []
    for _ in range(2):
        _poison(3 * q.numel() * 2)
        runs.append(_flash_attn_bwd_cuda(do, q, k, v, out, lse, None, causal, deterministic=True))
    for name, g, r in zip(("dq", "dk", "dv"), runs[0], ref):
        assert torch.isfinite(g).all(), name
        err = (g.float() - r.float()).abs().max().item()
        assert err <= 2e-2 * r.float().abs().max().item(), (name, err)
    assert all(torch.equal(a, c) for a, c in zip(runs[0], runs[1]))


@pytest.mark.parametrize("d,fields,det", [(64, {"dq_split": "k"}, False), (64, {"dq_split": "k"}, True),
                                         (64, {"early_stats": True}, False), (128, {"early_stats": False}, False),
                                         (128, {"dq_buffers": 2}, True), (64, {"tile_m": 128, "p_smem": True}, False),
                                         (64, {"tile_m": 128, "p_smem": True, "stages": 1}, True),
                                         (128, {"p_smem": True}, False)])
def test_schedule_options(d, fields, det):
    """Schedule options off the defaults (the quick suite's columns), through the backward op directly."""
    import dataclasses

    from cute_kernels.attention.ops import _flash_attn_bwd_cuda
    from schedules.attention_bwd import default_bwd_schedule

    torch.manual_seed(d)
    q, k, v = (randn(2, 700, 4, d) for _ in range(3))
    k, v = k[:, :, :2].contiguous(), v[:, :, :2].contiguous()
    out, lse = ck.flash_attn(q, k, v, causal=True, return_lse=True)
    do = randn(*out.shape)
    sched = dataclasses.replace(default_bwd_schedule(d), **fields)
    _poison(3 * q.numel() * 2)
    got = [g.float() for g in _flash_attn_bwd_cuda(do, q, k, v, out, lse, None, True, deterministic=det,
                                                     schedule=sched)]
    args = (q, k, v, do, None, -1, 0, 1 / math.sqrt(d), 0.0)
    _assert_grads(got, _grads(*args, torch.float32), _grads(*args, torch.bfloat16), torch.bfloat16)
    if det:
        again = _flash_attn_bwd_cuda(do, q, k, v, out, lse, None, True, deterministic=True, schedule=sched)
        assert all(torch.equal(a.float(), b) for a, b in zip(again, got))


def _varlen_ref(q, k, v, do, cu_q, cu_k, causal, window, d, dtype):
    grads = [torch.zeros_like(t, dtype=torch.float32) for t in (q, k, v)]
    ptg = [torch.zeros_like(t, dtype=torch.float32) for t in (q, k, v)]
    left, right = window[0], 0 if causal else window[1]
    for i in range(len(cu_q) - 1):
        a, e = cu_q[i], cu_q[i + 1]
        c, f = cu_k[i], cu_k[i + 1]
        if e == a or f == c:
            continue
        args = (q[None, a:e], k[None, c:f], v[None, c:f], do[None, a:e], None, left, right, 1 / math.sqrt(d), 0.0)
        for dst, dt in ((grads, torch.float32), (ptg, dtype)):
            gq, gk, gv = _grads(*args, dt)
            dst[0][a:e] += gq[0]
            dst[1][c:f] += gk[0]
            dst[2][c:f] += gv[0]
    return grads, ptg


@pytest.mark.parametrize("causal,window,d,tail", [(False, (-1, -1), 128, (0, 0)), (True, (-1, -1), 64, (37, 130)),
                                                  (False, (50, 20), 96, (0, 0)), (False, (-1, -1), 256, (200, 3))])
def test_varlen(causal, window, d, tail):
    """Packed sequences with empty ones; `tail`: rows of Q and of K / V past the last sequence (their gradients 0)."""
    torch.manual_seed(5)
    lens_q = [100, 0, 257, 1, 64, 300]
    lens_k = [90, 40, 257, 0, 200, 300]
    dtype = torch.bfloat16
    cu_q = [0]
    cu_k = [0]
    for a, b in zip(lens_q, lens_k):
        cu_q.append(cu_q[-1] + a)
        cu_k.append(cu_k[-1] + b)
    hq, hk = 4, 2
    q = randn(cu_q[-1] + tail[0], hq, d, dtype=dtype).requires_grad_()
    k = randn(cu_k[-1] + tail[1], hk, d, dtype=dtype).requires_grad_()
    v = randn(cu_k[-1] + tail[1], hk, d, dtype=dtype).requires_grad_()
    tq = torch.tensor(cu_q, dtype=torch.int32, device="cuda")
    tk = torch.tensor(cu_k, dtype=torch.int32, device="cuda")
    out = ck.flash_attn_varlen(q, k, v, tq, tk, max(lens_q), max(lens_k), causal=causal, window=window)
    do = randn(*out.shape, dtype=dtype)
    _poison(3 * q.numel() * 2)
    got = [g.float() for g in torch.autograd.grad(out, (q, k, v), do)]
    ref, pt = _varlen_ref(q, k, v, do, cu_q, cu_k, causal, window, d, dtype)
    _assert_grads(got, ref, pt, dtype)


def test_bad_dout():
    q = randn(1, 64, 2, 64).requires_grad_()
    k = randn(1, 64, 2, 64).requires_grad_()
    v = randn(1, 64, 2, 64).requires_grad_()
    out = ck.flash_attn(q, k, v)
    with pytest.raises(ValueError, match="dout must have the output's shape"):
        torch.ops.cute_kernels.flash_attn_bwd(out[:, :32], q, k, v, out, torch.zeros(1, 2, 64, device="cuda"))
    with pytest.raises(TypeError, match="dout has dtype float32"):
        torch.ops.cute_kernels.flash_attn_bwd(out.float(), q, k, v, out, torch.zeros(1, 2, 64, device="cuda"))


SWEEP = [(d, dt, mask, cap, det) for d in (64, 96, 128, 192, 256) for dt in (torch.bfloat16, torch.float16)
         for mask in ("none", "causal", "window", "band") for cap in (0.0, 30.0) for det in (False, True)]


@pytest.mark.sweep
@pytest.mark.parametrize("d,dtype,mask,softcap,det", SWEEP)
def test_whole_product(d, dtype, mask, softcap, det):
    """Every combination of head dim, dtype, mask, softcap and mode (`pytest -m sweep`), GQA 2, S_q != S_k."""
    window = {"none": (-1, -1), "causal": (-1, -1), "window": (90, 30), "band": (70, 0)}[mask]
    _check(1, 211, 300, 4, 2, d, causal=mask == "causal", window=window, softcap=softcap, dtype=dtype,
           deterministic=det)
