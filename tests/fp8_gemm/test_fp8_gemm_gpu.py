"""GPU: the FP8 block-scaled GEMM against an fp32 reference on the dequantized inputs, with
DeepGEMM's metric 1 - 2 sum(x y) / sum(x^2 + y^2) < 1e-3, on the issue's shapes, every schedule,
odd sizes (N = 2112, K not a multiple of 128, M = 1), poisoned outputs; the quantizers bitwise
equal on GPU and CPU."""

import pytest
import torch

from tests.helpers import randn

pytestmark = pytest.mark.gpu

ck = pytest.importorskip("cute_kernels")
from cute_kernels.fp8_gemm.ops import _fp8_gemm_cuda  # noqa: E402
from cute_kernels.quantize.ops import (  # noqa: E402
    dequantize_1x128,
    dequantize_128x128,
    quantize_1x128_reference,
    quantize_128x128_reference,
)
from schedules.fp8_gemm import fp8_schedule  # noqa: E402

ISSUE_NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
SCHEDULES = {
    "coop128x128": fp8_schedule("cooperative", 128, 128),
    "pingpong64x128": fp8_schedule("pingpong", 64, 128),
    "coop128x64": fp8_schedule("cooperative", 128, 64),
    "pingpong64x64": fp8_schedule("pingpong", 64, 64),
    "coop_1x2": fp8_schedule("cooperative", 128, 128, cluster_m=1, cluster_n=2),
    "nonpersistent": fp8_schedule("cooperative", 128, 128, cluster_m=1, persistent=False),
}


def calc_diff(x, y):
    x, y = x.double(), y.double()
    return (1 - 2 * (x * y).sum() / (x * x + y * y).sum()).item()


def _inputs(m, n, k, ue8m0=False):
    a, sa = ck.quantize_1x128(randn(m, k), ue8m0)
    b, sb = ck.quantize_128x128(randn(n, k), ue8m0)
    return a, sa, b, sb


def _reference(a, sa, b, sb):
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return dequantize_1x128(a, sa) @ dequantize_128x128(b, sb).t()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def _poison_allocator(nbytes):
    torch.cuda.empty_cache()  # else the output may reuse a cached block of finite garbage
    torch.full((nbytes // 2 + 4096,), float("nan"), dtype=torch.bfloat16, device="cuda")
    torch.cuda.synchronize()


def _check(out, a, sa, b, sb, dtype=torch.bfloat16, bound=1e-3):
    ref = _reference(a, sa, b, sb)
    assert out.shape == ref.shape and out.dtype == dtype
    assert torch.isfinite(out).all(), "unwritten (NaN) or overflowed elements"
    diff = calc_diff(out, ref)
    assert diff < bound, f"DeepGEMM diff {diff:.2e} >= {bound:.0e}"


def _same_bits(m, n, k, kw, ref_kw):
    """Fresh inputs, outputs poisoned: `_fp8_gemm_cuda(..., **kw)` equals `_fp8_gemm_cuda(..., **ref_kw)` bit
    for bit (the same FFMAs in the same order) and meets the fp32 reference."""
    a, sa, b, sb = _inputs(m, n, k)
    _poison_allocator(m * n * 4 * 8)
    out = _fp8_gemm_cuda(a, sa, b, sb, **kw)
    assert out.equal(_fp8_gemm_cuda(a, sa, b, sb, **ref_kw))
    _check(out, a, sa, b, sb)


@pytest.mark.parametrize("n,k", ISSUE_NK)
@pytest.mark.parametrize("m", [64, 128, 4096])
def test_issue_shapes(m, n, k):
    a, sa, b, sb = _inputs(m, n, k)
    _poison_allocator(m * n * 2)
    _check(ck.fp8_gemm(a, sa, b, sb), a, sa, b, sb)


@pytest.mark.parametrize("sched", list(SCHEDULES))
def test_schedules(sched):
    m, n, k = 769, 2112, 1040  # M, N partial tiles; K = 8 blocks + 16 (zero-filled by TMA)
    a, sa, b, sb = _inputs(m, n, k)
    _poison_allocator(m * n * 2)
    _check(_fp8_gemm_cuda(a, sa, b, sb, schedule=SCHEDULES[sched]), a, sa, b, sb)


@pytest.mark.parametrize("m,n,k", [(1, 128, 128), (5125, 96, 200), (33, 17, 9), (300, 2112, 7168), (128, 256, 16)])
def test_odd_shapes(m, n, k):
    """K not a multiple of 16 (copied, zero-padded), N not a multiple of 8 (padded output), M = 1."""
    a, sa, b, sb = _inputs(m, n, k)
    _poison_allocator(m * n * 2)
    _check(ck.fp8_gemm(a, sa, b, sb), a, sa, b, sb)


def test_empty_and_k_zero():
    a, sa, b, sb = _inputs(0, 64, 256)
    assert ck.fp8_gemm(a, sa, b, sb).shape == (0, 64)
    z = torch.empty(5, 0, dtype=torch.float8_e4m3fn, device="cuda")
    out = ck.fp8_gemm(z, torch.empty(5, 0, device="cuda"), torch.empty(7, 0, dtype=z.dtype, device="cuda"),
                      torch.empty(1, 0, device="cuda"))
    assert torch.equal(out, torch.zeros(5, 7, dtype=torch.bfloat16, device="cuda"))


def test_fp16_out_ue8m0_and_row_major_scales():
    a, sa, b, sb = _inputs(512, 1024, 2048, ue8m0=True)
    _check(ck.fp8_gemm(a, sa, b, sb, torch.float16), a, sa, b, sb, torch.float16)
    out = ck.fp8_gemm(a, sa, b, sb)
    assert torch.equal(ck.fp8_gemm(a, sa.contiguous(), b, sb.t().contiguous().t()), out)


def test_non_contiguous_operands_are_copied():
    a, sa, b, sb = _inputs(256, 384, 512)
    at = a.t().contiguous().t()  # M-major A: not K-major, copied
    assert torch.equal(ck.fp8_gemm(at, sa, b, sb), ck.fp8_gemm(a, sa, b, sb))


def test_torch_compile_fullgraph():
    a, sa, b, sb = _inputs(256, 512, 1024)

    @torch.compile(fullgraph=True)
    def f(a, sa, b, sb):
        return ck.fp8_gemm(a, sa, b, sb) * 2

    _check(f(a, sa, b, sb) / 2, a, sa, b, sb)


@pytest.mark.parametrize("m,k", [(4096, 7168), (769, 200), (1, 16)])
@pytest.mark.parametrize("ue8m0", [False, True])
def test_quantize_bitwise_gpu_vs_cpu(m, k, ue8m0):
    x = randn(m, k) * 3
    q, sa = ck.quantize_1x128(x, ue8m0)
    q_ref, sa_ref = quantize_1x128_reference(x.cpu(), ue8m0)
    assert torch.equal(q.cpu().view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(sa.cpu(), sa_ref)
    w, sb = ck.quantize_128x128(x, ue8m0)
    w_ref, sb_ref = quantize_128x128_reference(x.cpu(), ue8m0)
    assert torch.equal(w.cpu().view(torch.uint8), w_ref.view(torch.uint8)) and torch.equal(sb.cpu(), sb_ref)
