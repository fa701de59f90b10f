"""GEMV, SiLU/SwiGLU, ArgMax and transposes on the GPU: fp64 references, dtype-aware bounds,
NaN-poisoned outputs, edge shapes (0/1 rows, 769, 5125), non-contiguous inputs, argmax ties and NaN,
bitwise transposes for all four variants, autograd against torch.

Parametrizations cover each size class once per dtype (not the full product), so the whole file
runs in about a minute on an H200 with a cold compile cache."""

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import EPS, randn

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
VARIANTS = ["naive", "smem", "swizzle", "tma"]


# --- GEMV ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k,cols", [(1, 1, 0), (1, 4096, 1), (769, 5125, 3), (4096, 4096, 8), (3, 16384, 0),
                                      (5125, 64, 8), (769, 5125, 0), (769, 5125, 5), (5125, 4097, 4),
                                      (1, 333, 8), (1023, 4099, 2), (5, 77, 7), (4099, 1000, 6)])
def test_gemv(dtype, n, k, cols):
    import cute_kernels as ck

    w = randn(n, k, dtype=dtype)
    x = randn(k, dtype=dtype) if cols == 0 else randn(cols, k, dtype=dtype).t()
    y = ck.gemv(w, x)
    ref = w.double() @ x.double()
    bound = EPS[dtype] * ref.abs() + 4 * k**0.5 * 2.0**-24 * (w.double().abs() @ x.double().abs()) + 1e-30
    assert y.shape == ref.shape and y.dtype == dtype
    assert not torch.isnan(y).any()
    assert ((y.double() - ref).abs() <= bound).all()


def test_gemv_layouts_and_determinism():
    import cute_kernels as ck

    w = randn(1000, 4100, dtype=torch.bfloat16)
    x = randn(4100, 5, dtype=torch.bfloat16)  # row-major (K, B): transposed into a buffer first
    ref = w.double() @ x.double()
    y = ck.gemv(w, x)
    assert ((y.double() - ref).abs() <= 2**-8 * ref.abs() + 1e-3 * ref.abs().max()).all()
    ws = randn(1000, 8192, dtype=torch.bfloat16)[:, 100:4200]  # row stride 8192, misaligned base
    y2 = ck.gemv(ws, x)
    ref2 = ws.double() @ x.double()
    assert ((y2.double() - ref2).abs() <= 2**-8 * ref2.abs() + 1e-3 * ref2.abs().max()).all()
    for _ in range(3):
        assert torch.equal(ck.gemv(w, x), y)
    assert ck.gemv(randn(0, 16), randn(16)).shape == (0,)


@pytest.mark.parametrize("cols", [1, 2, 3, 4, 5, 8])
def test_gemv_row_blocks_unaligned_and_strided(cols):
    """Every register-tile size (R = 1, 2, 4 rows per thread) on: N not a multiple of the tile
    (769, 5125) or below it (1, 5), odd K (the scalar tail), x whose columns are misaligned (the
    unvectorized path) or strided along K (copied first), and a W slice with a row stride."""
    import cute_kernels as ck

    def check(w, x):
        y = ck.gemv(w, x)
        ref = w.double() @ x.double()
        bound = EPS[w.dtype] * ref.abs() + 4 * w.shape[1] ** 0.5 * 2.0**-24 * (w.double().abs() @ x.double().abs())
        assert y.shape == ref.shape and not torch.isnan(y).any()
        assert ((y.double() - ref).abs() <= bound + 1e-30).all(), (tuple(w.shape), x.stride())
        assert torch.equal(ck.gemv(w, x), y)  # deterministic
        return y

    for n, k in [(769, 4097), (5125, 1031), (1, 4096), (5, 9)]:
        w = randn(n, k, dtype=torch.bfloat16)
        check(w, randn(cols, k, dtype=torch.bfloat16).t())  # aligned, contiguous columns
        check(w, randn(cols, k + 3, dtype=torch.bfloat16)[:, 1:k + 1].t())  # misaligned columns: vec = 1
        check(w, randn(cols, 2 * k, dtype=torch.bfloat16)[:, ::2].t())  # strided along K: copied
    check(randn(769, 8192, dtype=torch.float16)[:, 8:4104], randn(cols, 4096, dtype=torch.float16).t())
    check(randn(1000, 4100, dtype=torch.float32), randn(cols, 4100, dtype=torch.float32).t())
    assert (ck.gemv(torch.empty(4, 0, device="cuda"), torch.empty(0, device="cuda")) == 0).all()


