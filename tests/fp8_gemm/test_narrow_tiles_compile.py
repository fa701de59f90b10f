"""CPU: the FP8 GEMM's narrow ping-pong tiles (64x32, 64x16: a CTA per 32 / 16 columns, for small-M
grids that 64x64 leaves mostly idle) compile for sm_90a without spills or local memory, with the plain
promotion and with the small-M default (`promote_overlap` + `sb_ahead`); the SASS runs QGMMAs of the
tile's width."""

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from tests.helpers import sass_or_skip

SPEC = catalog.get("fp8_gemm")


@pytest.mark.parametrize("tile_n", [32, 16])
@pytest.mark.parametrize("extra", [{}, {"promote_overlap": True, "sb_ahead": True}], ids=["plain", "overlap_ahead"])
def test_narrow_tile_compiles(tile_n, extra, tmp_path):
    cfg = SPEC.resolve({"schedule": "pingpong", "tile_m": 64, "tile_n": tile_n, "cluster_m": 1, **extra})
    report, art = compile_with_artifacts(SPEC, cfg, str(tmp_path))
    assert not report.spills and report.ptx_census["ld/st.local"] == 0, report.format()
    sass = sass_or_skip(report, art)
    assert f"QGMMA.64x{tile_n}x32.F32.E4M3.E4M3" in sass
