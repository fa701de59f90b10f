"""GPU: ArgMax exact against torch: ties, NaN, inf and zeros, the two-level scan's positions, the row heads of
unaligned 16-bit rows, strided inputs, determinism, keepdim."""

import pytest
import torch

from tests.helpers import randn

pytestmark = pytest.mark.gpu


DTYPES = [torch.bfloat16, torch.float16, torch.float32]


# --- ArgMax --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,shape", [
    *[(d, s) for d in DTYPES for s in [(1, 31), (3, 769), (5125, 7), (2, 1 << 22 | 5)]],
    (torch.bfloat16, (1, 1)), (torch.float16, (1000, 4096)), (torch.float32, (1, 50_000_003)),
    (torch.bfloat16, (257, 128))])
def test_argmax_exact(dtype, shape):
    import cute_kernels as ck
    from cute_kernels.argmax.ops import _argmax_rows
    from cute_kernels.reduction.ops import _rows_of

    x = randn(*shape, dtype=dtype)
    out = torch.full(shape[:-1], -7, dtype=torch.int64, device="cuda")
    _argmax_rows(_rows_of(x), out.view(-1))
    assert torch.equal(out, torch.argmax(x, dim=-1))
    assert torch.equal(ck.argmax(x), torch.argmax(x, dim=-1))


