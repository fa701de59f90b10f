"""GPU: the FP8 GEMM's short A box (`GemmSchedule.a_rows`, session 18; decode M <= 32): A's and its scales' TMA
boxes cover only the tile's first a_rows rows. The tile's other rows compute on whatever shared memory held, are
never stored, and no promotion mixes rows, so the output must equal the whole box's bit for bit (the same WGMMAs
and promotions in the same order), and meet the fp32 reference on the dequantized inputs; outputs poisoned. M = 1
to 32 under the small-M schedules (1x1 / 1x2 clusters, 64x32 / 64x64, k_interleave, split-K, the overlap with the
scales a K-block ahead), N not a multiple of the tile, odd K. The op refuses M past a_rows."""

import dataclasses

import pytest

from tests.fp8_gemm.test_fp8_gemm_gpu import _inputs, _same_bits

pytestmark = pytest.mark.gpu

ck = pytest.importorskip("cute_kernels")
from cute_kernels.fp8_gemm.ops import _fp8_gemm_cuda  # noqa: E402
from schedules.fp8_gemm import fp8_schedule  # noqa: E402
from schedules.gemm import a_box_for  # noqa: E402

SHAPES = [(1, 2112, 7168), (5, 520, 1000), (8, 4096, 384), (16, 7168, 2048), (20, 96, 1408), (32, 4096, 7168)]
SCHEDULES = {
    "64x32": (dict(tile_n=32, cluster_n=1), {}),
    "64x64_c1x2": (dict(tile_n=64, cluster_n=2), {}),
    "64x32_kinterleave": (dict(tile_n=32, cluster_n=1, k_interleave=True), {}),
    "64x32_splitk2": (dict(tile_n=32, cluster_n=1, split_k=2), {}),
    "64x32_overlap_ahead": (dict(tile_n=32, cluster_n=1), dict(promote_overlap=True, sb_ahead=True)),
}


@pytest.mark.parametrize("name", list(SCHEDULES))
@pytest.mark.parametrize("m,n,k", SHAPES, ids=str)
def test_short_box_bitwise(name, m, n, k):
    sk, kw = SCHEDULES[name]
    full = fp8_schedule("pingpong", 64, cluster_m=1, **sk)
    short = dataclasses.replace(full, a_rows=a_box_for(m, full.cluster_n))
    base = {"promote_overlap": False, "sb_ahead": False, **kw}  # (kw may turn the overlap on)
    _same_bits(m, n, k, dict(base, schedule=short), dict(base, schedule=full))


def test_short_box_refuses_more_rows():
    s = dataclasses.replace(fp8_schedule("pingpong", 64, 32, cluster_m=1), a_rows=16)
    a, sa, b, sb = _inputs(17, 256, 512)
    with pytest.raises(ValueError, match="a_rows 16"):
        _fp8_gemm_cuda(a, sa, b, sb, schedule=s)
