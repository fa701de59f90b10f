"""GPU: `ck.flash_attn_fp8` against `fp8_attention_reference`'s semantics, generalized here to windows and softcap
(`_reference`).

The bound: the kernel rounds P to e4m3 at each block's running max (then rescales), the reference at the row's final
max, so the two differ by e4m3's rounding of P, not bit for bit. The tolerance is twice the error the reference's own
P rounding causes (fp64 reference with P rounded against P unrounded), plus twice the output dtype's rounding of the
reference; paths that round P at other points by design (`lazy_rescale`: stale references, the v-scale ratio in P's
exponent) are held to that tolerance from the unrounded result instead. LSE (which rounding of P does not touch)
carries the error of S itself: FP8 WGMMA accumulates with about 14 significant bits, not fp32's 24, so each row's
bound is 2^-12 of its largest |q| . |k| (the dot product of absolute values, scaled as S), plus 1e-4. Cases:
causal / window / band, GQA and MQA, edge lengths (1, 127, 129, 1000, 4096), S_q != S_k, per-head and block scales,
D 64 / 128 / 256, softcap, fp16 output, NaN-poisoned outputs (every element written), torch.compile and CUDA-graph
capture."""

import math

import pytest
import torch

from tests.helpers import poison_empty

pytestmark = pytest.mark.gpu

ck = pytest.importorskip("cute_kernels")
from cute_kernels.attention.fp8_reference import E4M3, _heads_first, scale_rows  # noqa: E402
from schedules.attention import fp8_default_lazy  # noqa: E402


def _reference(q8, k8, v8, qs, ks, vs, window=(-1, -1), causal=False, softcap=0.0, round_p=True):
    """`fp8_attention_reference` with FlashAttention's window (bottom-right aligned) and softcap; (O, LSE) in fp64."""
    f64 = torch.float64
    b, sq, hq, d = q8.shape
    sk, hk = k8.shape[1], k8.shape[2]
    g = hq // hk
    scale = 1.0 / math.sqrt(d)
    qsr = scale_rows(qs.to(f64), sq)
    ksr = scale_rows(ks.to(f64), sk).repeat_interleave(g, dim=1)
    vsr = scale_rows(vs.to(f64), sk).repeat_interleave(g, dim=1)
    qq, kk, vv = q8.to(f64).permute(0, 2, 1, 3), _heads_first(k8, g, f64), _heads_first(v8, g, f64)
    s = (qq @ kk.transpose(-1, -2)) * qsr[..., :, None] * ksr[..., None, :] * scale
    absdot = (qq.abs() @ kk.abs().transpose(-1, -2)) * qsr[..., :, None] * ksr[..., None, :] * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    left, right = window
    if causal:
        right = 0
    i = torch.arange(sq, device=q8.device)[:, None] + (sk - sq)
    j = torch.arange(sk, device=q8.device)[None, :]
    masked = torch.zeros(sq, sk, dtype=torch.bool, device=q8.device)
    if right >= 0:
        masked |= j > i + right
    if left >= 0:
        masked |= j < i - left
    s = s.masked_fill(masked, float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m)
    rowsum = p.to(torch.float32).to(f64).sum(dim=-1, keepdim=True)
    if round_p:
        p = p.to(torch.float32).to(E4M3).to(f64)
    o = (p * vsr[..., None, :]) @ vv
    o = o / torch.where(rowsum > 0, rowsum, torch.ones_like(rowsum))
    lse = torch.where(rowsum[..., 0] > 0, m[..., 0] + torch.log(rowsum[..., 0]), torch.full_like(m[..., 0], math.inf))
    lse_tol = 1e-4 + 2.0**-12 * absdot.masked_fill(masked, 0).amax(dim=-1)
    return o.permute(0, 2, 1, 3), (lse, lse_tol)


def _inputs(b, sq, sk, hq, hk, d, gran, seed=0):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    q = torch.randn(b, sq, hq, d, device="cuda", generator=g, dtype=torch.bfloat16)
    k = torch.randn(b, sk, hk, d, device="cuda", generator=g, dtype=torch.bfloat16)
    v = torch.randn(b, sk, hk, d, device="cuda", generator=g, dtype=torch.bfloat16)
    return ck.quantize_attention_fp8(q, k, v, granularity=gran)


