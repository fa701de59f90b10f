"""GPU: the bf16 GEMM's short A box (`GemmSchedule.a_rows`, session 17; small M): A's TMA box covers only the
tile's first a_rows rows, so a box of M rows has nothing out of bounds. The tile's other rows are whatever shared
memory held (their accumulator rows are past M, never stored), so the result must equal the full-box schedule's
bit for bit (the same WGMMA K order): M = 1, 5, 8, 16, 20, 32 under the 1x1 and 1x2 clusters the small-M defaults
use, the deep ring and the 64x32 tile, odd N and K, batched A with a shared B, outputs poisoned. The op refuses M
past a_rows and an M-major A, naming the schedule."""

import dataclasses

import pytest
import torch

from tests.helpers import randn

pytestmark = pytest.mark.gpu

ck = pytest.importorskip("cute_kernels")
from cute_kernels.gemm.ops import _gemm_cuda  # noqa: E402
from schedules.gemm import GemmSchedule, a_box_for  # noqa: E402
from tests.gemm.test_gemm_gpu import _check  # noqa: E402
from tests.gemm.test_pipeline_options_gpu import _run  # noqa: E402  (poisoned output, fp64 check at the cuBLAS bound)

CASES = [(1, 4096, 4096), (5, 520, 1000), (8, 96, 16), (16, 2112, 7168), (20, 4096, 1024), (32, 4096, 4096)]


@pytest.mark.parametrize("tile_n,cn,stages", [(64, 2, 12), (32, 2, 16), (32, 1, 0)], ids=str)
@pytest.mark.parametrize("m,n,k", CASES, ids=str)
def test_short_a_box_bitwise(m, n, k, tile_n, cn, stages):
    full = GemmSchedule(kind="pingpong", tile_m=64, tile_n=tile_n, cluster_m=1, cluster_n=cn, stages=stages)
    short = dataclasses.replace(full, a_rows=a_box_for(m, cn))
    a, b = randn(m, k, dtype=torch.bfloat16), randn(k, n, dtype=torch.bfloat16)
    assert torch.equal(_run(a, b, short), _gemm_cuda(a, b, schedule=full))


def test_short_a_box_batched_and_refused():
    s = GemmSchedule(kind="pingpong", tile_m=64, tile_n=64, cluster_m=1, cluster_n=2, a_rows=16)
    a, b = randn(3, 16, 512, dtype=torch.bfloat16), randn(3, 512, 200, dtype=torch.bfloat16)
    out = _run(a, b, s)  # three batches of 16 rows (B batched too: nothing folds)
    assert torch.equal(out, _gemm_cuda(a, b, schedule=dataclasses.replace(s, a_rows=0)))
    with pytest.raises(ValueError, match="a_rows 16"):
        _gemm_cuda(randn(17, 512, dtype=torch.bfloat16), b[0], schedule=s)
    with pytest.raises(ValueError, match="a_rows 16"):  # a contiguous batched A folds with a shared B: 48 rows
        _gemm_cuda(a, b[0], schedule=s)
    with pytest.raises(ValueError, match="M-major"):
        _gemm_cuda(randn(512, 16, dtype=torch.bfloat16).t(), b[0], schedule=s)


@pytest.mark.parametrize("m,n,k", [(1, 4096, 4096), (16, 4096, 4096), (32, 4096, 4096), (8, 7168, 2048),
                                   (20, 2112, 1000)], ids=str)
def test_small_m_default(m, n, k):
    """The M <= 32 default (`schedules.gemm.shortened`, session 18) equals its whole-box schedule bit for bit; an
    M-major A (the op drops the short box for it) and the fp16 and fp32-output signatures run correct too."""
    from schedules.gemm import default_schedule

    d = default_schedule(m, n, k)
    a, b = randn(m, k, dtype=torch.bfloat16), randn(k, n, dtype=torch.bfloat16)
    out = _run(a, b, None)
    assert torch.equal(out, _gemm_cuda(a, b, schedule=dataclasses.replace(d, a_rows=0)))
    _run(randn(k, m, dtype=torch.bfloat16).t(), b, None)
    _run(a.half(), b.half(), None)
    _check(_gemm_cuda(a, b, out_dtype=torch.float32), a, b, out_dtype=torch.float32)
