"""The study subcommands of `cute-kernels`: layout, algebra, swizzle, atoms (all on the CPU).

  cute-kernels layout "(4,8):(8,1)" [--tv MxN] [--svg F] [--png F]
  cute-kernels algebra OP A [B] [--svg F] [--png F]         OP: composition, complement, coalesce,
        right_inverse, logical_divide, zipped_divide, tiled_divide, logical_product, blocked_product,
        raked_product
  cute-kernels swizzle B M S --tile ROWSxCOLS --dtype bf16 [--pattern P] [--svg F] [--png F]
  cute-kernels atoms [--dtype bf16] [--n 64] [--tile 128x128x64] [--out DIR] [--format svg|png]
"""

from __future__ import annotations

import argparse
from pathlib import Path


def _dims(text: str, n: int, what: str) -> tuple[int, ...]:
    parts = text.lower().replace("*", "x").split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        dims = ()
    if len(dims) != n or any(d <= 0 for d in dims):
        raise SystemExit(f"{what} expects {'x'.join(['N'] * n)} with positive ints, got {text!r}")
    return dims


def _save(panels, args, title=None) -> None:
    from cute_kernels.study import draw

    for path in (args.svg, args.png):
        if path:
            try:
                draw.save(panels, path, title)
            except RuntimeError as e:
                raise SystemExit(str(e)) from None
            print(f"wrote {path}")


def _guard(fn):
    def run(args):
        try:
            return fn(args)
        except ValueError as e:
            raise SystemExit(f"{args.cmd}: {e}") from None
    return run


@_guard
def cmd_layout(args) -> int:
    from cute_kernels.study import draw
    from cute_kernels.study.layout import format_grid, grid, parse, tv_grid

    lay = parse(args.layout)
    if args.tv:
        m, n = _dims(args.tv, 2, "--tv")
        tv = tv_grid(lay, (m, n))
        width = max(len(f"T{t}V{v}") for row in tv.owner for (t, v) in (o or (0, 0) for o in row))
        print(f"{lay}  (thread, value) -> element of a {m}x{n} tile (index m + {m}*n)")
        for r, row in enumerate(tv.owner):
            print(f"{r:>3}| " + " ".join(f"{('T%dV%d' % o) if o else '.':>{width}}" for o in row))
        panels = [draw.tv_panel(tv, color_by=args.color)]
    else:
        g = grid(lay)
        print(format_grid(g))
        panels = [draw.layout_panel(lay, g=g)]
    _save(panels, args)
    return 0


@_guard
def cmd_algebra(args) -> int:
    from cute_kernels.study import draw
    from cute_kernels.study.layout import algebra, parse, parse_tiler

    a = parse(args.a)
    b = None
    if args.b is not None:
        b = int(args.b) if args.op == "complement" else parse_tiler(args.b)
    steps = algebra(args.op, a, b)
    width = max(len(s.label) for s in steps)
    for s in steps:
        print(f"{s.label:<{width}}  =  {s}")
        if s.note:
            print(f"{'':<{width}}     {s.note}")
    if args.svg or args.png:
        panels = []
        for s in steps:
            if s.layout.size > 4096:
                continue
            note = s.note + ("; one color and one outline a tile" if s.tiles is not None else "")
            panels.append(draw.layout_panel(s.layout, f"{s.label} = {s}", note=note, tiles=s.tiles))
        _save(panels, args, f"{args.op}")
    return 0


@_guard
def cmd_swizzle(args) -> int:
    from cute_kernels.study import banks, draw
    from cute_kernels.study.layout import check_swizzle

    rows, cols = _dims(args.tile, 2, "--tile")
    esize = banks.dtype_bytes(args.dtype)
    sw = (args.B, args.M, args.S)
    check_swizzle(*sw)
    print(f"S<{args.B},{args.M},{args.S}> (DSL: {banks.swizzle_dsl_string(sw)}) on byte addresses of a "
          f"{rows}x{cols} {args.dtype} tile ({cols * esize} bytes per row)")
    tile = banks.make_tile(rows, cols, esize, swizzle=sw)
    if rows * cols <= 64 * 64:
        print("bank of each element:")
        for r in range(rows):
            print(f"{r:>3}| " + " ".join(f"{tile.bank(r, c):>2}" for c in range(cols)))
    print()
    print(banks.format_table(rows, cols, esize, sw))
    if args.svg or args.png:
        if rows * cols > 128 * 128:
            raise SystemExit("swizzle: tiles above 128x128 elements are not drawn (choose a smaller --tile)")
        panels = [draw.bank_panel(tile, args.pattern)]
        if args.compare:
            for t in banks.comparison_tiles(rows, cols, esize):
                if t.name == tile.name or t.swizzle == sw:
                    continue
                panels.append(draw.bank_panel(t, args.pattern))
        _save(panels, args, f"S<{args.B},{args.M},{args.S}> on a {rows}x{cols} {args.dtype} tile")
    return 0


