"""Elementwise copy's TMA bulk variant (`mode=bulk`, `schedules/bulk_chunks.py`) on the GPU: bitwise
equal to `x.clone()` for every size (empty, under one 16-byte vector, scalar tails, partial last
chunks and pieces), randn data, outputs poisoned with NaN and guarded past their end; misaligned
operands fall back to the grid-stride kernel; the op takes the variant where a size class says so."""

import pytest
import torch

from schedules.bulk_chunks import BulkChunks
from tests.helpers import randn

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
SIZES = [0, 1, 7, 8, 31, 1000, 4096, 4096 + 8, 4096 + 9, 3 * 4096 - 8, 2**20 + 3, 3 * 2**20 + 5]
SCHEDULES = [BulkChunks(), BulkChunks(2048), BulkChunks(4096, 4), BulkChunks(16384, 2), BulkChunks(32768, 4)]
GUARD = 64  # poisoned elements past the output's end that must stay untouched


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _bulk_copy(x: torch.Tensor, schedule: BulkChunks) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, guard) of the launch path under `schedule` into a NaN-poisoned buffer: the output is
    its first n elements (16-byte aligned), the guard the GUARD elements after them."""
    from cute_kernels.elementwise.ops import _launch

    n = x.numel()
    buf = torch.full((n + GUARD,), float("nan"), dtype=x.dtype, device=x.device)
    out = buf[:n]
    _launch("copy", x, x, out, 1.0, 0.0, schedule=schedule)
    return out, buf[n:]


def _check(x, out, guard):
    ref = x.clone()
    assert torch.equal(_bits(out), _bits(ref)), "differs from x.clone() (bitwise)"
    assert torch.isnan(guard).all(), "wrote past the end of the output"


@pytest.mark.parametrize("schedule", SCHEDULES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_bulk_copy_bitwise(n, dtype, schedule):
    x = randn(n + 8, dtype=dtype)[:n]  # a real data pointer even for n = 0 (the op skips n = 0 itself)
    out, guard = _bulk_copy(x, schedule)
    _check(x, out, guard)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mib", [1, 4, 16])
def test_bulk_copy_bench_sizes(dtype, mib):
    """The sizes the bench times, under every chunk the small-size study times."""
    n = mib * 2**20 // torch.tensor([], dtype=dtype).element_size()
    x = randn(n, dtype=dtype)
    for chunk in (2048, 4096, 8192, 16384, 32768):
        out, guard = _bulk_copy(x, BulkChunks(chunk, 2))
        _check(x, out, guard)


@pytest.mark.parametrize("dtype", DTYPES)
def test_misaligned_falls_back_to_grid_stride(dtype):
    from cute_kernels.elementwise.ops import _launch

    base = randn(4097 + 100, dtype=dtype)
    x = base[1:]  # 2 or 4 bytes past a 16-byte boundary
    assert x.data_ptr() % 16 != 0
    out = torch.full_like(x, float("nan"))
    _launch("copy", x, x, out, 1.0, 0.0, schedule=BulkChunks())
    assert torch.equal(_bits(out), _bits(x.clone()))


def test_bulk_schedule_is_for_copy_only():
    from cute_kernels.elementwise.ops import _launch

    x = randn(64, dtype=torch.float32)
    with pytest.raises(ValueError, match="copy only"):
        _launch("add", x, x, torch.empty_like(x), 1.0, 1.0, schedule=BulkChunks())


def test_size_class_hook_routes_copy_to_bulk(monkeypatch):
    """With a size class listed, the public op takes the bulk kernel (and stays bitwise exact);
    other sizes keep the grid-stride schedule."""
    import cute_kernels as ck
    from cute_kernels.elementwise import ops as ew
    from schedules import bulk_chunks

    sched = BulkChunks(4096, 2)
    monkeypatch.setitem(bulk_chunks.SIZE_CLASSES, "copy", ((1 << 20, 2 << 20, sched),))
    x = randn(2**19 + 3, dtype=torch.bfloat16)  # 1 MiB + 6 bytes
    assert torch.equal(_bits(ck.copy(x)), _bits(x.clone()))
    assert any(k[0] == "copy" and k[4] == id(sched) for k in ew._fns), "the bulk schedule was not taken"
    y = randn(1000, dtype=torch.bfloat16)
    assert bulk_chunks.pick("copy", y.numel() * 2) is None
    assert torch.equal(_bits(ck.copy(y)), _bits(y.clone()))


def test_runs_on_the_current_stream():
    x = randn(1 << 22, dtype=torch.float32)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out, guard = _bulk_copy(x, BulkChunks(8192, 4))
    torch.cuda.current_stream().wait_stream(s)
    _check(x, out, guard)


@pytest.mark.large
def test_bulk_copy_64bit_past_2_31_elements():
    n = 2**31 + 5
    x = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    out, guard = _bulk_copy(x, BulkChunks())
    assert torch.equal(_bits(out[-1000:]), _bits(x[-1000:])) and torch.equal(_bits(out[:1000]), _bits(x[:1000]))
    assert torch.equal(_bits(out), _bits(x))
    assert torch.isnan(guard).all()
