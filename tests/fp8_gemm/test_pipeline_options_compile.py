"""CPU: the FP8 GEMM's pipeline variants (docs/kernels/fp8_gemm.md, "The options") compile for sm_90a
and are what they claim in SASS, with the K loop of the default.

* `epi_stages=3` (`DEEP_EPI_STAGES`): 3 epilogue buffers instead of 4 leave room for a 6th A/B
  stage at cooperative 128x128 with sb_smem (cuBLAS's blockwise kernel runs 6): 12 mbarriers, the
  ring wraps at 6, the TMA store waits for <= 2 outstanding stores; 128x192 with 2 buffers gets 5.
* 2x2 clusters: A and B both multicast (two multicast TMA loads per stage, the A-scale box local).
* `schedules.fp8_gemm.smem_bytes` is the kernel's storage: the B-scale row's offset read back from
  the K loop's LDS equals the accounting, and the accounting is what the catalogue checks.
* the K loop (QGMMAs, FFMAs, scale loads, no LDG) is the default's in every variant.
"""

import re

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from schedules.fp8_gemm import (
    DEEP_EPI_STAGES,
    EPI_STAGES,
    SB_SMEM_MIN_M,
    acc_per_thread,
    default_fp8_schedule,
    fp8_schedule,
    sb_smem_error,
    smem_bytes,
)
from schedules.gemm import SMEM_BYTES
from schedules.hardware import _gpc_bound_clusters
from tests.fp8_gemm.test_b_scales_in_smem_and_wide_tiles_compile import _blocks
from tests.helpers import assert_within_registers, sass_instructions, sass_or_skip

SPEC = catalog.get("fp8_gemm")
CONFIGS = {
    "sb_smem": {"sb_smem": True},  # the default at M >= 1024
    "deep": {"sb_smem": True, "epi_stages": DEEP_EPI_STAGES},
    "c2x2": {"sb_smem": True, "cluster_n": 2},
    "c2x2_deep": {"sb_smem": True, "cluster_n": 2, "epi_stages": DEEP_EPI_STAGES},
    "wide192_deep": {"sb_smem": True, "tile_n": 192, "epi_stages": 2},
    "wide160_sb_smem": {"sb_smem": True, "tile_n": 160},
}
STAGES = {"sb_smem": 5, "deep": 6, "c2x2": 5, "c2x2_deep": 6, "wide192_deep": 5, "wide160_sb_smem": 5}
CONSUMER_REGS = 232
ISSUE_NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]


def _sched(name):
    p = SPEC.resolve(CONFIGS[name])
    return fp8_schedule(p["schedule"], p["tile_m"], p["tile_n"], p["cluster_m"], p["cluster_n"], p["stages"],
                        p["raster_group"], p["persistent"], p["epi_stages"])


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    return {name: compile_with_artifacts(SPEC, SPEC.resolve(over), str(tmp_path_factory.mktemp(name)))
            for name, over in CONFIGS.items()}


def _sass(artifacts, name):
    return sass_or_skip(*artifacts[name])


@pytest.mark.parametrize("name", list(CONFIGS))
def test_census(artifacts, name):
    report, files = artifacts[name]
    assert not report.spills, report.format()
    assert report.ptx_census["ld/st.local"] == 0
    sass = _sass(artifacts, name)
    assert_within_registers(report, sass, CONSUMER_REGS)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_stage_ring_and_epilogue_buffers(artifacts, name):
    s = _sched(name)
    assert s.stages == STAGES[name]
    ptx = artifacts[name][1]["ptx"].read_text()
    assert len(re.findall(r"mbarrier\.init\.shared\.b64", ptx)) == 2 * s.stages  # full + empty per stage
    sass = _sass(artifacts, name)
    # the consumers' and the producer's stage index wraps at `stages`
    assert re.search(rf"UISETP\.NE\.U32\.AND UP0, UPT, UR\d+, {hex(s.stages)}, UPT", sass)
    # the TMA store pipeline: at most epi_stages - 1 stores in flight before a buffer is reused (0x0:
    # the tail, all stores done before exit)
    waits = set(re.findall(r"DEPBAR\.LE SB0, (0x[0-9a-f]+)", sass))
    assert waits == {hex(s.epi_stages - 1), "0x0"}, waits


@pytest.mark.parametrize("name", list(CONFIGS))
def test_smem_accounting_matches_the_kernel(artifacts, name):
    """The K loop reads sb from the staged row at [UR + offset]: that offset is `smem_bytes` without
    the row, and the whole storage fits the 227 KiB the catalogue allows."""
    s = _sched(name)
    sass = _sass(artifacts, name)
    offsets = [int(o, 16) for o in re.findall(r"LDS(?:\.64)? R\d+, \[UR\d+\+(0x[0-9a-f]+)\]", sass)]
    assert offsets, "no LDS of the staged B-scale row"
    assert max(offsets) == smem_bytes(s, sb_smem=False, padded=False)
    assert smem_bytes(s, sb_smem=True) <= SMEM_BYTES and sb_smem_error(s) is None


