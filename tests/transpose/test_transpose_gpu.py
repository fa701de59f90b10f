"""GPU: the four transposes bitwise against torch in every tile order, 2x2 blocks, the persistent walk, large
batches and 64-bit sizes, poisoned outputs and odd layouts."""

import pytest
import torch

from tests.helpers import randn

pytestmark = pytest.mark.gpu


DTYPES = [torch.bfloat16, torch.float16, torch.float32]


VARIANTS = ["naive", "smem", "swizzle", "tma"]


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
    from cute_kernels.transpose.ops import _transpose_cuda

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
    from cute_kernels.transpose.ops import _transpose_cuda

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
    from cute_kernels.transpose.ops import _transpose_cuda

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
    from cute_kernels.transpose.ops import _transpose_cuda

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
