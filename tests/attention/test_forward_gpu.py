"""GPU: FlashAttention forward against FA3's rule. With ref = the attention in fp32 (from the same
bf16/fp16 inputs) and pt = the same attention computed by torch in the input dtype,

    max|out - ref| <= 2 * max|pt - ref| + 2 * max|(ref + 0.3 - 0.3) - ref|   (the last in the input dtype)

for every mask (none, causal bottom-right, windows, causal + window), GQA/MQA, head dims 64-256, fp16,
softcap, strided inputs, sequence lengths 1, 17, 1000, mismatched S_q / S_k and 64k+; the LSE to 1e-3.
The other schedules of the kernel (fa3 with overlap, with two P buffers, with one consumer warpgroup;
fa2) on a subset; the two-buffer overlap bit for bit against the default.
Outputs are poisoned through the allocator (an unwritten element shows up as NaN)."""

import math

import pytest
import torch

from tests.helpers import randn

pytestmark = pytest.mark.gpu

ck = pytest.importorskip("cute_kernels")


def _poison(nbytes):
    torch.cuda.empty_cache()  # else O / LSE may land in a cached block of finite garbage, not the NaN one
    torch.full((nbytes // 2 + 4096,), float("nan"), dtype=torch.bfloat16, device="cuda")
    torch.cuda.synchronize()


def _attention(q, k, v, left, right, scale, softcap, dtype):
    """Attention with every op in `dtype` (fp32: the reference; bf16/fp16: what torch gets), rows
    chunked so 64k sequences fit. Returns (out fp32, lse fp32 (B, H, S_q))."""
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    qh = q.to(dtype).transpose(1, 2)
    kh = k.to(dtype).repeat_interleave(hq // hk, 2).transpose(1, 2)
    vh = v.to(dtype).repeat_interleave(hq // hk, 2).transpose(1, 2)
    off = sk - sq
    j = torch.arange(sk, device=q.device)
    outs, lses = [], []
    chunk = max(1, min(sq, (1 << 28) // max(1, b * hq * sk)))
    for i0 in range(0, sq, chunk):
        i = torch.arange(i0, min(sq, i0 + chunk), device=q.device)[:, None]
        s = (qh[:, :, i0:i0 + chunk] @ kh.transpose(-1, -2)) * scale
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        ok = torch.ones(i.shape[0], sk, dtype=torch.bool, device=q.device)
        if right >= 0:
            ok &= j[None, :] <= i + off + right
        if left >= 0:
            ok &= j[None, :] >= i + off - left
        s = s.masked_fill(~ok, float("-inf"))
        lse = torch.logsumexp(s.float(), -1)
        lses.append(lse.masked_fill(lse == float("-inf"), float("inf")))  # keyless rows: +inf, as FA
        p = torch.nan_to_num(torch.softmax(s, -1), nan=0.0)
        outs.append((p.to(dtype) @ vh).float())
    return torch.cat(outs, 2).transpose(1, 2), torch.cat(lses, 2)


def _check(q, k, v, causal=False, window=(-1, -1), softmax_scale=None, softcap=0.0, schedule=None):
    torch.backends.cuda.matmul.allow_tf32 = False
    _poison(q.numel() * 2 + q.shape[0] * q.shape[1] * q.shape[2] * 4)
    if schedule is None:
        out, lse = ck.flash_attn(q, k, v, causal=causal, window=window, softmax_scale=softmax_scale, softcap=softcap,
                                 return_lse=True)
    else:
        from cute_kernels.attention.ops import _flash_attn_cuda

        out, lse = _flash_attn_cuda(q, k, v, causal, window[0], window[1], softmax_scale, softcap, schedule=schedule)
    left, right = window[0], 0 if causal else window[1]
    scale = softmax_scale or 1 / math.sqrt(q.shape[-1])
    ref, lse_ref = _attention(q, k, v, left, right, scale, softcap, torch.float32)
    pt, _ = _attention(q, k, v, left, right, scale, softcap, q.dtype)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and lse.dtype == torch.float32
    assert torch.isfinite(out).all(), "unwritten (NaN) or overflowed output elements"
    ref_lp = ref.to(q.dtype)
    atol = 2 * ((ref_lp + 0.3 - 0.3) - ref_lp).abs().max().item()
    err = (out.float() - ref).abs().max().item()
    bound = 2 * (pt - ref).abs().max().item() + atol
    assert err <= bound, f"max err {err:.3e} > {bound:.3e} (pt err {(pt - ref).abs().max().item():.3e})"
    torch.testing.assert_close(lse, lse_ref, atol=1e-3, rtol=1e-4)


# --- the other schedules of the same kernel: fa3 with the intra-warpgroup overlap, fa2 (no warp
# specialization), one computing warpgroup; each over the pipeline's wrap-around (8 K/V blocks),
# partial blocks and a band, compiled once per (schedule, head dim, mask)
def _schedule(name, d):
    from schedules.attention import AttentionSchedule, default_schedule

    tn = default_schedule(d).tile_n
    return {
        "fa3_overlap": AttentionSchedule(tile_n=tn, overlap=True),
        "fa3_overlap_nopp": AttentionSchedule(tile_n=tn, overlap=True, pingpong=False),
        "fa3_m64": AttentionSchedule(tile_m=64, tile_n=tn),
        "fa2": AttentionSchedule(kind="fa2", tile_n=tn),
        "fa2_m64_s1": AttentionSchedule(kind="fa2", tile_m=64, tile_n=tn, stages=1),
        "fa2_s3": AttentionSchedule(kind="fa2", tile_n=tn, stages=3),
        "fa3_double_p": AttentionSchedule(tile_n=tn, overlap=True, double_p=True),
        "fa3_double_p_nopp": AttentionSchedule(tile_n=tn, overlap=True, double_p=True, pingpong=False),
        "fa3_lazy": AttentionSchedule(tile_n=tn, lazy_rescale=True),
        "fa2_lazy": AttentionSchedule(kind="fa2", tile_n=tn, lazy_rescale=True),
        # the split walk with 64-key blocks (D = 256's candidate that keeps its WGMMAs asynchronous), no ping-pong
        "fa3_n64_split_nopp": AttentionSchedule(tile_n=64, overlap=True, split_mask=True, pingpong=False),
        # three consumer warpgroups taking turns round robin (D = 64 only: 160 registers each)
        "fa3_m192": AttentionSchedule(tile_m=192, tile_n=tn),
        "fa3_m192_nopp": AttentionSchedule(tile_m=192, tile_n=tn, pingpong=False),
        "fa3_m192_n64_overlap": AttentionSchedule(tile_m=192, tile_n=64, overlap=True, split_mask=True),
        "fa3_m192_overlap": AttentionSchedule(tile_m=192, tile_n=tn, overlap=True, split_mask=True),
        "fa3_m192_overlap_nosplit": AttentionSchedule(tile_m=192, tile_n=tn, overlap=True),
    }[name]


SCHEDULE_CASES = [(64, "causal"), (128, "window")]
M192_CASES = [(64, "causal"), (64, "window"), (64, "none")]
SCHEDULE_NAMES = ["fa3_overlap", "fa3_overlap_nopp", "fa3_m64", "fa2", "fa2_m64_s1", "fa2_s3", "fa3_lazy", "fa2_lazy",
                  "fa3_double_p", "fa3_double_p_nopp"]
AGREE_NAMES = ["fa3_overlap", "fa3_overlap_nopp", "fa2", "fa3_m64", "fa2_m64_s1", "fa3_lazy", "fa3_double_p"]
D256_NAMES = ["fa3_overlap", "fa2", "fa3_lazy", "fa3_double_p", "fa3_n64_split_nopp"]  # fa2 with 3 stages does not fit D = 256 (Q 64 KiB + 3 x 80 KiB of K/V)


@pytest.mark.parametrize("name", ["default", *SCHEDULE_NAMES, "fa3_m192"])
def test_smoke_every_schedule_finishes(name):
    """First in the file: one small causal launch per schedule (D = 64, compiled again by the tests
    below). Run the file under `timeout` with -x: a hang here points at the schedule's synchronization
    (the K/V rings' phases, the producer's tails, the ping-pong turns), not at the math. S_q - S_k =
    200 >= tile_m: the first q tile has no K/V block at all; the last has 6 (> 4 stages: the rings wrap)."""
    sched = None if name == "default" else _schedule(name, 64)
    q, k, v = randn(1, 900, 2, 64), randn(1, 700, 2, 64), randn(1, 700, 2, 64)
    _check(q, k, v, True, schedule=sched)
    torch.cuda.synchronize()


MASKS = {  # name: (causal, window); kernel mask kinds: none, causal, band, window, band
    "none": (False, (-1, -1)),
    "causal": (True, (-1, -1)),
    "window": (False, (64, 32)),
    "left": (False, (100, -1)),
    "causal_left": (True, (50, -1)),
}
SEQS = [(1, 1), (17, 17), (1000, 1000), (17, 1000), (1000, 17), (113, 203)]


@pytest.mark.parametrize("seqs", SEQS, ids=[f"{a}x{b}" for a, b in SEQS])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("d", [64, 128])
def test_masks_seqlens_gqa(d, mask, seqs):
    sq, sk = seqs
    causal, window = MASKS[mask]
    q, k, v = randn(2, sq, 6, d), randn(2, sk, 2, d), randn(2, sk, 2, d)
    _check(q, k, v, causal, window)


@pytest.mark.parametrize("d,causal", [(96, False), (192, True), (256, False), (256, True)])
def test_head_dims(d, causal):
    q, k, v = randn(1, 1000, 4, d), randn(1, 1000, 4, d), randn(1, 1000, 4, d)
    _check(q, k, v, causal)


@pytest.mark.parametrize("d,mask", SCHEDULE_CASES, ids=[f"d{d}-{m}" for d, m in SCHEDULE_CASES])
@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_schedules(name, d, mask):
    causal, window = MASKS[mask]
    sched = _schedule(name, d)
    for sq, sk in ((1000, 1000), (113, 203), (1000, 17), (1, 1)):  # 1000 x 17: q tiles that see no key
        q, k, v = randn(2, sq, 6, d), randn(2, sk, 2, d), randn(2, sk, 2, d)
        _check(q, k, v, causal, window, schedule=sched)


@pytest.mark.parametrize("d,mask", M192_CASES, ids=[f"d{d}-{m}" for d, m in M192_CASES])
@pytest.mark.parametrize("name", ["fa3_m192", "fa3_m192_nopp", "fa3_m192_n64_overlap", "fa3_m192_overlap",
                                  "fa3_m192_overlap_nosplit"])
def test_three_consumer_warpgroups(name, d, mask):
    """tile_m 192: three consumers (the ping-pong's turns round robin, the last two turns handed on
    at the end); q tiles of 192 rows over partial and keyless ranges, the K/V ring wrapping."""
    causal, window = MASKS[mask]
    sched = _schedule(name, d)
    for sq, sk in ((1000, 1000), (113, 203), (1000, 17), (1, 1), (900, 700)):
        q, k, v = randn(2, sq, 6, d), randn(2, sk, 2, d), randn(2, sk, 2, d)
        _check(q, k, v, causal, window, schedule=sched)


@pytest.mark.parametrize("name", D256_NAMES)
def test_schedules_d256_and_empty_ranges(name):
    """D = 256 (the overlap's register peak) over 13 K/V blocks; and S_q > S_k causal, where the first
    q tiles see no key at all (the overlap's n_count == 0 path, the ping-pong's turn counts)."""
    sched = _schedule(name, 256)
    q, k, v = randn(1, 1000, 2, 256), randn(1, 1000, 2, 256), randn(1, 1000, 2, 256)
    _check(q, k, v, True, schedule=sched)
    q, k, v = randn(1, 700, 2, 256), randn(1, 90, 2, 256), randn(1, 90, 2, 256)
    _check(q, k, v, True, schedule=sched)


def test_schedules_agree():
    """Every schedule computes the same attention to within the bf16 rounding of P (the same K/V
    block order, the same row-state math); a sliding window (64, 32) of a 777-token sequence."""
    from cute_kernels.attention.ops import _flash_attn_cuda

    q, k, v = randn(2, 777, 4, 128), randn(2, 777, 4, 128), randn(2, 777, 4, 128)
    base = _flash_attn_cuda(q, k, v, False, 64, 32)[0].float()
    for name in AGREE_NAMES:
        out = _flash_attn_cuda(q, k, v, False, 64, 32, schedule=_schedule(name, 128))[0].float()
        assert (out - base).abs().max().item() < 2e-2, name


# (causal, window, S_q, S_k, D): K/V block counts per q tile from 0 to 16, odd and even step counts
# (the two-buffer walk runs in pairs of steps), keyless q tiles, masked blocks at both band edges
DOUBLE_P_CASES = [(True, (-1, -1), 1000, 1000, 128), (False, (-1, -1), 300, 2000, 128),
                  (False, (-1, -1), 129, 257, 64), (False, (64, 32), 777, 777, 64),
                  (True, (-1, -1), 700, 90, 256), (True, (200, -1), 1000, 1000, 96)]


@pytest.mark.parametrize("case", DOUBLE_P_CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}x{c[3]}-d{c[4]}" for c in DOUBLE_P_CASES])
def test_double_p_bitwise(case):
    """`double_p` performs the one-buffer overlap's operations on the same values (O after P_{j-1} V_{j-1}
    times corr_j, then P_j V_j; the same softmax code): O and LSE equal the default's bit for bit, with
    and without ping-pong. A difference here (the FA3 rule of test_schedules still holding) would mean
    ptxas contracted the softmax's arithmetic differently in the two loops."""
    from cute_kernels.attention.ops import _flash_attn_cuda
    from schedules.attention import AttentionSchedule, default_schedule

    causal, (left, right), sq, sk, d = case
    q, k, v = randn(2, sq, 4, d), randn(2, sk, 2, d), randn(2, sk, 2, d)
    tn = default_schedule(d).tile_n
    base = _flash_attn_cuda(q, k, v, causal, left, right, schedule=AttentionSchedule(tile_n=tn, overlap=True))
    for pp in (True, False):
        out = _flash_attn_cuda(q, k, v, causal, left, right,
                               schedule=AttentionSchedule(tile_n=tn, overlap=True, double_p=True, pingpong=pp))
        assert torch.equal(out[0], base[0]), f"O differs (pingpong={pp})"
        assert torch.equal(out[1], base[1]), f"LSE differs (pingpong={pp})"


@pytest.mark.parametrize("causal", [True, False])
def test_heads_first_bitwise(causal):
    """`heads_first` (session 21, written on the desk): the grid launched as (H_q, B, q_tiles) computes the same tiles,
    so O and LSE equal the default grid's bit for bit (GQA, a part-full last q tile, S_q != S_k)."""
    import dataclasses

    from cute_kernels.attention.ops import _flash_attn_cuda
    from schedules.attention import default_schedule

    q, k, v = randn(2, 1000, 8, 128), randn(2, 1200, 2, 128), randn(2, 1200, 2, 128)
    s = default_schedule(128, causal, 1200)
    base = _flash_attn_cuda(q, k, v, causal, schedule=s)
    out = _flash_attn_cuda(q, k, v, causal, schedule=dataclasses.replace(s, heads_first=True))
    assert torch.equal(out[0], base[0]) and torch.equal(out[1], base[1])


PERSISTENT = [(128, True, {}), (128, False, {}), (128, True, {"heads_first": True}),
              (128, False, {"overlap": False, "split_mask": False}), (64, True, {}), (256, True, {}), (256, False, {}),
              (128, True, {"l2_groups": True}), (64, True, {"l2_groups": True}), (128, False, {"dynamic": True}),
              (128, True, {"dynamic": True, "l2_groups": True}), (64, True, {"dynamic": True, "l2_groups": True}),
              (256, True, {"dynamic": True, "l2_groups": True}), (64, False, {"dynamic": True}),
              # D = 192: the causal default since session 24, and the no-mask candidate (1.061x in session 24's call 6)
              (192, True, {"dynamic": True, "l2_groups": True}), (192, False, {"dynamic": True})]


@pytest.mark.parametrize("d,causal,extra", PERSISTENT,
                         ids=[f"d{d}-{'causal' if c else 'full'}-{e}" for d, c, e in PERSISTENT])
def test_persistent_bitwise(d, causal, extra):
    """`persistent` (session 22; D = 128 passed on the H200 that session): one CTA per SM walking about four
    tiles each (GQA, a part-full last q tile, S_q != S_k, the producer loading the next tile's first K/V blocks
    under this tile's end) computes the same O and LSE as the one-CTA-a-tile grid, bit for bit, at the default
    schedule of each head dim. `l2_groups` (the 1-D grid in L2-grouped order, and the persistent walk in that
    order) likewise, and `dynamic` (session 23: the tiles handed out by an atomic counter) too, on every call: the
    counter is back at 0 after each launch."""
    import dataclasses

    from cute_kernels.attention.ops import _flash_attn_cuda, _tile_counter
    from schedules.attention import default_schedule

    q, k, v = randn(2, 2000, 16, d), randn(2, 2100, 4, d), randn(2, 2100, 4, d)
    dynamic = extra.get("dynamic", False)
    s = dataclasses.replace(default_schedule(d, causal, 2100), persistent=False, dynamic=False, l2_groups=False)
    s = dataclasses.replace(s, **{k: x for k, x in extra.items() if k != "dynamic"})  # (the D = 64 default is dynamic)
    plain = dataclasses.replace(s, l2_groups=False)
    walk = dataclasses.replace(s, persistent=True, dynamic=dynamic)
    base = _flash_attn_cuda(q, k, v, causal, schedule=plain)
    if s.l2_groups:  # the 1-D grid in the grouped order, one CTA a tile
        out = _flash_attn_cuda(q, k, v, causal, schedule=s)
        assert torch.equal(out[0], base[0]) and torch.equal(out[1], base[1])
    for _ in range(3 if dynamic else 1):
        out = _flash_attn_cuda(q, k, v, causal, schedule=walk)
        assert torch.equal(out[0], base[0]) and torch.equal(out[1], base[1])
        if dynamic:
            assert _tile_counter(q.device).item() == 0
    # and a grid of fewer tiles than SMs (every CTA one tile)
    q1, k1, v1 = randn(1, 300, 2, d), randn(1, 300, 2, d), randn(1, 300, 2, d)
    base = _flash_attn_cuda(q1, k1, v1, causal, schedule=plain)
    out = _flash_attn_cuda(q1, k1, v1, causal, schedule=walk)
    assert torch.equal(out[0], base[0]) and torch.equal(out[1], base[1])


@pytest.mark.parametrize("d,causal", [(128, True), (128, False), (256, True), (64, False), (64, True)])
def test_skip_rescale(d, causal):
    """`skip_rescale` (session 23, written on the desk): O's rescale skipped on warps where no row's max moved,
    corr exactly 1 there. FA3's rule against the fp32 reference, and within a few ulps of corr of the default
    (GQA, a part-full last q tile, S_q != S_k)."""
    import dataclasses

    from cute_kernels.attention.ops import _flash_attn_cuda
    from schedules.attention import default_schedule

    q, k, v = randn(2, 2000, 8, d), randn(2, 2100, 2, d), randn(2, 2100, 2, d)
    s = default_schedule(d, causal, 2100)
    skip = dataclasses.replace(s, skip_rescale=True)
    _check(q, k, v, causal=causal, schedule=skip)
    base = _flash_attn_cuda(q, k, v, causal, schedule=s)
    out = _flash_attn_cuda(q, k, v, causal, schedule=skip)
    assert (out[0].float() - base[0].float()).abs().max() <= 2 ** -6 * base[0].float().abs().max()
    assert (out[1] - base[1]).abs().max() <= 1e-5


LATE_V = [(128, False, 2100, {}), (128, True, 2100, {}), (64, False, 2100, {}), (64, True, 2100, {}),
          (96, False, 2100, {}), (192, False, 2100, {}), (192, True, 2100, {}), (128, True, 100, {}),
          (128, False, 2100, {"persistent": True, "dynamic": True}), (128, True, 2100, {"window": (300, 0)}),
          (128, False, 2100, {"softcap": 5.0})]


@pytest.mark.parametrize("d,causal,sk,extra", LATE_V, ids=[f"d{d}-{'causal' if c else 'full'}-k{sk}-{e}"
                                                           for d, c, sk, e in LATE_V])
def test_late_v_release_bitwise(d, causal, sk, extra):
    """`late_v_release` (session 25): V_j's stage released one step later, after S_{j+2}'s wait, instead of right
    after P_j V_j's. Only the producer's view of the ring moves, so O and LSE equal the default's bit for bit (GQA,
    a part-full last q tile, S_q != S_k; one K/V block at 100 keys; the dynamic persistent walk carrying the ring
    across tiles; a window's left edge; softcap), run twice (a ring left out of step would hang or corrupt the
    second launch)."""
    import dataclasses

    from cute_kernels.attention.ops import _flash_attn_cuda
    from schedules.attention import default_schedule

    q, k, v = randn(2, 2000, 8, d), randn(2, sk, 2, d), randn(2, sk, 2, d)
    kw = {}
    s = default_schedule(d, causal, sk)
    if "persistent" in extra:
        s = dataclasses.replace(s, persistent=True, dynamic=extra["dynamic"])
    if "window" in extra:
        kw["window_left"], kw["window_right"] = extra["window"]
    if "softcap" in extra:
        kw["softcap"] = extra["softcap"]
    late = dataclasses.replace(s, late_v_release=True)
    s = dataclasses.replace(s, late_v_release=False)  # the baseline (the default has it at D = 96 / 128 causal)
    base = _flash_attn_cuda(q, k, v, causal, schedule=s, **kw)
    for _ in range(2):
        out = _flash_attn_cuda(q, k, v, causal, schedule=late, **kw)
        assert torch.equal(out[0], base[0]) and torch.equal(out[1], base[1])
    if not kw:
        _check(q, k, v, causal=causal, schedule=late)


def test_mqa_fp16_scale_softcap():
    q, k, v = randn(2, 300, 8, 128), randn(2, 500, 1, 128), randn(2, 500, 1, 128)
    _check(q, k, v, causal=True)
    h = [randn(2, 257, 4, 128, dtype=torch.float16) for _ in range(3)]
    _check(*h)
    _check(q, k, v, softmax_scale=0.3, softcap=5.0)  # logits pushed into the cap


def test_strided_inputs():
    """A packed QKV tensor and (B, H, S, D) tensors transposed to (B, S, H, D): read in place."""
    qkv = randn(2, 333, 3, 4, 128)
    _check(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True)
    q, k, v = (randn(2, 4, 333, 64).transpose(1, 2) for _ in range(3))
    _check(q, k, v)


@pytest.mark.parametrize("d,causal", [(128, True), (64, False)])
def test_long_sequence(d, causal):
    s = 65536 + 17
    q, k, v = randn(1, s, 1, d), randn(1, s, 1, d), randn(1, s, 1, d)
    _check(q, k, v, causal)


def test_empty_and_keyless():
    q = randn(2, 0, 4, 64)
    out, lse = ck.flash_attn(q, q, q, return_lse=True)
    assert out.shape == (2, 0, 4, 64) and lse.shape == (2, 4, 0)
    q, k = randn(1, 5, 2, 64), randn(1, 0, 2, 64)
    out, lse = ck.flash_attn(q, k, k, return_lse=True)
    assert (out == 0).all() and (lse == float("inf")).all()  # FA's convention for rows that see no key


def test_autograd_and_compile():
    q, k, v = (randn(1, 64, 2, 64).requires_grad_() for _ in range(3))
    out = ck.flash_attn(q, k, v, causal=True)
    out.float().sum().backward()  # the backward (tests/attention/test_backward_gpu.py checks its values)
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    f = torch.compile(lambda a, b, c: ck.flash_attn(a, b, c, causal=True), fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(f(q, k, v), ck.flash_attn(q, k, v, causal=True), atol=0, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("growth", [0.0, 0.05, 3.0])
def test_lazy_rescale(causal, growth):
    """lazy_rescale keeps a row's exponent reference while the block maxima exceed it by <= 2^8 (log2
    units): keys whose norm grows along the sequence (growth 0.05: the max creeps up by less than
    the threshold per block, the reference stays and the probabilities exceed 1; 3.0: it jumps past
    it, the warp rescales) and plain randn (0: a few early rescales). FA3's rule against fp32 for the
    default and the lazy schedule alike (D = 128, GQA 8/2, 2000 keys = 16 blocks); the two agree to
    within P's bf16 rounding."""
    from cute_kernels.attention.ops import _flash_attn_cuda
    from schedules.attention import AttentionSchedule

    q, k, v = randn(2, 1000, 8, 128), randn(2, 2000, 2, 128), randn(2, 2000, 2, 128)
    if growth:
        ramp = 1 + growth * torch.arange(2000, device=k.device, dtype=torch.float32) / 128
        k = (k.float() * ramp[None, :, None, None]).to(k.dtype)
    lazy = AttentionSchedule(lazy_rescale=True)
    _check(q, k, v, causal)
    _check(q, k, v, causal, schedule=lazy)
    base = _flash_attn_cuda(q, k, v, causal)[0].float()
    out = _flash_attn_cuda(q, k, v, causal, schedule=lazy)[0].float()
    assert (out - base).abs().max().item() <= 4e-2 * base.abs().max().item() + 1e-3
