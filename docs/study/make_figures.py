"""Regenerate the pictures of docs/study with the study tool (CPU only):

    python docs/study/make_figures.py

Every picture comes from `cute_kernels.study` (the DSL computes the layouts); none is drawn by
hand. Large pictures are written as PNG to stay small.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from cute_kernels.study import banks, draw  # noqa: E402
from cute_kernels.study.cli import atom_pictures  # noqa: E402
from cute_kernels.study.layout import algebra, parse, parse_tiler  # noqa: E402

OUT = Path(__file__).resolve().parent / "figures"


def steps_figure(name, op, a, b=None):
    bb = None if b is None else (int(b) if op == "complement" else parse_tiler(b))
    steps = algebra(op, parse(a), bb)
    panels = [draw.layout_panel(s.layout, f"{s.label} = {s}", tiles=s.tiles,
                                note=s.note + ("; one color and one outline a tile" if s.tiles is not None else ""))
              for s in steps]
    return draw.save(panels, OUT / f"{name}.svg", op)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    written = [
        draw.save([draw.layout_panel(parse("(4,8):(8,1)"), "row-major (4,8):(8,1)"),
                   draw.layout_panel(parse("(4,8):(1,4)"), "column-major (4,8):(1,4)"),
                   draw.layout_panel(parse("(4,(2,4)):(2,(1,8))"), "hierarchical (4,(2,4)):(2,(1,8))")],
                  OUT / "layouts.svg", "coordinates to offsets"),
        steps_figure("composition", "composition", "(6,2):(8,2)", "(4,3):(3,1)"),
        steps_figure("complement", "complement", "4:2", "24"),
        steps_figure("logical_divide", "logical_divide", "16:1", "4:2"),
        steps_figure("zipped_divide", "zipped_divide", "(4,8):(1,4)", "(2,4)"),
        steps_figure("blocked_product", "blocked_product", "(2,2):(1,2)", "(2,3):(1,2)"),
        steps_figure("raked_product", "raked_product", "(2,2):(1,2)", "(2,3):(1,2)"),
    ]
    # lesson 9: a 32x32 fp32 transpose tile, column read
    t32 = [banks.make_tile(32, 32, 4), banks.make_tile(32, 32, 4, pad=1)]
    written.append(draw.save([draw.bank_panel(t, "col") for t in t32], OUT / "transpose_32x32_fp32.png",
                             "32x32 fp32: a column read (outlined) without and with one column of padding"))
    # lesson 10/13: bf16 rows of 64, ldmatrix, every variant
    variants = banks.comparison_tiles(8, 64, 2)
    written.append(draw.save([draw.bank_panel(t, "ldmatrix") for t in variants], OUT / "swizzle_8x64_bf16.png",
                             "8x64 bf16 (128-B rows): the bank of each element, ldmatrix phase 0 outlined"))
    for name, (title, panels) in atom_pictures("bf16", 16, (128, 128, 64)).items():
        fmt = "svg" if name.startswith("tma") else "png"
        written.append(draw.save(panels, OUT / f"{name}.{fmt}", title))
    for p in written:
        size = p.stat().st_size
        print(f"{p.relative_to(ROOT)}  {size / 1024:.0f} KiB")
        if size > 200 * 1024:
            print(f"  warning: {p.name} is above 200 KiB")


if __name__ == "__main__":
    main()
