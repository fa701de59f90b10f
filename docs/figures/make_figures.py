"""Draw the thread-to-data pictures of the lesson 1-2 kernels from the schedule objects themselves.

    python3 docs/figures/make_figures.py      # writes docs/figures/*.png

The pictures replay `GridStride.thread_walk` and `plan_rows` on a toy size, so they show what the
kernels actually do; change a schedule and the picture changes with it.
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

from cute_kernels.figures import save_png  # noqa: E402
from schedules.gemm import GemmSchedule, tile_order  # noqa: E402
from schedules.grid_stride import GridStride  # noqa: E402
from schedules.row_tiling import plan_rows  # noqa: E402

OUT = Path(__file__).resolve().parent


def _walk(s: GridStride, n: int, grid: int):
    """item -> (cta, thread, pass, u), replaying strided_fold."""
    owner = {}
    for b in range(grid):
        for t in range(s.threads):
            first, stride, pass_stride = s.thread_walk(b, grid, t)
            p = 0
            while p * pass_stride + first < n or p < n // pass_stride:
                for u in range(s.unroll):
                    j = p * pass_stride + first + u * stride
                    if j < n:
                        owner[j] = (b, t, p, u)
                p += 1
    return owner


def grid_stride_orders():
    threads, unroll, grid, n, width = 32, 2, 3, 320, 64
    fig, axes = plt.subplots(2, 1, figsize=(11, 4.4))
    cmap = plt.get_cmap("tab10")
    for ax, order in zip(axes, ("grid", "cta")):
        s = GridStride(threads=threads, unroll=unroll, ctas_per_sm=1, order=order)
        owner = _walk(s, n, grid)
        for j in range(n):
            b, t, p, u = owner[j]
            x, y = j % width, -(j // width)
            ax.add_patch(Rectangle((x, y), 1, 1, facecolor=cmap(b), alpha=1.0 if p % 2 == 0 else 0.45,
                                   edgecolor="white", lw=0.3, hatch="////" if u else None))
        ax.set_xlim(0, width)
        ax.set_ylim(-(n // width), 1)
        ax.set_xticks([0, 32, 64])
        ax.set_yticks([])
        ax.set_xlabel(f"vector index mod {width} (rows continue downward)", fontsize=8)
        ax.set_title(f'order="{order}": {grid} CTAs x {threads} threads, unroll {unroll}\n'
                     "colour = CTA, pale = odd pass, hatched = 2nd item of a pass", fontsize=8.5)
    fig.tight_layout()
    save_png(fig, OUT / "grid_stride_orders.png", dpi=130)


def row_tiling():
    cases = [(64, 16), (4, 4096), (1, 1 << 20)]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
    for ax, (rows, vecs) in zip(axes, cases):
        plan = plan_rows(rows, vecs, 132)
        t = plan.tiling
        text = (f"{rows} rows x {vecs} vectors\n"
                f"threads/CTA {t.threads}, threads/row {t.threads_per_row}\n"
                f"rows/CTA {t.rows_per_cta}, unroll {t.unroll}\n"
                f"column splits {plan.splits}, CTA cap {plan.ctas_per_sm}/SM\n"
                f"grid {plan.grid(rows, 132)}")
        shown_rows = min(rows, 8)
        for r in range(shown_rows):
            cta = r // t.rows_per_cta
            for sp in range(min(plan.splits, 8)):
                ax.add_patch(Rectangle((sp, shown_rows - 1 - r), 1, 1, facecolor=plt.get_cmap("tab20")((cta * 7 + sp) % 20),
                                       edgecolor="white"))
        ax.set_xlim(0, max(min(plan.splits, 8), 1))
        ax.set_ylim(0, shown_rows)
        ax.set_xlabel("column chunks (splits; first 8)", fontsize=8)
        ax.set_ylabel("rows (first 8)", fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(text, fontsize=7.5, loc="left")
    fig.suptitle("row tiling chosen by plan_rows on an H200 (colour = which CTA owns the block)", fontsize=9)
    fig.tight_layout()
    save_png(fig, OUT / "row_tiling.png", dpi=130)


def reduction_tree():
    fig, ax = plt.subplots(figsize=(11, 3.2))
    lanes = 32
    y = 0
    for offset in (16, 8, 4, 2, 1):
        for lane in range(lanes):
            ax.add_patch(Rectangle((lane, -y), 1, 0.7, facecolor="#9ecae1", edgecolor="white"))
            partner = lane ^ offset
            if lane < partner:
                ax.annotate("", xy=(partner + 0.5, -y - 0.05), xytext=(lane + 0.5, -y - 0.05),
                            arrowprops=dict(arrowstyle="<->", lw=0.4, color="#555555", connectionstyle="arc3,rad=0.3"))
        ax.text(-0.5, -y + 0.35, f"shfl.bfly {offset:>2}", ha="right", va="center", fontsize=7)
        y += 1
    ax.add_patch(Rectangle((0, -y), 8, 0.7, facecolor="#fdae6b", edgecolor="white"))
    ax.text(8.5, -y + 0.35, "lane 0 of each warp -> smem[warp]; barrier; warps_per_row lanes reload and repeat",
            fontsize=7, va="center")
    ax.set_xlim(-5, lanes)
    ax.set_ylim(-y - 0.3, 1)
    ax.axis("off")
    ax.set_title("collectives.reduce.group_reduce: each lane adds its partner's value (lane ^ offset); after 5 steps "
                 "every lane holds the warp's sum,\nthen one shared-memory stage combines the warps of a row", fontsize=9)
    fig.tight_layout()
    save_png(fig, OUT / "group_reduce.png", dpi=130)


def gemm_timelines(k_tiles: int = 4, tiles: int = 4):
    """Who works when in the two warp-specialized schedules, for one CTA's first tiles: the producer
    warp's TMA loads (one box per K-block), the consumers' WGMMA mainloops and epilogues. Replayed
    from the schedule's rules (cooperative: both warpgroups on every tile; ping-pong: alternate
    tiles, mainloops ordered by the named-barrier turn), with unit costs: TMA 1, WGMMA of a K-block 1
    per warpgroup-tile-half (cooperative) or 2 (one warpgroup owns the whole tile), epilogue 3."""
    fig, axes = plt.subplots(2, 1, figsize=(12, 4.6), sharex=True)
    colors = {"tma": "#8da0cb", "mma": "#66c2a5", "epi": "#fc8d62"}
    for ax, kind in zip(axes, ("cooperative", "pingpong")):
        rows = {"producer warp (TMA)": 2.0, "consumer WG 1": 1.0, "consumer WG 2": 0.0}
        loads, t = [], 0.0
        for i in range(tiles * k_tiles):
            loads.append(t)
            ax.add_patch(Rectangle((t, 2.0), 0.9, 0.7, color=colors["tma"]))
            t += 1.0
        if kind == "cooperative":
            free = 0.0
            for tile in range(tiles):
                start = max(free, loads[tile * k_tiles] + 1)
                cur = start
                for kb in range(k_tiles):
                    cur = max(cur, loads[tile * k_tiles + kb] + 1)
                    for y in (1.0, 0.0):
                        ax.add_patch(Rectangle((cur, y), 0.95, 0.7, color=colors["mma"]))
                    cur += 1.0
                for y in (1.0, 0.0):
                    ax.add_patch(Rectangle((cur, y), 2.9, 0.7, color=colors["epi"]))
                    ax.text(cur + 1.45, y + 0.35, f"epi {tile}", ha="center", va="center", fontsize=7)
                free = cur + 3.0
        else:
            wg_free = [0.0, 0.0]
            turn = 0.0  # the tensor cores are handed over at the end of each mainloop
            for tile in range(tiles):
                wg = tile % 2
                y = 1.0 if wg == 0 else 0.0
                cur = max(wg_free[wg], turn, loads[tile * k_tiles] + 1)
                for kb in range(k_tiles):
                    cur = max(cur, loads[tile * k_tiles + kb] + 1)
                    ax.add_patch(Rectangle((cur, y), 1.9, 0.7, color=colors["mma"]))
                    cur += 2.0
                turn = cur
                ax.add_patch(Rectangle((cur, y), 2.9, 0.7, color=colors["epi"]))
                ax.text(cur + 1.45, y + 0.35, f"epi {tile}", ha="center", va="center", fontsize=7)
                wg_free[wg] = cur + 3.0
        ax.set_yticks([v + 0.35 for v in rows.values()], list(rows))
        ax.set_ylim(-0.2, 2.9)
        ax.set_xlim(0, 40)
        ax.set_title(f"{kind}: " + ("both consumer warpgroups compute each tile (half the rows each), then both run "
                                    "its epilogue: the tensor cores idle during epilogues" if kind == "cooperative" else
                                    "warpgroups alternate tiles; one's epilogue overlaps the other's mainloop "
                                    "(ordered by named barriers)"), fontsize=9)
    handles = [Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    axes[0].legend(handles, ["TMA load of a K-block (A + B)", "WGMMA on a K-block", "epilogue (convert, stmatrix, TMA store)"],
                   fontsize=8, loc="upper right", ncol=3)
    axes[1].set_xlabel("time (unit costs; a schematic replay of the schedule rules, not a measurement)")
    fig.tight_layout()
    save_png(fig, OUT / "gemm_timelines.png", dpi=120)


def order_grid(ax, cells, rows: int, cols: int, fontsize: float = 7):
    """Draw a tile visit order on `ax`: `cells` (step, row, col) triples, out of `max step + 1` steps,
    each cell shaded and numbered by its step (row 0 on top); no ticks."""
    steps = max(i for i, _, _ in cells) + 1
    for i, r, c in cells:
        ax.add_patch(Rectangle((c, rows - 1 - r), 1, 1, color=plt.cm.viridis(i / steps), ec="w"))
        ax.text(c + 0.5, rows - 0.5 - r, str(i), ha="center", va="center", fontsize=fontsize,
                color="w" if i < 0.6 * steps else "k")
    ax.set_xlim(0, cols)
    ax.set_ylim(0, rows)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])


def gemm_raster(tiles_m: int = 12, tiles_n: int = 6):
    """The order in which the persistent scheduler hands out output tiles (schedules.gemm.tile_order):
    groups of `raster_group` cluster-rows, M fastest inside a group."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 5.2))
    for ax, s in zip(axes, (GemmSchedule(cluster_m=1, raster_group=1), GemmSchedule(cluster_m=2, raster_group=2))):
        order = tile_order(tiles_m, tiles_n, 1, s)
        order_grid(ax, [(i, cm * s.cluster_m + dm, cn) for i, (cm, cn, _) in enumerate(order)
                        for dm in range(s.cluster_m)], tiles_m, tiles_n)
        ax.set_xlabel("tile column (N)")
        ax.set_ylabel("tile row (M)")
        ax.set_title(f"cluster {s.cluster_m}x{s.cluster_n}, raster_group {s.raster_group}", fontsize=9)
    fig.suptitle("schedules.gemm.tile_order: the number is when a (cluster) tile is handed out; with 132 SMs "
                 "busy at once,\nneighbours in time share A rows and B columns in L2", fontsize=9)
    fig.tight_layout()
    save_png(fig, OUT / "gemm_raster.png", dpi=120)


if __name__ == "__main__":
    gemm_timelines()
    gemm_raster()
    grid_stride_orders()
    row_tiling()
    reduction_tree()
    print("wrote", ", ".join(p.name for p in sorted(OUT.glob("*.png"))))