def test_c2x2_multicasts_both_operands(artifacts):
    loads = {name: re.findall(r"UTMALDG\.3D(\.MULTICAST)?", _sass(artifacts, name)) for name in ("sb_smem", "c2x2")}
    assert sorted(loads["sb_smem"]) == ["", "", ".MULTICAST"]  # A local, B multicast (2x1), A scales local
    assert sorted(loads["c2x2"]) == ["", ".MULTICAST", ".MULTICAST"]  # A and B multicast, A scales local


@pytest.mark.parametrize("name", [n for n in CONFIGS if n != "sb_smem"])
def test_k_loop_is_the_defaults(artifacts, name):
    """The loop block of each variant has the default's work: 4 QGMMAs of the tile's width, its 2
    sa * sb FMULs (4 for wide tiles), 3 LDS (sb + 2 sa rows; the wide row is one LDS.64), one FFMA
    per accumulator element, no LDG."""
    ops = sass_instructions(_sass(artifacts, name))
    (_, b0), (a1, b1) = _blocks(ops)
    tile_n = _sched(name).tile_n
    end = next(i for i in range(b1, len(ops)) if ops[i][0] == "BRA")
    start = next(i for i in range(b0 + 1, a1) if ops[i][0] == "BRA")
    loop = [op for op, _ in ops[start + 1:end + 1]]
    assert [op for op in loop if op.startswith("QGMMA")] == [f"QGMMA.64x{tile_n}x32.F32.E4M3.E4M3"] * 4
    assert loop.count("FFMA") == acc_per_thread(_sched(name))
    assert loop.count("FMUL") == (2 if tile_n == 128 else 4)
    assert sum(op.startswith("LDS") for op in loop) == 3
    assert not [op for op in loop if op.startswith("LDG")]


def test_schedules_and_catalogue():
    deep = fp8_schedule(epi_stages=DEEP_EPI_STAGES)
    assert (deep.stages, deep.epi_stages) == (6, 3) and str(deep) == "cooperative_128x128x128_c2x1_s6_e3_r8_p"
    assert str(fp8_schedule()) == "cooperative_128x128x128_c2x1_s5_r8_p"  # the default's key is unchanged
    assert fp8_schedule("cooperative", 128, 192, epi_stages=2).stages == 5
    assert fp8_schedule("cooperative", 128, 192, epi_stages=3).stages == 4
    assert smem_bytes(deep, sb_smem=True) == 6 * (32768 + 512) + 3 * 8192 + 1024 + 2048
    with pytest.raises(ValueError, match="6 stages need 233472 bytes"):  # with 4 epilogue buffers
        fp8_schedule(stages=6)
    with pytest.raises(ValueError, match="6 stages need"):
        SPEC.resolve({"stages": 6})
    assert SPEC.resolve({"stages": 6, "epi_stages": 3, "sb_smem": True})["stages"] == 6
    with pytest.raises(ValueError, match="epi_stages must be one of"):
        fp8_schedule(epi_stages=5)
    assert EPI_STAGES == SPEC.params["epi_stages"].choices and SPEC.resolve()["epi_stages"] == 4
    # every variant the bench times, at the six M = 4096 shapes, passes the catalogue with sb_smem
    from cute_kernels.fp8_gemm import params_for
    from cute_kernels.fp8_gemm.bench import _variant

    for n, k in ISSUE_NK:
        d = default_fp8_schedule(4096, n, k)
        for s in (_variant(d, epi_stages=DEEP_EPI_STAGES), _variant(d, cluster_n=2),
                  _variant(d, cluster_n=2, epi_stages=DEEP_EPI_STAGES),
                  _variant(fp8_schedule("cooperative", 128, 192), epi_stages=2),
                  default_fp8_schedule(4096, n, k, wide=True)):
            p = SPEC.resolve({**params_for(s), "sb_smem": True})
            SPEC.check(p)
            assert sb_smem_error(s) is None and 4096 >= SB_SMEM_MIN_M


def test_cluster_occupancy_fallback():
    """Without the occupancy API, 2x2 clusters are bounded by 16-SM GPCs: 32 on 132 SMs, not 33
    (a 33rd cluster would run its whole share after the others)."""
    assert _gpc_bound_clusters(132, 4) == 32 and _gpc_bound_clusters(132, 2) == 66
    assert _gpc_bound_clusters(132, 1) == 132 and _gpc_bound_clusters(8, 4) == 1
