"""Row sums and the full sum on the GPU: fp64 references, dtype-aware bounds, poisoned outputs,
edge shapes, strided rows, split rows, determinism, 64-bit indexing."""

import pytest
import torch

from tests.helpers import EPS, randn

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _bound(x2: torch.Tensor, ref: torch.Tensor, out_dtype) -> torch.Tensor:
    """fp32 accumulation error (~n * 2^-24 * sum|x|, loosely) plus one rounding to the output dtype."""
    n = x2.shape[-1]
    absum = x2.double().abs().sum(-1)
    return EPS[out_dtype] * ref.abs() + 4 * n**0.5 * 2.0**-24 * absum + 1e-30


def _row_sum_poisoned(x2, out_dtype=None):
    from cute_kernels.reduction.ops import _rows_of, _sum_rows

    out = torch.full(x2.shape[:-1], float("nan"), dtype=out_dtype or x2.dtype, device=x2.device)
    _sum_rows(_rows_of(x2), out.view(-1))
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape", [(1, 1), (1, 31), (3, 769), (1000, 4096), (257, 128), (5, 1 << 20 | 3), (4096, 7), (2, 65536 * 4)]
)
def test_row_sum(dtype, shape):
    x = randn(*shape, dtype=dtype)
    for out_dtype in (None, torch.float32):
        out = _row_sum_poisoned(x, out_dtype)
        assert not torch.isnan(out).any(), "unwritten outputs"
        ref = x.double().sum(-1)
        err = (out.double() - ref).abs()
        assert (err <= _bound(x, ref, out.dtype)).all(), f"max err {err.max().item()}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [0, 1, 31, 2**20 + 3, 50_000_000])
def test_sum_all(dtype, n):
    import cute_kernels as ck

    x = randn(n, dtype=dtype)
    out = ck.sum(x)
    ref = x.double().sum()
    assert out.dtype == dtype and out.shape == ()
    assert abs(out.double().item() - ref.item()) <= _bound(x.view(1, -1), ref.view(1), dtype).item()


def test_deterministic_run_to_run():
    import cute_kernels as ck

    x = randn(1 << 26, dtype=torch.float32)
    a = ck.sum(x, out_dtype=torch.float32)
    for _ in range(5):
        assert torch.equal(ck.sum(x, out_dtype=torch.float32), a)
    y = randn(64, 1 << 20, dtype=torch.bfloat16)
    r = ck.sum(y, dim=-1, out_dtype=torch.float32)
    for _ in range(3):
        assert torch.equal(ck.sum(y, dim=-1, out_dtype=torch.float32), r)


def test_strided_and_transposed_inputs():
    import cute_kernels as ck

    base = randn(300, 1024, dtype=torch.bfloat16)
    view = base[:, :1000]  # row stride 1024: read in place
    ref = view.double().sum(-1)
    assert ((ck.sum(view, dim=-1).double() - ref).abs() <= _bound(view, ref, torch.bfloat16)).all()
    t = randn(512, 300, dtype=torch.float32).t()  # last dim not unit-stride: copied first
    ref = t.double().sum(-1)
    assert ((ck.sum(t, dim=-1).double() - ref).abs() <= _bound(t, ref, torch.float32)).all()
    b3 = randn(4, 6, 100, dtype=torch.float16)[:, ::2]  # 3-D, non-flattenable leading dims
    ref = b3.double().sum(-1)
    out = ck.sum(b3, dim=-1)
    assert out.shape == (4, 3)
    assert ((out.double() - ref).abs() <= _bound(b3, ref, torch.float16)).all()
    odd = randn(10001, dtype=torch.bfloat16)[1:]  # misaligned base
    ref = odd.double().sum()
    assert abs(ck.sum(odd).double().item() - ref.item()) <= _bound(odd.view(1, -1), ref.view(1), torch.bfloat16).item()


