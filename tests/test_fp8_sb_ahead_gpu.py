"""GPU: the FP8 GEMM with its B scales read from global one K-block ahead (`sb_ahead`) against the same
schedule reading them in their own K-block: the same scales multiplied into the same FFMAs, so the outputs
must be equal bit for bit; plus the fp32 reference on the dequantized inputs. Even and odd K-block counts
(the pair loop and its tail), one K-block, K not a multiple of 128, split-K units (each unit's K-blocks
start at its own k0), the small-M defaults, a cooperative tile with sb_smem off, outputs poisoned."""

import pytest

from tests.test_fp8_gpu import _check, _inputs, _poison_allocator

pytestmark = pytest.mark.gpu

ck = pytest.importorskip("cute_kernels")
from cute_kernels.ops.fp8_gemm import _fp8_gemm_cuda  # noqa: E402
from schedules.fp8_gemm import fp8_schedule  # noqa: E402

SCHEDULES = {"default": None,
             "pp64x128_c2x1": fp8_schedule("pingpong", 64, 128, cluster_m=2),
             "coop128x192": fp8_schedule("cooperative", 128, 192, cluster_m=1),
             "pp64x64_k3": fp8_schedule("pingpong", 64, 64, cluster_m=1, cluster_n=2, split_k=3)}
SHAPES = [(64, 2112, 7168), (128, 4096, 7168), (64, 256, 128), (77, 520, 1000), (1, 96, 1408), (300, 4096, 384)]


@pytest.mark.parametrize("sched", list(SCHEDULES))
@pytest.mark.parametrize("m,n,k", SHAPES, ids=lambda v: str(v))
def test_sb_ahead_bitwise(sched, m, n, k):
    s = SCHEDULES[sched]
    a, sa, b, sb = _inputs(m, n, k)
    _poison_allocator(m * n * 4 * 8)
    ahead = _fp8_gemm_cuda(a, sa, b, sb, schedule=s, sb_smem=False, sb_ahead=True)
    plain = _fp8_gemm_cuda(a, sa, b, sb, schedule=s, sb_smem=False, sb_ahead=False)
    assert ahead.equal(plain)
    _check(ahead, a, sa, b, sb)


@pytest.mark.parametrize("sched", ["pp64x64", "pp64x128_c2x1", "coop128x128"])
@pytest.mark.parametrize("k", [128, 256, 384, 1040, 7168], ids=lambda v: f"k{v}")
def test_sb_ahead_with_promote_overlap_bitwise(sched, k):
    """promote_overlap's pair loop, its even and odd tails (K-blocks 1, 2, 3, 9 with a partial last,
    56) with the scales loaded a step ahead: bitwise the plain promotion (overlap is bitwise it too)."""
    s = {"pp64x64": fp8_schedule("pingpong", 64, 64, cluster_m=1),
         "pp64x128_c2x1": fp8_schedule("pingpong", 64, 128, cluster_m=2),
         "coop128x128": fp8_schedule("cooperative", 128, 128, cluster_m=1)}[sched]
    a, sa, b, sb = _inputs(130, 2112, k)
    _poison_allocator(130 * 2112 * 4 * 8)
    both = _fp8_gemm_cuda(a, sa, b, sb, schedule=s, sb_smem=False, promote_overlap=True, sb_ahead=True)
    plain = _fp8_gemm_cuda(a, sa, b, sb, schedule=s, sb_smem=False)
    assert both.equal(plain)
    _check(both, a, sa, b, sb)


@pytest.mark.parametrize("m,n,k", [(64, 2112, 7168), (77, 520, 1000), (1, 96, 1408)], ids=lambda v: str(v))
def test_split_with_overlap_and_sb_ahead_bitwise(m, n, k):
    """Split-K units promoted with the overlap and the scales a step ahead: each unit's partial is the
    plain promotion's, so the summed output equals the plain split bit for bit."""
    s = fp8_schedule("pingpong", 64, 64, cluster_m=1, cluster_n=2, split_k=3)
    a, sa, b, sb = _inputs(m, n, k)
    _poison_allocator(m * n * 4 * 8)
    both = _fp8_gemm_cuda(a, sa, b, sb, schedule=s, promote_overlap=True, sb_ahead=True)
    plain = _fp8_gemm_cuda(a, sa, b, sb, schedule=s)
    assert both.equal(plain)
    _check(both, a, sa, b, sb)
