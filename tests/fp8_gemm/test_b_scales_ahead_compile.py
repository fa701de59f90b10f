"""CPU: the FP8 GEMM's `sb_ahead` option (B scales read from global one K-block ahead) compiles for
sm_90a without spills and, in SASS, puts a whole K-block between a B-scale load and its first use: at
least two of the 32-bit global loads are first read after another K-block's WGMMA batch was issued
(its last QGMMA, the one carrying `gsb0`), where the default reads each within its own K-block (ptxas
even places the scale products between that K-block's QGMMAs, so a late load holds up their issue). The K loop runs
two K-blocks an iteration, each scale in its own register: no register move carries a load across
iterations (a one-K-block loop had one, placed right after the load, waiting for it). With
`promote_overlap` the same holds for its pairs of steps. The catalogue refuses the option with staged B
scales and with `promote_halves`."""

import re

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from tests.helpers import sass_instructions, sass_or_skip

SPEC = catalog.get("fp8_gemm")
CONFIGS = {
    "pp64x64": {"schedule": "pingpong", "tile_m": 64, "tile_n": 64, "cluster_m": 1},
    "pp64x128_c2x1": {"schedule": "pingpong", "tile_m": 64},
    "coop128x192": {"tile_n": 192, "cluster_m": 1},
    "pp64x64_k3": {"schedule": "pingpong", "tile_m": 64, "tile_n": 64, "cluster_m": 1, "cluster_n": 2, "split_k": 3},
    # with promote_overlap (K-block k-1 promoted under k's WGMMAs): the scales of K-block j loaded in the
    # step that issues j, a step before its promotion
    "pp64x64_overlap": {"schedule": "pingpong", "tile_m": 64, "tile_n": 64, "cluster_m": 1, "promote_overlap": True},
    "pp64x128_overlap": {"schedule": "pingpong", "tile_m": 64, "promote_overlap": True},
    # split-K units promote with the overlap too (the split path called the plain promotion before)
    "pp64x64_k3_overlap": {"schedule": "pingpong", "tile_m": 64, "tile_n": 64, "cluster_m": 1, "split_k": 3,
                           "promote_overlap": True},
}


def scale_loads_ahead(sass: str) -> tuple[int, int]:
    """(32-bit global loads with a whole K-block's WGMMAs issued before their first read -- a QGMMA
    carrying `gsb0`, the last of a K-block's batch, in between -- all 32-bit global loads), in program
    order (a loop's carried load is followed past the back-edge into the tail)."""
    ins = sass_instructions(sass)
    ahead = total = 0
    for i, (op, args) in enumerate(ins):
        if op not in ("LDG.E", "LDG.E.CONSTANT"):
            continue
        rd = args.split(",")[0].strip()
        total += 1
        waited = False
        for op2, args2 in ins[i + 1:]:
            ops = [x.strip() for x in args2.split(",")]
            srcs = ops if op2.startswith("ST") else ops[1:]
            if any(re.fullmatch(rf"-?{rd}(\.reuse)?", x) for x in srcs):
                break
            waited = waited or op2.startswith(("QGMMA", "HGMMA")) and "gsb0" in args2
        ahead += waited
    return ahead, total


@pytest.mark.parametrize("name", list(CONFIGS))
def test_scales_loaded_a_k_block_ahead(name, tmp_path):
    on = compile_with_artifacts(SPEC, SPEC.resolve({**CONFIGS[name], "sb_ahead": True}), str(tmp_path / "on"))
    off = compile_with_artifacts(SPEC, SPEC.resolve(CONFIGS[name]), str(tmp_path / "off"))
    for report, _ in (on, off):
        assert not report.spills and report.ptx_census["ld/st.local"] == 0, report.format()
    if "split_k" in CONFIGS[name]:
        return  # the fixup's partial loads are 32-bit global loads too: the count below is for plain tiles
    ahead_on, n_on = scale_loads_ahead(sass_or_skip(*on))
    ahead_off, _ = scale_loads_ahead(sass_or_skip(*off))
    assert ahead_on >= 2 and ahead_on > ahead_off, (ahead_on, n_on, ahead_off)
    if "promote_overlap" not in CONFIGS[name]:
        assert ahead_off == 0
    else:  # every load a step ahead (ptxas already delays some of the default's products at 64x128)
        assert ahead_on == n_on, (ahead_on, n_on)


def test_refused_with_staged_scales_and_halves():
    with pytest.raises(ValueError, match="sb_ahead"):
        SPEC.resolve({"sb_ahead": True, "sb_smem": True})
    with pytest.raises(ValueError, match="sb_ahead"):
        SPEC.resolve({"sb_ahead": True, "promote_halves": True})
