"""GPU: ping-pong `k_interleave` (session 14): both consumer warpgroups on every 64-row tile, warpgroup w on
the tile's K-blocks w, w + 2, ..., warpgroup 1's fp32 partial added by warpgroup 0 through shared memory.
Not bitwise the one-warpgroup kernel (two partial sums added at the end), so against the references: the
bf16 GEMM within 2x cuBLAS's bf16 error (+1e-4) of the fp64 product, and DeepGEMM's diff < 1e-3 for FP8, plus
closeness to the plain schedule's output. K-block counts of 1 (warpgroup 1 adds zeros), odd and even; several
tiles a CTA (the exchange buffer reused, the ring position carried across tiles); 1x1, 2x1 and 1x2 clusters;
N not a multiple of the tile; the fused bias and activation; outputs poisoned."""

import dataclasses

import pytest
import torch

from tests.fp8_gemm.test_fp8_gemm_gpu import _check as _fp8_check
from tests.fp8_gemm.test_fp8_gemm_gpu import _inputs as _fp8_inputs
from tests.gemm.test_gemm_gpu import _check, _poison_allocator
from tests.helpers import randn, rel_err

pytestmark = pytest.mark.gpu

ck = pytest.importorskip("cute_kernels")
from cute_kernels.fp8_gemm.ops import _fp8_gemm_cuda  # noqa: E402
from cute_kernels.gemm.ops import _gemm_cuda  # noqa: E402
from schedules.fp8_gemm import fp8_schedule  # noqa: E402
from schedules.gemm import GemmSchedule  # noqa: E402

# (M, N, K): 64 K-blocks of 64 (bf16) / 32 of 128 (FP8); K-block counts 1, 9 (odd), 2; 1024 rows x 4096: 16 x 64
# tiles of 64x64 on 132 SMs, ~8 a CTA; M = 1 and 100 (a partial tile row), N = 2112 / 520 (partial tile columns)
BF16_SHAPES = [(64, 4096, 4096), (100, 2112, 64), (1, 520, 576), (1024, 4096, 128), (77, 96, 1000)]
BF16_SCHEDULES = {
    "pp64x64_c1x2": GemmSchedule(kind="pingpong", tile_m=64, tile_n=64, cluster_m=1, cluster_n=2),
    "pp64x32_c2x1": GemmSchedule(kind="pingpong", tile_m=64, tile_n=32, cluster_m=2),
    "pp64x64_c1x1": GemmSchedule(kind="pingpong", tile_m=64, tile_n=64, cluster_m=1),
}