def test_empty_shapes():
    import cute_kernels as ck

    assert ck.sum(torch.empty(0, 5, device="cuda"), dim=-1).shape == (0,)
    z = ck.sum(torch.empty(5, 0, device="cuda", dtype=torch.bfloat16), dim=-1)
    assert z.shape == (5,) and (z == 0).all()
    assert ck.sum(torch.empty(0, device="cuda")).item() == 0.0


def test_autograd_and_compile():
    import cute_kernels as ck

    x = randn(33, 77, dtype=torch.float32).requires_grad_()
    (ck.sum(x, dim=-1) * torch.arange(33, device="cuda")).sum().backward()
    assert torch.equal(x.grad, torch.arange(33, device="cuda", dtype=torch.float32)[:, None].expand(33, 77))

    f = torch.compile(lambda t: ck.sum(t, dim=-1) + ck.sum(t), fullgraph=True)
    y = randn(64, 4096, dtype=torch.bfloat16)
    assert torch.equal(f(y), ck.sum(y, dim=-1) + ck.sum(y))


def test_named_errors():
    import cute_kernels as ck

    with pytest.raises(ValueError, match="dim must be None or the last dim"):
        ck.sum(randn(4, 4), dim=0)
    with pytest.raises(TypeError, match="out_dtype"):
        ck.sum(randn(4, 4), out_dtype=torch.int32)
    with pytest.raises(ValueError, match="at least 1 dimension"):
        torch.ops.cute_kernels.row_sum(randn((), dtype=torch.float32))


@pytest.mark.large
def test_64bit_indexing_past_2_31_elements():
    import cute_kernels as ck

    n = 2**31 + 5
    x = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    x.uniform_(-1, 1)
    x[-3:] = 1000.0  # the tail must be counted
    out = ck.sum(x, out_dtype=torch.float32)
    ref = sum(x[i : i + (1 << 28)].double().sum().item() for i in range(0, n, 1 << 28))
    absum = sum(x[i : i + (1 << 28)].double().abs().sum().item() for i in range(0, n, 1 << 28))
    assert abs(out.item() - ref) <= 1e-5 * absum
    rows = x[: 2**31].view(2, 2**30)
    r = ck.sum(rows, dim=-1, out_dtype=torch.float32)
    for i in range(2):
        ref = sum(rows[i, j : j + (1 << 28)].double().sum().item() for j in range(0, 2**30, 1 << 28))
        assert abs(r[i].item() - ref) <= 1e-5 * absum


# --- column sums (the norms' backward finishes its fp32 weight-gradient partials with them) -------
@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (1, 4096), (3, 7), (30, 65536), (264, 4096), (528, 4097), (1000, 769)])
def test_col_sum(out_dtype, shape):
    from cute_kernels.reduction.ops import sum_columns_into

    p = randn(*shape, dtype=torch.float32)
    out = torch.full((shape[1],), float("nan"), dtype=out_dtype, device=p.device)
    sum_columns_into(p, out)
    assert not torch.isnan(out).any(), "unwritten outputs"
    ref = p.double().sum(0)
    err = (out.double() - ref).abs()
    assert (err <= _bound(p.t(), ref, out_dtype)).all(), f"max err {err.max().item()}"
    again = torch.full_like(out, float("nan"))
    sum_columns_into(p, again)
    assert torch.equal(out, again), "not bitwise run to run"


def test_col_sum_unaligned():
    """Rows whose start is not 16-byte aligned (a column offset into a wider buffer) and an out that is
    not: the scalar variant, same values."""
    from cute_kernels.reduction.ops import sum_columns_into

    wide = randn(264, 4099, dtype=torch.float32)
    p = wide[:, 1:4097]
    for dt in DTYPES:
        buf = torch.full((4097,), float("nan"), dtype=dt, device=p.device)
        out = buf[1:]
        sum_columns_into(p, out)
        ref = p.double().sum(0)
        assert (((out.double() - ref).abs()) <= _bound(p.t(), ref, dt)).all()
        assert torch.isnan(buf[0]), "wrote outside out"