def atom_pictures(dtype: str = "bf16", n: int = 64, tile_mnk=(128, 128, 64)) -> dict[str, tuple[str, list]]:
    """Every picture of `cute-kernels atoms`: name -> (title, panels)."""
    from cute_kernels.study import atoms, banks, draw
    from cute_kernels.study.layout import tv_grid

    out: dict[str, tuple[str, list]] = {}
    for major in ("K", "MN"):
        panels = []
        for sw in ("INTER", "SW32", "SW64", "SW128"):
            kind = f"{major}_{sw}"
            lay = atoms.smem_atom(kind, dtype)
            tile = atoms.as_tile(lay, dtype, name=f"{kind}: {lay}")
            pattern = "wgmma-k" if major == "K" else "wgmma-mn"
            p = draw.bank_panel(tile, pattern, title=f"{kind}  {lay}  (rows: {'MN' if major == 'K' else 'K'}, "
                                                     f"columns: {'K' if major == 'K' else 'MN'} contiguous)")
            panels.append(p)
        out[f"smem_atoms_{major.lower()}_{dtype}"] = (
            f"WGMMA shared-memory layout atoms, {major}-major {dtype}: bank of each element", panels)
    acc = atoms.accumulator(n, 1, dtype)
    tv = tv_grid(acc.tv, acc.tile_mn)
    out[f"wgmma_acc_64x{n}"] = (
        f"WGMMA accumulator 64x{n} (fp32): thread and value of each element",
        [draw.tv_panel(tv, f"tv_layout_C = {acc.tv}", note="make_trivial_tiled_mma(..., (1,1,1), (64, "
                       f"{n})).tv_layout_C_tiled; tile index m + 64*n", color_by="thread")])
    acc2 = atoms.accumulator(n, 2, dtype)
    tv2 = tv_grid(acc2.tv, acc2.tile_mn)
    out[f"warpgroup_partition_128x{n}"] = (
        f"A 128x{n} accumulator tile across two warpgroups: colored by warp (warps 0-3: warpgroup 0)",
        [draw.tv_panel(tv2, f"tv_layout_C_tiled = {acc2.tv}", color_by="warp",
                       note="each warp owns 16 rows; within a warp, lane/4 picks the row, lane%4 the column pair")])
    panels = []
    esize = banks.dtype_bytes(dtype)
    for major in ("k", "mn"):
        tb = atoms.tma_boxes("a", major, tile_mnk, dtype)
        per = 16 // esize  # one cell per core matrix: 8 rows x 16 bytes of the contiguous dimension
        rows, cols = len(tb.box), len(tb.box[0])
        if major == "k":
            values = [[tb.box[r][c] for c in range(0, cols, per)] for r in range(0, rows, 8)]
            axes = "rows: M in 8s, cols: K in 16-byte chunks"
        else:
            values = [[tb.box[r][c] for c in range(0, cols, 8)] for r in range(0, rows, per)]
            axes = "rows: M in 16-byte chunks, cols: K in 8s"
        panels.append(draw.index_panel(values, f"A {major.upper()}-major {tile_mnk[0]}x{tile_mnk[2]} {dtype}: "
                                       f"smem {tb.smem}", "box",
                                       [f"{tb.boxes} TMA box(es) of {tb.box_elems} elements "
                                        f"({tb.box_elems * esize} bytes); one cell per core matrix ({axes})"]))
    out[f"tma_boxes_{tile_mnk[0]}x{tile_mnk[2]}"] = (
        "TMA boxes filling one stage of operand A (make_tiled_tma_atom's copy size)", panels)
    return out


