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
    # rows not 16-byte aligned (odd lengths): a scalar head per row, then 128-bit vectors
    ("argmax.rows", {"aligned": False, "row_head": True}),
    ("argmax.rows", {"aligned": False, "row_head": True, "keys_out": True, "dtype": "fp16", "index64": True}),
    ("gemv.rows", {}), ("gemv.rows", {"cols": 8, "threads_per_row": 256, "unroll": 2}),
    ("gemv.rows", {"cols": 3, "dtype": "fp16", "threads_per_row": 64}), ("gemv.rows", {"aligned": False}),
    # the op's register tiles: R = 2 for B = 3-4, R = 4 for B = 5-8 (schedules/gemv.py)
    ("gemv.rows", {"cols": 4, "threads_per_row": 64, "row_block": 2}),
    ("gemv.rows", {"cols": 8, "threads": 128, "threads_per_row": 128, "unroll": 1, "row_block": 4}),
    ("gemv.rows", {"cols": 5, "threads": 128, "threads_per_row": 16, "unroll": 1, "row_block": 4, "aligned": False}),
    ("transpose.naive", {}), ("transpose.smem", {}), ("transpose.smem", {"pad": 0}), ("transpose.swizzle", {}),
    ("transpose.tma", {}), ("transpose.tma", {"dtype": "fp32"}), ("transpose.swizzle", {"aligned": False}),
    # tile orders (schedules/tile_order.py): the old row-major one, diagonal, other group sizes, 64-bit
    ("transpose.tma", {"order": "row"}), ("transpose.tma", {"order": "diagonal", "index64": True}),
    ("transpose.swizzle", {"order": "diagonal", "index64": True}), ("transpose.smem", {"dtype": "fp32", "group": 8}),
    ("transpose.naive", {"order": "row", "aligned": False, "index64": True}),
    # 2 x 2 tiles a CTA (256-byte row runs on both sides)
    ("transpose.tma", {"sub": 2, "dtype": "fp32"}), ("transpose.tma", {"sub": 2, "index64": True}),
    ("transpose.swizzle", {"sub": 2}), ("transpose.smem", {"sub": 2, "dtype": "fp32", "aligned": False}),
    # persistent CTAs over two load stages / store buffers
    ("transpose.tma", {"persistent": True}), ("transpose.tma", {"persistent": True, "sub": 2, "dtype": "fp32"}),
    ("transpose.tma", {"persistent": True, "order": "diagonal", "index64": True}),
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
    aligned = (over.get("aligned", True) or over.get("row_head", False)) and over.get("dtype") != "key"
    family = name.split(".")[0]
    if name == "transpose.tma":
        q = over.get("sub", 1) ** 2
        # one TMA load and one TMA store per tile; the persistent kernel issues its loads in two places
        # (the first block, the next block from the loop)
        assert ptx["cp.async.bulk.tensor"] == (3 if over.get("persistent") else 2) * q, ptx["cp.async.bulk.tensor"]
        assert ptx["mbarrier"] > 0 and ptx["ld.global (all)"] == 0 and ptx["st.global (all)"] == 0
        if sass is not None and not over.get("persistent"):
            assert sass["UTMALDG (TMA load)"] == q and sass["UTMASTG (TMA store)"] == q
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
    if family == "swiglu":
        # 16-bit outputs: sigmoid by the hardware reciprocal, no IEEE division (its Newton steps and slow-path
        # call per element); fp32 outputs keep the division
        fast = over.get("dtype", "bf16") != "fp32"
        assert ("rcp.approx.ftz.f32" in ptx_text) == fast
        assert (re.search(r"\b(div|rcp)\.rn\.f32", ptx_text) is None) == fast
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


@pytest.mark.parametrize("width", [1, 2, 3, 5, 6, 8, 20, 24, 28, 32])
@pytest.mark.parametrize("group", [8, 16, 32])
def test_spread_reduce_schedule(width, group):
    """A lane-by-lane model of `group_reduce_spread`'s warp stage on its own stage list: every value
    of every group ends summed in exactly one owner lane, at about one shuffle per value."""
    from collectives.reduce import _spread_stages

    stages = _spread_stages(width, group)
    lanes = range(32)
    vals = {lane: [float((lane + 1) * 1000 + i) for i in range(width)] for lane in lanes}
    idx = {lane: list(range(width)) for lane in lanes}
    own = {lane: [1] * width for lane in lanes}
    shuffles = 0
    for offset, m, h in stages:
        nv, ni, no = {}, {}, {}
        for lane in lanes:
            hi = (lane & offset) != 0
            other = lane ^ offset
            v, ov = vals[lane], vals[other]
            # the partner sends what it does not keep: its lower half when its bit is 1, else its upper
            nv[lane] = [(v[i + h] if hi else v[i]) + (ov[i + h] if hi else ov[i]) for i in range(h)]
            ni[lane] = [idx[lane][i + h] if hi else idx[lane][i] for i in range(h)]
            no[lane] = [own[lane][i + h] if hi else own[lane][i] for i in range(h)]
            if m % 2:
                nv[lane].append(v[m - 1] + ov[m - 1])
                ni[lane].append(idx[lane][m - 1])
                no[lane].append(own[lane][m - 1] * (0 if hi else 1))
        vals, idx, own = nv, ni, no
        shuffles += h + m % 2
    for g0 in range(0, 32, group):
        got = {}
        for lane in range(g0, g0 + group):
            for v, i, o in zip(vals[lane], idx[lane], own[lane]):
                if o:
                    assert i not in got, f"value {i} owned twice"
                    got[i] = v
        assert sorted(got) == list(range(width))
        for i, v in got.items():
            assert v == sum((lane + 1) * 1000 + i for lane in range(g0, g0 + group))
    assert shuffles <= width + len(stages)
