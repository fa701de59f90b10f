"""GPU: `split_mask` and `sum_from_corr` (docs/kernels/attention.md, "How it got here":
"The loop").

* split_mask walks the same blocks in the same order with the same operations as the one-buffer
  overlap default, only in three loops (key end / right edge, interior, left edge) instead of one
  with a per-block mask branch: O and LSE equal the default's bit for bit, batched and varlen, causal,
  windows, band, softcap, GQA/MQA, lengths 1, 77, 1000 and 8192 (not multiples of the tiles), S_q !=
  S_k, a window with keyless rows, ping-pong on and off.
* sum_from_corr adds the block's probabilities to l * corr (another rounding of l): FA3's rule
  against an fp64 reference (max|out - ref| <= 2 max|pt - ref| + 2 ulp-ish, pt = torch in bf16), the
  LSE to 1e-3, alone and with split_mask.
Outputs are poisoned through the allocator (an unwritten element shows up as NaN)."""

import itertools
import math

import pytest
import torch

from tests.attention.test_forward_gpu import _attention, _poison
from tests.helpers import randn

pytestmark = pytest.mark.gpu

ck = pytest.importorskip("cute_kernels")


def _sched(d, **kw):
    from schedules.attention import AttentionSchedule, default_schedule

    return AttentionSchedule(tile_n=default_schedule(d).tile_n, overlap=True, **kw)


def _run(q, k, v, causal, left, right, softcap, sched):
    from cute_kernels.attention.ops import _flash_attn_cuda

    _poison(q.numel() * 2 + q.shape[0] * q.shape[1] * q.shape[2] * 4)
    out, lse = _flash_attn_cuda(q, k, v, causal, left, right, None, softcap, schedule=sched)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all(), "unwritten (NaN) or overflowed output elements"
    return out, lse


# (causal, (left, right), S_q, S_k, H_q, H_kv, D, softcap)
BITWISE_CASES = [
    (False, (-1, -1), 1000, 1000, 4, 2, 128, 0.0),
    (True, (-1, -1), 1000, 1000, 4, 2, 128, 0.0),
    (True, (-1, -1), 77, 1000, 4, 1, 128, 0.0),  # causal, S_q < S_k: every q tile sees a long interior
    (True, (-1, -1), 1000, 77, 4, 4, 64, 0.0),  # S_q > S_k: keyless rows at the top
    (False, (-1, -1), 1, 8192, 8, 2, 128, 0.0),  # one query row, 64 blocks
    (False, (-1, -1), 8192, 1, 2, 2, 128, 0.0),
    (True, (-1, -1), 8192, 8192, 2, 1, 128, 0.0),
    (False, (256, 0), 8192, 8192, 2, 2, 128, 0.0),  # causal + left: three loops
    (False, (64, 32), 777, 777, 4, 2, 64, 0.0),  # band narrower than a block: everything on an edge
    (False, (300, -1), 1000, 1000, 4, 2, 96, 0.0),  # left-bounded window only
    (False, (-1, 200), 1000, 1000, 4, 2, 128, 0.0),  # right-bounded only, past the diagonal
    (True, (-1, -1), 1000, 1000, 4, 2, 128, 5.0),  # softcap
    (False, (200, -1), 1000, 1000, 4, 2, 192, 0.0),  # D = 192: the left edge shares the interior loop
    (True, (-1, -1), 1000, 1000, 4, 2, 192, 0.0),
]


def _id(c):
    return f"c{int(c[0])}-w{c[1][0]}_{c[1][1]}-{c[2]}x{c[3]}-h{c[4]}_{c[5]}-d{c[6]}" + ("-cap" if c[7] else "")


