"""Pictures of layouts: hand-written SVG (no dependencies) and PNG through matplotlib.

A picture is a list of `Panel`s stacked top to bottom. A panel is a grid of `Cell`s with a title
and optional notes; every cell carries its meaning as `data-*` attributes in the SVG
(`data-offset`, `data-thread`, `data-value`, `data-bank`, ...), so a test or a script can read
back what a picture encodes, not only how it looks.

Colors: a plain layout colors each cell by its offset; a thread-value layout by thread (every
thread one color, different threads different colors); a shared-memory tile by bank.
"""

from __future__ import annotations

import colorsys
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

from cute_kernels.figures import save_png
from cute_kernels.study import banks as _banks
from cute_kernels.study.layout import Grid, Layout, TVGrid, grid, tv_grid


@dataclass
class Cell:
    text: str
    fill: str
    data: dict[str, int | str] = field(default_factory=dict)
    outline: bool = False


@dataclass
class Panel:
    title: str
    cells: list[list[Cell | None]]
    notes: list[str] = field(default_factory=list)
    kind: str = "layout"
    tiles: tuple[tuple[int, ...], ...] | None = None  # a tile id per cell: an outline around each tile

    def tile_edges(self) -> list[tuple[int, int, int, int]]:
        """(r0, c0, r1, c1) segments in cell units where neighbouring cells lie in different tiles, and the frame."""
        if self.tiles is None:
            return []
        t, rows, cols = self.tiles, self.rows, self.cols
        out = [(0, 0, 0, cols), (rows, 0, rows, cols), (0, 0, rows, 0), (0, cols, rows, cols)]
        for r in range(rows):
            for c in range(cols):
                if c + 1 < cols and t[r][c] != t[r][c + 1]:
                    out.append((r, c + 1, r + 1, c + 1))
                if r + 1 < rows and t[r][c] != t[r + 1][c]:
                    out.append((r + 1, c, r + 1, c + 1))
        return out

    @property
    def rows(self) -> int:
        return len(self.cells)

    @property
    def cols(self) -> int:
        return len(self.cells[0]) if self.cells else 0


# ----------------------------------------------------------------------------------------------
# colors

def _hex(r: float, g: float, b: float) -> str:
    return "#%02x%02x%02x" % (round(r * 255), round(g * 255), round(b * 255))


