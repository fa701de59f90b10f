"""CPU: the softmax of a K/V block as the SASS shows it (docs/kernels/attention.md, "How it got
here": "The loop"). Per block and consumer thread at D = 128, tile_n = 128 (two rows of 32
columns): 64 + 2 ex2 (the probabilities and the two rescale factors), 64 packed-pair conversions of P
in 32 F2FP; the row max as independent partial chains (FMNMX/SHFL dependency depth <= 12, was 34 when
folded one by one); `lazy_rescale`: one VOTE.ALL and a branch around the 64 FMULs of the O rescale,
no exponential recomputed (LLVM did that when fp32 probabilities lived across the branch); no spills,
HGMMA, setmaxnreg 24 / 240."""

import re

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from tests.helpers import highest_register

VARIANTS = {
    "no_overlap": {"head_dim": 128, "overlap": False},  # one softmax site (the default overlap has two)
    "lazy": {"head_dim": 128, "lazy_rescale": True},
    "lazy_causal_d64": {"head_dim": 64, "mask": "causal", "lazy_rescale": True},
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def compiled(request, tmp_path_factory):
    spec = catalog.get("flash_attn")
    p = spec.resolve(VARIANTS[request.param])
    report, files = compile_with_artifacts(spec, p, str(tmp_path_factory.mktemp("fa_sm")))
    sass = files["sass"].read_text() if "sass" in files else None
    return request.param, p, report, files["ptx"].read_text(), sass


def _fmnmx_depth(sass: str) -> int:
    """Longest chain of FMNMX / SHFL through their register operands (straight-line approximation:
    a register written by anything else restarts at 0)."""
    depth, best = {}, 0
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?(\S+)\s+(.*);", line)
        if not m:
            continue
        op, args = m.group(1), [a.strip() for a in m.group(2).split(",")]
        if op == "FMNMX" or op.startswith("SHFL.BFLY"):
            d = 1 + max((depth.get(a.split(".")[0], 0) for a in args[1:3] if a.startswith("R")), default=0)
            depth[args[0]] = d
            best = max(best, d)
        elif args and args[0].startswith("R"):
            depth.pop(args[0], None)
    return best


def test_softmax_instructions(compiled):
    name, p, report, ptx, sass = compiled
    d = p["head_dim"]
    cols = 128 // 4  # tile_n 128 at D = 64 and 128: 32 columns per row and thread
    # one softmax site (no overlap): 2 rows x cols probabilities + 2 factors, nothing recomputed
    assert len(re.findall(r"ex2\.approx", ptx)) == 2 * cols + 2, name
    assert report.ptx_census["wgmma.mma_async"] == d // 16 + 128 // 16
    assert re.search(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+24\b", ptx)
    assert re.search(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+240\b", ptx)
    assert report.ptx_census["ld/st.local"] == 0 and not report.spills, report.format()
    if p["lazy_rescale"]:
        assert len(re.findall(r"vote\.sync\.all\.pred", ptx)) == 1
    else:
        assert "vote.sync" not in ptx
    if sass is not None:
        assert report.sass_census["HGMMA/QGMMA"] == d // 16 + 128 // 16
        assert report.sass_census["LDL/STL (spills)"] == 0
        assert len(re.findall(r"MUFU\.EX2", sass)) == 2 * cols + 2
        assert _fmnmx_depth(sass) <= 12, _fmnmx_depth(sass)
        top = highest_register(sass)
        assert top < 240, top
        if p["lazy_rescale"]:
            assert "VOTE.ALL" in sass
