"""CPU: the four transposes compile for sm_90a with what each is meant to do (scattered column writes naive,
128-bit shared accesses tiled, one TMA load and store per tile), in every tile order, and no local memory;
the smem tiles' column walk is conflict-free."""

import pytest

from tests.helpers import case_id, compile_and_check_census

CASES = [
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


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_census(case, tmp_path):
    compile_and_check_census(case, tmp_path)


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
