"""GPU: the FP8 GEMM with `promote_halves=True` (each K-block's WGMMAs in two column halves, committed
as two groups, one half promoted while the other runs: `collectives.wgmma_mainloop.
mma_k_tiles_promoted_halves`) against the fp32 reference on the dequantized inputs (DeepGEMM's metric
< 1e-3), outputs poisoned; bitwise equal to the option off (the same FFMAs in the same K order) on
every FP8 schedule, the wide tiles (128x160 / 128x192, with and without sb_smem), K-block counts
1, 2, 3 and partial, odd M / N, fp16 output."""

import pytest
import torch

from tests.fp8_gemm.test_fp8_gemm_gpu import SCHEDULES, _check, _inputs, _poison_allocator

pytestmark = pytest.mark.gpu

ck = pytest.importorskip("cute_kernels")
from cute_kernels.fp8_gemm.ops import _fp8_gemm_cuda  # noqa: E402
from schedules.fp8_gemm import default_fp8_schedule, fp8_schedule  # noqa: E402

WIDE = {"coop128x160": fp8_schedule("cooperative", 128, 160), "coop128x192": fp8_schedule("cooperative", 128, 192),
        "coop128x192_1x2": fp8_schedule("cooperative", 128, 192, cluster_m=1, cluster_n=2)}


def _run(a, sa, b, sb, sched=None, dtype=torch.bfloat16, sb_smem=None):
    m, n = a.shape[0], b.shape[0]
    _poison_allocator(m * n * 2)
    out = _fp8_gemm_cuda(a, sa, b, sb, dtype, schedule=sched, sb_smem=sb_smem, promote_halves=True)
    _check(out, a, sa, b, sb, dtype)
    return out


@pytest.mark.parametrize("k", [128, 256, 384, 1040, 16])
@pytest.mark.parametrize("sched", list(SCHEDULES) + list(WIDE))
def test_schedules_and_k_blocks(sched, k):
    """K = 128 / 256 / 384: 1 / 2 / 3 K-blocks (no loop: the tail only; one and two loop trips);
    1040: 9 blocks, the last partial; 16: one partial block. M and N partial tiles."""
    s = {**SCHEDULES, **WIDE}[sched]
    a, sa, b, sb = _inputs(769, 2112, k)
    out = _run(a, sa, b, sb, s)
    assert torch.equal(out, _fp8_gemm_cuda(a, sa, b, sb, schedule=s))


@pytest.mark.parametrize("sched", ["coop128x128", "coop_1x2", *WIDE])
def test_sb_smem(sched):
    """With the B-scale rows staged in smem (the default from M = 1024)."""
    s = {**SCHEDULES, **WIDE}[sched]
    a, sa, b, sb = _inputs(1280, 2112, 7168)
    out = _run(a, sa, b, sb, s, sb_smem=True)
    assert torch.equal(out, _fp8_gemm_cuda(a, sa, b, sb, schedule=s, sb_smem=True))


@pytest.mark.parametrize("n,k", [(2112, 7168), (7168, 2048), (24576, 1536)])
def test_issue_shapes_large_m(n, k):
    """M = 4096 with the op's default schedule (the wide search), bitwise the default."""
    a, sa, b, sb = _inputs(4096, n, k)
    out = _run(a, sa, b, sb)
    assert torch.equal(out, _fp8_gemm_cuda(a, sa, b, sb, schedule=default_fp8_schedule(4096, n, k)))


@pytest.mark.parametrize("m,n,k", [(1, 128, 128), (5125, 96, 200), (33, 17, 9), (128, 256, 16)])
def test_odd_shapes(m, n, k):
    a, sa, b, sb = _inputs(m, n, k)
    out = _run(a, sa, b, sb)
    assert torch.equal(out, ck.fp8_gemm(a, sa, b, sb))


def test_fp16_out_ue8m0():
    a, sa, b, sb = _inputs(512, 1024, 2048, ue8m0=True)
    out = _run(a, sa, b, sb, dtype=torch.float16)
    assert torch.equal(out, ck.fp8_gemm(a, sa, b, sb, torch.float16))
