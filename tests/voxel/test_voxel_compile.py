"""CPU: the voxel pipelines compile for sm_90a with what they are meant to use: IEEE division for the voxel coordinate
(the reference's fp32 quotient, bit for bit), `match.any` ranks and ballots in the sort and the numbering, 16-byte
loads where rows allow them, every kernel waiting on its predecessor (PDL), no local memory, and no float atomics
anywhere (the only atomics: the scatter's integer bounding box)."""

import re

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts

CASES = [
    ("voxel.dynamic", {}),
    ("voxel.hard", {}),
    ("voxel.scatter", {}),
    ("voxel.scatter", {"reduce": "max", "dtype": "bf16", "group": 8}),
    ("voxel.hard", {"passes": 4, "digit_bits": 8, "aligned": False}),
    ("voxel.dynamic", {"aligned": False}),
    ("voxel.scatter", {"reduce": "sum", "aligned": False, "group": 4}),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_pipeline_compiles_clean(case, tmp_path):
    name, over = case
    spec = catalog.get(name)
    p = spec.resolve(over)
    report, files = compile_with_artifacts(spec, p, str(tmp_path))
    ptx = files["ptx"].read_text()
    assert not report.spills, report.format()
    assert "ld.local" not in ptx and "st.local" not in ptx
    kernels = len(re.findall(r"^\.visible \.entry", ptx, re.M))
    assert ptx.count("griddepcontrol.wait") >= kernels  # every kernel waits for the one before it
    assert not re.search(r"atom\.global\.(add\.)?f(32|64)|red\.global\.add\.f", ptx), "a float atomic"
    atomics = re.findall(r"atom\.global\.\w+(?:\.\w+)*", ptx)
    if name == "voxel.scatter":
        assert atomics and all(".max.s32" in a for a in atomics), atomics  # the bounding box's six words
    else:
        assert not atomics, atomics
    assert (report.ptx_census["ld.global.v4 (128-bit)"] > 0) == p["aligned"]
    if name in ("voxel.dynamic", "voxel.hard"):
        assert "div.rn.f32" in ptx and "div.approx" not in ptx and "div.full" not in ptx
    if name != "voxel.dynamic":
        assert "match.any.sync" in ptx and "vote.sync.ballot" in ptx
        # the radix passes: a histogram (but pass 0's, counted by the key kernel), a scan, a scatter each
        passes = p["passes"] if name == "voxel.hard" else 4
        assert len(re.findall(r"^\.visible \.entry \w*scatter_kernel\w*RadixSort", ptx, re.M)) == passes
        assert len(re.findall(r"^\.visible \.entry \w*hist_kernel\w*RadixSort", ptx, re.M)) == passes - 1
    if name == "voxel.hard":
        assert kernels == 1 + 3 * p["passes"] - 1 + 6 + 1  # keys, sort, heads and firsts numbering, the writer
    if name == "voxel.scatter":
        assert kernels == 2 + 3 * 4 - 1 + 3 + 2  # box, keys, sort, heads, the runs and the fix-up


def test_catalogue_rules():
    with pytest.raises(ValueError, match="passes must be one of"):
        catalog.get("voxel.hard").resolve({"passes": 5})
