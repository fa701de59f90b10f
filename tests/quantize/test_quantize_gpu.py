"""GPU: the FP8 quantizer kernels (issue 5) bitwise equal to the torch reference (run on the GPU
and on the CPU), for 1x128 and 128x128, fp32 and power-of-two scales, bf16/fp16/fp32 inputs, odd
shapes (K not a multiple of 128 or 16, one row), all-zero blocks, the NaN/inf policy, strided
inputs, poisoned outputs; end to end, ck.fp8_gemm on the quantized operands against the bf16
product within DeepGEMM's metric."""

import pytest
import torch

from tests.helpers import randn

pytestmark = pytest.mark.gpu

ck = pytest.importorskip("cute_kernels")
from cute_kernels.quantize.ops import quantize_1x128_reference, quantize_128x128_reference  # noqa: E402

QUANT = {"1x128": (lambda x, u: ck.quantize_1x128(x, u), quantize_1x128_reference),
         "128x128": (lambda x, u: ck.quantize_128x128(x, u), quantize_128x128_reference)}


def _poison(nbytes):
    torch.full((nbytes // 4 + 4096,), float("nan"), device="cuda")
    torch.cuda.synchronize()


def _same(a, b):
    """Equal bits, NaN matching NaN (its sign and payload are not part of the contract)."""
    a, b = a.cpu(), b.cpu()
    assert a.shape == b.shape and a.dtype == b.dtype
    if a.dtype == torch.float8_e4m3fn:
        na, nb = torch.isnan(a.float()), torch.isnan(b.float())
        assert torch.equal(na, nb), "NaN positions differ"
        ai, bi = a.view(torch.uint8), b.view(torch.uint8)
        bad = (ai != bi) & ~na
        assert not bad.any(), f"{bad.sum().item()} of {a.numel()} e4m3 values differ, first at {bad.nonzero()[0].tolist()}"
    else:
        assert torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(a.nan_to_num(), b.nan_to_num())


def _check(kind, x, ue8m0):
    run, ref = QUANT[kind]
    _poison(x.numel() * 2)
    q, s = run(x, ue8m0)
    torch.cuda.synchronize()
    q_gpu, s_gpu = ref(x, ue8m0)
    q_cpu, s_cpu = ref(x.cpu(), ue8m0)
    assert s.stride() == s_gpu.stride()
    _same(q, q_gpu)
    _same(s, s_gpu)
    _same(q, q_cpu)
    _same(s, s_cpu)
    return q, s


@pytest.mark.parametrize("kind", list(QUANT))
@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("m,k", [(4096, 7168), (769, 200), (1, 16), (1, 7168), (5125, 128), (300, 1040), (130, 77)])
def test_bitwise(kind, ue8m0, m, k):
    _check(kind, randn(m, k) * 3, ue8m0)


@pytest.mark.parametrize("kind", list(QUANT))
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_dtypes(kind, dtype):
    x = randn(257, 1536, dtype=dtype) * torch.logspace(-4, 4, 1536, device="cuda").to(dtype)
    _check(kind, x, False)
    _check(kind, x, True)


@pytest.mark.parametrize("kind", list(QUANT))
def test_zero_blocks_nan_inf(kind):
    x = randn(300, 520)
    x[:130, :128] = 0  # whole zero blocks, both granularities
    x[200, 5] = float("nan")
    x[250, 300] = float("inf")
    x[260, 400] = -float("inf")
    q, s = _check(kind, x, False)
    assert torch.isnan(q[200, 5].float()) and torch.isinf(s).any()


@pytest.mark.parametrize("kind", list(QUANT))
def test_strided_inputs(kind):
    base = randn(512, 2048)
    _check(kind, base[:, 256:1792], False)  # row stride 2048: read in place
    _check(kind, base[:, 3:1027], False)  # base not 16-byte aligned: the scalar variant
    _check(kind, base.t()[:1000, :384], False)  # column-major: copied


def test_empty():
    q, s = ck.quantize_1x128(randn(0, 256))
    assert q.shape == (0, 256) and s.shape == (0, 2)
    q, s = ck.quantize_128x128(randn(5, 0))
    assert q.shape == (5, 0) and s.shape == (1, 0)


def calc_diff(x, y):
    x, y = x.double(), y.double()
    return (1 - 2 * (x * y).sum() / (x * x + y * y).sum()).item()


@pytest.mark.parametrize("m,n,k", [(4096, 7168, 2048), (769, 2112, 7168), (64, 4096, 1040)])
@pytest.mark.parametrize("ue8m0", [False, True])
def test_end_to_end_gemm(m, n, k, ue8m0):
    """DeepGEMM's check: the FP8 GEMM of the quantized operands against the bf16 product."""
    x, w = randn(m, k), randn(n, k)
    out = ck.fp8_gemm(*ck.quantize_1x128(x, ue8m0), *ck.quantize_128x128(w, ue8m0))
    ref = x.float() @ w.float().t()
    assert calc_diff(out, ref) < 1e-3


def test_torch_compile():
    x = randn(333, 1024)

    @torch.compile(fullgraph=True)
    def f(x):
        return ck.quantize_1x128(x), ck.quantize_128x128(x)

    (q, s), (w, sb) = f(x)
    _same(q, quantize_1x128_reference(x)[0])
    _same(w, quantize_128x128_reference(x)[0])


# --- the norms' fused FP8 output (issue 3) -------------------------------------------------------
def _per_token_reference(y):
    from cute_kernels.fp8_gemm.ops import E4M3_MAX
    from cute_kernels.quantize.ops import _amax, _scale_of

    s = _scale_of(_amax(y.float(), 1), False).unsqueeze(1)  # (M, 1)
    q = (y.float() * torch.reciprocal(s)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, s


def _norm(kind, x, w, b, res, fp8_out=None):
    if kind == "rms":
        return ck.rms_norm(x, w, 1e-6, res, fp8_out=fp8_out)
    return ck.layer_norm(x, w, b, 1e-5, res, fp8_out=fp8_out)


NORM_SHAPES = [(4096, 4096, torch.bfloat16, False), (769, 7168, torch.bfloat16, True), (1, 256, torch.bfloat16, False),
               (333, 769, torch.bfloat16, False), (64, 131072, torch.bfloat16, False), (300, 2048, torch.float32, True),
               (130, 200, torch.float16, False),
               # session 14: the 16-CTA plans (RMSNorm from 128k, LayerNorm at 256k) and the register floor of the
               # quantizing epilogue beside a residual
               (16, 131072, torch.bfloat16, True), (4, 262144, torch.bfloat16, True),
               # session 20: vectors per thread that are not a power of two (RMSNorm 6144 at 256 x 3, LayerNorm 6
               # staged; 5120 at 3 and 5)
               (300, 6144, torch.bfloat16, False), (257, 6144, torch.float16, True), (300, 5120, torch.bfloat16, True)]


@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("mode", ["per_token", "block128"])
@pytest.mark.parametrize("m,n,dtype,residual", NORM_SHAPES)
def test_norm_fp8_bitwise(kind, mode, m, n, dtype, residual):
    """Fused = the plain norm's y quantized by the reference, bit for bit (y rounded to x's dtype first)."""
    x = randn(m, n, dtype=dtype)
    x[: min(m, 3)] = 0  # all-zero rows: y = 0, the scale floor
    w, b = randn(n, dtype=dtype), randn(n, dtype=dtype)
    res = randn(m, n, dtype=dtype) if residual else None
    plain = _norm(kind, x, w, b, res)
    y = plain[0] if residual else plain
    _poison(m * n * 2)
    out = _norm(kind, x, w, b, res, mode)
    q, s = out[0], out[1]
    if residual:
        assert torch.equal(out[2], plain[1])
    if mode == "per_token":
        q_ref, s_ref = _per_token_reference(y)
    else:
        q_ref, s_ref = quantize_1x128_reference(y)
        assert s.stride() == s_ref.stride()
    _same(q, q_ref)
    _same(s, s_ref)


def test_norm_fp8_feeds_the_gemm():
    x, w = randn(1024, 4096), randn(4096)
    wt = randn(2112, 4096)
    q, s = ck.rms_norm(x, w, fp8_out="block128")
    wq, sw = ck.quantize_128x128(wt)
    out = ck.fp8_gemm(q, s, wq, sw)
    ref = ck.rms_norm(x, w).float() @ wt.float().t()
    assert calc_diff(out, ref) < 1e-3
    q2, s2 = ck.rms_norm(x, w, fp8_out="per_token")
    out2 = ck.fp8_gemm(q2, s2.expand(-1, 32), wq, sw)
    assert calc_diff(out2, ref) < 1e-3


def test_norm_fp8_3d_and_empty():
    x = randn(2, 5, 512)
    q, s = ck.layer_norm(x, fp8_out="block128")
    assert q.shape == x.shape and s.shape == (10, 4)
    _same(q.view(10, 512), quantize_1x128_reference(ck.layer_norm(x).view(10, 512))[0])
    q, s = ck.rms_norm(randn(0, 512), fp8_out="per_token")
    assert q.shape == (0, 512) and s.shape == (0, 1)
