"""Draw the two grouped (MoE) FP8 GEMM layouts from the scheduler's own host mirrors.

    python3 docs/figures/make_grouped_figure.py      # writes docs/figures/fp8_grouped_layouts.png

Left: the contiguous layout (`contiguous_layout` builds m_indices; each 128-row tile takes the
expert of its first row, padding tiles are skipped). Right: the masked layout (per-expert buffers;
`schedules.gemm.masked_tile_order` is the order the walk hands out the tiles under masked_m).
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from cute_kernels.fp8_gemm.ops import contiguous_layout  # noqa: E402
from schedules.fp8_gemm import fp8_schedule  # noqa: E402
from schedules.gemm import masked_tile_order, tile_order  # noqa: E402

OUT = Path(__file__).resolve().parent
COLORS = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"]
TILE = 128


def _tile(ax, x, y, color, text, hatch=None, alpha=1.0, text_color="w"):
    ax.add_patch(Rectangle((x, y), 1, 1, facecolor=color, edgecolor="w", hatch=hatch, alpha=alpha))
    if text:
        ax.text(x + 0.5, y + 0.5, text, ha="center", va="center", fontsize=6, color=text_color)


def contiguous(ax, rows=(300, 0, 200, 130), tiles_n=4):
    idx, spans = contiguous_layout(list(rows), TILE)
    tiles_m = idx.numel() // TILE + 1  # one more tile of padding (a caller's fixed-size buffer)
    s = fp8_schedule(cluster_m=1, cluster_n=2)
    order = {(cm, cn): i for i, (cm, cn, _) in enumerate(tile_order(tiles_m, tiles_n, 1, s))}
    for m in range(tiles_m):
        first = m * TILE
        e = int(idx[first]) if first < idx.numel() else -1
        valid_rows = int((idx[first:first + TILE] == e).sum()) if e >= 0 else 0
        y = tiles_m - 1 - m
        # the A rows of the tile (left strip): expert colour for its rows, grey for padding
        frac = valid_rows / TILE
        ax.add_patch(Rectangle((-1.6, y + 1 - frac), 1, frac, facecolor=COLORS[e] if e >= 0 else "0.8", edgecolor="none"))
        ax.add_patch(Rectangle((-1.6, y), 1, 1 - frac, facecolor="0.85", edgecolor="w", hatch="///"))
        ax.text(-1.1, y + 0.5, f"e{e}" if e >= 0 else "-1", ha="center", va="center", fontsize=7)
        for n in range(tiles_n):
            if e < 0:
                _tile(ax, n, y, "0.85", "skip", hatch="///", text_color="k")
            else:
                _tile(ax, n, y, COLORS[e], str(order[(m, n // 2)]))
    ax.set_xlim(-1.8, tiles_n)
    ax.set_ylim(0, tiles_m)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"contiguous: rows per expert {list(rows)},\neach expert padded to {TILE} rows (hatched);\n"
                 "m_indices at a tile's first row picks B[e];\npadding tiles skipped; number = the tile's\n"
                 "turn in the walk (1x2 clusters share A)", fontsize=8)


def masked(ax, masked_m=(300, 0, 128, 40), max_m=512, tiles_n=4):
    s = fp8_schedule(cluster_m=2)
    tiles_m = max_m // TILE
    order = masked_tile_order(list(masked_m), tiles_m, tiles_n, s)
    turn = {}
    for i, (cm, cn, e) in enumerate(order):
        for dm in range(s.cluster_m):
            turn[(cm * s.cluster_m + dm, cn, e)] = i
    x0 = 0
    for e, rows in enumerate(masked_m):
        for m in range(tiles_m):
            y = tiles_m - 1 - m
            for n in range(tiles_n):
                t = turn.get((m, n, e))
                if t is None:
                    _tile(ax, x0 + n, y, "0.9", "")
                elif m * TILE >= rows:
                    _tile(ax, x0 + n, y, COLORS[e], str(t), alpha=0.45)  # the cluster's second CTA, past masked_m
                else:
                    _tile(ax, x0 + n, y, COLORS[e], str(t))
        ax.plot([x0, x0 + tiles_n], [tiles_m - rows / TILE] * 2, color="k", lw=1.2)
        ax.text(x0 + tiles_n / 2, tiles_m + 0.2, f"expert {e}\nmasked_m={rows}", ha="center", fontsize=7)
        x0 += tiles_n + 0.6
    ax.set_xlim(0, x0)
    ax.set_ylim(0, tiles_m + 1.2)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"masked: (E, max_m={max_m}, N) buffers; the walk enumerates only the tiles above the\n"
                 "black line (masked_m, read on the device), expert after expert; 2x1 clusters: pale =\n"
                 "the cluster's second CTA past masked_m (computed, rows unspecified); grey never visited",
                 fontsize=8)


def main():
    fig, axes = plt.subplots(1, 2, figsize=(13, 6.2), gridspec_kw={"width_ratios": [1.2, 2.2]})
    contiguous(axes[0])
    masked(axes[1])
    fig.tight_layout()
    fig.savefig(OUT / "fp8_grouped_layouts.png", dpi=120)
    plt.close(fig)
    print("wrote", OUT / "fp8_grouped_layouts.png")


if __name__ == "__main__":
    main()