@pytest.mark.parametrize("case", BITWISE_CASES, ids=[_id(c) for c in BITWISE_CASES])
def test_split_mask_bitwise(case):
    causal, (left, right), sq, sk, hq, hk, d, cap = case
    b = 1 if max(sq, sk) >= 8192 else 2
    q, k, v = randn(b, sq, hq, d), randn(b, sk, hk, d), randn(b, sk, hk, d)
    base = _run(q, k, v, causal, left, right, cap, _sched(d))
    for pp in (True, False):
        out = _run(q, k, v, causal, left, right, cap, _sched(d, split_mask=True, pingpong=pp))
        assert torch.equal(out[0], base[0]), f"O differs (pingpong={pp}): max {(out[0].float() - base[0].float()).abs().max()}"
        assert torch.equal(out[1], base[1]), f"LSE differs (pingpong={pp})"


VARLEN_CASES = [  # (q lengths, k lengths, causal, window)
    ([1, 77, 1000, 0, 300], [1, 77, 1000, 5, 900], True, (-1, -1)),
    ([1000, 129, 8192], [1000, 200, 8192], False, (-1, -1)),
    ([777, 64, 1000], [777, 500, 1000], False, (128, 64)),
]


@pytest.mark.parametrize("case", VARLEN_CASES, ids=["causal", "none", "band"])
def test_split_mask_varlen_bitwise(case):
    from cute_kernels.attention.ops import _flash_attn_varlen_cuda

    lq, lk, causal, (left, right) = case
    cu = [torch.tensor([0, *itertools.accumulate(n)], dtype=torch.int32, device="cuda") for n in (lq, lk)]
    q, k, v = randn(sum(lq), 6, 128), randn(sum(lk), 2, 128), randn(sum(lk), 2, 128)
    outs = []
    for sched in (_sched(128), _sched(128, split_mask=True)):
        _poison(q.numel() * 2 + q.shape[0] * q.shape[1] * 4)
        out, lse = _flash_attn_varlen_cuda(q, k, v, cu[0], cu[1], max(lq), max(lk), causal, left, right,
                                           schedule=sched)
        torch.cuda.synchronize()
        assert torch.isfinite(out).all()
        outs.append((out, lse))
    assert torch.equal(outs[0][0], outs[1][0]), "O differs"
    assert torch.equal(outs[0][1], outs[1][1]), "LSE differs"


SUM_CASES = [(False, (-1, -1), 1000, 1000, 128, 0.0), (True, (-1, -1), 8192, 8192, 128, 0.0),
             (False, (64, 32), 777, 777, 64, 0.0), (True, (-1, -1), 300, 500, 128, 5.0)]


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("case", SUM_CASES, ids=[f"c{int(c[0])}-w{c[1][0]}_{c[1][1]}-{c[2]}x{c[3]}-d{c[4]}"
                                                 + ("-cap" if c[5] else "") for c in SUM_CASES])
def test_sum_from_corr_fp64(case, split):
    causal, (left, right), sq, sk, d, cap = case
    q, k, v = randn(1, sq, 4, d), randn(1, sk, 2, d), randn(1, sk, 2, d)
    out, lse = _run(q, k, v, causal, left, right, cap, _sched(d, split_mask=split, sum_from_corr=True))
    rl, rr = left, 0 if causal else right
    scale = 1 / math.sqrt(d)
    ref, lse_ref = _attention(q, k, v, rl, rr, scale, cap, torch.float64)
    pt, _ = _attention(q, k, v, rl, rr, scale, cap, q.dtype)
    ref = ref.float()
    ref_lp = ref.to(q.dtype)
    atol = 2 * ((ref_lp + 0.3 - 0.3) - ref_lp).abs().max().item()
    err = (out.float() - ref).abs().max().item()
    bound = 2 * (pt - ref).abs().max().item() + atol
    assert err <= bound, f"max err {err:.3e} > {bound:.3e}"
    torch.testing.assert_close(lse, lse_ref.float(), atol=1e-3, rtol=1e-4)
    base = _run(q, k, v, causal, left, right, cap, _sched(d))[0]
    assert (out.float() - base.float()).abs().max().item() <= bound  # the default to its rounding
