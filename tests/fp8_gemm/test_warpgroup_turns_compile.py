"""CPU (sm_90a compile): the FP8 GEMM's `wg_turns` option (cooperative: the two consumer warpgroups
issue each K-block's WGMMAs in turn on named barriers 3 + warpgroup). No spills; the turns are a
`bar.sync` (mine) and a `bar.arrive` (theirs) of 256 threads around each K-block's WGMMA group (K-block
0 of a tile and the loop, with and without the smem B-scale row); the catalogue refuses it where there
is no pair of warpgroups sharing a tile."""

import re

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts

SPEC = catalog.get("fp8_gemm")


@pytest.mark.parametrize("over", [{"sb_smem": True, "tile_n": 160}, {"sb_smem": False}, {"grouping": "contiguous",
                                                                                      "cluster_m": 1, "cluster_n": 2}])
def test_turns_compile(over, tmp_path):
    p = SPEC.resolve({"wg_turns": True, **over})
    report, files = compile_with_artifacts(SPEC, p, str(tmp_path))
    assert not report.spills and report.ptx_census["ld/st.local"] == 0, report.format()
    ptx = files["ptx"].read_text()
    base, _ = compile_with_artifacts(SPEC, SPEC.resolve(over), str(tmp_path / "off"))
    arrives = len(re.findall(r"bar\.arrive\s+%r\d+, 256;", ptx))
    # one hand-over per WGMMA-group site (K-block 0 and the loop with sb_smem, the loop without) + the
    # initial pre-arrive of warpgroup 0
    assert arrives >= (3 if p["sb_smem"] else 2), arrives
    assert report.ptx_census["wgmma.mma_async"] == base.ptx_census["wgmma.mma_async"]


@pytest.mark.parametrize("over", [{"schedule": "pingpong", "tile_m": 64}, {"promote_overlap": True}])
def test_turns_refused(over):
    with pytest.raises(ValueError, match="wg_turns"):
        SPEC.check(SPEC.resolve({"wg_turns": True, **over}))
