"""CPU: the pictures encode what they claim (cells, offsets, one color per thread, banks), the PNG
is a real PNG, and the study subcommands run."""

import builtins
import struct
import xml.etree.ElementTree as ET

import pytest

from cute_kernels.study import atoms, banks, draw
from cute_kernels.study.layout import parse, tv_grid

NS = "{http://www.w3.org/2000/svg}"


def cells(svg_text):
    root = ET.fromstring(svg_text)
    assert root.tag == NS + "svg"
    return [e for e in root.iter(NS + "rect") if e.get("class") == "cell"]


def test_layout_svg_cells_hold_the_offsets():
    svg = draw.svg([draw.layout_panel(parse("(4,8):(8,1)"))])
    cs = cells(svg)
    assert len(cs) == 32
    for e in cs:
        r, c = int(e.get("data-row")), int(e.get("data-col"))
        assert int(e.get("data-offset")) == 8 * r + c
    # distinct offsets get distinct colors here (32 offsets, a 32-color period)
    assert len({e.get("fill") for e in cs}) == 32


def test_tv_svg_one_color_per_thread():
    acc = atoms.accumulator(16, 1)
    svg = draw.svg([draw.tv_panel(tv_grid(acc.tv, acc.tile_mn))])
    cs = cells(svg)
    assert len(cs) == 64 * 16
    by_thread = {}
    for e in cs:
        by_thread.setdefault(int(e.get("data-thread")), set()).add(e.get("fill"))
    assert len(by_thread) == 128
    assert all(len(colors) == 1 for colors in by_thread.values())          # one color per thread
    assert len({next(iter(c)) for c in by_thread.values()}) == 128          # different threads differ
    per_thread = {}
    for e in cs:
        per_thread[int(e.get("data-thread"))] = per_thread.get(int(e.get("data-thread")), 0) + 1
    assert set(per_thread.values()) == {8}                                  # 64*16/128 values each


def test_warp_coloring_of_two_warpgroups():
    acc = atoms.accumulator(8, 2)
    assert acc.tile_mn == (128, 8) and acc.threads == 256
    svg = draw.svg([draw.tv_panel(tv_grid(acc.tv, acc.tile_mn), color_by="warp")])
    rows_of_warp = {}
    for e in cells(svg):
        rows_of_warp.setdefault(int(e.get("data-warp")), set()).add(int(e.get("data-row")))
    # warp w owns rows 16w..16w+15 (warpgroup 1 = warps 4..7 holds rows 64..127)
    assert rows_of_warp == {w: set(range(16 * w, 16 * w + 16)) for w in range(8)}


