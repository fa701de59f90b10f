"""GPU: the grouped (MoE) FP8 GEMMs against fp32 references on the dequantized inputs, DeepGEMM's
metric 1 - 2 sum(x y) / sum(x^2 + y^2) < 1e-3 over the valid rows: contiguous layouts with padding
rows, whole padding blocks and experts with 0 rows; masked layouts with masked_m = 0, = max_m and
odd counts; every grouped schedule; the masked op replayed from a CUDA graph after masked_m changed
on the device (no host synchronization); odd N / K; outputs poisoned through the allocator."""

import pytest
import torch

from tests.helpers import randn

pytestmark = pytest.mark.gpu

ck = pytest.importorskip("cute_kernels")
from cute_kernels.fp8_gemm.ops import (  # noqa: E402
    _contiguous_cuda,
    _masked_cuda,
    contiguous_layout,
    fp8_gemm_grouped_contiguous_reference,
    fp8_gemm_grouped_masked_reference,
)
from schedules.fp8_gemm import fp8_schedule  # noqa: E402

CONTIGUOUS_SCHEDULES = {"coop_1x2": fp8_schedule(cluster_m=1, cluster_n=2), "coop_1x1": fp8_schedule(cluster_m=1),
                        "coop_128x64": fp8_schedule(tile_n=64, cluster_m=1),
                        # the wide tiles (the default from 1024 rows since session 15), B-scale rows of two blocks
                        "coop_128x192_1x2": fp8_schedule(tile_n=192, cluster_m=1, cluster_n=2),
                        "coop_128x160": fp8_schedule(tile_n=160, cluster_m=1)}
MASKED_SCHEDULES = {"coop_2x1": fp8_schedule(), "coop_1x2": fp8_schedule(cluster_m=1, cluster_n=2),
                    "pingpong64x128": fp8_schedule("pingpong", 64, 128), "pingpong64x64": fp8_schedule("pingpong", 64, 64),
                    "nonpersistent": fp8_schedule(cluster_m=1, persistent=False)}


def calc_diff(x, y):
    x, y = x.double(), y.double()
    return (1 - 2 * (x * y).sum() / (x * x + y * y).sum()).item()