@_guard
def cmd_atoms(args) -> int:
    from cute_kernels.study import atoms, banks
    from cute_kernels.study.layout import tv_grid

    tile_mnk = _dims(args.tile, 3, "--tile")
    esize = banks.dtype_bytes(args.dtype)
    print(f"WGMMA shared-memory layout atoms ({args.dtype}; warpgroup.make_smem_layout_atom):")
    for kind in atoms.SMEM_KINDS:
        lay = atoms.smem_atom(kind, args.dtype)
        t = atoms.as_tile(lay, args.dtype)
        pat = "wgmma-k" if kind.startswith("K") else "wgmma-mn"
        c = banks.count(t, pat)
        print(f"  {kind:<9} {str(lay):<32} {t.rows}x{t.cols * esize}B rows; {pat}: "
              f"{'conflict-free' if c.conflict_free else str(c.ways) + '-way'}")
    for op in ("a", "b"):
        for major in ("k", "mn"):
            print(f"  {op.upper()} {major.upper()}-major tile {tile_mnk}, 2 stages: "
                  f"{atoms.operand_smem(op, major, tile_mnk, args.dtype, 2)}")
    acc = atoms.accumulator(args.n, 1, args.dtype)
    print(f"\nWGMMA 64x{args.n} accumulator, {acc.threads} threads: tv_layout_C = {acc.tv}")
    tv = tv_grid(acc.tv, acc.tile_mn)
    print("first 8 rows, thread/value of each element:")
    for r in range(8):
        print(f"{r:>3}| " + " ".join(f"{'T%dV%d' % tv.owner[r][c]:>7}" for c in range(min(16, acc.tile_mn[1]))))
    for major in ("k", "mn"):
        tb = atoms.tma_boxes("a", major, tile_mnk, args.dtype)
        print(f"TMA A {major.upper()}-major {tile_mnk[0]}x{tile_mnk[2]}: {tb.boxes} box(es) of {tb.box_elems} elements")
    if args.out:
        from cute_kernels.study import draw

        out = Path(args.out)
        for name, (title, panels) in atom_pictures(args.dtype, args.n, tile_mnk).items():
            path = draw.save(panels, out / f"{name}.{args.format}", title)
            print(f"wrote {path}")
    return 0


def add_parsers(sub) -> None:
    """Register the study subcommands on `cute-kernels`' subparsers."""
    from cute_kernels.study.layout import OPS

    def pics(s):
        s.add_argument("--svg", default=None, metavar="FILE", help="draw it as SVG")
        s.add_argument("--png", default=None, metavar="FILE", help="draw it as PNG (needs matplotlib)")

    s = sub.add_parser("layout", help="print (and draw) a CuTe layout: coordinates to offsets",
                       description='Print a layout such as "(4,8):(8,1)" as a grid of offsets.')
    s.add_argument("layout", help='CuTe notation, e.g. "(4,8):(8,1)" or "S<3,4,3> o 0 o (8,64):(64,1)"')
    s.add_argument("--tv", default=None, metavar="MxN", help="a thread-value layout over an MxN tile")
    s.add_argument("--color", default="thread", choices=("thread", "warp", "value"), help="with --tv")
    pics(s)
    s.set_defaults(fn=cmd_layout)

    s = sub.add_parser("algebra", help="run one layout-algebra operation step by step",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="complement takes an int cotarget; divides take a layout, a shape "
                                   "tuple '(2,4)' or a tuple of layouts '[2:1,4:2]'; products a layout.")
    s.add_argument("op", choices=OPS)
    s.add_argument("a", help="layout A")
    s.add_argument("b", nargs="?", default=None, help="B (layout, tiler, or cotarget for complement)")
    pics(s)
    s.set_defaults(fn=cmd_algebra)

    s = sub.add_parser("swizzle", help="a Swizzle<B,M,S> over a shared-memory tile: banks and conflicts")
    s.add_argument("B", type=int, help="bits of the row-chunk index XORed")
    s.add_argument("M", type=int, help="log2 of the unit moved, in bytes (4: 16-byte chunks)")
    s.add_argument("S", type=int, help="shift of the bits XORed in (3: one 128-byte row)")
    s.add_argument("--tile", default="8x64", metavar="ROWSxCOLS")
    s.add_argument("--dtype", default="bf16")
    s.add_argument("--pattern", default="ldmatrix", choices=("row", "col", "ldmatrix", "stmatrix", "wgmma-k", "wgmma-mn"),
                   help="the warp access outlined in the picture")
    s.add_argument("--compare", action="store_true", help="draw no swizzle, padding and SW32/64/128 too")
    pics(s)
    s.set_defaults(fn=cmd_swizzle)

    s = sub.add_parser("atoms", help="the layouts Hopper kernels use, from the DSL: SMEM atoms, WGMMA, TMA")
    s.add_argument("--dtype", default="bf16")
    s.add_argument("--n", type=int, default=32, help="WGMMA N of the accumulator picture")
    s.add_argument("--tile", default="128x128x64", metavar="MxNxK", help="CTA tile of the operand/TMA layouts")
    s.add_argument("--out", default=None, metavar="DIR", help="write every picture here")
    s.add_argument("--format", default="svg", choices=("svg", "png"))
    s.set_defaults(fn=cmd_atoms)