# --- SiLU / SwiGLU -------------------------------------------------------------------------------
def _close(out, ref, dtype, torch_out, scale=None, ulps=None):
    """out against the fp64 `ref`, element by element: within twice torch's own worst error relative to
    `scale` (torch_out vs ref) plus `ulps` ulps of `scale` (default |ref|; for a sum of terms that can
    cancel, pass the magnitude of the terms). One ulp <= 2 * EPS * |x|; below the smallest normal the
    spacing is tiny * 2 * EPS, so `ulps` of that cover subnormal results and exact zeros."""
    assert out.shape == ref.shape and out.dtype == dtype
    if ulps is None:  # bf16/fp16: one rounding of an fp32 result; fp32: fast exp + a few roundings
        ulps = 4 if dtype == torch.float32 else 1
    if ref.numel() == 0:
        return
    scale = ref.abs() if scale is None else scale
    tiny = torch.finfo(dtype).tiny
    err = (out.double() - ref).abs()
    torch_rel = ((torch_out.double() - ref).abs() / (scale + tiny)).max().item()
    bound = (2 * torch_rel + ulps * 2 * EPS[dtype]) * (scale + tiny)
    bad = err > bound
    assert not bad.any(), (f"{int(bad.sum())} of {err.numel()} beyond 2x torch's relative error {torch_rel:.3g} + "
                           f"{ulps} ulps: worst err {err.max().item():.3g}, ours/scale "
                           f"{(err / (scale + tiny)).max().item():.3g}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(0,), (1,), (769,), (5125, 3), (1 << 22) + 3])
def test_silu_swiglu_forward(dtype, shape):
    import cute_kernels as ck

    shape = shape if isinstance(shape, tuple) else (shape,)
    g, u = randn(*shape, dtype=dtype), randn(*shape, dtype=dtype)
    gd, ud = g.double(), u.double()
    sd = torch.sigmoid(gd)
    y = ck.silu(g)
    assert y.shape == g.shape and y.dtype == dtype and not torch.isnan(y).any()
    _close(y, gd * sd, dtype, F.silu(g))
    out = ck.swiglu(g, u)
    assert not torch.isnan(out).any()
    _close(out, gd * sd * ud, dtype, F.silu(g) * u)


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_backward_vs_fp64_and_torch(dtype):
    import cute_kernels as ck

    g = randn(513, 1031, dtype=dtype).requires_grad_()
    u = randn(513, 1031, dtype=dtype).requires_grad_()
    dout = randn(513, 1031, dtype=dtype)
    ck.swiglu(g, u).backward(dout)
    gt, ut = g.detach().clone().requires_grad_(), u.detach().clone().requires_grad_()
    (F.silu(gt) * ut).backward(dout)
    gd, ud, dd = g.double(), u.double(), dout.double()
    s = torch.sigmoid(gd)
    # silu'(g) = s * (1 + g * (1 - s)) cancels near g = -1.28: bound by the terms' magnitude there
    _close(g.grad, dd * ud * s * (1 + gd * (1 - s)), dtype, gt.grad, scale=(dd * ud * s * (1 + (gd * (1 - s)).abs())).abs())
    _close(u.grad, dd * gd * s, dtype, ut.grad)
    x = randn(777, dtype=dtype).requires_grad_()
    dy = dout.view(-1)[:777]
    ck.silu(x).backward(dy)
    xt = x.detach().clone().requires_grad_()
    F.silu(xt).backward(dy)
    xd = x.double()
    sx = torch.sigmoid(xd)
    _close(x.grad, dy.double() * sx * (1 + xd * (1 - sx)), dtype, xt.grad,
           scale=(dy.double() * sx * (1 + (xd * (1 - sx)).abs())).abs())


def test_swiglu_non_contiguous_and_compile():
    import cute_kernels as ck

    h = randn(300, 2 * 1000, dtype=torch.bfloat16)
    g, u = h[:, :1000], h[:, 1000:]  # halves of a fused projection: copied first
    _close(ck.swiglu(g, u), F.silu(g.double()) * u.double(), torch.bfloat16, F.silu(g) * u)
    odd = randn(10001, dtype=torch.float16)[1:]  # misaligned: scalar variant
    _close(ck.silu(odd), F.silu(odd.double()), torch.float16, F.silu(odd))
    f = torch.compile(lambda a, b: ck.swiglu(a, b) + 1, fullgraph=True)
    a, b = randn(64, 4096), randn(64, 4096)
    assert torch.equal(f(a, b), ck.swiglu(a, b) + 1)


# --- ArgMax --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,shape", [
    *[(d, s) for d in DTYPES for s in [(1, 31), (3, 769), (5125, 7), (2, 1 << 22 | 5)]],
    (torch.bfloat16, (1, 1)), (torch.float16, (1000, 4096)), (torch.float32, (1, 50_000_003)),
    (torch.bfloat16, (257, 128))])
