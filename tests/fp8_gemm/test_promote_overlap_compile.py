"""CPU: the FP8 GEMM's `promote_overlap` option (collectives.wgmma_mainloop.mma_k_tiles_promoted_overlap)
compiles for sm_90a and does what it claims in SASS: each K-block's WGMMAs are committed and the
warpgroup waits with one group still in flight (WARPGROUP.DEPBAR.LE gsb0, 0x1), then promotes the
previous K-block (one FFMA per accumulator element) while that group runs; three accumulators fit
the consumers' setmaxnreg budget without spills. The default (option off) keeps its serialized
mainloop (wait for zero groups, then promote)."""

import re

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from schedules.fp8_gemm import acc_per_thread, fp8_schedule, overlap_error
from schedules.gemm import GemmSchedule
from tests.helpers import assert_within_registers, sass_instructions, sass_or_skip

SPEC = catalog.get("fp8_gemm")
CONFIGS = {
    "default": {},
    "coop128x128_overlap": {"promote_overlap": True},
    "pingpong64x128_overlap": {"schedule": "pingpong", "tile_m": 64, "promote_overlap": True},
    "coop128x64_overlap": {"tile_n": 64, "promote_overlap": True},
    "contiguous_overlap": {"grouping": "contiguous", "cluster_m": 1, "cluster_n": 2, "promote_overlap": True},
}
CONSUMER_REGS = 232


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    return {name: compile_with_artifacts(SPEC, SPEC.resolve(over), str(tmp_path_factory.mktemp(name)))
            for name, over in CONFIGS.items()}


def _acc(name):
    p = SPEC.resolve(CONFIGS[name])
    return acc_per_thread(fp8_schedule(p["schedule"], p["tile_m"], p["tile_n"]))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_census(artifacts, name):
    report, files = artifacts[name]
    assert not report.spills, report.format()
    assert report.ptx_census["ld/st.local"] == 0 and report.ptx_census["setmaxnreg"] >= 2
    ptx = files["ptx"].read_text()
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k32\.f32\.e4m3\.e4m3", ptx)
    assert re.search(rf"setmaxnreg\.inc\.sync\.aligned\.u32\s+{CONSUMER_REGS};", ptx)
    sass = sass_or_skip(report, files)
    assert "QGMMA" in sass and "HGMMA" not in sass
    assert_within_registers(report, sass, CONSUMER_REGS)


@pytest.mark.parametrize("name", [n for n in CONFIGS if n != "default"])
def test_promotion_overlaps_wgmma(artifacts, name):
    """After every wait that leaves one WGMMA group in flight, the previous K-block's promotion
    (acc FFMAs) runs before the next WGMMA is issued."""
    report, files = artifacts[name]
    ops = sass_instructions(sass_or_skip(report, files))
    waits = [i for i, (op, args) in enumerate(ops) if op == "WARPGROUP.DEPBAR.LE" and "0x1" in args]
    assert re.search(r"wgmma\.wait_group\.sync\.aligned\s+1;", files["ptx"].read_text())
    assert len(waits) >= 3, "expected the loop's two waits and the tail's, each leaving one group in flight"
    acc = _acc(name)
    for i in waits:
        ffma = 0
        for op, _ in ops[i + 1:]:
            if op.startswith("QGMMA") or op == "WARPGROUP.DEPBAR.LE" or op == "EXIT":
                break
            ffma += op == "FFMA"
        assert ffma >= acc, f"only {ffma} FFMAs between a 1-in-flight wait and the next WGMMA (acc {acc})"


def test_default_stays_serialized(artifacts):
    """Option off: the PR's mainloop is untouched (4 QGMMAs per K-block, wait for all, promote)."""
    report, files = artifacts["default"]
    ptx = files["ptx"].read_text()
    assert len(re.findall(r"wgmma\.mma_async", ptx)) == 4
    assert not re.search(r"wgmma\.wait_group\.sync\.aligned\s+1;", ptx)
    if report.sass_census is not None:
        sass = files["sass"].read_text()
        assert "DEPBAR.LE gsb0, 0x1" not in sass and report.sass_census["HGMMA/QGMMA"] == 4


def test_overlap_budget():
    assert overlap_error(fp8_schedule("cooperative", 128, 128)) is None
    assert overlap_error(fp8_schedule("pingpong", 64, 128)) is None
    too_big = GemmSchedule(kind="cooperative", tile_m=128, tile_n=256, tile_k=128)
    assert "accumulators per thread" in overlap_error(too_big)
    assert SPEC.resolve({"promote_overlap": "True"})["promote_overlap"] is True
    assert SPEC.resolve()["promote_overlap"] is False
