"""CPU: the GEMM's split-K option: the K ranges of the splits, the unit walk, the model's choice, and
the compiled kernels (WGMMA + TMA loads, fp32 partials from registers, a vectorized summing pass,
no local memory)."""

import dataclasses

import pytest

from cute_kernels.artifacts import compile_with_artifacts
from cute_kernels.gemm import GEMM
from schedules.gemm import (
    GemmSchedule,
    candidates,
    default_schedule,
    effective_splits,
    estimate_streaming,
    grid,
    split_range,
)


@pytest.mark.parametrize("kb", [1, 2, 3, 5, 7, 16, 31, 32, 64, 65, 127, 1000])
@pytest.mark.parametrize("splits", [1, 2, 3, 4, 5, 7, 8, 16])
def test_split_ranges_partition_k_blocks(kb, splits):
    ranges = [split_range(s, splits, kb) for s in range(splits)]
    covered = [k for first, count in ranges for k in range(first, first + count)]
    assert covered == list(range(kb))  # in order, each K-block once
    counts = [c for _, c in ranges]
    assert max(counts) - min(counts) <= 1
    if splits <= kb:
        assert min(counts) >= 1  # empty ranges only when there are more splits than K-blocks


def _units(tiles, splits, clusters):
    """Host mirror of TileWalk's split-K unit walk: (tile, split) of every unit each cluster visits."""
    out = []
    for z in range(clusters):
        for u in range(z, tiles * splits, clusters):
            out.append((u % tiles, u // tiles))
    return out


@pytest.mark.parametrize("tiles,splits,clusters", [(64, 2, 128), (64, 2, 66), (7, 3, 4), (1, 4, 1), (33, 5, 132)])
def test_unit_walk_covers_every_tile_and_split_once(tiles, splits, clusters):
    units = _units(tiles, splits, clusters)
    assert sorted(units) == [(t, s) for t in range(tiles) for s in range(splits)]


def test_grid_and_effective_splits():
    s = GemmSchedule(kind="pingpong", tile_m=64, tile_n=64, cluster_m=1, cluster_n=2, split_k=2)
    assert grid(1, 64, 1, s, 132) == (1, 2, 64)  # 64 tiles x 2 splits / cluster of 2
    assert effective_splits(s, 16) == 1 and effective_splits(s, 64) == 1 and effective_splits(s, 65) == 2
    assert effective_splits(dataclasses.replace(s, split_k=8), 3 * 64) == 3
    assert str(s).endswith("_k2") and not str(dataclasses.replace(s, split_k=1)).endswith("_k1")
    with pytest.raises(ValueError, match="split_k"):
        GemmSchedule(split_k=0)


def test_model_splits_only_starved_grids():
    d = default_schedule(64, 1024, 16384)  # 16 tiles of 64x64 on 132 SMs, 256 K-blocks each
    assert d.split_k > 2 and (d.tile_m, d.tile_n) == (64, 64)
    assert estimate_streaming(d, 64, 1024, 16384) < estimate_streaming(dataclasses.replace(d, split_k=1), 64, 1024, 16384)
    # 64x4096x4096 (64 tiles): the split in 2 measured slower than unsplit on the H200 (session 11)
    for shape in [(8192, 8192, 8192), (4096, 4096, 4096), (4096, 2112, 7168), (128, 7168, 2048), (769, 2112, 1032),
                  (64, 4096, 4096)]:
        assert default_schedule(*shape).split_k == 1, shape
    assert default_schedule(64, 4096, 64).split_k == 1  # one K-block: nothing to split
    cs = candidates(64, 1024, 16384)
    assert cs[0] == d and cs[1] == dataclasses.replace(d, split_k=1) and len(cs) <= 32
    cs = candidates(64, 4096, 4096)
    assert cs[0] == default_schedule(64, 4096, 4096) and len(cs) <= 32
    assert sum(c.split_k > 1 for c in cs) >= 4 and len(set(cs)) == len(cs)
    assert all(c.split_k == 1 for c in candidates(8192, 8192, 8192))


def test_source_is_refused():
    with pytest.raises(ValueError, match="source"):
        GEMM.resolve({"split_k": 2, "source": True})


@pytest.mark.parametrize("over", [
    {"schedule": "pingpong", "tile_m": 64, "tile_n": 64, "cluster_m": 1, "cluster_n": 2, "split_k": 2},
    {"schedule": "cooperative", "tile_n": 128, "split_k": 4, "bias": True, "activation": "gelu"},
    {"schedule": "pingpong", "tile_n": 128, "split_k": 3, "bias": True, "activation": "silu", "scale": True,
     "a_major": "m", "b_major": "n", "dtype": "fp16", "out_dtype": "fp16"},
], ids=["pp64x64_k2", "coop128x128_k4_bias_gelu", "pp_k3_fused_mn_fp16"])
def test_split_k_compiles(over, tmp_path):
    report, files = compile_with_artifacts(GEMM, GEMM.resolve(over), str(tmp_path))
    names = [k.name for k in report.kernels]
    assert len(names) == 2 and any("reduce_kernel" in n for n in names), names
    assert not report.spills, report.format()
    ptx = report.ptx_census
    assert ptx["wgmma.mma_async"] > 0 and ptx["cp.async.bulk.tensor"] > 0 and ptx["setmaxnreg"] >= 2
    assert ptx["ld/st.local"] == 0
    assert ptx["ld.global.v4 (128-bit)"] >= over["split_k"], "the summing pass loads 4 fp32 per access"
    text = files["ptx"].read_text()
    assert "red.global" not in text and "atom.global" not in text  # deterministic: no atomics
    if report.sass_census is not None:
        sass = report.sass_census
        assert sass["HGMMA/QGMMA"] > 0 and sass["UTMALDG (TMA load)"] > 0 and sass["LDL/STL (spills)"] == 0
        assert sass["UTMASTG (TMA store)"] == 0  # the fp32 partials leave from registers
        assert sass["LDG.128"] > 0


# --- split-K in one launch (`split_fixup`) --------------------------------------------------------------
FIXUP = {"pp64x64_k2": {"schedule": "pingpong", "tile_m": 64, "tile_n": 64, "cluster_m": 1, "cluster_n": 2,
                        "split_k": 2},
         "coop128x128_k4_gelu_bias": {"tile_m": 128, "tile_n": 128, "split_k": 4, "activation": "gelu", "bias": True}}


@pytest.mark.parametrize("name", list(FIXUP))
def test_split_fixup_compiles(name, tmp_path):
    """One kernel: the partials from registers, a GPU-scope release fence and one acq_rel atomic per
    unit, then (the last split) an acquire fence, the partials read back and the TMA-store epilogue;
    no summing pass, no local memory."""
    p = GEMM.resolve({**FIXUP[name], "split_fixup": True})
    report, files = compile_with_artifacts(GEMM, p, str(tmp_path))
    assert not report.spills, report.format()
    assert len(report.kernels) == 1, report.format()  # no second (summing) kernel
    ptx = files["ptx"].read_text()
    assert ptx.count("atom.global.acq_rel.add") == 1
    assert ptx.count("fence.acq_rel.gpu") == 2
    assert "cp.async.bulk.tensor" in ptx and report.ptx_census["wgmma.mma_async"] > 0
    splits = FIXUP[name]["split_k"]
    acc = 64 * FIXUP[name]["tile_n"] // 128  # fp32 accumulators a thread (64 rows a warpgroup)
    assert ptx.count("ld.global.f32") + ptx.count("ld.global.b32") >= splits * acc  # every split's partial


def test_split_fixup_schedule_rules():
    s = GemmSchedule(kind="pingpong", tile_m=64, tile_n=64, split_k=2, split_fixup=True)
    assert str(s).endswith("_k2f") and not str(dataclasses.replace(s, split_fixup=False)).endswith("f")
    with pytest.raises(ValueError, match="split_fixup"):
        GemmSchedule(split_fixup=True)
    with pytest.raises(ValueError, match="split_fixup"):
        GEMM.resolve({"split_fixup": True})
    from schedules.gemm import clamp_splits as _clamp_split

    assert _clamp_split(s, 64) == dataclasses.replace(s, split_k=1, split_fixup=False)  # one K-block
