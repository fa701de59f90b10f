"""GPU: FlashAttention varlen (packed sequences, cu_seqlens) against FA3's rule, sequence by sequence:
with ref the attention of each sequence alone in fp32 and pt the same in the input dtype (both from
tests/attention/test_forward_gpu.py's `_attention`), max|out - ref| <= 2 max|pt - ref| + 2 ulp-ish, over the
whole packed output; the LSE (H_q, total_q) to 1e-3 (+inf for rows that see no key).

Lengths include 0 (no q rows, or no keys: O = 0, LSE = +inf), 1, 17 and 1000, q and k lengths that
differ per sequence (causal is bottom-right aligned in each), GQA, windows, the other schedules, a
max_seqlen_q above the longest sequence (more CTAs skip). Outputs are poisoned (NaN through the
allocator). Neighbours: a partial last q tile must not write past its sequence's end: a sentinel
buffer keeps its pattern outside the sequences' rows, and a sequence written first keeps its
values when its left neighbour (whose last tile overlaps it) is computed afterwards."""

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


def _cu(lengths):
    c = [0]
    for n in lengths:
        c.append(c[-1] + n)
    return torch.tensor(c, dtype=torch.int32, device="cuda")


def _reference(q, k, v, cu_q, cu_k, left, right, scale, softcap, dtype):
    """Per sequence, the batched reference of tests/attention/test_forward_gpu.py: (out (total_q, H, D) fp32,
    lse (H, total_q) fp32); rows outside the sequences stay NaN."""
    from tests.attention.test_forward_gpu import _attention

    out = torch.full(q.shape, float("nan"), dtype=torch.float32, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("nan"), dtype=torch.float32, device=q.device)
    cq, ck_ = cu_q.tolist(), cu_k.tolist()
    for b in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[b], cq[b + 1], ck_[b], ck_[b + 1]
        if q1 == q0:
            continue
        o, s = _attention(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], left, right, scale, softcap, dtype)
        out[q0:q1] = o[0]
        lse[:, q0:q1] = s[0]
    return out, lse


def _check(lq, lk, hq=6, hk=2, d=64, causal=False, window=(-1, -1), softmax_scale=None, softcap=0.0, schedule=None,
           extra_max_q=0, dtype=torch.bfloat16):
    torch.backends.cuda.matmul.allow_tf32 = False
    cu_q, cu_k = _cu(lq), _cu(lk)
    tq, tk = sum(lq), sum(lk)
    q, k, v = randn(tq, hq, d, dtype=dtype), randn(tk, hk, d, dtype=dtype), randn(tk, hk, d, dtype=dtype)
    _poison(q.numel() * 2 + tq * hq * 4)
    max_q, max_k = max(lq) + extra_max_q, max(lk)
    if schedule is None:
        out, lse = ck.flash_attn_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal, window=window,
                                        softmax_scale=softmax_scale, softcap=softcap, return_lse=True)
    else:
        from cute_kernels.attention.ops import _flash_attn_varlen_cuda

        out, lse = _flash_attn_varlen_cuda(q, k, v, cu_q, cu_k, max_q, max_k, causal, window[0], window[1],
                                           softmax_scale, softcap, schedule=schedule)
    left, right = window[0], 0 if causal else window[1]
    scale = softmax_scale or 1 / math.sqrt(d)
    ref, lse_ref = _reference(q, k, v, cu_q, cu_k, left, right, scale, softcap, torch.float32)
    pt, _ = _reference(q, k, v, cu_q, cu_k, left, right, scale, softcap, q.dtype)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (hq, tq) and lse.dtype == torch.float32
    assert torch.isfinite(out).all(), "unwritten (NaN) or overflowed output elements"
    ref_lp = ref.to(q.dtype)
    atol = 2 * ((ref_lp + 0.3 - 0.3) - ref_lp).abs().max().item()
    err = (out.float() - ref).abs().max().item()
    bound = 2 * (pt - ref).abs().max().item() + atol
    assert err <= bound, f"max err {err:.3e} > {bound:.3e} (pt err {(pt - ref).abs().max().item():.3e})"
    torch.testing.assert_close(lse, lse_ref, atol=1e-3, rtol=1e-4)
    return q, k, v, cu_q, cu_k, out, lse


