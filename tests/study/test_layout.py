"""CPU: the layout study tool against values worked out by hand from CuTe's definitions.

Each expected layout below was derived on paper (or is a worked example of CuTe's layout-algebra
documentation), never by calling the code under test. The algebra runs in the real DSL.
"""

import pytest

from cute_kernels.study.layout import (
    Layout,
    algebra,
    evaluate,
    format_grid,
    grid,
    offset_at,
    parse,
    parse_tiler,
    tv_grid,
)


def result(op, a, b=None):
    bb = None
    if b is not None:
        bb = b if isinstance(b, int) else parse_tiler(b)
    return str(algebra(op, parse(a), bb)[-1].layout)


# (op, A, B, expected result): >= 30 hand-computed cases
CASES = [
    # composition R(i) = A(B(i))
    ("composition", "(6,2):(8,2)", "(4,3):(3,1)", "((2,2),3):((24,2),8)"),      # CuTe docs example
    ("composition", "20:2", "(5,4):(4,1)", "(5,4):(8,2)"),                      # 2*(4i+j)
    ("composition", "(10,2):(16,4)", "(5,4):(1,5)", "(5,(2,2)):(16,(80,4))"),    # CuTe docs example
    ("composition", "(4,8):(8,1)", "8:4", "8:1"),                                # index 4i -> coord (0,i) -> i
    ("composition", "32:1", "(4,8):(8,1)", "(4,8):(8,1)"),                       # identity on the left
    ("composition", "(12,(4,8)):(59,(13,1))", "[3:4,8:2]", "(3,(2,4)):(236,(26,1))"),  # by-mode, docs
    ("composition", "(8,8):(8,1)", "(2,4)", "(2,4):(8,1)"),                       # shape tiler = first 2 rows, 4 cols
    # complement: the offsets A does not reach, up to the cotarget
    ("complement", "4:1", 24, "6:4"),
    ("complement", "6:4", 24, "4:1"),
    ("complement", "4:2", 24, "(2,3):(1,8)"),
    ("complement", "(2,4):(1,6)", 24, "3:2"),
    ("complement", "(2,2):(1,6)", 24, "(3,2):(2,12)"),
    # coalesce: same function, fewest modes
    ("coalesce", "(2,(1,6)):(1,(6,2))", None, "12:1"),
    ("coalesce", "(2,4):(1,2)", None, "8:1"),
    ("coalesce", "(2,4):(4,1)", None, "(2,4):(4,1)"),
    ("coalesce", "((2,2),(2,2)):((1,2),(4,8))", None, "16:1"),
    # right_inverse: A(R(k)) = k
    ("right_inverse", "(4,8):(8,1)", None, "(8,4):(4,1)"),       # k = j + 8i -> index i + 4j
    ("right_inverse", "(2,4):(4,1)", None, "(4,2):(2,1)"),       # k = j + 4i -> index i + 2j
    ("right_inverse", "(4,8):(1,4)", None, "32:1"),              # already the identity
    # logical_divide: A o (B, complement(B, size A))
    ("logical_divide", "16:1", "4:2", "(4,(2,2)):(2,(1,8))"),
    ("logical_divide", "(4,2,3):(2,1,8)", "4:2", "((2,2),(2,3)):((4,1),(2,8))"),   # CuTe docs example
    ("logical_divide", "24:1", "8:1", "(8,3):(1,8)"),
    ("logical_divide", "(4,8):(1,4)", "(2,4)", "((2,2),(4,2)):((1,2),(4,16))"),    # by-mode
    # zipped_divide: ((tiles' modes), (rests' modes))
    ("zipped_divide", "(4,8):(1,4)", "(2,4)", "((2,4),(2,2)):((1,4),(2,16))"),
    ("zipped_divide", "(8,8):(8,1)", "(4,2)", "((4,2),(2,4)):((8,1),(32,2))"),
    # tiled_divide: (tile, rest_0, rest_1)
    ("tiled_divide", "(4,8):(1,4)", "(2,4)", "((2,4),2,2):((1,4),2,16)"),
    ("tiled_divide", "(8,8):(8,1)", "(4,2)", "((4,2),2,4):((8,1),32,2)"),
    # logical_product: (A, complement(A, size A * cosize B) o B)
    ("logical_product", "(2,2):(4,1)", "6:1", "((2,2),(2,3)):((4,1),(2,8))"),     # CuTe docs example
    ("logical_product", "4:1", "3:1", "(4,3):(1,4)"),
    ("logical_product", "(2,2):(1,2)", "3:1", "((2,2),3):((1,2),4)"),
    # blocked / raked products, per mode (A_i, B_i) / (B_i, A_i)
    ("blocked_product", "(2,2):(1,2)", "(2,3):(1,2)", "((2,2),(2,3)):((1,4),(2,8))"),
    ("blocked_product", "(2,2):(2,1)", "(2,2):(1,2)", "((2,2),(2,2)):((2,4),(1,8))"),
    ("raked_product", "(2,2):(1,2)", "(2,3):(1,2)", "((2,2),(3,2)):((4,1),(8,2))"),
]


def test_at_least_thirty_cases():
    assert len(CASES) >= 30


@pytest.mark.parametrize("op,a,b,expected", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CASES])
def test_algebra_matches_hand_computed(op, a, b, expected):
    assert result(op, a, b) == expected


