"""GPU: the FP8 GEMM with `wg_turns=True` (the cooperative tile's two consumer warpgroups issue each
K-block's WGMMAs in turn on named barriers, `collectives.wgmma_mainloop.mma_k_tiles_promoted`'s
`turns`) against the fp32 reference on the dequantized inputs (DeepGEMM's metric < 1e-3), poisoned
outputs, bitwise equal to the option off (same FFMAs in the same K order). K-block counts 1 to 9
(the turns' hand-over inside a tile and across the persistent walk's tiles), sb_smem on and off,
the wide tiles, the issue's large-M shapes, odd shapes."""

import pytest
import torch

from tests.fp8_gemm.test_fp8_gemm_gpu import SCHEDULES, _check, _inputs, _poison_allocator

pytestmark = pytest.mark.gpu

ck = pytest.importorskip("cute_kernels")
from cute_kernels.fp8_gemm.ops import _fp8_gemm_cuda  # noqa: E402
from schedules.fp8_gemm import default_fp8_schedule, fp8_schedule  # noqa: E402

ISSUE_NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
COOP = [name for name, s in SCHEDULES.items() if s.kind == "cooperative"]


def _run(a, sa, b, sb, sched=None, sb_smem=None, dtype=torch.bfloat16):
    m, n = a.shape[0], b.shape[0]
    _poison_allocator(m * n * 2)
    out = _fp8_gemm_cuda(a, sa, b, sb, dtype, schedule=sched, sb_smem=sb_smem, wg_turns=True)
    _check(out, a, sa, b, sb, dtype)
    return out


@pytest.mark.parametrize("sb_smem", [False, True])
@pytest.mark.parametrize("k", [128, 256, 384, 1040, 16])
@pytest.mark.parametrize("sched", COOP)
def test_schedules_and_k_blocks(sched, k, sb_smem):
    s = SCHEDULES[sched]
    a, sa, b, sb = _inputs(769, 2112, k)
    out = _run(a, sa, b, sb, s, sb_smem)
    assert torch.equal(out, _fp8_gemm_cuda(a, sa, b, sb, schedule=s, sb_smem=sb_smem))


@pytest.mark.parametrize("tile_n", [160, 192])
def test_wide_tiles(tile_n):
    s = fp8_schedule("cooperative", 128, tile_n, cluster_m=2)
    a, sa, b, sb = _inputs(2048, 2112, 3072)
    assert torch.equal(_run(a, sa, b, sb, s), _fp8_gemm_cuda(a, sa, b, sb, schedule=s))


@pytest.mark.parametrize("n,k", ISSUE_NK)
def test_issue_shapes_large_m(n, k):
    """M = 4096 with the op's default schedule (cooperative there), bitwise the option off."""
    assert default_fp8_schedule(4096, n, k).kind == "cooperative"
    a, sa, b, sb = _inputs(4096, n, k)
    assert torch.equal(_run(a, sa, b, sb), ck.fp8_gemm(a, sa, b, sb))


@pytest.mark.parametrize("m,n,k", [(1, 128, 128), (5125, 96, 200), (33, 17, 9), (128, 256, 16)])
def test_odd_shapes(m, n, k):
    a, sa, b, sb = _inputs(m, n, k)
    s = default_fp8_schedule(m, n, k)
    if s.kind != "cooperative":
        s = fp8_schedule("cooperative", 128, 128, cluster_m=1)
    assert torch.equal(_run(a, sa, b, sb, s), _fp8_gemm_cuda(a, sa, b, sb, schedule=s))