def test_argmax_exact(dtype, shape):
    import cute_kernels as ck
    from cute_kernels.ops.argmax import _argmax_rows
    from cute_kernels.ops.reduction import _rows_of

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
    from cute_kernels.ops.argmax import _argmax_rows
    from cute_kernels.ops.reduction import _rows_of

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


# --- Transpose -----------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (1, 8), (64, 64), (769, 5125), (8, 4096), (4096, 8), (3, 128, 200),
                                   (5, 769, 33), (2, 1000, 1000)])
def test_transpose_bitwise(variant, dtype, shape):
    import cute_kernels as ck

    x = randn(*shape, dtype=dtype)
    ref = x.transpose(-2, -1).contiguous()  # (1, 8) -> (8, 1) keeps stride (1, 8): compare flattened
    out = ck.transpose(x, variant=variant)
    assert out.shape == ref.shape and out.is_contiguous()
    assert torch.equal(out.flatten().view(torch.uint8), ref.flatten().view(torch.uint8))


@pytest.mark.parametrize("order", [{"order": "row"}, {"order": "diagonal"}, {"order": "grouped", "group": 1},
                                   {"order": "grouped", "group": 4}, {"order": "grouped", "group": 64}], ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_transpose_tile_orders(order, dtype):
    """Every tile order (schedules/tile_order.py) on ragged tile grids (tile-rows not a multiple of
    the group, partial tiles), batches, and a misaligned (scalar) input."""
    from cute_kernels.ops.transpose import _transpose_cuda

    for shape in [(769, 5125), (5, 769, 33), (3, 2100, 300), (1, 8), (4096, 8), (2, 1000, 1000)]:
        x = randn(*shape, dtype=dtype)
        for v in VARIANTS:
            out = _transpose_cuda(x, v, order)
            assert torch.equal(out, x.transpose(-2, -1).contiguous()), (v, shape)
    x = randn(3, 515, 261, dtype=dtype)[:, 1:, 1:]  # 16-byte misaligned rows: the scalar builds
    for v in VARIANTS:
        assert torch.equal(_transpose_cuda(x, v, order), x.transpose(-2, -1).contiguous()), v


@pytest.mark.parametrize("order", [{}, {"order": "row"}, {"order": "diagonal"}, {"group": 4}], ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_transpose_two_by_two_blocks(order, dtype):
    """`sub=2` (a CTA takes a 2 x 2 block of tiles): ragged block grids (a block half or a quarter
    outside the matrix, a single partial tile), batches, every tile order, the scalar builds."""
    from cute_kernels.ops.transpose import _transpose_cuda

    cfg = {"sub": 2, **order}
    for shape in [(769, 5125), (5, 769, 33), (3, 2100, 300), (1, 8), (4096, 8), (2, 1000, 1000), (130, 72)]:
        x = randn(*shape, dtype=dtype)
        for v in ("smem", "swizzle", "tma"):
            out = _transpose_cuda(x, v, cfg)
            assert torch.equal(out, x.transpose(-2, -1).contiguous()), (v, shape)
    x = randn(3, 515, 261, dtype=dtype)[:, 1:, 1:]  # 16-byte misaligned rows: the scalar builds
    for v in ("smem", "swizzle"):
        assert torch.equal(_transpose_cuda(x, v, cfg), x.transpose(-2, -1).contiguous()), v


@pytest.mark.parametrize("cfg", [{"persistent": True}, {"persistent": True, "sub": 2},
                                 {"persistent": True, "order": "diagonal"}, {"persistent": True, "order": "row"}],
                         ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_transpose_persistent(cfg, dtype):
    """The persistent TMA transpose (two load stages, two store buffers): CTAs with one block, with many
    (more blocks than resident CTAs: both stages reused, mbarrier phases flipping), ragged edges, batches."""
    from cute_kernels.ops.transpose import _transpose_cuda

    for shape in [(769, 5125), (5, 768, 40), (3, 2100, 304), (1, 8), (2, 4104, 4096), (8, 8)]:
        x = randn(*shape, dtype=dtype)
        torch.cuda.empty_cache()
        torch.full((x.numel() + 4096,), float("nan"), dtype=dtype, device="cuda")
        out = _transpose_cuda(x, "tma", cfg)  # rows not 16-byte multiples: the swizzle fallback, option dropped
        assert torch.equal(out, x.transpose(-2, -1).contiguous()), shape


def test_transpose_default_blocks_on_large_matrices():
    """The op's default for a matrix of >= 96 MiB is the TMA transpose with 2 x 2 blocks
    (`schedules.tile_order.transpose_sub`): ragged block edges on both dims, poisoned output."""
    import cute_kernels as ck

    x = randn(7000, 7200, dtype=torch.bfloat16)  # 96.1 MiB; 7000 = 54 x 128 + 88, 7200 = 56 x 128 + 32
    torch.cuda.empty_cache()
    torch.full((7000 * 7200 + 4096,), float("nan"), dtype=torch.bfloat16, device="cuda")
    assert torch.equal(ck.transpose(x), x.t().contiguous())


def test_transpose_large_batch_and_64bit():
    """A batch past the old grid-z limit (65535), and 64-bit indexing: > 2^31 elements over a batch
    (aligned: the TMA and 16-byte builds) and in one dim (2^31 + 64 columns, one row: the scalar
    builds, tile column offsets past 2^31)."""
    import cute_kernels as ck

    x = randn(70000, 3, 8, dtype=torch.float32)
    for v in VARIANTS:
        assert torch.equal(ck.transpose(x, variant=v), x.transpose(-2, -1).contiguous()), v
    for shape in [(3, 26000, 27536), (1, 2**31 + 64)]:
        x = torch.randint(-1000, 1000, shape, device="cuda", dtype=torch.int16).view(torch.bfloat16)
        ref = x.transpose(-2, -1).contiguous()
        for v in VARIANTS:
            out = ck.transpose(x, variant=v)
            assert torch.equal(out.flatten().view(torch.int16), ref.flatten().view(torch.int16)), (v, shape)
            del out
        del x, ref
        torch.cuda.empty_cache()


def test_transpose_poisoned_and_odd_layouts():
    import cute_kernels as ck
    from cute_kernels.ops.transpose import _transpose_cuda

    x = randn(3, 777, 1030, dtype=torch.bfloat16)
    for v in VARIANTS:
        out = _transpose_cuda(x, v)
        out.fill_(float("nan"))
        out = _transpose_cuda(x, v)
        assert torch.equal(out, x.transpose(-2, -1).contiguous())
    base = randn(4, 512, 640, dtype=torch.float32)
    for view in (base[:, :, :512], base[1:3], base[:, 8:264, 64:320], base.transpose(1, 2)):
        for v in VARIANTS:
            assert torch.equal(ck.transpose(view, variant=v), view.transpose(-2, -1).contiguous())
    assert ck.transpose(torch.empty(0, 5, device="cuda")).shape == (5, 0)
    g = randn(64, 96, dtype=torch.float32).requires_grad_()
    ck.transpose(g, variant="swizzle").backward(torch.ones(96, 64, device="cuda"))
    assert torch.equal(g.grad, torch.ones_like(g))
