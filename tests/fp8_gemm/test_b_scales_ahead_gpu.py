"""GPU: the FP8 GEMM with its B scales read from global one K-block ahead (`sb_ahead`) against the same
schedule reading them in their own K-block: the same scales multiplied into the same FFMAs, so the outputs
must be equal bit for bit; plus the fp32 reference on the dequantized inputs. Even and odd K-block counts
(the pair loop and its tail), one K-block, K not a multiple of 128, split-K units (each unit's K-blocks
start at its own k0), the small-M defaults, a cooperative tile with sb_smem off, outputs poisoned."""

import pytest

from tests.fp8_gemm.test_fp8_gemm_gpu import _same_bits

pytestmark = pytest.mark.gpu

ck = pytest.importorskip("cute_kernels")
from schedules.fp8_gemm import fp8_schedule  # noqa: E402

SCHEDULES = {"default": None,
             "pp64x128_c2x1": fp8_schedule("pingpong", 64, 128, cluster_m=2),
             "coop128x192": fp8_schedule("cooperative", 128, 192, cluster_m=1),
             "pp64x64_k3": fp8_schedule("pingpong", 64, 64, cluster_m=1, cluster_n=2, split_k=3)}
SHAPES = [(64, 2112, 7168), (128, 4096, 7168), (64, 256, 128), (77, 520, 1000), (1, 96, 1408), (300, 4096, 384)]


@pytest.mark.parametrize("sched", list(SCHEDULES))
@pytest.mark.parametrize("m,n,k", SHAPES, ids=lambda v: str(v))
def test_sb_ahead_bitwise(sched, m, n, k):
    # the plain promotion on both sides (the small-M default would put both on promote_overlap)
    s = dict(schedule=SCHEDULES[sched], sb_smem=False, promote_overlap=False)
    _same_bits(m, n, k, dict(s, sb_ahead=True), dict(s, sb_ahead=False))


@pytest.mark.parametrize("sched", ["pp64x64", "pp64x128_c2x1", "coop128x128"])
@pytest.mark.parametrize("k", [128, 256, 384, 1040, 7168], ids=lambda v: f"k{v}")
def test_sb_ahead_with_promote_overlap_bitwise(sched, k):
    """promote_overlap's pair loop, its even and odd tails (K-blocks 1, 2, 3, 9 with a partial last,
    56) with the scales loaded a step ahead: bitwise the plain promotion (overlap is bitwise it too)."""
    s = {"pp64x64": fp8_schedule("pingpong", 64, 64, cluster_m=1),
         "pp64x128_c2x1": fp8_schedule("pingpong", 64, 128, cluster_m=2),
         "coop128x128": fp8_schedule("cooperative", 128, 128, cluster_m=1)}[sched]
    _same_bits(130, 2112, k, dict(schedule=s, sb_smem=False, promote_overlap=True, sb_ahead=True),
               dict(schedule=s, sb_smem=False, promote_overlap=False, sb_ahead=False))


@pytest.mark.parametrize("m,n,k", [(64, 2112, 7168), (77, 520, 1000), (1, 96, 1408)], ids=lambda v: str(v))
def test_split_with_overlap_and_sb_ahead_bitwise(m, n, k):
    """Split-K units promoted with the overlap and the scales a step ahead: each unit's partial is the
    plain promotion's, so the summed output equals the plain split bit for bit."""
    s = fp8_schedule("pingpong", 64, 64, cluster_m=1, cluster_n=2, split_k=3)
    # the plain side explicit: at M <= 128, K >= 1024 the op's default is the overlap with sb_ahead itself
    _same_bits(m, n, k, dict(schedule=s, promote_overlap=True, sb_ahead=True),
               dict(schedule=s, promote_overlap=False, sb_ahead=False))
