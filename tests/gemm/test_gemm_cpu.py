"""CPU: the GEMM's schedules (tile order, grid, budgets, candidate list) and its torch op in fake mode."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import cute_kernels as ck  # noqa: F401  (registers the ops)
from schedules.gemm import GemmSchedule, candidates, default_schedule, grid, tile_order


@pytest.mark.parametrize("tm,tn,batch,group,cm", [(7, 5, 1, 8, 2), (16, 16, 2, 4, 1), (1, 33, 1, 8, 1), (9, 1, 3, 2, 2)])
def test_tile_order_is_a_permutation(tm, tn, batch, group, cm):
    s = GemmSchedule(cluster_m=cm, raster_group=group)
    order = tile_order(tm, tn, batch, s)
    cms, cns = -(-tm // cm), tn
    assert sorted(order) == sorted((m, n, l) for m in range(cms) for n in range(cns) for l in range(batch))


def test_raster_groups_walk_m_first_inside_a_group():
    s = GemmSchedule(cluster_m=1, raster_group=4)
    order = tile_order(8, 3, 1, s)
    assert order[:6] == [(0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 0, 0), (0, 1, 0), (1, 1, 0)]
    assert order[12] == (4, 0, 0)  # the second group starts after 4 rows x 3 columns
    # Any `group` consecutive tiles touch at most `group` A row-blocks and 2 B column-blocks.
    for i in range(len(order) - 4):
        window = order[i:i + 4]
        assert len({m for m, _, _ in window}) <= 4 and len({n for _, n, _ in window}) <= 2


def test_grid_is_capped_for_persistent_schedules():
    s = GemmSchedule(cluster_m=2)
    assert grid(64, 32, 1, s, 132) == (2, 1, 66)
    assert grid(2, 2, 1, s, 132) == (2, 1, 2)
    assert grid(64, 32, 1, GemmSchedule(cluster_m=2, persistent=False), 132) == (2, 1, 32 * 32)


def test_schedule_budgets():
    coop = GemmSchedule()
    assert coop.fits() and coop.num_stages(2, 2) == 4
    pp = GemmSchedule(kind="pingpong", tile_m=128, tile_n=128)
    assert pp.fits() and pp.num_stages(2, 2) >= 5 and pp.epi_tile == (64, 32)
    with pytest.raises(ValueError, match="accumulators"):
        GemmSchedule(kind="pingpong", tile_m=128, tile_n=256)
    with pytest.raises(ValueError, match="multiple of 128"):
        GemmSchedule(kind="cooperative", tile_m=64)
    with pytest.raises(ValueError, match="register budget"):
        GemmSchedule(consumer_regs=240, producer_regs=40)


def test_candidates_are_few_valid_and_start_with_the_default():
    for m, n, k in [(8192, 8192, 8192), (128, 7168, 2048), (64, 4096, 4096), (4096, 2112, 7168)]:
        cs = candidates(m, n, k)
        assert 1 <= len(cs) <= 32 and all(c.fits() for c in cs)
        assert cs[0] == default_schedule(m, n, k)
        assert len(set(cs)) == len(cs)
        # every cluster divides its tile grid: no CTA of a cluster computes a tile past the problem
        # (session 12: the split-K candidates at M = 64 / 128 were 2x1 clusters on one tile row)
        for c in cs:
            assert -(-m // c.tile_m) % c.cluster_m == 0 and -(-n // c.tile_n) % c.cluster_n == 0, c


def test_fake_mode_shapes_and_errors():
    with FakeTensorMode():
        a = torch.empty(3, 64, 32, dtype=torch.bfloat16, device="cuda")
        b = torch.empty(32, 48, dtype=torch.bfloat16, device="cuda")
        out = torch.ops.cute_kernels.gemm(a, b, None, "relu", None)
        assert out.shape == (3, 64, 48) and out.dtype == torch.bfloat16
        a2 = torch.empty(64, 32, dtype=torch.bfloat16, device="cuda")
        out = torch.ops.cute_kernels.gemm(a2, b, None, None, torch.float16)
        assert out.shape == (64, 48) and out.dtype == torch.float16
        out = torch.ops.cute_kernels.gemm(a2, b, None, "gelu", torch.float32)  # fp32 output (session 14)
        assert out.shape == (64, 48) and out.dtype == torch.float32
        with pytest.raises(TypeError, match="out_dtype must be"):
            torch.ops.cute_kernels.gemm(a2, b, None, None, torch.int32)
        with pytest.raises(ValueError, match="inner dims"):
            torch.ops.cute_kernels.gemm(a, a, None, None, None)
        with pytest.raises(TypeError, match="float32"):
            torch.ops.cute_kernels.gemm(a.float(), b.float(), None, None, None)


def test_cpu_tensor_gets_a_named_device_error():
    with pytest.raises(ValueError, match="a must be on a CUDA device"):
        ck.gemm(torch.randn(4, 4, dtype=torch.bfloat16), torch.randn(4, 4, dtype=torch.bfloat16))


def test_narrowing_counts_a_wave_as_the_deep_ring_does():
    """`schedules.gemm.narrowed` stops where the narrower grid would give a CTA a second tile, counted as `deepened`
    and `interleaved` count it (`on_one_wave`: cluster slots x cluster size; session 17 unified the two counts). Over
    the 1320 dense and grouped shapes checked then, no default moved: the counts differ only for 4-CTA clusters (32
    slots of 4 on 132 SMs: 128 CTAs), which no small-grid default uses."""
    import dataclasses

    from schedules.gemm import NARROW_TILE_N, GemmSchedule, narrowed, on_one_wave

    for cm, cn in ((1, 1), (2, 1), (1, 2), (2, 2)):
        s0 = GemmSchedule(kind="pingpong", tile_m=64, tile_n=64, cluster_m=cm, cluster_n=cn)
        for fam in ("bf16", "fp8"):
            for m in (33, 64, 128, 200):
                for n in (512, 2112, 4096, 7168, 8192):
                    s = narrowed(s0, m, n, family=fam)
                    if s.tile_n != 64:
                        assert on_one_wave(s, m, n), (s, m, n)
                    narrower = [t for t in NARROW_TILE_N[fam] if t < s.tile_n]
                    if narrower:  # the next width would not have been one wave
                        assert not on_one_wave(dataclasses.replace(s0, tile_n=narrower[0]), m, n), (s, m, n)
