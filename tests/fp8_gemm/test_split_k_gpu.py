"""GPU: the FP8 GEMM with split-K in one launch (`split_k` > 1: each split promotes its own K-blocks into
an fp32 partial, the last split of a tile sums them in split order and stores the tile) against the fp32
reference on the dequantized inputs (DeepGEMM's metric < 1e-3) and close to the unsplit kernel (only the
order of the promoted partials' sum differs); outputs poisoned, launched twice (the arrival flags are left
at zero), K-block counts below the split count (clamped), odd N / K, fp16 output."""

import pytest
import torch

from tests.fp8_gemm.test_fp8_gemm_gpu import _check, _inputs, _poison_allocator

pytestmark = pytest.mark.gpu

ck = pytest.importorskip("cute_kernels")
from cute_kernels.fp8_gemm.ops import _fp8_gemm_cuda  # noqa: E402
from schedules.fp8_gemm import fp8_schedule  # noqa: E402

SPLIT = {"pp64x128_k4": fp8_schedule("pingpong", 64, 128, cluster_m=1, split_k=4),
         "pp64x64_k7": fp8_schedule("pingpong", 64, 64, cluster_m=1, cluster_n=2, split_k=7),
         "coop128x128_k2": fp8_schedule("cooperative", 128, 128, cluster_m=1, split_k=2)}


@pytest.mark.parametrize("sched", list(SPLIT))
@pytest.mark.parametrize("m,n,k", [(64, 2112, 7168), (128, 4096, 7168), (1, 256, 1040), (77, 96, 200), (64, 128, 16)])
def test_split(sched, m, n, k):
    s = SPLIT[sched]
    a, sa, b, sb = _inputs(m, n, k)
    _poison_allocator(m * n * 4 * 8)
    for _ in range(2):
        out = _fp8_gemm_cuda(a, sa, b, sb, schedule=s)
        _check(out, a, sa, b, sb)
    plain = _fp8_gemm_cuda(a, sa, b, sb, schedule=fp8_schedule(s.kind, s.tile_m, s.tile_n, s.cluster_m, s.cluster_n))
    assert (out.float() - plain.float()).abs().max().item() <= 2e-2 * plain.float().abs().max().item()


def test_fp16_out():
    a, sa, b, sb = _inputs(64, 1024, 4096)
    out = _fp8_gemm_cuda(a, sa, b, sb, torch.float16, schedule=SPLIT["pp64x128_k4"])
    _check(out, a, sa, b, sb, torch.float16)