def _check(args, out, lse, out_dtype=torch.bfloat16, lazy=False, **kw):
    """O within twice the reference's own P-rounding error (plus the output dtype's rounding), measured from the
    reference (the kernel rounds P at the same points, up to the running max) or, for `lazy` paths, which round P
    at other points by design (stale exponent references, the v-scale ratio folded into P), from the unrounded
    computation: no worse than twice the reference semantics' own error. LSE within `lse_tol`."""
    ref, (ref_lse, lse_tol) = _reference(*args, **kw)
    ref_exact, _ = _reference(*args, round_p=False, **kw)
    tol = 2 * (ref - ref_exact).abs().max().item() + 2 * (ref.to(out_dtype).double() - ref).abs().max().item() + 1e-6
    assert out.dtype == out_dtype and torch.isfinite(out).all()
    err = (out.double() - (ref_exact if lazy else ref)).abs().max().item()
    assert err <= tol, f"max error {err:.3e} > bound {tol:.3e}{' (from the unrounded result)' if lazy else ''}"
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), fin)
    lse_err = (lse[fin].double() - ref_lse[fin]).abs()
    assert (lse_err <= lse_tol[fin]).all(), f"LSE error {lse_err.max().item():.3e}, bound there {lse_tol[fin][lse_err.argmax()].item():.3e}"


CASES = [
    # b, sq, sk, hq, hk, d, causal, window
    (2, 1000, 1000, 4, 4, 128, False, (-1, -1)),
    (2, 1000, 1000, 4, 4, 128, True, (-1, -1)),
    (1, 4096, 4096, 2, 1, 128, True, (-1, -1)),
    (2, 129, 127, 6, 2, 128, False, (-1, -1)),
    (2, 127, 129, 6, 2, 128, True, (-1, -1)),
    (1, 1, 1000, 8, 1, 128, False, (-1, -1)),
    (1, 1000, 1, 8, 1, 128, True, (-1, -1)),
    (2, 1000, 1000, 4, 2, 128, False, (200, 0)),
    (2, 777, 1000, 4, 2, 128, False, (128, 64)),
    (2, 1000, 1000, 4, 2, 64, True, (-1, -1)),
    (2, 1000, 1000, 4, 2, 256, False, (-1, -1)),
    (1, 1000, 1000, 4, 2, 256, False, (100, 100)),
]