def _schedule(name, d):
    from tests.attention.test_forward_gpu import _schedule as sched

    return sched(name, d)


LENGTHS = {  # name: (q lengths, k lengths)
    "uneven": ([17, 1000, 1, 0, 130, 5], [17, 1000, 1, 3, 200, 5]),
    "q_ne_k": ([1000, 17, 300, 1], [17, 1000, 129, 64]),  # causal: rows before the diagonal see no key
    "keyless": ([5, 40, 0, 200], [0, 40, 0, 0]),  # O = 0 and LSE = +inf for sequences without keys
}
MASKS = {
    "none": (False, (-1, -1)),
    "causal": (True, (-1, -1)),
    "window": (False, (64, 32)),
    "causal_left": (True, (50, -1)),
}


def test_smoke_finishes():
    """First: one small causal varlen launch (a hang here points at the skip of tiles past a
    sequence's end, or at the per-sequence block ranges); run the file under `timeout` with -x."""
    _check([17, 300, 0, 1], [17, 100, 5, 1], causal=True)
    torch.cuda.synchronize()


@pytest.mark.parametrize("lengths", list(LENGTHS))
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("d", [64, 128])
def test_lengths_masks_gqa(d, mask, lengths):
    lq, lk = LENGTHS[lengths]
    causal, window = MASKS[mask]
    _check(lq, lk, d=d, causal=causal, window=window)


@pytest.mark.parametrize("d,causal", [(96, False), (256, True)])
def test_head_dims_fp16_softcap(d, causal):
    _check([1000, 17, 1], [900, 17, 1], hq=4, hk=4, d=d, causal=causal, dtype=torch.float16)
    _check([257, 64, 65], [300, 64, 65], hq=4, hk=1, d=d, softmax_scale=0.3, softcap=5.0)


@pytest.mark.parametrize("name", ["fa3_overlap", "fa3_overlap_nopp", "fa3_m64", "fa2", "fa2_m64_s1"])
def test_schedules(name):
    for d, mask in ((64, "causal"), (128, "window")):
        causal, window = MASKS[mask]
        lq, lk = LENGTHS["uneven"]
        _check(lq, lk, d=d, causal=causal, window=window, schedule=_schedule(name, d))


def test_max_seqlen_above_the_longest_and_many_sequences():
    """A grid wider than every sequence (most CTAs skip), and 64 random lengths in [0, 300]."""
    _check([17, 1, 129], [40, 1, 129], causal=True, extra_max_q=1000)
    g = torch.Generator().manual_seed(0)
    lq = torch.randint(0, 301, (64,), generator=g).tolist()
    lk = torch.randint(0, 301, (64,), generator=g).tolist()
    _check(lq, lk, causal=True)
    _check(lq, lk, window=(100, 0))


def test_strided_packed_qkv():
    """q, k, v as slices of one packed (total, 3, H, D) tensor: read in place."""
    lq = [100, 333, 7]
    cu = _cu(lq)
    qkv = randn(sum(lq), 3, 4, 128)
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    out = ck.flash_attn_varlen(q, k, v, cu, cu, max(lq), max(lq), causal=True)
    ref, _ = _reference(q, k, v, cu, cu, -1, 0, 1 / math.sqrt(128), 0.0, torch.float32)
    pt, _ = _reference(q, k, v, cu, cu, -1, 0, 1 / math.sqrt(128), 0.0, q.dtype)
    assert (out.float() - ref).abs().max().item() <= 2 * (pt - ref).abs().max().item() + 2e-2


# --- neighbours: nothing past a sequence's end is written --------------------------------------------
SENTINEL = -1232.0  # exact in bf16 (and fp16): compared bit for bit


