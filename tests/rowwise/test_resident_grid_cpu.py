"""CPU: `HeldRowPlan.resident_grid` (the backward's persistent grid capped at the co-resident clusters):
the grid the op computes, the plan's cache-key tag, HELD_TUNED settings that carry it, and that it
leaves the compiled kernel alone (a launch setting: same catalogue config)."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from cute_kernels.rowwise import config_of
from cute_kernels.rowwise import launch as R
from schedules import row_tiling as RT
from schedules.hardware import max_active_clusters
from schedules.row_tiling import plan_held_rows

DEV = SimpleNamespace(index=0)


def _fake_device(monkeypatch, sms=132, clusters=None):
    clusters = clusters or {2: 66, 4: 32, 8: 16}
    monkeypatch.setattr(R, "num_sms", lambda index=None: sms)
    monkeypatch.setattr(R, "max_active_clusters", lambda c, index=None: clusters[c])


def test_cap_counts_resident_clusters(monkeypatch):
    _fake_device(monkeypatch)
    p = plan_held_rows(65536, 8, target_elems=16, max_elems=32, min_threads=256, max_tpr=512)
    assert (p.cluster_n, p.ctas_per_sm) == (4, 1)
    # SMs-capped: 132 clusters of 4 where 32 fit (5 waves), one partial row each
    assert R.grid_ctas(2048, p, True, DEV) == (132, 132)
    rg = dataclasses.replace(p, resident_grid=True)
    assert R.grid_ctas(2048, rg, True, DEV) == (32, 32)
    assert R.grid_ctas(20, rg, True, DEV) == (32, 20)  # fewer tiles than clusters
    assert R.grid_ctas(0, rg, True, DEV) == (32, 1)
    two = dataclasses.replace(rg, ctas_per_sm=2)
    assert R.grid_ctas(2048, two, True, DEV) == (64, 64)
    # uncapped launches (forward kernels) ignore it
    assert R.grid_ctas(2048, rg, False, DEV) == (R.UNCAPPED, 2048)


def test_no_cluster_no_change(monkeypatch):
    _fake_device(monkeypatch)
    p = RT.plan_for_rows("rms_bwd", 4096, 8)
    assert p.cluster_n == 1
    rg = dataclasses.replace(p, resident_grid=True)
    assert R.grid_ctas(32768, rg, True, DEV) == R.grid_ctas(32768, p, True, DEV) == (p.ctas_per_sm * 132,) * 2
    # the tag shows anyway: on a forward plan the flag caps an otherwise uncapped grid
    assert "rg" in str(rg).split() and "rg" not in str(p).split()
    assert R.grid_ctas(32768, rg, rg.resident_grid, DEV) == (p.ctas_per_sm * 132,) * 2
    assert R.grid_ctas(32768, p, p.resident_grid, DEV) == (R.UNCAPPED, 32768 // p.tiling.rows_per_cta)


def test_tag_and_same_kernel():
    p = plan_held_rows(65536, 8, target_elems=16, max_elems=32, min_threads=256, max_tpr=512)
    rg = dataclasses.replace(p, resident_grid=True)
    assert "rg" in str(rg).split() and "rg" not in str(p).split() and rg != p and hash(rg) != hash(p)
    assert config_of(rg) == config_of(p)


def test_held_tuned_setting(monkeypatch):
    bwd = dict(target_elems=16, max_elems=32, min_threads=256, max_tpr=512)
    monkeypatch.setitem(RT.HELD_TUNED, "rms_bwd", ((4096, dict(bwd)), (None, dict(bwd, resident_grid=True))))
    small = RT.plan_for_rows("rms_bwd", 4096, 8)
    big = RT.plan_for_rows("rms_bwd", 65536, 8)
    assert not small.resident_grid and big.resident_grid
    assert dataclasses.replace(big, resident_grid=False) == plan_held_rows(65536, 8, **bwd)
    RT.max_held_row.cache_clear()  # cached per family: the patched table's answer must not outlive the test
    try:
        assert RT.max_held_row("rms_bwd", 8) >= 65536
    finally:
        RT.max_held_row.cache_clear()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU answers through the occupancy API")
def test_fallback_without_gpu():
    # no GPU: the GPC bound (a cluster never spans GPCs of 16+ SMs on H100/H200)
    assert max_active_clusters(4) == 32 and max_active_clusters(8) == 16 and max_active_clusters(2) == 66


def test_forward_grids_are_whole_waves():
    """A staged forward's capped grid (`ops._rowwise.grid_ctas_per_sm`): the plan's CTAs per SM count its staged rows
    alone; where the kernel fits fewer beside its weights (or a residual's row) and they do not divide the plan's
    count, the grid takes the largest multiple of the fit (session 20: LayerNorm fwd 6144 planned at 8 an SM, 6 fit).
    The measured defaults keep their grids."""
    import torch

    from cute_kernels.rowwise.launch import grid_ctas_per_sm, grid_plan, kernel_params, plan_for
    from schedules import row_tiling as RT
    from tests.helpers import op_signature, plan_params

    def grid(name, n, plan=None, **sig):
        p = plan or plan_for(name, torch.bfloat16, n, True)
        kp = (plan_params(name, p, **sig) if plan else
              kernel_params(name, torch.bfloat16, n, True, **op_signature(name, **sig)))
        return p, grid_ctas_per_sm(name, p, kp), grid_plan(name, p, kp)

    # session 20's staged plans (the defaults of 4097-8192 and 8193-16384 until session 21's one-tile plans)
    ln_6k = RT.plan_held_rows(6144, 8, **RT._LN_FWD_8K_STAGED)
    rms_16k = RT.plan_held_rows(16384, 8, **dict(RT._STAGED_RMS_FWD_16K, hold=True, resident_grid=True))
    p, c, gp = grid("layernorm.fwd", 6144, ln_6k)
    assert (p.ctas_per_sm, c) == (8, 6) and gp == dataclasses.replace(p, ctas_per_sm=6)
    for n in (8192, 16384, 32768, 65536, 131072, 262144):  # the measured plans: 2 or 4 of 4 or 8 resident
        p, c, gp = grid("layernorm.fwd", n)
        assert c == p.ctas_per_sm and gp is p, n
    assert grid("layernorm.fwd", 16384, residual=True)[1] == 3  # 3 of 4 fit beside the residual's row
    assert grid("rmsnorm.fwd", 16384, rms_16k)[1] == 8 and grid("rmsnorm.fwd", 16384, rms_16k, residual=True)[1] == 6
    p, c, _ = grid("rmsnorm.fwd", 8192)  # a register plan: its own count
    assert p.staging == "regs" and c == p.ctas_per_sm
