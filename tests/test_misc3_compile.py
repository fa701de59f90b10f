"""CPU: GEMV, transposes, SiLU/SwiGLU and ArgMax compile for sm_90a with the instructions each is
meant to use: 128-bit global accesses where vectorized, 128-bit shared accesses in the tiled
transposes, one TMA load and one TMA store per tile in the TMA transpose, shuffles in the row
reductions, and no local memory anywhere."""

import re

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts

CASES = [
    ("swiglu.silu_fwd", {}), ("swiglu.silu_bwd", {}), ("swiglu.swiglu_fwd", {}), ("swiglu.swiglu_bwd", {}),
    ("swiglu.swiglu_bwd", {"dtype": "fp32"}), ("swiglu.swiglu_fwd", {"aligned": False}),
    ("argmax.rows", {}), ("argmax.rows", {"threads_per_row": 4, "dtype": "fp32"}), ("argmax.rows", {"keys_out": True}),
    ("argmax.rows", {"dtype": "key", "aligned": False, "threads_per_row": 32}),
    ("gemv.rows", {}), ("gemv.rows", {"cols": 8, "threads_per_row": 256, "unroll": 2}),
    ("gemv.rows", {"cols": 3, "dtype": "fp16", "threads_per_row": 64}), ("gemv.rows", {"aligned": False}),
    ("transpose.naive", {}), ("transpose.smem", {}), ("transpose.smem", {"pad": 0}), ("transpose.swizzle", {}),
    ("transpose.tma", {}), ("transpose.tma", {"dtype": "fp32"}), ("transpose.swizzle", {"aligned": False}),
]


def _id(case):
    name, over = case
    return name + "".join(f",{k}={v}" for k, v in over.items())


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return {}


def _compile(built, case, tmp_path_factory):
    key = _id(case)
    if key not in built:
        spec = catalog.get(case[0])
        built[key] = compile_with_artifacts(spec, spec.resolve(case[1]), str(tmp_path_factory.mktemp("m3")))
    return built[key]


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_census(built, case, tmp_path_factory):
    name, over = case
    report, files = _compile(built, case, tmp_path_factory)
    ptx_text = files["ptx"].read_text()
    ptx, sass = report.ptx_census, report.sass_census
    assert not report.spills, report.format()
    assert report.kernels[0].registers <= 255
    aligned = over.get("aligned", True) and over.get("dtype") != "key"
    family = name.split(".")[0]
    if name == "transpose.tma":
        assert ptx["cp.async.bulk.tensor"] == 2, "one TMA load and one TMA store per tile"
        assert ptx["mbarrier"] > 0 and ptx["ld.global (all)"] == 0 and ptx["st.global (all)"] == 0
        if sass is not None:
            assert sass["UTMALDG (TMA load)"] == 1 and sass["UTMASTG (TMA store)"] == 1
        assert len(re.findall(r"ld\.shared\.v4", ptx_text)) > 0
        return
    if aligned:
        assert ptx["ld.global.v4 (128-bit)"] > 0
        if sass is not None:
            assert sass["LDG.128"] > 0
    else:
        assert ptx["ld.global.v4 (128-bit)"] == 0
    if family == "swiglu" and aligned:
        assert ptx["st.global.v4 (128-bit)"] > 0
    if family in ("argmax", "gemv") and over.get("threads_per_row", 2) > 1:
        assert ptx["shfl.sync"] > 0
    if name == "transpose.naive":
        assert ptx["st.global.v4 (128-bit)"] == 0, "naive writes scalars down the output's columns"
    if name in ("transpose.smem", "transpose.swizzle"):
        assert len(re.findall(r"ld\.shared\.v4", ptx_text)) > 0, "the smem transpose reads 16-byte chunks"
        if aligned:
            assert ptx["st.global.v4 (128-bit)"] > 0
            assert len(re.findall(r"st\.shared\.v4", ptx_text)) > 0


def test_transpose_tile_layouts_are_conflict_free():
    """The column walk of the smem transpose (8 lanes read chunk j of 8 consecutive rows) hits 8
    distinct 16-byte bank groups with padding or the swizzle, and one group without either."""
    from collectives.smem_tiles import bank_of

    row_bytes = 128

    def groups(offset_of):
        return {bank_of(offset_of(r, j)) // 4 for r in range(8) for j in [3]}

    assert len(groups(lambda r, j: r * row_bytes + 16 * j)) == 1  # plain row-major: 8-way conflict
    assert len(groups(lambda r, j: r * (row_bytes + 16) + 16 * j)) == 8  # 16-byte padding
    assert len(groups(lambda r, j: r * row_bytes + 16 * (j ^ (r % 8)))) == 8  # Swizzle<3,4,3>