def _poison_allocator(nbytes):
    torch.cuda.empty_cache()  # else the output may reuse a cached block of finite garbage
    torch.full((nbytes // 2 + 4096,), float("nan"), dtype=torch.bfloat16, device="cuda")
    torch.cuda.synchronize()


def _weights(e, n, k):
    qs = [ck.quantize_128x128(randn(n, k)) for _ in range(e)]
    return torch.stack([q for q, _ in qs]), torch.stack([s for _, s in qs])


def _check_rows(out, ref, rows, bound=1e-3):
    """DeepGEMM's metric over the boolean row mask `rows` (the valid rows)."""
    x, y = out[rows], ref[rows]
    assert torch.isfinite(x).all(), "unwritten (NaN) or overflowed elements in valid rows"
    if x.numel():
        diff = calc_diff(x, y)
        assert diff < bound, f"DeepGEMM diff {diff:.2e} >= {bound:.0e}"


def _contiguous_inputs(rows_per_expert, n, k, extra_padding_blocks=0):
    idx, _ = contiguous_layout(rows_per_expert)
    idx = torch.cat([idx, torch.full((128 * extra_padding_blocks,), -1, dtype=torch.int32)]).cuda()
    a, sa = ck.quantize_1x128(randn(idx.numel(), k))
    b, sb = _weights(len(rows_per_expert), n, k)
    return a, sa, b, sb, idx


def _run_contiguous(rows_per_expert, n, k, schedule=None, out_dtype=torch.bfloat16, extra_padding_blocks=0,
                    sb_smem=None):
    a, sa, b, sb, idx = _contiguous_inputs(rows_per_expert, n, k, extra_padding_blocks)
    _poison_allocator(idx.numel() * n * 2)
    out = _contiguous_cuda(a, sa, b, sb, idx, out_dtype, schedule, sb_smem)
    assert out.shape == (idx.numel(), n) and out.dtype == out_dtype
    _check_rows(out, fp8_gemm_grouped_contiguous_reference(a, sa, b, sb, idx), idx >= 0)
    return out, (a, sa, b, sb, idx)


def _masked_inputs(e, max_m, n, k):
    a, sa = ck.quantize_1x128(randn(e * max_m, k))
    # Rows quantize independently of experts: the (E * max_m, KB) scales viewed per expert keep
    # unit stride along M (max_m a multiple of 4 keeps them TMA-aligned, else the op copies).
    b, sb = _weights(e, n, k)
    return a.view(e, max_m, k), sa.view(e, max_m, -1), b, sb


def _run_masked(masked_m, max_m, n, k, schedule=None, expected_m=None, out_dtype=torch.bfloat16, sb_smem=None):
    e = len(masked_m)
    a, sa, b, sb = _masked_inputs(e, max_m, n, k)
    mm = torch.tensor(masked_m, dtype=torch.int32, device="cuda")
    _poison_allocator(e * max_m * n * 2)
    out = _masked_cuda(a, sa, b, sb, mm, expected_m, out_dtype, schedule, sb_smem)
    assert out.shape == (e, max_m, n) and out.dtype == out_dtype
    rows = torch.arange(max_m, device="cuda")[None, :] < mm.clamp(0, max_m)[:, None]
    _check_rows(out, fp8_gemm_grouped_masked_reference(a, sa, b, sb, mm), rows)
    return out, rows, (a, sa, b, sb, mm)


# --- contiguous ---------------------------------------------------------------------------------
def test_contiguous_issue_like():
    """4 experts x 1024 tokens (the issue's 4 x 8192 at a test's size), N = 4096, K = 7168."""
    _run_contiguous([1024] * 4, 4096, 7168)


@pytest.mark.parametrize("rows", [[300, 0, 128, 1, 513], [0, 0, 7], [129]])
def test_contiguous_padding_and_empty_experts(rows):
    _run_contiguous(rows, 2112, 1040, extra_padding_blocks=2)


@pytest.mark.parametrize("sched", list(CONTIGUOUS_SCHEDULES))
def test_contiguous_schedules(sched):
    _run_contiguous([200, 384, 0, 70], 768, 1024, CONTIGUOUS_SCHEDULES[sched])


@pytest.mark.parametrize("n,k", [(17, 200), (96, 9), (256, 16)])
def test_contiguous_odd_shapes(n, k):
    """N not a multiple of 8 (padded output), K not a multiple of 16 (A and B copied, zero-padded)."""
    _run_contiguous([130, 5], n, k)


def test_contiguous_fp16_and_out_of_range_expert():
    a, sa, b, sb, idx = _contiguous_inputs([128, 256], 512, 512)
    idx[:128] = 7  # no such expert: treated as padding (the tile is skipped, never reads past b)
    out = ck.fp8_gemm_grouped_contiguous(a, sa, b, sb, idx, torch.float16)
    assert out.dtype == torch.float16
    _check_rows(out, fp8_gemm_grouped_contiguous_reference(a, sa, b, sb, idx), (idx >= 0) & (idx < 2))


@pytest.mark.parametrize("rows,n,k", [([1024] * 4, 4096, 7168), ([300, 0, 128, 1, 513], 2112, 1040)])
def test_contiguous_sb_smem_bitwise(rows, n, k):
    """B scales staged in smem per tile (each tile its own expert's row), bitwise equal to the scales
    read from global memory, padding tiles skipped; the dense rule would stage them at this shape."""
    from schedules.fp8_gemm import default_grouped_schedule, use_sb_smem

    on, (a, sa, b, sb, idx) = _run_contiguous(rows, n, k, sb_smem=True, extra_padding_blocks=1)
    off = _contiguous_cuda(a, sa, b, sb, idx, torch.bfloat16, None, False)
    valid = idx >= 0
    assert torch.equal(on[valid], off[valid])
    assert use_sb_smem(default_grouped_schedule("contiguous", 4096, 4096, 7168), 4096)


def test_contiguous_wide_default_bitwise():
    """The default tile from 1024 rows (the dense search's wide tiles) against 128x128: each output element the same
    promotions in the same K order, so bitwise on the valid rows."""
    from schedules.fp8_gemm import default_grouped_schedule

    rows = [1024, 0, 3000, 1030]  # 5120 rows once each expert is padded to the 128-row alignment
    out, (a, sa, b, sb, idx) = _run_contiguous(rows, 2112, 1152)
    assert default_grouped_schedule("contiguous", idx.numel(), 2112, 1152).tile_n > 128, idx.numel()
    sq = _contiguous_cuda(a, sa, b, sb, idx, torch.bfloat16, fp8_schedule(cluster_m=1, cluster_n=2))
    valid = idx >= 0
    assert torch.equal(out[valid], sq[valid])


# --- masked -------------------------------------------------------------------------------------
@pytest.mark.parametrize("masked_m,max_m", [([1024], 1024), ([256] * 4, 512)])
def test_masked_issue_shapes(masked_m, max_m):
    _run_masked(masked_m, max_m, 4096, 7168, expected_m=masked_m[0])


@pytest.mark.parametrize("masked_m", [[0, 384, 1, 300], [0, 0], [384, 384], [-3, 500]])
def test_masked_edges(masked_m):
    """masked_m = 0 and = max_m, 1 row, a negative count (clamped to 0), one past max_m (clamped)."""
    _run_masked(masked_m, 384, 1024, 1024)


@pytest.mark.parametrize("sched", list(MASKED_SCHEDULES))
def test_masked_schedules(sched):
    _run_masked([5, 200, 0, 333], 336, 2112, 1040, MASKED_SCHEDULES[sched])


def test_masked_fp16_odd_shapes():
    _run_masked([3, 70], 72, 17, 200, out_dtype=torch.float16)


def test_masked_cuda_graph_reads_masked_m_on_device():
    e, max_m, n, k = 3, 256, 512, 1024
    a, sa, b, sb = _masked_inputs(e, max_m, n, k)
    mm = torch.tensor([256, 0, 17], dtype=torch.int32, device="cuda")
    ck.fp8_gemm_grouped_masked(a, sa, b, sb, mm, 64)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ck.fp8_gemm_grouped_masked(a, sa, b, sb, mm, 64)
    for counts in ([256, 0, 17], [1, 255, 0], [0, 0, 256]):
        mm.copy_(torch.tensor(counts, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        rows = torch.arange(max_m, device="cuda")[None, :] < mm[:, None]
        _check_rows(out, fp8_gemm_grouped_masked_reference(a, sa, b, sb, mm), rows)


def test_torch_compile_fullgraph():
    a, sa, b, sb, idx = _contiguous_inputs([128, 200], 256, 512)

    @torch.compile(fullgraph=True)
    def f(a, sa, b, sb, idx):
        return ck.fp8_gemm_grouped_contiguous(a, sa, b, sb, idx) * 2

    _check_rows(f(a, sa, b, sb, idx) / 2, fp8_gemm_grouped_contiguous_reference(a, sa, b, sb, idx), idx >= 0)


@pytest.mark.parametrize("masked_m,max_m,n,k", [([1024], 1024, 4096, 7168), ([5, 200, 0, 333], 336, 2112, 1040)])
def test_masked_sb_smem_bitwise(masked_m, max_m, n, k):
    """The masked walk with B scales staged per tile (the expert's row): bitwise the global-read path."""
    on, rows, (a, sa, b, sb, mm) = _run_masked(masked_m, max_m, n, k, MASKED_SCHEDULES["coop_2x1"], sb_smem=True)
    off = _masked_cuda(a, sa, b, sb, mm, None, torch.bfloat16, MASKED_SCHEDULES["coop_2x1"], False)
    assert torch.equal(on[rows], off[rows])
