"""Draw the layout and pipeline pictures of the row-wise, GEMV, transpose and SwiGLU/ArgMax pages from
the planners and layouts the kernels use (CPU only; the DSL evaluates the shared-memory layouts).

    python3 docs/figures/make_kernel_figures.py            # writes docs/figures/{rowwise,gemv,transpose,argmax,swiglu}_*.png
    python3 docs/figures/make_kernel_figures.py --out DIR  # somewhere else (the test does this)

What comes from the code: `schedules.row_tiling.plan_for_rows` / `plan_rows` (row plans, their
strings, staging bytes, splits), `schedules.gemv.plan_gemv` (the register tile), the transpose's own
`Transpose` object (tile side, padding) and `collectives.smem_tiles` layouts evaluated by the DSL
(bank of every element, counted with `cute_kernels.study.banks`), `schedules.tile_order` (launch
order), `GridStride.thread_walk` replayed as in make_figures.py (SwiGLU's vectors). The cluster
exchange timeline is a schematic with unit costs, labelled as such.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import cutlass  # noqa: E402
from figure_io import cli, save  # noqa: E402
from make_figures import _walk, order_grid  # noqa: E402

from collectives import smem_tiles  # noqa: E402
from cute_kernels.study import banks  # noqa: E402
from cute_kernels.study.draw import GROUP_COLORS  # noqa: E402
from cute_kernels.study.layout import Layout, from_dsl, in_dsl  # noqa: E402
from cute_kernels.swiglu import SWIGLU_TUNED  # noqa: E402
from cute_kernels.transpose.kernels import Transpose  # noqa: E402
from schedules.gemv import plan_gemv  # noqa: E402
from schedules.row_tiling import plan_for_rows, plan_rows  # noqa: E402
from schedules.tile_order import TileOrder, tile_list  # noqa: E402

SMS = 132  # H200
BF16_VEC = 8  # elements per 16-byte vector


def _arrow(ax, xy_from, xy_to, text="", color="#444", fontsize=7, rad=0.0):
    ax.add_patch(FancyArrowPatch(xy_from, xy_to, arrowstyle="-|>", mutation_scale=9, color=color, lw=0.9,
                                 connectionstyle=f"arc3,rad={rad}"))
    if text:
        ax.text((xy_from[0] + xy_to[0]) / 2, (xy_from[1] + xy_to[1]) / 2 + 0.12, text, ha="center", va="bottom",
                fontsize=fontsize, color=color)


# ---------------------------------------------------------------------------------------------
# row-wise kernels
# ---------------------------------------------------------------------------------------------
ROW_LENGTHS = (4096, 16384, 65536, 131072)
RANK_COLORS = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#eeca3b", "#9d755d"]


def rowwise_plans(out: Path, families=(("rms_fwd", "RMSNorm forward"), ("fwd", "softmax forward"))) -> Path:
    """How `plan_for_rows` splits one bf16 row: cluster ranks x vpt k-slabs x tpr lanes of 16 bytes."""
    fig, axes = plt.subplots(len(ROW_LENGTHS), len(families), figsize=(13, 8.4))
    for col, (family, label) in enumerate(families):
        for row, n in enumerate(ROW_LENGTHS):
            ax = axes[row][col]
            plan = plan_for_rows(family, n, BF16_VEC)
            t = plan.tiling
            cap = plan.capacity(BF16_VEC)
            scale = 1.0 / cap  # the plan's capacity spans the bar; past N is grey
            slab = t.threads_per_row * BF16_VEC  # elements of one k-slab (tpr lanes x 16 B)
            for rank in range(plan.cluster_n):
                for k in range(t.unroll):
                    x0 = (rank * t.unroll + k) * slab
                    shade = 1.0 if k % 2 == 0 else 0.62
                    color = RANK_COLORS[rank % len(RANK_COLORS)]  # 16-CTA clusters reuse the 8 colors
                    ax.add_patch(Rectangle((x0 * scale, 0.45), slab * scale, 0.5, facecolor=color,
                                           alpha=shade, edgecolor="white", lw=0.4))
                    if t.unroll * plan.cluster_n <= 32:
                        ax.text((x0 + slab / 2) * scale, 0.7, f"k{k}", ha="center", va="center", fontsize=5.5,
                                color="white")
                ax.add_patch(Rectangle((rank * t.unroll * slab * scale, 0.42), t.unroll * slab * scale, 0.56,
                                       fill=False, edgecolor="black", lw=1.0))
                ax.text((rank + 0.5) * t.unroll * slab * scale, 1.05, f"CTA rank {rank}" if plan.cluster_n <= 4
                        else f"r{rank}", ha="center", va="bottom", fontsize=6.5)
            if n < cap:
                ax.add_patch(Rectangle((n * scale, 0.45), (cap - n) * scale, 0.5, facecolor="0.85",
                                       hatch="///", edgecolor="white"))
            # where the row is held while it is reduced and normalized
            staged = plan.staging == "smem"
            held = (f"staged in shared memory (cp.async.cg, vector k of lane l at slot k*tpr + l): x's row slice "
                    f"{plan.row_smem_bytes(BF16_VEC, rows=(2,)) // 1024} KB/CTA, {plan.ctas_per_sm} CTAs/SM "
                    "(.minnctapersm)" if staged else
                    f"held in registers: {t.unroll} x 16 B per thread; grid cap {plan.ctas_per_sm} CTAs/SM")
            ax.add_patch(Rectangle((0, 0.05), 1.0, 0.25, facecolor="#c7e9c0" if staged else "#fdd0a2",
                                   edgecolor="0.5", lw=0.5))
            ax.text(0.01, 0.175, held, fontsize=5.8, va="center")
            sync = ""
            if plan.cluster_n > 1:
                sync = "; st.async + mbarrier" if plan.cluster_sync == "mbarrier" else "; cluster barrier"
            ax.set_title(f'{label}, N = {n}: plan "{plan}"\n{t.threads} threads/CTA, {t.rows_per_cta} row(s)/CTA, '
                         f"{t.threads_per_row} thr/row x {t.unroll} vectors = {t.unroll * BF16_VEC} el/thread, "
                         f"cluster {plan.cluster_n}{sync}", fontsize=7, loc="left")
            ax.set_xlim(0, 1)
            ax.set_ylim(0, 1.25)
            ax.axis("off")
    fig.suptitle("schedules.row_tiling.plan_for_rows(family, N, vec=8) for bf16 rows: one bar = one row; boxes = CTAs "
                 "of the cluster; slabs k = the k-th 16-byte vector of every lane\n(a slab is tpr lanes x 16 B, "
                 "coalesced; element (rank, k, lane, e) = ((rank*vpt + k)*tpr + lane)*8 + e); grey = capacity past N",
                 fontsize=8.5)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return save(fig, out, "rowwise_plans.png")


def rowwise_cluster_exchange(out: Path) -> Path:
    """Schematic timeline of two row tiles of two CTAs of a cluster, for the two `cluster_sync` modes."""
    colors = {"stage": "#8da0cb", "reduce": "#66c2a5", "store_x": "#a6d854", "wait": "#e5e5e5",
              "fence": "#e78ac3", "norm": "#fc8d62", "drain": "#fdd0a2"}
    load = {0: (3.0, 3.0), 1: (3.6, 3.0)}  # rank 1's first tile arrives a little later
    drain = 6.0  # a store's round trip to the memory system, longer than the next tile's stage + reduce
    fig, axes = plt.subplots(2, 1, figsize=(12.5, 6.2), sharex=True)
    for ax, mode in zip(axes, ("barrier", "mbarrier")):
        free = {0: 0.0, 1: 0.0}
        drained = {0: 0.0, 1: 0.0}  # when the previous tile's global stores have left the SM
        for tile in range(2):
            ready = {}
            for rank in (0, 1):
                y = 2.2 - 1.1 * rank
                t0 = free[rank]
                d = load[rank][tile]
                ax.add_patch(Rectangle((t0, y), d, 0.6, color=colors["stage"]))
                ax.text(t0 + d / 2, y + 0.3, f"tile {tile}: cp.async stage\n(RowSlice.fetch, wait_group)",
                        ha="center", va="center", fontsize=6)
                t = t0 + d
                ax.add_patch(Rectangle((t, y), 1.0, 0.6, color=colors["reduce"]))
                ax.text(t + 0.5, y + 0.3, "partial\nreduce", ha="center", va="center", fontsize=6)
                t += 1.0
                ax.add_patch(Rectangle((t, y), 0.35, 0.6, color=colors["store_x"]))
                t += 0.35
                if mode == "barrier" and drained[rank] > t:  # MEMBAR.ALL.GPU: previous tile's stores drain
                    ax.add_patch(Rectangle((t, y), drained[rank] - t, 0.6, color=colors["fence"]))
                    ax.text((t + drained[rank]) / 2, y + 0.3, "MEMBAR", ha="center", va="center", fontsize=6)
                    t = drained[rank]
                ready[rank] = t
            meet = max(ready.values())  # both the cluster barrier and the peer's bytes wait for the slower CTA
            for rank in (0, 1):
                y = 2.2 - 1.1 * rank
                if meet > ready[rank]:
                    ax.add_patch(Rectangle((ready[rank], y), meet - ready[rank], 0.6, facecolor=colors["wait"],
                                           hatch="///", edgecolor="0.6", lw=0.3))
                    ax.text((ready[rank] + meet) / 2, y + 0.3, "barrier.cluster\nwait" if mode == "barrier"
                            else "mbarrier\ntry_wait", ha="center", va="center", fontsize=5.5)
                t = meet + 0.3  # fold the peers' slots in rank order
                ax.add_patch(Rectangle((t, y), 2.0, 0.6, color=colors["norm"]))
                ax.text(t + 1.0, y + 0.3, "normalize + store", ha="center", va="center", fontsize=6)
                t += 2.0
                yd = y - 0.27 - 0.22 * tile
                ax.add_patch(Rectangle((t - 1.0, yd), drain + 1.0, 0.18, color=colors["drain"]))
                ax.text(t + drain / 2, yd + 0.09, f"tile {tile}'s global stores in flight (to L2 / DRAM)",
                        ha="center", va="center", fontsize=5)
                drained[rank] = t + drain
                free[rank] = t
        ax.set_yticks([2.5, 1.4], ["CTA rank 0", "CTA rank 1"])
        ax.set_ylim(0.5, 3.0)
        ax.set_xlim(0, 21)
        if mode == "barrier":
            ax.set_title('cluster_sync="barrier": each CTA writes its partial into slot [row, rank] of every peer '
                         "(st.shared::cluster), then barrier.cluster arrive.release / wait.acquire;\n"
                         "ptxas puts MEMBAR.ALL.GPU before the arrive: from the second tile on it waits for the "
                         "previous tile's global stores to drain (pink)", fontsize=7.5, loc="left")
        else:
            ax.set_title('cluster_sync="mbarrier": st.async.shared::cluster.mbarrier::complete_tx::bytes: each '
                         "store completes its bytes on the receiver's mbarrier (armed by thread 0 with the bytes it "
                         "will\nreceive, two per call site by tile parity); threads wait with mbarrier.try_wait.parity:"
                         " no fence, no cluster-wide barrier per tile", fontsize=7.5, loc="left")
    handles = [Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    names = ["cp.async stage of the row", "partial reduce (group_reduce: shfl.bfly + smem)",
             "remote store of the partial", "wait for the peer", "MEMBAR.ALL.GPU", "normalize + store (fold slots "
             "in rank order)", "global stores in flight"]
    fig.legend(handles, names, fontsize=6.5, loc="lower center", ncol=4)
    axes[1].set_xlabel("time (unit costs: a schematic of collectives.reduce.cluster_reduce as called by "
                       "RowReducer.reduce, not a measurement)", fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return save(fig, out, "rowwise_cluster_exchange.png")


# ---------------------------------------------------------------------------------------------
# GEMV
# ---------------------------------------------------------------------------------------------
def gemv_register_tile(out: Path, n_rows: int = 4096, k: int = 4096, cols=(1, 4, 8)) -> Path:
    """Which thread owns which rows of W and which k-vectors of W and x (plan_gemv)."""
    import numpy as np

    nv = k // BF16_VEC
    fig, axes = plt.subplots(len(cols), 1, figsize=(12.5, 2.8 * len(cols)))
    for ax, b in zip(axes, cols):
        plan = plan_gemv(n_rows, nv, b, SMS)
        t, r = plan.tiling, plan.row_block
        tpr = t.threads_per_row
        groups = min(t.rows_per_cta, 2)
        labels = [f"W row {g * r + rr} (group {g})" for g in range(groups) for rr in range(r)]
        labels += ["x (same k)"] + [f"x column {c}" for c in range(b)]
        img = np.ones((len(labels), nv, 3))
        lane_rgb = plt.cm.hsv(np.arange(tpr) / tpr)[:, :3] * 0.55 + 0.45  # pale rainbow by lane
        for i, lab in enumerate(labels):
            if lab == "x (same k)":
                continue
            for j in range(nv):
                lane = j % tpr
                img[i, j] = (0.1, 0.1, 0.1) if lane == 0 else lane_rgb[lane]
        ax.imshow(img, aspect="auto", interpolation="nearest", extent=(0, nv, len(labels), 0))
        for g in range(1, groups):
            ax.axhline(g * r, color="black", lw=1.2)
        ax.axhline(groups * r + 1, color="0.4", lw=0.6)
        step = tpr * t.unroll  # one pass of the row's threads: unroll k-vectors per lane
        for x in range(step, nv, step):
            ax.axvline(x, color="black", lw=0.6, ls="--")
        ax.set_yticks([i + 0.5 for i in range(len(labels))], [lab if lab != "x (same k)" else "" for lab in labels],
                      fontsize=5.5)
        ax.set_xticks(sorted({0, tpr, step, nv}))
        ax.tick_params(labelsize=6)
        reuse = f"x read once per k-vector and used for all {r} rows" if r > 1 else "no reuse of x across rows"
        ax.set_title(f"B = {b}: R = {r} row(s) per thread, {t.threads} threads/CTA, {tpr} threads/row (one row group "
                     f"per {tpr} threads), unroll {t.unroll}, {t.rows_per_cta} group(s)/CTA: tile = "
                     f"{t.rows_per_cta * r} rows; grid cap {plan.ctas_per_sm} CTAs/SM.\nColour = lane in the group "
                     f"(lane 0 black): lane l folds k-vectors l, l + {tpr}, ... of its group's {r} W row(s) and of the "
                     f"{b} x column(s) into {r}x{b} = {r * b} fp32 accumulators\n({reuse}); dashed: one pass "
                     f"({t.unroll} k-vector(s) in flight per lane)", fontsize=7, loc="left")
    axes[-1].set_xlabel(f"k-vector index (16 bytes = 8 bf16 of K; K = {k}: {nv} vectors)", fontsize=8)
    fig.suptitle(f"schedules.gemv.plan_gemv({n_rows}, {nv}, B, {SMS}) for W {n_rows} x {k} bf16: the rows of the CTA's "
                 "first row tile (at most two groups shown) and x, by owning thread", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return save(fig, out, "gemv_register_tile.png")


def gemv_mma_chunk(out: Path) -> Path:
    """One 32-wide K chunk of the tensor-core GEMV: which lane loads which 16 bytes of W (and of x), and
    which k slot of which MMA each element feeds (`cute_kernels.gemv.mma.chunk_slot`)."""
    import numpy as np

    from cute_kernels.gemv.mma import chunk_slot

    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(12.5, 5.6), gridspec_kw={"height_ratios": [3, 1.3]})
    img = np.ones((8, 32, 3))
    base = plt.cm.tab10(np.arange(4))[:, :3]
    for g in range(8):
        for c in range(4):
            lane = 4 * g + c
            for t in range(2):
                for e in range(4):
                    slot, k = chunk_slot(lane, t, e)
                    img[g, k] = base[c] * (0.55 if t == 0 else 0.85) + (0.45 if t == 0 else 0.15)
                    ax.text(k + 0.5, g + 0.5, f"{slot}", ha="center", va="center", fontsize=6)
    ax.imshow(img, aspect="auto", interpolation="nearest", extent=(0, 32, 8, 0))
    for x in range(8, 32, 8):
        ax.axvline(x, color="black", lw=1.0)
    for x in range(4, 32, 8):
        ax.axvline(x, color="0.3", lw=0.5, ls="--")
    ax.set_yticks([g + 0.5 for g in range(8)], [f"W row 8b+{g} (lanes {4 * g}-{4 * g + 3})" for g in range(8)],
                  fontsize=6)
    ax.set_xticks([4 * i + 2 for i in range(8)], [f"c={i // 2}, MMA t={i % 2}" for i in range(8)], fontsize=6)
    ax.set_title("W rows of one 8-row block x one 32-wide K chunk (memory order). Lane 4g+c loads the 16 bytes "
                 "k = 8c..8c+7 of row g in ONE LDG.128;\n"
                 "elements 0-3 feed MMA t=0, 4-7 MMA t=1 (pale / dark); "
                 "the number is the MMA's k slot (0-15) the element takes in lane c's B fragment, x column g "
                 "the same", fontsize=7, loc="left")
    ax2.axis("off")
    lines = ["C (16 x 8) of each MMA pair = y^T of the block: lane 4g+c holds C[g, 2c], C[g, 2c+1] = "
             "y[8b+2c, g], y[8b+2c+1, g] (rows g >= B dropped),",
             "and C[g+8, *] (the zero rows 8-15 of A: never stored). Warps split the chunks (warp w: w, w+warps, ...);"
             " their C values meet in shared memory, summed in warp order.",
             "A (16 x 16) = x^T: A[g, k] from the same 16-byte load of x column g (lanes g >= B load column B-1: "
             "their C rows are dropped); A[g+8, *] = 0 (constant registers)."]
    for i, line in enumerate(lines):
        ax2.text(0.0, 0.85 - 0.3 * i, line, fontsize=7, transform=ax2.transAxes, va="top")
    fig.suptitle("kernels.gemv_mma: mma.sync.m16n8k16 with x^T as A and 8 rows of W as B; the K permutation "
                 "memory k = 8c + 4t + e", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return save(fig, out, "gemv_mma_chunk.png")


# ---------------------------------------------------------------------------------------------
# transpose
# ---------------------------------------------------------------------------------------------
def _transpose_tiles(dtype=cutlass.BFloat16):
    """The three shared-memory tiles of the transposes, as the kernel builds them, evaluated by the DSL."""
    esize = dtype.width // 8
    plain = Transpose("smem", dtype, 128 // dtype.width, False, pad=0)
    padded = Transpose("smem", dtype, 128 // dtype.width, False)
    swz = Transpose("swizzle", dtype, 128 // dtype.width, False)
    tiles = []
    for k, name in ((plain, "smem, pad=0 (row-major)"), (padded, f"smem (default pad = {padded.pad} el = "
                                                                    f"{padded.pad * esize} B per row)"),
                    (swz, "swizzle / tma: S<3,4,3> on byte addresses")):
        T = k.T
        if k.variant == "smem":
            lay = in_dsl(lambda k=k: from_dsl(smem_tiles.padded_tile(k.T, k.T, k.pad)))
        else:
            lay = in_dsl(lambda: from_dsl(smem_tiles.swizzled_tile(T, T, dtype)))
        tile = banks.make_tile(T, T, esize, layout=Layout(lay.shape, lay.stride), swizzle=lay.swizzle, name=name)
        tiles.append((k, tile))
    return tiles


def _transpose_phases(k: Transpose, warp: int = 0):
    """The phases of warp `warp`'s first read in `_smem_transpose`: lane -> row r = i % T, chunk j = i // T,
    one 16-byte read each, 8 lanes per phase."""
    acc = []
    for lane in range(32):
        i = warp * 32 + lane
        r, j = i % k.T, i // k.T
        acc.append((lane, r, j * k.cv, 16))
    return [acc[p:p + 8] for p in range(0, 32, 8)]


def transpose_banks(out: Path, rows_shown: int = 16) -> Path:
    tiles = _transpose_tiles()
    fig, axes = plt.subplots(len(tiles), 1, figsize=(12.5, 2.9 * len(tiles)))
    for ax, (k, tile) in zip(axes, tiles):
        phases = _transpose_phases(k)
        waves = [banks.phase_wavefronts(tile, p) for p in phases]
        for r in range(rows_shown):
            for c in range(tile.cols):
                bnk = tile.bank(r, c)
                ax.add_patch(Rectangle((c, rows_shown - 1 - r), 1, 1, facecolor=GROUP_COLORS[bnk // 4],
                                       edgecolor="white", lw=0.3))
                if c % k.cv == 0:
                    ax.text(c + 0.5, rows_shown - 0.5 - r, str(bnk), fontsize=4.2, ha="center", va="center")
        for p, style in ((0, "-"), (1, "--")):
            for _lane, r, c, nbytes in phases[p]:
                ax.add_patch(Rectangle((c + 0.08, rows_shown - 1 - r + 0.08), nbytes // tile.esize - 0.16, 0.84,
                                       fill=False, edgecolor="black", lw=1.1, ls=style))
        verdict = "conflict-free" if max(waves) == 1 else f"{max(waves)}-way conflict"
        ax.set_title(f"transpose.{tile.name}: warp 0's 128-bit reads of sA (lanes 0-7 solid = phase 0, lanes 8-15 "
                     f"dashed = phase 1): wavefronts per phase {waves} ({verdict})", fontsize=7.5, loc="left")
        ax.set_xlim(0, tile.cols)
        ax.set_ylim(0, rows_shown)
        ax.set_xticks(range(0, tile.cols + 1, k.cv))
        ax.set_yticks([rows_shown - 0.5 - r for r in range(0, rows_shown, 4)], [str(r) for r in range(0, rows_shown, 4)])
        ax.tick_params(labelsize=6)
        ax.set_ylabel("tile row", fontsize=7)
    axes[-1].set_xlabel("tile column (bf16 elements; a row is 128 bytes = all 32 banks; the first rows of the 64 x 64 "
                        "tile shown)", fontsize=8)
    handles = [Rectangle((0, 0), 1, 1, color=GROUP_COLORS[g]) for g in range(8)]
    axes[0].legend(handles, [f"banks {4 * g}-{4 * g + 3}" for g in range(8)], fontsize=6, ncol=8,
                   loc="lower center", bbox_to_anchor=(0.5, 1.18))
    fig.suptitle("Transpose._smem_transpose reads chunk j of 32 consecutive rows per warp (lane = row): the bank of "
                 "each element (number at each 16-byte chunk's first element)\nfor the kernel's three tiles "
                 "(collectives.smem_tiles.padded_tile / swizzled_tile, evaluated by the DSL; conflicts counted by "
                 "cute_kernels.study.banks)", fontsize=8.5)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return save(fig, out, "transpose_banks.png")


def transpose_orders_tma(out: Path, tiles: int = 8) -> Path:
    fig, axes = plt.subplots(1, 4, figsize=(14, 4.0), gridspec_kw=dict(width_ratios=[1, 1, 1, 1.5]))
    for ax, order in zip(axes, (TileOrder("row"), TileOrder("grouped", 4), TileOrder("diagonal"))):
        order_grid(ax, [(i, tm, tn) for i, (tm, tn, _) in enumerate(tile_list(tiles, tiles, 1, order))],
                   tiles, tiles, fontsize=6.5)
        ax.set_xlabel("tn (tile column of x)", fontsize=7)
        ax.set_ylabel("tm (tile row of x)", fontsize=7)
        name = {"row": 'order="row"', "grouped": 'order="grouped", group=4\n(default group 32)',
                "diagonal": 'order="diagonal"'}[order.order]
        ax.set_title(name, fontsize=8)
    # the TMA variant's box
    ax = axes[3]
    k = Transpose("tma", cutlass.BFloat16, 8, False)
    box_bytes = k.T * k.T * cutlass.BFloat16.width // 8
    tm, tn = 1, 2

    def grid(x0, label, hi):
        for a in range(4):
            for b in range(4):
                hit = (a, b) == hi
                ax.add_patch(Rectangle((x0 + b * 0.5, 3 - a * 0.5), 0.5, 0.5, facecolor="#fdae6b" if hit else "0.92",
                                       edgecolor="0.6", lw=0.5))
        ax.text(x0 + 1.0, 3.62, label, ha="center", fontsize=7)

    grid(0, "x (M, N)", (tm, tn))
    grid(5.2, "out (N, M)", (tn, tm))
    for x0, lab in ((2.5, "sA"), (3.8, "sB")):
        ax.add_patch(Rectangle((x0, 1.3), 0.9, 0.9, facecolor="#fdae6b", hatch="...", edgecolor="0.4"))
        ax.text(x0 + 0.45, 1.15, lab, ha="center", va="top", fontsize=7)
    _arrow(ax, (0.5 * tn + 0.5, 3.0 - 0.5 * tm), (2.7, 2.25), rad=-0.2)
    ax.text(0.0, 0.95, f"TMA load: cp.async.bulk.tensor\nbox ({k.T}, {k.T}) = {box_bytes} B,\nmbarrier expect_tx "
            f"{box_bytes}", fontsize=6.3, va="top")
    _arrow(ax, (3.4, 1.75), (3.8, 1.75))
    ax.text(3.6, 0.85, "_smem_transpose\n(threads)", ha="center", va="top", fontsize=6.3)
    _arrow(ax, (4.7, 2.25), (5.2 + 0.5 * tm + 0.25, 3.0 - 0.5 * tn), rad=-0.2)
    ax.text(4.8, 0.85, "fence.proxy.async.shared::cta,\nTMA store of the box at (tn, tm)", fontsize=6.3, va="top")
    ax.set_xlim(-0.1, 7.4)
    ax.set_ylim(0, 4)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"transpose.tma: one {k.T}x{k.T} box per CTA each way (bf16);\nboth smem tiles SWIZZLE_128B "
                 "= S<3,4,3> (the swizzle variant's layout)", fontsize=8)
    fig.suptitle("schedules.tile_order.tile_list: the launch index of each tile (8 x 8 tiles; nearby numbers run "
                 "together), and the TMA variant's path", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    return save(fig, out, "transpose_orders_tma.png")


# ---------------------------------------------------------------------------------------------
# ArgMax and SwiGLU
# ---------------------------------------------------------------------------------------------
def argmax_two_level(out: Path) -> Path:
    """Level 1: a thread's in-order scan over its vectors (one vector max vs the best per vector, the
    best vector's words kept), then `locate` inside it; level 2 (long rows): splits write keys, a second
    launch reduces them."""
    import random

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(12.5, 6.4), gridspec_kw=dict(height_ratios=[1.25, 1]))
    # (a) one thread's scan, a row of 32768 x 4096 bf16 under the op's plan
    m, n = 32768, 4096
    plan = plan_rows(m, n // BF16_VEC, SMS, unroll=4)
    t = plan.tiling
    lane, shown = 3, 4  # the thread's first `shown` vectors
    rng = random.Random(7)
    vals = [[round(rng.gauss(0, 1), 1) for _ in range(BF16_VEC)] for _ in range(shown)]
    vals[2][5] = vals[1][6] = 2.9  # a tie across vectors: the earlier vector keeps it
    best, best_v, pos = float("-inf"), None, None
    for s in range(shown):
        j = lane + s * t.threads_per_row  # strided_fold: lane, lane + tpr, ... (unroll in flight)
        x0 = s * 11
        vm = max(vals[s])
        take = vm > best
        for e in range(BF16_VEC):
            ax1.add_patch(Rectangle((x0 + e, 1.2), 1, 0.8, facecolor="#c6dbef" if not take else "#9ecae1",
                                    edgecolor="white"))
            ax1.text(x0 + e + 0.5, 1.6, f"{vals[s][e]:.1f}", ha="center", va="center", fontsize=6)
        ax1.text(x0 + 4, 2.15, f"vector {j} (elements {j * 8}..{j * 8 + 7})", ha="center", fontsize=6.5)
        ax1.text(x0 + 4, 0.85, f"vector_max = {vm:.1f}", ha="center", fontsize=6.5)
        ax1.text(x0 + 4, 0.45, ("improves: keep its words" if take else "not > best: skip"), ha="center",
                 fontsize=6.5, color="#08519c" if take else "0.45")
        if take:
            best, best_v, pos = vm, s, j * BF16_VEC
        ax1.text(x0 + 4, 0.05, f"best = {best:.1f} at vector {lane + best_v * t.threads_per_row}", ha="center",
                 fontsize=6.5)
    e = vals[best_v].index(best)
    ax1.text(45, 1.6, f"after the scan, locate:\nfirst element == best\nin the kept vector -> {e}\nindex = "
             f"{pos} + {e} = {pos + e}", fontsize=7, va="center")
    ax1.text(45, 0.25, "key = ordered(best) << 32 | (2^32 - 1 - index)\n-> group_reduce(max) over the row's "
             f"{t.threads_per_row} threads", fontsize=6.5, va="center")
    ax1.set_xlim(-0.5, 60)
    ax1.set_ylim(-0.2, 2.5)
    ax1.axis("off")
    ax1.set_title(f"level 1, one thread (lane {lane}) of a {m} x {n} bf16 row under plan_rows: {t.threads} threads, "
                  f"{t.threads_per_row} per row, unroll {t.unroll}; it visits vectors lane, lane + "
                  f"{t.threads_per_row}, ... in index order (made-up values; the tie 2.9 keeps the earlier vector)",
                  fontsize=7.5, loc="left")
    # (b) the split of a long row
    m2, n2 = 1, 1 << 28
    p1 = plan_rows(m2, n2 // BF16_VEC, SMS, unroll=4)
    p2 = plan_rows(m2, p1.splits, SMS, max_splits=1)
    shown_splits = 6
    w = 1.6
    for s in list(range(shown_splits - 1)) + [p1.splits - 1]:
        i = s if s < shown_splits - 1 else shown_splits
        ax2.add_patch(Rectangle((i * w, 1.5), w * 0.92, 0.7, facecolor=plt.cm.tab20(s % 20), edgecolor="none"))
        ax2.text(i * w + w * 0.46, 1.85, f"split {s}\nCTA ({0}, {s})", ha="center", va="center", fontsize=6)
        ax2.add_patch(Rectangle((i * w + w * 0.2, 0.6), w * 0.5, 0.45, facecolor="#fdae6b", edgecolor="0.4"))
        ax2.text(i * w + w * 0.45, 0.82, f"key {s}", ha="center", va="center", fontsize=6)
        _arrow(ax2, (i * w + w * 0.46, 1.48), (i * w + w * 0.46, 1.07))
    ax2.text((shown_splits - 1) * w + w * 0.46, 1.85, "...", ha="center", va="center", fontsize=10)
    ax2.text((shown_splits - 1) * w + w * 0.46, 0.82, "...", ha="center", va="center", fontsize=10)
    x_end = (shown_splits + 1) * w
    ax2.add_patch(Rectangle((x_end + 0.6, 0.4), 3.2, 0.85, facecolor="#c7e9c0", edgecolor="0.4"))
    ax2.text(x_end + 2.2, 0.82, f"second launch (keys in, index out):\n{p2.tiling.threads} threads, "
             f"{p2.tiling.threads_per_row} per row, max over {p1.splits} keys", ha="center", va="center", fontsize=6.5)
    _arrow(ax2, (x_end - 0.3, 0.82), (x_end + 0.55, 0.82))
    ax2.text(x_end + 4.1, 0.82, "-> int64 index", va="center", fontsize=7)
    ax2.text(0, 2.45, f"level 2, a long row: {m2} x 2^28 bf16: plan_rows gives {p1.splits} splits (SM-count based: "
             f"{p1.ctas_per_sm} CTAs/SM x {SMS} SMs), each CTA of {p1.tiling.threads} threads scans "
             f"{-(-(n2 // BF16_VEC) // p1.splits)} vectors as above and writes its key to an int64 (M, splits) buffer; "
             "no atomics",
             fontsize=7.5)
    ax2.set_xlim(-0.2, x_end + 6)
    ax2.set_ylim(0.2, 2.7)
    ax2.axis("off")
    fig.suptitle("ArgMax (cute_kernels/argmax/kernels.py, collectives/arg_reduce.py): the two-level vector scan and "
                 "the split row's two launches", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    return save(fig, out, "argmax_two_level.png")


def swiglu_fusion(out: Path, n_vectors: int = 1536 + 256) -> Path:
    """What one pass of the fused SwiGLU map touches: vector j of gate and of up -> vector j of out, the
    same thread (GridStride.thread_walk of the tuned schedule, replayed on a toy length)."""
    import numpy as np

    s = SWIGLU_TUNED
    ctas = s.grid(n_vectors, SMS)  # uncapped: one CTA per threads * unroll vectors, one pass
    owner = _walk(s, n_vectors, ctas)
    width = 128
    rows = -(-n_vectors // width)
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6), gridspec_kw=dict(width_ratios=[2.3, 1]))
    ax = axes[0]
    cmap = plt.get_cmap("tab10")
    thread = (1, 5)  # (CTA, thread) whose vectors are outlined
    img = np.ones((rows, width, 3))
    for j in range(n_vectors):
        b, t, _p, _u = owner[j]
        base = np.array(cmap(b)[:3])
        shade = 1.0 if (j // width) % 2 == 0 else 0.6
        img[j // width, j % width] = (0, 0, 0) if (b, t) == thread else base * shade + (1 - shade)
    for ti, name in enumerate(("gate", "up", "out")):
        y0 = -ti * (rows + 2.2)  # top edge of this tensor's block
        ax.imshow(img, extent=(0, width, y0 - rows + 1, y0 + 1), interpolation="nearest", aspect="auto")
        ax.text(-2, y0 - rows / 2 + 1, name, ha="right", va="center", fontsize=8, weight="bold")
    ax.set_xlim(-14, width)
    ax.set_ylim(-3 * (rows + 2.2) + 2, 1.5)
    ax.axis("off")
    ax.set_title(f"GridStride {s} (SWIGLU_TUNED: {s.threads} threads, unroll {s.unroll}, order \"{s.order}\") on "
                 f"{n_vectors} vectors (toy size): grid = {ctas} CTAs, one pass each;\ncolour = CTA (rows of {width} "
                 f"vectors alternate shade); black = the {s.unroll} vectors thread {thread[1]} of CTA {thread[0]} loads "
                 "in one pass:\nthe same indices j in gate, up and out (two separate flat tensors, not interleaved)",
                 fontsize=7.5, loc="left")
    # the per-vector data flow and the bytes it saves
    ax = axes[1]
    steps = [("ld.global.v4 gate[j]  ld.global.v4 up[j]", "#9ecae1"), ("widen to fp32 (8 elements each)", "#c7e9c0"),
             ("s = 1 / (1 + exp(-g))   (ex2.approx)", "#fdd0a2"), ("o = g * s * u   (fp32)", "#fdd0a2"),
             ("round to bf16, st.global.v4 out[j]", "#9ecae1")]
    for i, (txt, col) in enumerate(steps):
        ax.add_patch(Rectangle((0, 4.2 - i), 4.6, 0.7, facecolor=col, edgecolor="0.5"))
        ax.text(2.3, 4.55 - i, txt, ha="center", va="center", fontsize=7, family="monospace")
        if i:
            _arrow(ax, (2.3, 5.2 - i), (2.3, 4.92 - i))
    ax.text(0, -0.6, "tensors moved per element (bf16, 2 B each):\n  forward: fused 3 (gate, up, out) vs torch eager "
            "5\n  (silu writes and re-reads a temporary)\n  backward: fused 5 vs ~9", fontsize=7, va="top")
    ax.text(0, -2.4, "A (..., 2H) projection's halves x[..., :H], x[..., H:]\nare strided views: the op copies them "
            "first\n(split the weight instead)", fontsize=6.5, va="top", color="0.3")
    ax.set_xlim(-0.2, 5)
    ax.set_ylim(-3.6, 5.2)
    ax.axis("off")
    ax.set_title("GatedActivation._f for one 16-byte vector (8 bf16): one read of each\ninput, fp32 math, one "
                 "rounding per output", fontsize=7.5, loc="left")
    fig.suptitle("SwiGLU forward (cute_kernels/swiglu/kernels.py via elementwise.map_vectors): out = silu(gate) * up "
                 "in one pass", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return save(fig, out, "swiglu_fusion.png")


FIGURES = (rowwise_plans, rowwise_cluster_exchange, gemv_register_tile, gemv_mma_chunk, transpose_banks,
           transpose_orders_tma, argmax_two_level, swiglu_fusion)


def main(argv=None) -> list[Path]:
    return cli(FIGURES, __doc__.splitlines()[0], HERE, argv)


if __name__ == "__main__":
    main()
