"""GPU: the tensor-core GEMV (`kernels.gemv_mma`) against an fp64 reference at dtype-aware bounds and
against the FMA kernel: every column count 1-8, bf16 and fp16, K with a partial last 32-wide chunk (K % 32
= 8, 16, 24) and K < 32, rows not a multiple of the 16-row CTA block (1, 7, 769), each plan shape (1 or 2
row blocks, 4-16 warps), a strided W (a slice of a wider matrix), outputs poisoned; deterministic."""

import pytest
import torch

from tests.helpers import randn

pytestmark = pytest.mark.gpu

ck = pytest.importorskip("cute_kernels")
from cute_kernels.gemv.ops import _gemv_cuda  # noqa: E402


def _check(y, w, x):
    ref = (w.double() @ x.double())
    torch_err = (w @ x).double().sub(ref).abs().max().item()
    err = y.double().sub(ref).abs().max().item()
    assert torch.isfinite(y).all(), "unwritten (NaN) outputs"
    assert err <= 2 * torch_err + 1e-3 * ref.abs().max().item(), (err, torch_err)


def _poison(n, b, dtype):
    torch.cuda.empty_cache()
    torch.full((n * b * 4 + 4096,), float("nan"), dtype=dtype, device="cuda")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,k", [(1, 4096), (7, 40), (769, 5128), (4096, 4096), (1024, 16384), (300, 24), (64, 8)],
                         ids=str)
@pytest.mark.parametrize("b", [1, 2, 3, 5, 8])
def test_gemv_mma(dtype, n, k, b):
    w = randn(n, k, dtype=dtype)
    x = randn(b, k, dtype=dtype).t()
    _poison(n, b, dtype)
    y = _gemv_cuda(w, x, tensor_cores=True)
    assert y.shape == (n, b)
    _check(y, w, x)
    assert torch.equal(y, _gemv_cuda(w, x, tensor_cores=True))  # deterministic


def test_gemv_mma_strided_w_and_vector_x():
    base = randn(2000, 6144, dtype=torch.bfloat16)
    w = base[:, 1024:5120]  # row stride 6144: read in place
    x = randn(8, 4096, dtype=torch.bfloat16).t()
    _check(_gemv_cuda(w, x, tensor_cores=True), w, x)
    xv = randn(4096, dtype=torch.bfloat16)
    y = _gemv_cuda(w, xv, tensor_cores=True)
    assert y.shape == (2000,)
    _check(y, w, xv)


def test_gemv_default_kernel_choice():
    """The op's default (`schedules.gemv.use_tensor_cores`): the tensor-core kernel from B = 2 on W of
    >= 16 rows per SM, from B = 5 on fewer rows; equal bit for bit to the forced kernel it picks."""
    for n, b in [(4096, 8), (4096, 2), (1024, 8), (1024, 4), (1024, 2)]:
        w = randn(n, 4096, dtype=torch.bfloat16)
        x = randn(b, 4096, dtype=torch.bfloat16).t()
        mma = n >= 16 * torch.cuda.get_device_properties(0).multi_processor_count or b >= 5
        assert torch.equal(ck.gemv(w, x), _gemv_cuda(w, x, tensor_cores=mma)), (n, b)


@pytest.mark.large
@pytest.mark.parametrize("b", [1, 8])
def test_gemv_past_2_31_elements(b):
    """W of 65600 x 32768 bf16 (2^31 + 2.1M elements, 4.3 GB): 64-bit row offsets in both kernels (B = 1:
    the FMA kernel, B = 8: the tensor cores); the rows past element 2^31 and the first rows checked against
    fp32 references of those rows."""
    n, k = 65600, 32768
    w = torch.empty(n, k, dtype=torch.bfloat16, device="cuda")
    for r0 in range(0, n, 8192):  # randn in chunks (a float32 randn of the whole would take 8.6 GB)
        w[r0:r0 + 8192] = randn(min(8192, n - r0), k, dtype=torch.bfloat16)
    x = randn(b, k, dtype=torch.bfloat16).t()
    _poison(n, b, torch.bfloat16)
    y = ck.gemv(w, x)
    assert torch.isfinite(y).all()
    for rows in (slice(0, 64), slice(65536 - 8, n)):
        ref = w[rows].float() @ x.float()
        err = (y[rows].float() - ref).abs().max().item()
        assert err <= 2e-2 * ref.abs().max().item(), (rows, err)