@pytest.mark.parametrize("dtype", DTYPES)
def test_argmax_ties_nan_inf_zero(dtype):
    import cute_kernels as ck

    x = torch.zeros(8, 5000, dtype=dtype, device="cuda")
    x[0, [17, 300, 4999]] = 3.0  # ties: lowest index
    x[1] = -float("inf")  # all -inf: index 0
    x[2, 4000] = float("nan")
    x[2, 4500] = float("nan")
    x[2, 10] = float("inf")  # the first NaN wins over inf
    x[3] = -0.0
    x[3, 2000] = 0.0  # -0 == +0: index 0
    x[4, 4999] = float("inf")
    x[5] = -1.0
    x[5, [1234, 1235]] = float("-nan") if dtype == torch.float32 else float("nan")
    x[6] = randn(5000, dtype=dtype)
    x[6, 2500:] = x[6, :2500]  # every maximum appears twice
    x[7] = 1.0
    assert torch.equal(ck.argmax(x), torch.argmax(x, dim=-1))
    big = torch.zeros(1, 30_000_000, dtype=dtype, device="cuda")  # split rows: ties across splits
    big[0, [29_000_000, 7_000_001, 7_000_002]] = 1.0
    assert ck.argmax(big).item() == 7_000_001
    big[0, 20_000_000] = float("nan")
    assert ck.argmax(big).item() == 20_000_000


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 7, 8, 9, 16, 769, 4096, 4099, 70_001])
def test_argmax_two_level_positions(dtype, n):
    """The two-level scan (vector max, then the position inside the best vector): ties inside a
    vector and across vectors (values drawn from 7 integers), a NaN at the first, last and middle
    slot of a vector and in the tail, -inf and all-equal rows, -0 against +0; aligned and strided."""
    import cute_kernels as ck

    g = torch.Generator(device="cuda")
    g.manual_seed(n)
    rows = 64
    x = torch.randint(-3, 4, (rows, n), generator=g, device="cuda").to(dtype)
    vec = 16 // x.element_size()
    nan = float("nan")
    for r, pos in enumerate([0, vec - 1, vec, vec + 3, n // 2, n - 1, (n // vec) * vec, n - 2]):
        if 0 <= pos < n:
            x[r, pos] = nan  # the only NaN of the row
    for r, (a, b) in enumerate([(1, vec + 1), (vec - 1, vec - 2), (n - 1, 0), (n // 3, n // 2)], start=8):
        if max(a, b) < n:
            x[r, a] = nan
            x[r, b] = nan  # two NaNs: the lower index wins
    x[12] = -float("inf")
    x[13] = 2.0
    x[14] = -0.0
    x[14, n // 2:] = 0.0  # -0 == +0: index 0
    x[15] = -float("inf")
    x[15, n - 1] = float("inf")
    x[16] = float("inf")
    x[17, :] = -5.0
    x[17, n - 1] = -4.0  # the maximum in the tail (or the last vector)
    x[18] = x[18].sort().values  # the maximum first reached in the last vectors
    x[19] = x[19].sort(descending=True).values  # the maximum run starts at index 0
    ref = torch.argmax(x, dim=-1)
    assert torch.equal(ck.argmax(x), ref)
    wide = torch.full((rows, n + 24), 9.0, dtype=dtype, device="cuda")
    wide[:, :n] = x
    assert torch.equal(ck.argmax(wide[:, :n]), ref)  # row stride n + 24 (aligned 128-bit vectors)
    off = torch.full((rows, n + 1), 9.0, dtype=dtype, device="cuda")
    off[:, 1:] = x
    assert torch.equal(ck.argmax(off[:, 1:]), ref)  # misaligned start: the element-wise scan
    if n >= 4096:  # one long row, split over CTAs: ties and NaNs across splits
        length = 40 * n
        big = torch.randint(-3, 3, (1, length), generator=g, device="cuda").to(dtype)
        big[0, [length * 9 // 10, length * 7 // 10 + 1, length * 7 // 10]] = 3.0
        assert ck.argmax(big).item() == length * 7 // 10
        big[0, [length - 1, length // 2 + 5]] = nan
        assert ck.argmax(big).item() == length // 2 + 5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_argmax_row_heads(dtype):
    """Rows of odd length (every row starts at a different offset from a 16-byte boundary: the scalar
    head, 128-bit vectors, the scalar end), the head path forced (`row_head=True`): the maximum, a NaN or a
    tie in the head, the vectors and the end of each row; a vocabulary row length; one long odd row split
    over CTAs; a strided view."""
    from cute_kernels.argmax.ops import _argmax_rows
    from cute_kernels.reduction.ops import _rows_of

    def am(t):
        out = torch.full(t.shape[:-1], -7, dtype=torch.int64, device="cuda")
        _argmax_rows(_rows_of(t), out.view(-1), row_head=True)
        return out

    n = 50257
    x = randn(64, n, dtype=dtype)
    for r in range(16):
        h = (-r * n) % 8  # this row's head length
        pos = [0, max(h - 1, 0), h, h + 7, n // 2, n - 1, n - 8, n - 9][r % 8]
        x[r, pos] = 100.0 if r < 8 else float("nan")
    x[16, [3, 40000]] = 100.0  # a tie between a head slot (row 16's head is 0) and the body
    x[17, [0, n - 1]] = 100.0
    x[18] = -float("inf")
    for r in (19, 20, 21, 22):  # heads of 5, 4, 3, 2 elements: a head slot ties with a later element that
        h = (-r * n) % 8  # the same lane scans (its first vector, element h + 9) -> the head slot wins
        x[r, [1, h + 9, n // 2]] = 100.0
    x[25, [0, 9]] = float("nan")  # head 7: a NaN in the head and in the first vector -> 0
    assert torch.equal(am(x), torch.argmax(x, dim=-1))
    v = randn(300, 1001, dtype=dtype)[:, :999]  # stride 1001, length 999: a head and an end on each row
    assert torch.equal(am(v), torch.argmax(v, dim=-1))
    for n in (16, 17, 23, 769, 4099):
        y = randn(33, n, dtype=dtype)
        y[5, n - 1] = float("nan")
        assert torch.equal(am(y), torch.argmax(y, dim=-1)), n
    big = randn(1, 3_000_001, dtype=dtype)
    big[0, [2_999_999, 1_000_003]] = 50.0
    assert am(big).item() == 1_000_003
    big[0, 1] = float("nan")
    assert am(big).item() == 1


def test_argmax_strided_deterministic_keepdim():
    import cute_kernels as ck

    base = randn(300, 1024, dtype=torch.bfloat16)
    v = base[:, :1000]
    assert torch.equal(ck.argmax(v), torch.argmax(v, -1))
    t = randn(512, 300, dtype=torch.float32).t()
    assert torch.equal(ck.argmax(t), torch.argmax(t, -1))
    b3 = randn(4, 6, 100, dtype=torch.float16)[:, ::2]
    assert torch.equal(ck.argmax(b3, keepdim=True), torch.argmax(b3, -1, keepdim=True))
    y = randn(64, 1 << 20, dtype=torch.bfloat16)
    r = ck.argmax(y)
    for _ in range(3):
        assert torch.equal(ck.argmax(y), r)
    assert ck.argmax(torch.empty(0, 5, device="cuda")).shape == (0,)
    with pytest.raises(ValueError, match="empty last dim"):
        ck.argmax(torch.empty(5, 0, device="cuda"))