def palette(n: int, seed_step: float = 0.61803398875) -> list[str]:
    """`n` distinct light colors; consecutive indices far apart in hue."""
    out: list[str] = []
    seen: set[str] = set()
    i = 0
    while len(out) < n:
        h = (i * seed_step) % 1.0
        s = (0.35, 0.55, 0.45)[i % 3]
        v = (1.0, 0.92)[(i // 3) % 2]
        c = _hex(*colorsys.hsv_to_rgb(h, s, v))
        i += 1
        if c in seen:
            continue
        seen.add(c)
        out.append(c)
    return out


def offset_color(offset: int, period: int = 32) -> str:
    return palette(period)[offset % period]


BANK_COLORS = [_hex(*colorsys.hsv_to_rgb(b / 32.0, 0.45 if b % 2 else 0.3, 1.0)) for b in range(32)]
GROUP_COLORS = [_hex(*colorsys.hsv_to_rgb(g / 8.0, 0.4, 1.0)) for g in range(8)]


# ----------------------------------------------------------------------------------------------
# panels

def layout_panel(layout: Layout, title: str | None = None, g: Grid | None = None, note: str = "",
                 tiles: tuple[tuple[int, ...], ...] | None = None) -> Panel:
    """Coordinates to offsets: cell (r, c) shows the offset of coordinate (r, c). With `tiles` (a tile id per
    cell: the divides) each tile has one color and an outline, and the cells carry `data-tile`."""
    g = g or grid(layout)
    if tiles is not None:
        colors = palette(max(v for row in tiles for v in row) + 1)
        cells = [[Cell(str(v), colors[tiles[r][c]], {"row": r, "col": c, "offset": v, "tile": tiles[r][c]})
                  for c, v in enumerate(row)] for r, row in enumerate(g.values)]
    else:
        period = min(max(v for row in g.values for v in row) + 1, 64)
        colors = palette(period)
        cells = [[Cell(str(v), colors[v % period], {"row": r, "col": c, "offset": v}) for c, v in enumerate(row)]
                 for r, row in enumerate(g.values)]
    notes = [note] if note else []
    return Panel(title or str(layout), cells, notes, "layout", tiles)


def tv_panel(tv: TVGrid, title: str | None = None, note: str = "", color_by: str = "thread") -> Panel:
    """Who owns each element of the tile: T<thread> V<value>, colored by thread (or by warp)."""
    if color_by not in ("thread", "warp", "value"):
        raise ValueError(f"color_by must be thread, warp or value, got {color_by!r}")
    count = {"thread": tv.threads, "warp": max(1, (tv.threads + 31) // 32), "value": tv.values_per_thread}[color_by]
    colors = palette(count)
    cells: list[list[Cell | None]] = []
    for m in range(tv.m):
        row: list[Cell | None] = []
        for n in range(tv.n):
            o = tv.owner[m][n]
            if o is None:
                row.append(None)
                continue
            t, v = o
            key = {"thread": t, "warp": t // 32, "value": v}[color_by]
            row.append(Cell(f"T{t}\nV{v}", colors[key], {"row": m, "col": n, "thread": t, "value": v, "warp": t // 32}))
        cells.append(row)
    notes = [note] if note else []
    return Panel(title or f"{tv.layout}  over a {tv.m}x{tv.n} tile", cells, notes, "tv")


def tv_layout_panel(tv: Layout, tile_mn: tuple[int, int], title: str | None = None, color_by: str = "thread") -> Panel:
    return tv_panel(tv_grid(tv, tile_mn), title, color_by=color_by)


def bank_panel(tile: "_banks.SmemTile", pattern: str | None = None, title: str | None = None,
               phase: int = 0) -> Panel:
    """Each element labelled with its bank, colored by its 16-byte bank group (banks 4g..4g+3);
    the elements of one phase of `pattern` are outlined."""
    hit: set[tuple[int, int]] = set()
    notes = []
    if pattern:
        phases = _banks.PATTERNS[pattern](tile)
        per = 1
        for _t, r, c, nbytes in phases[phase % len(phases)]:
            per = max(1, nbytes // tile.esize)
            for k in range(per):
                hit.add((r, (c + k) % tile.cols))
        res = _banks.count(tile, pattern)
        verdict = "conflict-free" if res.conflict_free else f"{res.ways}-way conflict"
        notes.append(f"{pattern}: {res.phases} phases, {res.wavefronts} wavefronts ({verdict}); "
                     f"outlined: phase {phase % len(phases)}")
    cells = []
    for r in range(tile.rows):
        row = []
        for c in range(tile.cols):
            a = tile.byte_addr(r, c)
            b = _banks.bank(a)
            row.append(Cell(str(b), GROUP_COLORS[b // 4], {"row": r, "col": c, "bank": b, "addr": a}, (r, c) in hit))
        cells.append(row)
    return Panel(title or f"{tile.name}: {tile.rows}x{tile.cols} x {tile.esize}B, bank of each element", cells,
                 notes, "banks")


def index_panel(values: list[list[int]], title: str, label: str = "box", notes: list[str] | None = None,
                data: list[list[dict]] | None = None) -> Panel:
    """A grid colored by an integer class (a TMA box, a warp, a stage), labelled with it."""
    n = max(v for row in values for v in row) + 1
    colors = palette(n)
    cells = []
    for r, row in enumerate(values):
        cr = []
        for c, v in enumerate(row):
            d = {"row": r, "col": c, label: v}
            if data:
                d.update(data[r][c])
            cr.append(Cell(str(v), colors[v], d))
        cells.append(cr)
    return Panel(title, cells, notes or [], label)


# ----------------------------------------------------------------------------------------------
# SVG

_FONT = "font-family:monospace"


def _geometry(panel: Panel) -> tuple[int, int, int]:
    two_lines = any(c is not None and "\n" in c.text for row in panel.cells for c in row)
    many = panel.rows * panel.cols > 4096
    w = 12 if many else (30 if two_lines else 24)
    h = 12 if many else (24 if two_lines else 18)
    return w, h, (0 if many else (8 if two_lines else 9))


def svg(panels: list[Panel], title: str | None = None) -> str:
    """One SVG document with the panels stacked; each cell is a <rect class="cell" data-...>."""
    pad, label_w, title_h, note_h = 10, 26, 18, 14
    parts: list[str] = []
    y = pad
    width = 0
    if title:
        parts.append(f'<text x="{pad}" y="{y + 14}" style="{_FONT};font-size:14px;font-weight:bold">{escape(title)}</text>')
        y += title_h + 6
    for pi, p in enumerate(panels):
        cw, ch, fs = _geometry(p)
        parts.append(f'<g class="panel" data-index="{pi}" data-kind="{p.kind}" data-rows="{p.rows}" data-cols="{p.cols}">')
        parts.append(f'<text class="title" x="{pad}" y="{y + 13}" style="{_FONT};font-size:12px">{escape(p.title)}</text>')
        y += title_h
        for note in p.notes:
            parts.append(f'<text class="note" x="{pad}" y="{y + 11}" style="{_FONT};font-size:10px;fill:#444">{escape(note)}</text>')
            y += note_h
        x0, y0 = pad + label_w, y + 14
        step = max(1, (p.cols + 15) // 16) if fs == 0 else 1
        for c in range(0, p.cols, step):
            parts.append(f'<text x="{x0 + c * cw + cw / 2:.1f}" y="{y0 - 3}" text-anchor="middle" '
                         f'style="{_FONT};font-size:9px;fill:#666">{c}</text>')
        rstep = max(1, (p.rows + 15) // 16) if fs == 0 else 1
        for r in range(0, p.rows, rstep):
            parts.append(f'<text x="{x0 - 3}" y="{y0 + r * ch + ch / 2 + 3:.1f}" text-anchor="end" '
                         f'style="{_FONT};font-size:9px;fill:#666">{r}</text>')
        outlines = []
        for r, row in enumerate(p.cells):
            for c, cell in enumerate(row):
                if cell is None:
                    continue
                x, yy = x0 + c * cw, y0 + r * ch
                data = "".join(f' data-{k}="{escape(str(v))}"' for k, v in cell.data.items())
                parts.append(f'<rect class="cell" x="{x}" y="{yy}" width="{cw}" height="{ch}" fill="{cell.fill}"{data}/>')
                if fs:
                    lines = cell.text.split("\n")
                    for li, line in enumerate(lines):
                        ty = yy + ch / 2 + fs / 2.8 + (li - (len(lines) - 1) / 2) * (fs + 1)
                        parts.append(f'<text class="v{fs}" x="{x + cw / 2:g}" y="{ty:.1f}">{escape(line)}</text>')
                if cell.outline:
                    outlines.append(f'<rect class="outline" x="{x + 1}" y="{yy + 1}" width="{cw - 2}" height="{ch - 2}" '
                                    f'fill="none" stroke="#000" stroke-width="2"/>')
        parts.extend(outlines)
        for r0, c0, r1, c1 in p.tile_edges():
            parts.append(f'<line class="tile-edge" x1="{x0 + c0 * cw}" y1="{y0 + r0 * ch}" x2="{x0 + c1 * cw}" '
                         f'y2="{y0 + r1 * ch}" stroke="#000" stroke-width="2.5"/>')
        parts.append("</g>")
        width = max(width, x0 + p.cols * cw + pad, pad + 7 * max([len(p.title)] + [len(n) for n in p.notes]))
        y = y0 + p.rows * ch + pad * 2
    height = y
    if title:  # 14 px bold monospace: ~8.5 px a character
        width = max(width, pad + round(8.5 * len(title)) + pad)
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}">')
    style = ("<style>.cell{stroke:#999;stroke-width:0.5}text{font-family:monospace}"
             ".v8,.v9{text-anchor:middle}.v8{font-size:8px}.v9{font-size:9px}</style>")
    return "\n".join([head, style, f'<rect width="{width}" height="{height}" fill="white"/>', *parts, "</svg>"]) + "\n"


# ----------------------------------------------------------------------------------------------
# PNG

def _matplotlib():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise RuntimeError("PNG output needs matplotlib (pip install 'cute-kernels[bench]'); "
                           "--svg needs nothing") from e
    return plt


def png(panels: list[Panel], path: str | Path, title: str | None = None, dpi: int = 100) -> None:
    """The same picture as `svg`, drawn with matplotlib (a raster for docs and slides)."""
    plt = _matplotlib()
    from matplotlib.patches import Rectangle

    unit = 0.32
    heights = [p.rows + 1.9 + 0.6 * len(p.notes) for p in panels]
    # in cell units (0.32 in): a monospace character is 0.6 of its point size wide; the text starts 1.3 cells left
    # of the grid, so the figure is as wide as the longest title or note as well as the widest grid
    chars = [len(title or "") * 10 * 0.6 / 72 / unit]
    chars += [len(p.title) * 8 * 0.6 / 72 / unit for p in panels]
    chars += [len(n) * 6.5 * 0.6 / 72 / unit for p in panels for n in p.notes]
    span = max(max(p.cols for p in panels) + 1.5, max(chars) + 0.5, 3.0 / unit)  # cells from x = -1.5
    fig_h = sum(heights) * unit + (0.4 if title else 0.1)
    fig = plt.figure(figsize=(span * unit, max(1.5, fig_h)), dpi=dpi)
    ax = fig.add_axes([0, 0, 1, 1])
    ax.set_xlim(-1.5, span - 1.5)  # one cell is `unit` inches across, whatever the grid
    total = sum(heights) + (1.2 if title else 0)
    ax.set_ylim(total, 0)
    ax.axis("off")
    y = 0.0
    if title:
        ax.text(-1.3, 0.7, title, fontsize=10, weight="bold", family="monospace", va="center")
        y = 1.2
    for p, h in zip(panels, heights):
        ax.text(-1.3, y + 0.6, p.title, fontsize=8, family="monospace", va="center")
        y += 1.0
        for note in p.notes:
            ax.text(-1.3, y + 0.3, note, fontsize=6.5, family="monospace", color="#444", va="center")
            y += 0.6
        y += 0.3
        fs = 5.5 if p.rows * p.cols <= 4096 else 0  # (the figure grows with the grid: labels stay this size)
        lstep = 1 if fs else max(1, max(p.rows, p.cols) // 16)
        for c in range(0, p.cols, lstep):
            ax.text(c + 0.5, y - 0.25, str(c), fontsize=4.5, ha="center", va="center", color="#666")
        for r in range(0, p.rows, lstep):
            ax.text(-0.3, y + r + 0.5, str(r), fontsize=4.5, ha="right", va="center", color="#666")
        for r, row in enumerate(p.cells):
            for c, cell in enumerate(row):
                if cell is None:
                    continue
                ax.add_patch(Rectangle((c, y + r), 1, 1, facecolor=cell.fill, edgecolor="#999", linewidth=0.3))
                if cell.outline:
                    ax.add_patch(Rectangle((c + 0.06, y + r + 0.06), 0.88, 0.88, fill=False, edgecolor="black",
                                           linewidth=1.2))
                if fs:
                    ax.text(c + 0.5, y + r + 0.5, cell.text, fontsize=fs * (0.75 if "\n" in cell.text else 1),
                            ha="center", va="center", family="monospace", linespacing=0.9)
        for r0, c0, r1, c1 in p.tile_edges():
            ax.plot([c0, c1], [y + r0, y + r1], color="black", linewidth=1.6, solid_capstyle="butt")
        y += p.rows + 0.6
    # every fill kept apart in the palette (128 threads: 128 colors) beside text's greys
    fills = len({cell.fill for p in panels for row in p.cells for cell in row if cell is not None})
    save_png(fig, path, dpi=dpi, colors=min(256, max(96, fills + 64)))


def save(panels: list[Panel], path: str | Path, title: str | None = None) -> Path:
    """Write the picture as SVG or PNG, by the file's extension."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".svg", ".png"):
        raise ValueError(f"picture file must end in .svg or .png, got {str(path)!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".svg":
        path.write_text(svg(panels, title))
    else:
        png(panels, path, title)
    return path