@pytest.mark.parametrize("sched", list(BF16_SCHEDULES))
@pytest.mark.parametrize("m,n,k", BF16_SHAPES, ids=lambda v: str(v))
def test_bf16(sched, m, n, k):
    s = BF16_SCHEDULES[sched]
    if -(-m // s.tile_m) % s.cluster_m or -(-n // s.tile_n) % s.cluster_n:
        pytest.skip("the cluster does not divide the tile grid (the op's default never picks that)")
    a, b = randn(m, k), randn(k, n)
    _poison_allocator(m * n * 2)
    out = _gemm_cuda(a, b, schedule=dataclasses.replace(s, k_interleave=True))
    _check(out, a, b)
    plain = _gemm_cuda(a, b, schedule=s)
    assert rel_err(out, plain) < 1e-2


@pytest.mark.parametrize("activation", [None, "gelu"])
def test_bf16_fused_epilogue(activation):
    m, n, k = 200, 1000, 704
    a, b, bias = randn(m, k), randn(k, n), randn(n)
    s = GemmSchedule(kind="pingpong", tile_m=64, tile_n=64, cluster_m=1, k_interleave=True)
    _check(_gemm_cuda(a, b, bias, activation, schedule=s), a, b, bias, activation)


FP8_SHAPES = [(64, 2112, 7168), (128, 4096, 1152), (1, 96, 128), (77, 520, 1000), (512, 2048, 256)]


@pytest.mark.parametrize("ahead", [False, True], ids=["plain", "sb_ahead"])
@pytest.mark.parametrize("tile_n", [64, 32, 16])
@pytest.mark.parametrize("m,n,k", FP8_SHAPES, ids=lambda v: str(v))
def test_fp8(tile_n, m, n, k, ahead):
    """With `sb_ahead` the read-ahead past a warpgroup's last K-block (and warpgroup 1's only one at K = 128) is
    clamped to the tile's last K-block (`BlockScales.k_last`)."""
    cm = 2 if m > 64 else 1
    a, sa, b, sb = _fp8_inputs(m, n, k)
    _poison_allocator(m * n * 4 * 8)
    ki = fp8_schedule("pingpong", 64, tile_n, cluster_m=cm, k_interleave=True)
    out = _fp8_gemm_cuda(a, sa, b, sb, schedule=ki, sb_ahead=ahead)
    if ahead:  # the same products and promotions in the same order: bitwise the plain interleave
        assert out.equal(_fp8_gemm_cuda(a, sa, b, sb, schedule=ki, sb_ahead=False))
    _fp8_check(out, a, sa, b, sb)
    plain = _fp8_gemm_cuda(a, sa, b, sb, schedule=fp8_schedule("pingpong", 64, tile_n, cluster_m=cm))
    assert rel_err(out, plain) < 1e-2


def test_refusals():
    with pytest.raises(ValueError, match="k_interleave"):
        GemmSchedule(kind="cooperative", tile_m=128, tile_n=128, k_interleave=True)
    with pytest.raises(ValueError, match="k_interleave"):
        GemmSchedule(kind="pingpong", tile_m=64, tile_n=128, k_interleave=True)
    a, sa, b, sb = _fp8_inputs(64, 256, 512)
    with pytest.raises(ValueError, match="k_interleave|promote_overlap"):
        _fp8_gemm_cuda(a, sa, b, sb, schedule=fp8_schedule("pingpong", 64, 64, cluster_m=1, k_interleave=True),
                       promote_overlap=True)
    assert torch.cuda.is_available()


@pytest.mark.parametrize("tile_n", [64, 32, 16])
@pytest.mark.parametrize("m,n,k", [(64, 2112, 7168), (128, 520, 1000), (1024, 2048, 2304)], ids=lambda v: str(v))
def test_fp8_deep_ring_bitwise(tile_n, m, n, k):
    """The interleaved small-M FP8 tile with its deepest ring (`schedules.fp8_gemm.deep_fp8`: 10-16 stages, even, the
    suite's "ours deep ring (small M)" column): the same WGMMAs and promotions in the same order as 8 stages, so
    bitwise their output; several tiles a CTA at 1024 rows (the ring wraps mid-tile)."""
    from schedules.fp8_gemm import deep_fp8

    cm = 2 if m > 64 else 1
    a, sa, b, sb = _fp8_inputs(m, n, k)
    _poison_allocator(m * n * 4 * 8)
    ki = fp8_schedule("pingpong", 64, tile_n, cluster_m=cm, k_interleave=True)
    deep = deep_fp8(ki)
    assert deep.stages > ki.stages
    out = _fp8_gemm_cuda(a, sa, b, sb, schedule=deep)
    assert out.equal(_fp8_gemm_cuda(a, sa, b, sb, schedule=ki))
    _fp8_check(out, a, sa, b, sb)


@pytest.mark.parametrize("m,n,k", [(64, 7168, 16384), (64, 4096, 7168)], ids=lambda v: str(v))
def test_fp8_deep_ring_back_to_back(m, n, k):
    """The default small-M schedule's deep ring launched 200 times without synchronizing (as a benchmark's warm-up
    rounds): every launch completes, each output (in poisoned memory of its own) bitwise the default's. The odd rings
    these shapes had (11 and 15 stages) let a warpgroup pass a stage's parity wait on the fill before the one it
    needed; the CTA then exited with loads in flight and a later launch failed (unspecified launch failure). Rings
    are even now."""
    from schedules.fp8_gemm import deep_fp8, default_fp8_schedule

    a, sa, b, sb = _fp8_inputs(m, n, k)
    d = default_fp8_schedule(m, n, k)
    deep = deep_fp8(d)
    assert deep.k_interleave and deep.stages % 2 == 0 and deep.stages > d.stages
    ref = _fp8_gemm_cuda(a, sa, b, sb, schedule=d)
    _poison_allocator(m * n * 2 * 200)
    outs = [_fp8_gemm_cuda(a, sa, b, sb, schedule=deep) for _ in range(200)]  # each in memory of its own
    torch.cuda.synchronize()
    assert all(o.equal(ref) for o in outs)


@pytest.mark.parametrize("stages", [8, 10])
def test_fp8_odd_k_blocks_many_tiles(stages):
    """Several tiles a CTA with an odd K-block count (K = 896: 7 blocks), so the ring base changes parity from tile to
    tile and warpgroup 1 may start a tile before warpgroup 0 ends the last: each warpgroup keeps the ring positions of
    its own parity (its stages on every tile). 100 launches back to back into poisoned memory, each output bitwise
    the 8-stage one, checked element by element against the reference (the same K-blocks go to the same warpgroups at
    both depths)."""
    m, n, k = 1024, 2048, 896
    a, sa, b, sb = _fp8_inputs(m, n, k)
    s = dataclasses.replace(fp8_schedule("pingpong", 64, 64, cluster_m=2, k_interleave=True), stages=stages)
    ref = _fp8_gemm_cuda(a, sa, b, sb, schedule=fp8_schedule("pingpong", 64, 64, cluster_m=2, k_interleave=True))
    _fp8_check(ref, a, sa, b, sb)
    _poison_allocator(m * n * 2 * 100)
    outs = [_fp8_gemm_cuda(a, sa, b, sb, schedule=s) for _ in range(100)]  # each in memory of its own
    torch.cuda.synchronize()
    assert all(o.equal(ref) for o in outs)


@pytest.mark.parametrize("tile_n,ki", [(16, True), (64, True), (128, False)])
def test_fp8_small_m_c1x2_bitwise(tile_n, ki):
    """M = 64 on 1x2 clusters (A multicast to two N-tiles; the suite's "ours c1x2 (small M)" column, which runs
    only where the N-tile count is even): the same products and promotions as 1x1, so bitwise."""
    a, sa, b, sb = _fp8_inputs(64, 2112 if tile_n == 16 else 2048, 1536)
    _poison_allocator(64 * 2112 * 4)
    one = fp8_schedule("pingpong", 64, tile_n, cluster_m=1, k_interleave=ki)
    two = fp8_schedule("pingpong", 64, tile_n, cluster_m=1, cluster_n=2, k_interleave=ki)
    out = _fp8_gemm_cuda(a, sa, b, sb, schedule=two)
    assert out.equal(_fp8_gemm_cuda(a, sa, b, sb, schedule=one))
    _fp8_check(out, a, sa, b, sb)
