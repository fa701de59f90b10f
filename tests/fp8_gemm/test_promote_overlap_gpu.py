"""GPU: the FP8 GEMM with `promote_overlap=True` (K-block k-1 promoted while K-block k's WGMMAs run,
`collectives.wgmma_mainloop.mma_k_tiles_promoted_overlap`) against the fp32 reference on the
dequantized inputs (DeepGEMM's metric < 1e-3), poisoned outputs, every FP8 schedule, K-block
counts 1, 2, 3 and odd (the loop runs in pairs after K-block 0, with a tail for even counts), the
issue's large-M shapes; and bitwise equal to the option off (same FFMAs in the same K order)."""

import pytest
import torch

from tests.fp8_gemm.test_fp8_gemm_gpu import SCHEDULES, _check, _inputs, _poison_allocator

pytestmark = pytest.mark.gpu

ck = pytest.importorskip("cute_kernels")
from cute_kernels.fp8_gemm.ops import _fp8_gemm_cuda  # noqa: E402
from schedules.fp8_gemm import default_fp8_schedule  # noqa: E402

ISSUE_NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]


def _run(a, sa, b, sb, sched=None, dtype=torch.bfloat16):
    m, n = a.shape[0], b.shape[0]
    _poison_allocator(m * n * 2)
    out = _fp8_gemm_cuda(a, sa, b, sb, dtype, schedule=sched, promote_overlap=True)
    _check(out, a, sa, b, sb, dtype)
    return out


@pytest.mark.parametrize("k", [128, 256, 384, 1040, 16])
@pytest.mark.parametrize("sched", list(SCHEDULES))
def test_schedules_and_k_blocks(sched, k):
    """K = 128 / 256 / 384: 1 / 2 / 3 K-blocks (prologue only, even tail, one loop pair);
    1040: 9 blocks, the last partial; 16: one partial block. M and N partial tiles."""
    s = SCHEDULES[sched]
    a, sa, b, sb = _inputs(769, 2112, k)
    out = _run(a, sa, b, sb, s)
    assert torch.equal(out, _fp8_gemm_cuda(a, sa, b, sb, schedule=s))


@pytest.mark.parametrize("n,k", ISSUE_NK)
def test_issue_shapes_large_m(n, k):
    """M = 4096 with the op's promote_overlap default schedule (the 128x128 search: the wide tiles
    of the plain default cannot overlap promotion), bitwise the same tile without the overlap."""
    a, sa, b, sb = _inputs(4096, n, k)
    s = default_fp8_schedule(4096, n, k, wide=False)
    out = _run(a, sa, b, sb)
    assert torch.equal(out, _run(a, sa, b, sb, s))
    assert torch.equal(out, _fp8_gemm_cuda(a, sa, b, sb, schedule=s))


@pytest.mark.parametrize("m,n,k", [(1, 128, 128), (5125, 96, 200), (33, 17, 9), (128, 256, 16)])
def test_odd_shapes(m, n, k):
    a, sa, b, sb = _inputs(m, n, k)
    out = _run(a, sa, b, sb)
    assert torch.equal(out, ck.fp8_gemm(a, sa, b, sb))


def test_fp16_out_ue8m0():
    a, sa, b, sb = _inputs(512, 1024, 2048, ue8m0=True)
    out = _run(a, sa, b, sb, dtype=torch.float16)
    assert torch.equal(out, ck.fp8_gemm(a, sa, b, sb, torch.float16))
