"""GPU: the bf16 GEMM's 64x32 ping-pong tile (a small-M option: twice the CTAs of 64x64 on the same grid)
equals the 64x64 tile bit for bit (each output element: the same WGMMA K order) and the fp64 reference within
twice cuBLAS's error (`test_gemm_pipeline_gpu._run`, the pipeline options' check); M = 1 / 64 / 77 / 128, N not a multiple of 32, K = 16 and odd K, 1x1 and 1x2 clusters,
outputs poisoned."""

import dataclasses

import pytest
import torch

from tests.helpers import randn

pytestmark = pytest.mark.gpu

ck = pytest.importorskip("cute_kernels")
from cute_kernels.gemm.ops import _gemm_cuda  # noqa: E402
from schedules.gemm import GemmSchedule  # noqa: E402
from tests.gemm.test_pipeline_options_gpu import _run  # noqa: E402  (poisoned output, fp64 check at the cuBLAS bound)


@pytest.mark.parametrize("cn", [1, 2])
@pytest.mark.parametrize("m,n,k", [(64, 4096, 4096), (1, 96, 16), (77, 520, 1000), (128, 2112, 7168), (64, 40, 72)],
                         ids=str)
def test_gemm_64x32_bitwise(cn, m, n, k):
    wide = GemmSchedule(kind="pingpong", tile_m=64, tile_n=64, cluster_m=1, cluster_n=cn)
    narrow = dataclasses.replace(wide, tile_n=32)
    a, b = randn(m, k, dtype=torch.bfloat16), randn(k, n, dtype=torch.bfloat16)
    assert torch.equal(_run(a, b, narrow), _gemm_cuda(a, b, schedule=wide))