def test_algebra_results_are_the_same_functions():
    """Beyond the notation: the divide is A re-indexed, so it holds the same offsets (hand check on
    (4,8):(1,4) / <2,4>: the tile at rest (1,0) starts at offset 2)."""
    ld = parse("((2,2),(4,2)):((1,2),(4,16))")
    assert sorted(evaluate(ld)) == list(range(32))
    assert offset_at(ld, ((0, 1), (0, 0))) == 2


def test_divide_steps_show_the_derivation():
    steps = algebra("logical_divide", parse("16:1"), parse("4:2"))
    labels = [s.label for s in steps]
    assert labels[0] == "A" and labels[1].startswith("B")
    # complement(4:2, 16): the offsets {1, 8, 9} patterns: (2,2):(1,8)
    assert str(steps[2].layout) == "(2,2):(1,8)"
    assert str(steps[3].layout) == "(4,(2,2)):(2,(1,8))"
    assert all(s.layout.size > 0 for s in steps)


def test_product_steps_show_the_complement():
    steps = algebra("logical_product", parse("(2,2):(4,1)"), parse("6:1"))
    # complement((2,2):(4,1), 4*6=24) = (2,3):(2,8): the offsets 2, 8, 16 start the copies
    assert str(steps[2].layout) == "(2,3):(2,8)"


def test_evaluate_row_major():
    # (4,8):(8,1): index 5 -> coordinate (1,1) (colexicographic) -> 8*1 + 1
    offs = evaluate(parse("(4,8):(8,1)"))
    assert offs[5] == 9
    assert offs[:4] == [0, 8, 16, 24]


def test_evaluate_nested_coordinate():
    lay = parse("(2,(2,2)):(1,(4,2))")
    assert offset_at(lay, (1, (0, 1))) == 3
    assert evaluate(lay) == [0, 1, 4, 5, 2, 3, 6, 7]


def test_swizzled_function_acts_on_the_layouts_units():
    # S<3,4,3>: bits 4..6 ^= bits 7..9 of the *element* offset when evaluated as a function
    lay = parse("S<3,4,3> o 0 o (8,64):(64,1)")
    assert offset_at(lay, (1, 0)) == 64            # 64 has no bit in 7..9
    assert offset_at(lay, (2, 0)) == 128 ^ 16      # bit 7 set -> flips bit 4
    assert offset_at(lay, (7, 17)) == (7 * 64 + 17) ^ (3 << 4)   # 465: bits 7..9 = 3


def test_parse_forms():
    assert parse("(4,8)") == Layout((4, 8), (1, 4))                 # column-major default
    assert parse("((2,2),4)") == Layout(((2, 2), 4), ((1, 2), 4))
    assert parse("8:2") == Layout(8, 2)
    assert parse(" ( 4 , 8 ) : ( 8 , 1 ) ") == Layout((4, 8), (8, 1))
    sw = parse("Sw<2,4,3> o (8,32):(32,1)")
    assert sw.swizzle == (2, 4, 3) and sw.offset == 0 and str(sw) == "S<2,4,3> o 0 o (8,32):(32,1)"
    assert str(parse("(8):(1)")) == "(8):(1)"
    assert parse_tiler("(2,4)") == (2, 4)
    assert parse_tiler("[2:1,(4,2):(1,8)]") == (Layout(2, 1), Layout((4, 2), (1, 8)))


@pytest.mark.parametrize("bad", ["", "(4,8):(8)", "(4,8", "(4;8)", "(0,4):(1,1)", "4:1:2"])
def test_parse_rejects(bad):
    with pytest.raises(ValueError):
        parse(bad)


def test_grid_and_text():
    g = grid(parse("(4,8):(8,1)"))
    assert (g.rows, g.cols) == (4, 8)
    assert g.values[3][7] == 31 and g.values[1][2] == 10
    text = format_grid(g)
    assert text.splitlines()[0] == "(4,8):(8,1)"
    assert text.splitlines()[-1].split("|")[1].split() == [str(24 + c) for c in range(8)]
    g1 = grid(parse("8:2"))
    assert (g1.rows, g1.cols) == (1, 8) and g1.values[0] == (0, 2, 4, 6, 8, 10, 12, 14)


def test_tv_grid_wgmma_accumulator():
    """The 64xN WGMMA accumulator: thread t holds rows t/4 (+8), columns 2*(t%4) (+1) of each 8
    columns; warp w owns rows 16w..16w+15 (hand-derived from the PTX ISA's wgmma D fragment)."""
    tv = tv_grid(parse("((4,8,4),(2,2,2)):((128,1,16),(64,8,512))"), (64, 16))
    assert tv.threads == 128 and tv.values_per_thread == 8
    assert tv.owner[0][0] == (0, 0) and tv.owner[0][1] == (0, 1) and tv.owner[8][0] == (0, 2)
    assert tv.owner[0][2] == (1, 0) and tv.owner[1][0] == (4, 0) and tv.owner[16][0] == (32, 0)
    assert tv.owner[0][8] == (0, 4)
    assert all(o is not None for row in tv.owner for o in row)


def test_algebra_errors():
    with pytest.raises(ValueError, match="op must be"):
        algebra("transpose", parse("4:1"))
    with pytest.raises(ValueError, match="needs a second"):
        algebra("composition", parse("4:1"))
