"""GPU: the FP8 GEMM's narrow 64-row ping-pong tiles, 64x32 and 64x16 (a quarter / an eighth of a B-scale
block wide; small M: 4x / 8x the CTAs of 64x64 on the same problem, so 2112 columns fill 132 SMs at
64x16), against the 64x64 tile on the same inputs: each output element is the same K-blocks' WGMMA sums
promoted with the same two scales in the same order, so the outputs must be equal bit for bit; plus the
fp32 reference on the dequantized inputs. The plain promotion and the small-M default (`promote_overlap`
with `sb_ahead`), 1x1 and 2x1 clusters, N not a multiple of the tile (2112 = 66 x 32, 520, 96, 8), odd
and short K, M = 1 / 77 / 128, outputs poisoned."""

import pytest

from tests.fp8_gemm.test_fp8_gemm_gpu import _same_bits

pytestmark = pytest.mark.gpu

ck = pytest.importorskip("cute_kernels")
from schedules.fp8_gemm import fp8_schedule  # noqa: E402

SHAPES = [(64, 2112, 7168), (128, 2112, 7168), (77, 520, 1000), (1, 96, 1408), (64, 8, 256), (128, 4096, 384)]


@pytest.mark.parametrize("tile_n", [32, 16])
@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap_ahead"])
@pytest.mark.parametrize("m,n,k", SHAPES, ids=lambda v: str(v))
def test_narrow_tile_bitwise(tile_n, overlap, m, n, k):
    cm = 2 if m > 64 else 1
    _same_bits(m, n, k, dict(schedule=fp8_schedule("pingpong", 64, tile_n, cluster_m=cm), promote_overlap=overlap,
                             sb_ahead=overlap),
               dict(schedule=fp8_schedule("pingpong", 64, 64, cluster_m=cm), promote_overlap=False, sb_ahead=False))
