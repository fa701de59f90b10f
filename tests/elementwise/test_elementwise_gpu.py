"""Elementwise copy/add/axpby on the GPU: bit-exact against torch where torch rounds once, bounded
otherwise; poisoned outputs; odd sizes, misaligned and non-contiguous inputs; 64-bit indexing."""

import pytest
import torch

from tests.helpers import EPS, randn

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
SIZES = [1, 31, 1000, 2**20 + 3, 3 * 2**20 + 5]


def _run(op, x, y, a=1.0, b=1.0):
    """Call the launch path on flat tensors with a NaN-poisoned output."""
    from cute_kernels.elementwise.ops import _launch

    out = torch.full_like(x, float("nan"))
    _launch(op, x, y, out, a, b)
    return out


def _check_axpby(out, a, x, b, y):
    ref = a * x.double() + b * y.double()
    scale = (a * x.double()).abs() + (b * y.double()).abs()
    bound = (EPS[x.dtype] + 4 * 2.0**-24) * scale + 1e-38
    assert not torch.isnan(out).any(), "unwritten (NaN) elements"
    err = (out.double() - ref).abs()
    assert (err <= bound).all(), f"max err {err.max().item()} over bound"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_copy_add_axpby(dtype, n):
    x, y = randn(n, dtype=dtype), randn(n, dtype=dtype)
    out = _run("copy", x, x)
    assert torch.equal(out, x)
    out = _run("add", x, y)
    assert torch.equal(out, x + y)  # both compute in fp32 and round once
    a, b = 1.7, -0.3
    _check_axpby(_run("axpby", x, y, a, b), a, x, b, y)


@pytest.mark.parametrize("dtype", DTYPES)
def test_misaligned_operands_take_the_scalar_path(dtype):
    base = randn(4097, dtype=dtype)
    x = base[1:]  # data pointer 2 or 4 bytes past a 16-byte boundary
    y = randn(4096, dtype=dtype)
    assert x.data_ptr() % 16 != 0
    assert torch.equal(_run("add", x, y), x + y)
    import cute_kernels as ck

    assert torch.equal(ck.add(x, y), x + y)


def test_public_ops_shapes_and_layouts():
    import cute_kernels as ck

    x = randn(64, 96, dtype=torch.bfloat16)
    y = randn(96, 64, dtype=torch.bfloat16).t()  # non-contiguous
    assert torch.equal(ck.add(x, y), x + y)
    assert torch.equal(ck.copy(y), y.contiguous())
    assert ck.copy(y).is_contiguous()
    _check_axpby(ck.axpby(2.0, x, 3.0, y), 2.0, x, 3.0, y)
    e = torch.empty(0, 5, device="cuda", dtype=torch.float16)
    assert ck.add(e, e).shape == (0, 5)
    s = randn((), dtype=torch.float32)
    assert torch.equal(ck.add(s, s), s + s)


def test_autograd():
    import cute_kernels as ck

    x = randn(1000, dtype=torch.float32).requires_grad_()
    y = randn(1000, dtype=torch.float32).requires_grad_()
    (ck.axpby(2.0, x, -3.0, y).sum() + ck.add(x, y).sum() + ck.copy(x).sum()).backward()
    assert torch.allclose(x.grad, torch.full_like(x, 4.0))
    assert torch.allclose(y.grad, torch.full_like(y, -2.0))


def test_torch_compile_fullgraph():
    import cute_kernels as ck

    @torch.compile(fullgraph=True)
    def f(x, y):
        return ck.axpby(0.5, ck.add(x, y), 2.0, y) * 1.0

    x, y = randn(4099, dtype=torch.bfloat16), randn(4099, dtype=torch.bfloat16)
    ref = ck.axpby(0.5, ck.add(x, y), 2.0, y)
    assert torch.equal(f(x, y), ref)


def test_named_errors():
    import cute_kernels as ck

    x = randn(8, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="y has dtype"):
        ck.add(x, x.float())
    with pytest.raises(ValueError, match="y has shape"):
        ck.add(x, x[:4])
    with pytest.raises(TypeError, match="x has dtype int32"):
        ck.copy(x.int())
    with pytest.raises(ValueError, match="x must be on a CUDA device"):
        ck.copy(x.cpu())


def test_new_sizes_do_not_recompile():
    import cute_kernels as ck
    from cute_kernels.jit import default_cache

    ck.add(randn(100, dtype=torch.float16), randn(100, dtype=torch.float16))
    before = default_cache().stats.compiles + default_cache().stats.disk_hits
    for n in (7, 1000, 123457):
        x = randn(n, dtype=torch.float16)
        ck.add(x, x)
    assert default_cache().stats.compiles + default_cache().stats.disk_hits == before


def test_runs_on_the_current_stream():
    import cute_kernels as ck

    x, y = randn(1 << 24, dtype=torch.float32), randn(1 << 24, dtype=torch.float32)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = ck.add(x, y)
        out2 = ck.copy(out)
    torch.cuda.current_stream().wait_stream(s)
    assert torch.equal(out2, x + y)


@pytest.mark.large
def test_64bit_indexing_past_2_31_elements():
    n = 2**31 + 5
    x = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    x.normal_()
    y = torch.empty_like(x)
    y.normal_()
    out = _run("add", x, y)
    assert out.shape[0] == n
    assert not torch.isnan(out).any()
    ref = torch.empty_like(x)
    torch.add(x, y, out=ref)
    assert torch.equal(out, ref)
    del ref
    out = _run("copy", x, x)
    assert torch.equal(out[-1000:], x[-1000:]) and torch.equal(out[:1000], x[:1000])
    assert torch.equal(out, x)
