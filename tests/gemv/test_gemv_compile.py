"""CPU: the FMA GEMV compiles for sm_90a with 128-bit loads of W where aligned and shuffles in its row reduction
under the op's register tiles, no local memory; the spread reduction's warp stage modelled lane by lane."""

import pytest

from tests.helpers import case_id, compile_and_check_census

CASES = [
    ("gemv.rows", {}), ("gemv.rows", {"cols": 8, "threads_per_row": 256, "unroll": 2}),
    ("gemv.rows", {"cols": 3, "dtype": "fp16", "threads_per_row": 64}), ("gemv.rows", {"aligned": False}),
    # the op's register tiles: R = 2 for B = 3-4, R = 4 for B = 5-8 (schedules/gemv.py)
    ("gemv.rows", {"cols": 4, "threads_per_row": 64, "row_block": 2}),
    ("gemv.rows", {"cols": 8, "threads": 128, "threads_per_row": 128, "unroll": 1, "row_block": 4}),
    ("gemv.rows", {"cols": 5, "threads": 128, "threads_per_row": 16, "unroll": 1, "row_block": 4, "aligned": False}),
]


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_census(case, tmp_path):
    compile_and_check_census(case, tmp_path)


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
