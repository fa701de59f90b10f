"""CPU: the FP8 GEMM's `promote_halves` option compiles for sm_90a and keeps its overlap in SASS.

Each K-block's WGMMAs are cut into two column halves (QGMMA.64x(N/2)x32, four per half), committed as
two groups: one half is promoted (N/4 FFMAs a thread, after `WARPGROUP.DEPBAR.LE gsb0, 0x1`: the
other half still in flight) while the tensor cores run the other. No WGMMA is serialized (one
WARPGROUP.ARRIVE per group of four QGMMA; ptxas serialized all of them, C7514, while the loop's tail
was written once), no spills, registers under the consumers' 232 (the wide 128x192 tile included:
the launch bound `.minnctapersm 1` lets ptxas honor setmaxnreg). The catalogue refuses the option with
the other promotion orders."""

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from schedules.fp8_gemm import acc_per_thread, fp8_schedule, halves_error
from tests.helpers import assert_within_registers, sass_instructions, sass_or_skip

SPEC = catalog.get("fp8_gemm")
CONFIGS = {
    "128x128": {"promote_halves": True},
    "128x128_sb_smem": {"promote_halves": True, "sb_smem": True},
    "128x160_sb_smem": {"promote_halves": True, "tile_n": 160, "sb_smem": True},
    "128x192_sb_smem": {"promote_halves": True, "tile_n": 192, "sb_smem": True},
    "pingpong64x128": {"promote_halves": True, "schedule": "pingpong", "tile_m": 64},
}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    return {name: compile_with_artifacts(SPEC, SPEC.resolve(over), str(tmp_path_factory.mktemp(name)))
            for name, over in CONFIGS.items()}


def _tile_n(name):
    return SPEC.resolve(CONFIGS[name])["tile_n"]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_halves_overlap_in_sass(artifacts, name):
    report, files = artifacts[name]
    assert not report.spills, report.format()
    sass = sass_or_skip(report, files)
    ops = sass_instructions(sass)
    qg = [args for op, args in ops if op.startswith("QGMMA")]
    shapes = {op for op, _ in ops if op.startswith("QGMMA")}
    assert shapes == {f"QGMMA.64x{_tile_n(name) // 2}x32.F32.E4M3.E4M3"}, shapes
    arrive = sum(op == "WARPGROUP.ARRIVE" for op, _ in ops)
    assert arrive * 4 == len(qg), f"{arrive} ARRIVE for {len(qg)} QGMMA: serialized WGMMAs"
    waits = [args for op, args in ops if op == "WARPGROUP.DEPBAR.LE"]
    assert sum(w.startswith("gsb0, 0x1") for w in waits) >= 3, waits
    # the K loop: after each of its two waits that leave a half in flight, the other half's whole
    # promotion (N/4 FFMAs a thread) before the next WGMMA or wait (the tails may hoist their last wait)
    s = fp8_schedule(SPEC.resolve(CONFIGS[name])["schedule"], SPEC.resolve(CONFIGS[name])["tile_m"], _tile_n(name))
    half = acc_per_thread(s) // 2
    counts = []
    for i, (op, args) in enumerate(ops):
        if op == "WARPGROUP.DEPBAR.LE" and args.startswith("gsb0, 0x1"):
            ffma = 0
            for op2, _ in ops[i + 1:]:
                if op2.startswith("QGMMA") or op2 in ("WARPGROUP.DEPBAR.LE", "EXIT"):
                    break
                ffma += op2 == "FFMA"
            counts.append(ffma)
    assert counts.count(half) >= 2, f"FFMAs after the one-in-flight waits {counts}, expected two of {half}"
    assert_within_registers(report, sass, 232)


def test_refused_with_other_orders():
    with pytest.raises(ValueError, match="promote_halves"):
        SPEC.resolve({"promote_halves": True, "promote_overlap": True})
    with pytest.raises(ValueError, match="promote_halves"):
        SPEC.resolve({"promote_halves": True, "wg_turns": True})
    assert halves_error(fp8_schedule("cooperative", 128, 192), False, False) is None