def test_bank_svg_and_phase_outline():
    tile = banks.make_tile(8, 64, 2, swizzle=(3, 4, 3))
    svg = draw.svg([draw.bank_panel(tile, "ldmatrix")])
    cs = cells(svg)
    assert len(cs) == 512
    for e in cs:
        r, c = int(e.get("data-row")), int(e.get("data-col"))
        assert int(e.get("data-bank")) == (((c // 8) ^ r) * 16 + (c % 8) * 2) // 4 % 32
    root = ET.fromstring(svg)
    outlines = [e for e in root.iter(NS + "rect") if e.get("class") == "outline"]
    assert len(outlines) == 8 * 8          # one phase: 8 rows x 16 bytes = 8 bf16 each


def test_png_is_a_png_of_the_right_size(tmp_path):
    pytest.importorskip("matplotlib")
    path = draw.save([draw.layout_panel(parse("(4,8):(8,1)"))], tmp_path / "l.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert 200 <= width <= 2000 and 100 <= height <= 2000


def test_png_without_matplotlib_says_so(tmp_path, monkeypatch):
    real = builtins.__import__

    def fake(name, *a, **k):
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(RuntimeError, match="matplotlib"):
        draw.save([draw.layout_panel(parse("4:1"))], tmp_path / "x.png")


def test_save_rejects_other_formats(tmp_path):
    with pytest.raises(ValueError, match=".svg or .png"):
        draw.save([], tmp_path / "x.jpg")


def test_tma_boxes_from_the_dsl_atom():
    # K-major bf16 128x64: one 128-B-wide box of 128 rows (8192 elements) covers the stage
    k = atoms.tma_boxes("a", "k", (128, 128, 64), "bf16")
    assert (k.box_elems, k.boxes) == (8192, 1)
    # K = 128 (256 B of K): the SW128 atom is 64 wide, two boxes side by side along K
    k2 = atoms.tma_boxes("a", "k", (128, 128, 128), "bf16")
    assert k2.boxes == 2 and k2.box[0][63] == 0 and k2.box[0][64] == 1


def test_smem_atoms_from_the_dsl():
    assert str(atoms.smem_atom("K_SW128", "bf16")) == "S<3,4,3> o 0 o (8,64):(64,1)"
    assert str(atoms.smem_atom("MN_SW64", "bf16")) == "S<2,4,3> o 0 o (32,8):(1,32)"
    assert str(atoms.smem_atom("K_SW128", "fp8")) == "S<3,4,3> o 0 o (8,128):(128,1)"


def test_cli_subcommands(tmp_path, capsys):
    from cute_kernels.cli import main

    assert main(["layout", "(4,8):(8,1)", "--svg", str(tmp_path / "l.svg")]) == 0
    out = capsys.readouterr().out
    assert " 0| 0  1  2  3  4  5  6  7" in out.replace("  0|", " 0|")
    assert len(cells((tmp_path / "l.svg").read_text())) == 32
    assert main(["algebra", "complement", "4:2", "24"]) == 0
    assert "(2,3):(1,8)" in capsys.readouterr().out
    assert main(["swizzle", "3", "4", "3", "--tile", "8x64", "--dtype", "bf16", "--svg", str(tmp_path / "s.svg"),
                 "--compare"]) == 0
    out = capsys.readouterr().out
    assert "SW128 S<3,4,3>" in out and "ldmatrix" in out
    root = ET.fromstring((tmp_path / "s.svg").read_text())
    assert len([g for g in root.iter(NS + "g") if g.get("class") == "panel"]) == 6   # S<3,4,3> + 5 others
    with pytest.raises(SystemExit, match="--tile"):
        main(["swizzle", "3", "4", "3", "--tile", "8by64"])
    with pytest.raises(SystemExit, match="layout"):
        main(["layout", "(4,8):(8)"])


def test_operand_layouts_match_the_dsl_helpers(monkeypatch):
    """The pictures use the GEMM collective's builders when present; they must equal the DSL's
    hopper_helpers (the fallback), K-major and MN-major."""
    with_collective = [atoms.operand_smem("a", m, (128, 128, 64), "bf16", 2) for m in ("k", "mn")]
    boxes = atoms.tma_boxes("a", "mn", (128, 128, 64), "bf16")
    monkeypatch.setattr(atoms, "_pipeline_collective", lambda: None)
    assert with_collective == [atoms.operand_smem("a", m, (128, 128, 64), "bf16", 2) for m in ("k", "mn")]
    assert str(with_collective[0]) == "S<3,4,3> o 0 o ((8,16),(64,1),(1,2)):((64,512),(1,0),(0,8192))"
    fallback = atoms.tma_boxes("a", "mn", (128, 128, 64), "bf16")
    assert (boxes.box_elems, boxes.boxes, boxes.box) == (fallback.box_elems, fallback.boxes, fallback.box)
    assert (boxes.box_elems, boxes.boxes) == (4096, 2)


def test_divide_pictures_show_the_tiles():
    """logical_divide by a shape tiler: B is drawn as the blocks of A it cuts (not as a layout), the result with one
    tile id per cell, one color per tile and an outline around each; zipped_divide: a tile per column."""
    from cute_kernels.study.layout import algebra, parse_tiler

    steps = algebra("zipped_divide", parse("(4,8):(1,4)"), parse_tiler("(2,4)"))
    tiler, ld, zd = steps[1], steps[-2], steps[-1]
    assert str(tiler) == "<2, 4>" and tiler.tiles == ((0, 0, 0, 0, 2, 2, 2, 2), (0, 0, 0, 0, 2, 2, 2, 2),
                                                      (1, 1, 1, 1, 3, 3, 3, 3), (1, 1, 1, 1, 3, 3, 3, 3))
    assert ld.tiles == tiler.tiles and zd.tiles == tuple((0, 1, 2, 3) for _ in range(8))
    panel = draw.layout_panel(ld.layout, str(ld), tiles=ld.tiles)
    root = ET.fromstring(draw.svg([panel]))
    tiles_of = {}
    for c in cells(draw.svg([panel])):
        tiles_of.setdefault(c.get("data-tile"), set()).add(c.get("fill"))
    assert len(tiles_of) == 4 and all(len(f) == 1 for f in tiles_of.values())
    assert len({f for fs in tiles_of.values() for f in fs}) == 4  # a color a tile
    edges = [e for e in root.iter(NS + "line") if e.get("class") == "tile-edge"]
    assert len(edges) == 4 + 4 + 8  # the frame, 4 cell edges between columns 3 and 4, 8 between rows 1 and 2


def test_png_is_as_wide_as_its_title(tmp_path):
    """A narrow grid under a long title: the PNG widens to the title (it used to clip it)."""
    title = "T" * 120
    path = tmp_path / "t.png"
    draw.png([draw.layout_panel(parse("2:1"), title)], path)
    width, _ = struct.unpack(">II", path.read_bytes()[16:24])
    assert width >= 120 * 8 * 0.6 / 72 * 100  # 8 pt monospace characters at 100 dpi