@pytest.mark.parametrize("gran", ["head", "block"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(str(x) for x in c[:6]) + f"-c{int(c[6])}-w{c[7]}")
def test_against_reference(case, gran, monkeypatch):
    poison_empty(monkeypatch)
    b, sq, sk, hq, hk, d, causal, window = case
    args = _inputs(b, sq, sk, hq, hk, d, gran)
    out, lse = ck.flash_attn_fp8(*args, causal=causal, window=window, return_lse=True)
    _check(args, out, lse, lazy=fp8_default_lazy(d) > 0, causal=causal, window=window)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_softcap_and_fp16(out_dtype, monkeypatch):
    poison_empty(monkeypatch)
    args = _inputs(2, 1000, 1000, 4, 2, 128, "block", seed=1)
    out, lse = ck.flash_attn_fp8(*args, softcap=5.0, out_dtype=out_dtype, return_lse=True)
    _check(args, out, lse, out_dtype=out_dtype, softcap=5.0)


def test_block_scales_differ_per_block():
    """Keys / values whose 128-row blocks have very different magnitudes: each block's scale must be the one applied
    (a wrong block index shows as a large error)."""
    g = torch.Generator(device="cuda")
    g.manual_seed(3)
    q = torch.randn(1, 512, 2, 128, device="cuda", generator=g, dtype=torch.bfloat16)
    k = torch.randn(1, 640, 2, 128, device="cuda", generator=g, dtype=torch.bfloat16)
    v = torch.randn(1, 640, 2, 128, device="cuda", generator=g, dtype=torch.bfloat16)
    mag = torch.tensor([0.01, 1.0, 30.0, 0.3, 5.0], device="cuda").repeat_interleave(128)[None, :, None, None]
    args = ck.quantize_attention_fp8(q, k * mag.to(k.dtype), v * mag.to(v.dtype), granularity="block")
    out, lse = ck.flash_attn_fp8(*args, causal=True, return_lse=True)
    _check(args, out, lse, causal=True)


def test_torch_compile_and_cuda_graph():
    args = _inputs(2, 1000, 1000, 4, 2, 128, "block")
    eager = ck.flash_attn_fp8(*args, causal=True)
    fn = torch.compile(lambda *a: ck.flash_attn_fp8(*a, causal=True), fullgraph=True)
    assert torch.equal(fn(*args), eager)
    static = [a.clone() for a in args]
    ck.flash_attn_fp8(*static, causal=True)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ck.flash_attn_fp8(*static, causal=True)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


def test_empty_and_keyless():
    args = _inputs(1, 0, 100, 2, 2, 128, "head")
    assert ck.flash_attn_fp8(*args).shape == (1, 0, 2, 128)
    args = _inputs(1, 300, 300, 2, 2, 128, "block")
    # window (0, -1) with S_q = S_k: row i sees keys >= i; a band that lets no key through is left to test_against
    out, lse = ck.flash_attn_fp8(*args, window=(0, 0), return_lse=True)
    _check(args, out, lse, window=(0, 0))


LAZY_CASES = [CASES[0], CASES[2], CASES[8], CASES[9], CASES[10]]


CONFIGS = [{"lazy_rescale": 0, "vt_ldsm": False}, {"lazy_rescale": 0}, {"vt_ldsm": False}, {"lazy_rescale": 4},
           {"lazy_rescale": 7}]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("gran", ["head", "block"])
@pytest.mark.parametrize("case", LAZY_CASES, ids=lambda c: "x".join(str(x) for x in c[:6]) + f"-c{int(c[6])}-w{c[7]}")
def test_configs(case, gran, config):
    """The configs beside the defaults (vt_ldsm; lazy_rescale 7 at D 256, 0 below): every rescale done, V^T by 32-bit
    words, lazy thresholds 4 and 7 at every D: the same bound."""
    from cute_kernels.attention.fp8_ops import _flash_attn_fp8_cuda

    b, sq, sk, hq, hk, d, causal, window = case
    args = _inputs(b, sq, sk, hq, hk, d, gran, seed=4)
    left, right = window
    out, lse = _flash_attn_fp8_cuda(*args, causal=causal, window_left=left, window_right=right, config=config)
    _check(args, out, lse, lazy=config.get("lazy_rescale", fp8_default_lazy(d)) > 0, causal=causal, window=window)


WIDE_CASES = [c for c in CASES if c[5] <= 128]


@pytest.mark.parametrize("tile_n", [192, 224])
@pytest.mark.parametrize("case", WIDE_CASES, ids=lambda c: "x".join(str(x) for x in c[:6]) + f"-c{int(c[6])}-w{c[7]}")
def test_wide_key_blocks_per_head(case, tile_n):
    """Per-head scales let a K/V block hold more keys than a 128-key scale block (FA3's FP8 tile at D 128 is 128 x
    224): 192 and 224 keys, two stages, across lengths off the block, GQA, causal and windows: the same bound."""
    from cute_kernels.attention.fp8_ops import _flash_attn_fp8_cuda

    b, sq, sk, hq, hk, d, causal, window = case
    args = _inputs(b, sq, sk, hq, hk, d, "head", seed=6)
    left, right = window
    out, lse = _flash_attn_fp8_cuda(*args, causal=causal, window_left=left, window_right=right,
                                    config={"tile_n": tile_n, "stages": 2})
    _check(args, out, lse, lazy=fp8_default_lazy(d) > 0, causal=causal, window=window)


@pytest.mark.parametrize("mags", [(0.01, 1.0, 30.0, 0.3, 5.0), (1.0, 1.6, 0.7, 1.9, 1.1)], ids=["far", "near"])
def test_lazy_rescale_v_units(mags):
    """Value blocks whose scales jump far apart (O's unit moves, corr carries it) or stay within 2x (folded into P's
    exponent), keys with growing magnitudes (the max moves by more than 2^7 now and then)."""
    from cute_kernels.attention.fp8_ops import _flash_attn_fp8_cuda

    g = torch.Generator(device="cuda")
    g.manual_seed(5)
    q = torch.randn(1, 512, 2, 128, device="cuda", generator=g, dtype=torch.bfloat16)
    k = torch.randn(1, 640, 2, 128, device="cuda", generator=g, dtype=torch.bfloat16)
    v = torch.randn(1, 640, 2, 128, device="cuda", generator=g, dtype=torch.bfloat16)
    mag = torch.tensor(mags, device="cuda").repeat_interleave(128)[None, :, None, None]
    kmag = torch.tensor([4.0, 2.0, 1.0, 0.5, 0.25], device="cuda").repeat_interleave(128)[None, :, None, None]
    args = ck.quantize_attention_fp8(q, k * kmag.to(k.dtype), v * mag.to(v.dtype), granularity="block")
    for causal in (False, True):
        out, lse = _flash_attn_fp8_cuda(*args, causal=causal, config={"lazy_rescale": 7})
        _check(args, out, lse, lazy=True, causal=causal)
    # caller-made v scales: a zero block (the unit is floored, never 0) and a negative one (the unit's sign flips)
    vs = args[5].clone()
    vs[:, :, 2] = 0.0
    vs[:, :, 3] = -vs[:, :, 3]
    args = (*args[:5], vs)
    out, lse = _flash_attn_fp8_cuda(*args, config={"lazy_rescale": 7})
    _check(args, out, lse, lazy=True)