@pytest.mark.parametrize("name", ["default", "fa3_overlap", "fa2", "fa3_m64"])
def test_rows_outside_the_sequences_keep_a_sentinel(name):
    """cu_seqlens_q = [100, 117, 117, 118, 1118] in a 1300-row buffer: rows 0..99 and 1118..1299 keep
    the sentinel (the 17-row sequence's tile would reach row 227, the 1000-row one's row 1141 + 64),
    the sequences' rows are attention, and the LSE outside the sequences stays NaN (poisoned)."""
    from cute_kernels.attention.ops import _flash_attn_varlen_cuda

    sched = None if name == "default" else _schedule(name, 128)
    total = 1300
    cu_q = torch.tensor([100, 117, 117, 118, 1118], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 40, 41, 41, 1041], dtype=torch.int32, device="cuda")
    q, k, v = randn(total, 4, 128), randn(1100, 2, 128), randn(1100, 2, 128)
    buf = torch.full((total, 4, 128), SENTINEL, dtype=torch.bfloat16, device="cuda")
    _poison(total * 4 * 4)
    out, lse = _flash_attn_varlen_cuda(q, k, v, cu_q, cu_k, 1000, 1000, True, schedule=sched, out=buf)
    assert out.data_ptr() == buf.data_ptr()
    assert (buf[:100] == SENTINEL).all() and (buf[1118:] == SENTINEL).all(), "rows past a sequence were written"
    assert torch.isnan(lse[:, :100]).all() and torch.isnan(lse[:, 1118:]).all(), "LSE written outside the sequences"
    assert torch.isfinite(buf[100:1118]).all()
    ref, lse_ref = _reference(q, k, v, cu_q, cu_k, -1, 0, 1 / math.sqrt(128), 0.0, torch.float32)
    pt, _ = _reference(q, k, v, cu_q, cu_k, -1, 0, 1 / math.sqrt(128), 0.0, q.dtype)
    err = (buf[100:1118].float() - ref[100:1118]).abs().max().item()
    assert err <= 2 * (pt[100:1118] - ref[100:1118]).abs().max().item() + 2e-2
    torch.testing.assert_close(lse[:, 100:1118], lse_ref[:, 100:1118], atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("name", ["default", "fa2"])
def test_left_neighbour_does_not_clobber(name):
    """Sequence B = rows [17, 1017) is computed first, then its left neighbour A = rows [0, 17) (whose
    one q tile covers rows 0..127) into the same buffer: B's rows must still be B's attention, bit
    for bit."""
    from cute_kernels.attention.ops import _flash_attn_varlen_cuda

    sched = None if name == "default" else _schedule(name, 64)
    q, k, v = randn(1017, 2, 64), randn(1017, 2, 64), randn(1017, 2, 64)
    buf = torch.full((1017, 2, 64), SENTINEL, dtype=torch.bfloat16, device="cuda")
    cu_b = torch.tensor([17, 1017], dtype=torch.int32, device="cuda")
    cu_a = torch.tensor([0, 17], dtype=torch.int32, device="cuda")
    _flash_attn_varlen_cuda(q, k, v, cu_b, cu_b, 1000, 1000, schedule=sched, out=buf)
    b_rows = buf[17:].clone()
    assert (buf[:17] == SENTINEL).all()
    _flash_attn_varlen_cuda(q, k, v, cu_a, cu_a, 17, 17, schedule=sched, out=buf)
    assert torch.equal(buf[17:], b_rows), "the left neighbour's last tile overwrote the next sequence's rows"
    assert torch.isfinite(buf[:17]).all()


def test_empty_batch_and_no_keys_at_all():
    q = randn(10, 2, 64)
    cu0 = torch.zeros(1, dtype=torch.int32, device="cuda")
    out, lse = ck.flash_attn_varlen(q, q, q, cu0, cu0, 0, 0, return_lse=True)  # B = 0: nothing to do
    assert out.shape == (10, 2, 64) and lse.shape == (2, 10)
    k = randn(0, 2, 64)
    cu_q, cu_k = _cu([4, 6]), torch.zeros(3, dtype=torch.int32, device="cuda")
    out, lse = ck.flash_attn_varlen(q, k, k, cu_q, cu_k, 6, 0, return_lse=True)
    assert (out == 0).all() and (lse == float("inf")).all()


def test_autograd_and_compile():
    lq = [64, 17]
    cu = _cu(lq)
    q, k, v = (randn(81, 2, 64).requires_grad_() for _ in range(3))
    out = ck.flash_attn_varlen(q, k, v, cu, cu, 64, 64, causal=True)
    out.float().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    f = torch.compile(lambda a, b, c: ck.flash_attn_varlen(a, b, c, cu, cu, 64, 64, causal=True), fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(f(q, k, v), ck.flash_attn_varlen(q, k, v, cu, cu, 64, 64, causal=True), atol=0,
                                   rtol=0)
