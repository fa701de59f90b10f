"""CPU: the tile orders of `schedules/tile_order.py` are permutations of the tile grid, "grouped"
with group 1 is the row-major order, and the footprints of a window of consecutive CTAs are what
the docs page (docs/kernels/transpose.md) claims."""

import pytest

from schedules.tile_order import ORDERS, TileOrder, picture, tile_list

SHAPES = [(1, 1, 1), (1, 7, 1), (7, 1, 2), (5, 3, 1), (128, 128, 1), (33, 70, 3), (64, 17, 2), (100, 257, 1)]


@pytest.mark.parametrize("order", [TileOrder("row"), TileOrder("diagonal"), TileOrder("grouped", 1),
                                   TileOrder("grouped", 4), TileOrder("grouped", 32), TileOrder("grouped", 64)],
                         ids=str)
@pytest.mark.parametrize("tm,tn,b", SHAPES)
def test_permutation(order, tm, tn, b):
    tiles = tile_list(tm, tn, b, order)
    assert sorted(tiles) == [(i, j, k) for i in range(tm) for j in range(tn) for k in range(b)]
    # batch entries follow one another
    assert [k for _, _, k in tiles] == sorted(k for _, _, k in tiles)


def test_row_is_group_one_and_row_major():
    for tm, tn, b in SHAPES:
        row = tile_list(tm, tn, b, TileOrder("row"))
        assert row == tile_list(tm, tn, b, TileOrder("grouped", 1))
        assert row == [(i, j, k) for k in range(b) for i in range(tm) for j in range(tn)]


def test_diagonal_small_picture():
    assert picture(4, 4, TileOrder("diagonal"), 2) == "\n".join([
        " 0  4  8 12", "13  1  5  9", "10 14  2  6", " 7 11 15  3"])


def _footprint(tiles):
    """(input tile-rows, input tile-columns) touched by a window of tiles; the output's are swapped."""
    return len({m for m, _, _ in tiles}), len({n for _, n, _ in tiles})


def test_window_footprints():
    """8192 x 8192 bf16 (128 x 128 tiles of 64), ~1,700 resident CTAs (13 per SM on 132 SMs)."""
    w = 1700
    rows, cols = _footprint(tile_list(128, 128, 1, TileOrder("row"))[:w])
    assert (rows, cols) == (14, 128)  # reads: whole rows; writes: <= 14 x 128 B of every output row
    rows, cols = _footprint(tile_list(128, 128, 1, TileOrder("grouped", 32))[:w])
    assert (rows, cols) == (32, 54)  # writes: 4 KB of 3456 output rows; reads: ~6.8 KB of 2048 input rows
    rows, cols = _footprint(tile_list(128, 128, 1, TileOrder("diagonal"))[:w])
    assert (rows, cols) == (128, 128)  # every row band of both, ~14 tiles each


def test_bad_orders():
    with pytest.raises(ValueError, match="order must be one of"):
        TileOrder("zigzag")
    with pytest.raises(ValueError, match="group must be"):
        TileOrder("grouped", 0)
    assert set(ORDERS) == {"row", "grouped", "diagonal"}
    assert str(TileOrder()) == "g32" and str(TileOrder("row")) == "r" and str(TileOrder("diagonal")) == "d"


def test_transpose_sub_policy():
    """2 x 2 blocks for the TMA transpose of matrices of ~100 MiB and more (measured wins), never for the
    other variants or small / batched-small matrices (measured losses or ties)."""
    from schedules.tile_order import transpose_sub

    assert transpose_sub("tma", 16384, 16384, 4) == 2
    assert transpose_sub("tma", 8192, 8192, 2) == 2
    assert transpose_sub("tma", 8000, 8000, 2) == 2
    assert transpose_sub("tma", 4096, 4096, 4) == 1
    assert transpose_sub("tma", 4096, 4096, 2) == 1
    assert transpose_sub("tma", 2048, 2048, 4) == 1  # one entry of a 32 x 2048 x 2048 batch
    assert transpose_sub("swizzle", 16384, 16384, 4) == 1
