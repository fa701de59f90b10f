"""Draw the pictures of the pages of lessons 14-17 (CPU only).

    python3 docs/figures/make_lesson_figures.py            # writes docs/figures/flow_*.png
    python3 docs/figures/make_lesson_figures.py --out DIR  # somewhere else (the test does this)

moe_routing_layouts: a small MoE's routing and the rows it builds, computed by `cute_kernels.moe.reference`: the
top-k experts of each token (weights renormalized), the contiguous layout (each expert's copies in token order, its
block padded to the 128-row tile), the masked layout (max_m slots an expert, copies past it dropped and counted),
dispatch and combine as the two directions of one token-to-row map, and the order of the expert-parallel forward's
work on the compute and NCCL streams with its chunks overlapped (`cute_kernels.moe.ep`; durations schematic).

flow_sampler_timeline: the sampler's host and GPU lanes, eager against one graph replay. The kernel counts per
step come from the code (the plain-torch twin's aten ops counted by a dispatch mode on CPU; ours from the network's
structure); the durations are typical values, labelled as such (the page's table has the measured latencies).

voxel_grid_order: a 2-D slice of a cloud on its voxel grid, computed by `cute_kernels.voxel.reference`: each voxel's
hard-mode number (order of its first point, with points past max_points and voxels past max_voxels dropped), the
scatter's order (ascending linear index), and the points out of range.

qat_grid_ste: the fake-quant staircase of `cute_kernels.qat.reference.fake_quant` (int4 asymmetric and e4m3), its STE
mask (the gradient passed where the value was in range, zero outside), and the LSQ scale gradient's sawtooth.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from figure_io import cli, save  # noqa: E402


def twin_ops_per_step() -> int:
    """aten ops of one step of the eager torch sampler (network + update) on CPU, counted as they dispatch."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from cute_kernels.flow.policy import ActionFlowNet, TorchActionFlowNet
    from cute_kernels.flow.reference import flow_update

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__ not in ("detach.default", "view.default", "t.default", "expand.default",
                                     "reshape.default", "unsqueeze.default", "slice.Tensor", "_unsafe_view.default"):
                Count.n += 1
            return func(*args, **(kwargs or {}))

    net = ActionFlowNet(device="cpu")
    twin = TorchActionFlowNet(net)
    x = torch.randn(1, 50, 32)
    t = torch.tensor(0.3)
    with torch.no_grad(), Count():
        v = twin(x, t)
        flow_update(x, [v], [1.0], 0.1)
    return Count.n


def flow_sampler_timeline(out: Path, steps: int = 3) -> Path:
    from cute_kernels.flow.policy import ActionFlowNet

    eager_ops = twin_ops_per_step()
    ours = ActionFlowNet.kernels_per_step(blocks=4, cast_input=True)
    host_op, kern, graph_launch = 6.0, 3.0, 2.5  # us: typical eager host cost per op, small-kernel time
    fig, ax = plt.subplots(figsize=(10, 3.4))
    lanes = {"eager torch: host": 3.2, "eager torch: GPU": 2.5, "ours, one graph: host": 1.2, "ours, one graph: GPU": 0.5}
    # eager: the GPU waits on every launch
    t = 0.0
    for s in range(steps):
        for i in range(eager_ops):
            ax.add_patch(Rectangle((t, lanes["eager torch: host"]), host_op * 0.9, 0.5, color="#d98c5f" if s % 2 else
                                   "#e8b08f", lw=0))
            ax.add_patch(Rectangle((t + host_op, lanes["eager torch: GPU"]), kern * 0.9, 0.5, color="#5f8dd9", lw=0))
            t += host_op
    eager_end = t + kern
    ax.add_patch(Rectangle((0, lanes["ours, one graph: host"]), graph_launch, 0.5, color="#e8b08f", lw=0))
    t = graph_launch + 3.0
    for s in range(steps):
        for i in range(ours):
            ax.add_patch(Rectangle((t, lanes["ours, one graph: GPU"]), kern * 0.9, 0.5,
                                   color="#4caf7a" if s % 2 else "#7fcf9f", lw=0))
            t += kern
    graph_end = t
    ax.set_yticks([v + 0.25 for v in lanes.values()], list(lanes))
    ax.set_xlim(0, eager_end * 1.02)
    ax.set_ylim(0, 4.0)
    ax.set_xlabel("time (us; schematic: typical ~6 us host cost per eager op, ~3 us per small kernel)")
    ax.set_title(f"{steps} Euler steps of the example policy: eager torch issues {eager_ops} ops a step, each "
                 f"launched by the host;\nthe graph replays our {ours} kernels a step from one host call "
                 f"(here {graph_end:.0f} us against {eager_end:.0f} us)", fontsize=9)
    for s in ("top", "right"):
        ax.spines[s].set_visible(False)
    fig.tight_layout()
    return save(fig, out, "flow_sampler_timeline.png", colors=64)


def voxel_grid_order(out: Path) -> Path:
    import numpy as np
    import torch

    from cute_kernels.voxel import reference as V

    g = torch.Generator().manual_seed(3)
    n = 60
    pts = torch.zeros(n, 4)
    pts[:, 0] = torch.rand(n, generator=g) * 4.4 - 2.2  # x over [-2.2, 2.2): some out of [-2, 2)
    pts[:, 1] = torch.rand(n, generator=g) * 4.2 - 1.1  # y over [-1.1, 3.1): some out of [-1, 3)
    pts[:8, :2] = torch.tensor([0.6, 0.7]) + 0.08 * torch.randn(8, 2, generator=g)  # a dense cluster
    pts[:, 2] = 0.5
    size, rng = (0.5, 0.5, 1.0), (-2.0, -1.0, 0.0, 2.0, 3.0, 1.0)
    max_points, max_voxels = 4, 14
    hard = V.voxelize_hard(pts, size, rng, max_points, max_voxels)
    coords = V.voxelize(pts, size, rng, mode="dynamic")
    sc, _ = V.voxel_scatter(pts[:, :1].contiguous(), coords, "sum")
    num = int(hard.voxel_num.reshape(-1)[0])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    for ax, title in zip(axes, ("hard mode: voxels numbered by their first point (max_points 4, max_voxels 14)",
                                "scatter: voxels in ascending linear index (torch.unique's order)")):
        for x in np.arange(-2.0, 2.01, 0.5):
            ax.axvline(x, color="#ccc", lw=0.6)
        for y in np.arange(-1.0, 3.01, 0.5):
            ax.axhline(y, color="#ccc", lw=0.6)
        ax.add_patch(Rectangle((-2, -1), 4, 4, fill=False, lw=1.2, color="#555"))
        ax.set_xlim(-2.3, 2.3)
        ax.set_ylim(-1.2, 3.2)
        ax.set_aspect("equal")
        ax.set_title(title, fontsize=8.5)
    inside = (coords[:, 0] >= 0).numpy()
    kept = torch.zeros(n, dtype=torch.bool)
    ax = axes[0]
    for v in range(num):
        z, y, x = hard.coords[v].tolist()
        ax.add_patch(Rectangle((-2 + 0.5 * x, -1 + 0.5 * y), 0.5, 0.5, color="#cfe3f7", lw=0))
        ax.text(-2 + 0.5 * x + 0.25, -1 + 0.5 * y + 0.25, str(v), ha="center", va="center", fontsize=8)
        for p in hard.voxels[v, : int(hard.num_points[v])]:
            kept |= (pts[:, :2] == p[:2]).all(1)
    xy = pts[:, :2].numpy()
    for ax in axes:
        ax.scatter(xy[~inside, 0], xy[~inside, 1], marker="x", s=14, color="#c44", label="out of range")
    axes[0].scatter(xy[inside & kept.numpy(), 0], xy[inside & kept.numpy(), 1], s=10, color="#235",
                    label="kept point")
    axes[0].scatter(xy[inside & ~kept.numpy(), 0], xy[inside & ~kept.numpy(), 1], s=10, facecolors="none",
                    edgecolors="#235", label="dropped (past max_points / max_voxels)")
    ax = axes[1]
    vcount = int(sc.voxel_num.reshape(-1)[0])
    for v in range(vcount):
        z, y, x = sc.coords[v].tolist()
        ax.add_patch(Rectangle((-2 + 0.5 * x, -1 + 0.5 * y), 0.5, 0.5, color="#d9f0d9", lw=0))
        ax.text(-2 + 0.5 * x + 0.25, -1 + 0.5 * y + 0.25, str(v), ha="center", va="center", fontsize=8)
    ax.scatter(xy[inside, 0], xy[inside, 1], s=10, color="#253")
    axes[0].legend(loc="upper center", bbox_to_anchor=(0.5, -0.05), ncol=3, fontsize=7, frameon=False)
    fig.tight_layout()
    return save(fig, out, "voxel_grid_order.png", colors=64)


def qat_grid_ste(out: Path) -> Path:
    import torch

    from cute_kernels.qat import reference as Q

    x = torch.linspace(-1.2, 2.4, 2001)
    s, z, qmin, qmax = torch.tensor([0.15]), torch.tensor([3]), 0, 15  # uint4 asymmetric: [-0.45, 1.8] represented
    y, mask = Q.fake_quant(x, s, z, qmin, qmax)
    ye, me = Q.fake_quant(x, torch.tensor([1.2 / 448]), None, 0, 0, qtype="e4m3")
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    ax = axes[0]
    ax.plot(x, x, color="#bbb", lw=0.8, label="x")
    ax.plot(x, y, color="#235", lw=1.4, label="fake_quant, uint4 (s 0.15, z 3)")
    ax.plot(x, ye, color="#c60", lw=1.0, label="e4m3 (amax 1.2)")
    lo, hi = float((qmin - z) * s), float((qmax - z) * s)
    for v in (lo, hi):
        ax.axvline(v, color="#c44", lw=0.8, ls="--")
    ax.set_title("the quantization grid (q - z) s; dashed: its ends", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    ax = axes[1]
    ax.fill_between(x, 0, mask.float(), color="#7fcf9f", step="mid", label="int4: dx = dy where in range")
    ax.plot(x, me.float() * 0.5, color="#c60", lw=1.0, label="e4m3 mask (x 0.5)")
    for v in (lo, hi):
        ax.axvline(v, color="#c44", lw=0.8, ls="--")
    ax.set_ylim(-0.05, 1.1)
    ax.set_title("the straight-through estimator's mask", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    ax = axes[2]
    _, g_s, _ = Q.learnable_grads(torch.ones_like(x), x, s, z.float(), qmin, qmax)
    ax.plot(x, g_s, color="#235", lw=1.0)
    for v in (lo, hi):
        ax.axvline(v, color="#c44", lw=0.8, ls="--")
    ax.set_title("LSQ: d y / d scale (per element, dy = 1)", fontsize=9)
    for a in axes:
        a.set_xlabel("x")
    fig.tight_layout()
    return save(fig, out, "qat_grid_ste.png", colors=64)


def moe_routing_layouts(out: Path, tokens: int = 8, experts: int = 4, top_k: int = 2, max_m: int = 3) -> Path:
    import torch

    from cute_kernels.moe import reference as M

    g = torch.Generator().manual_seed(1)  # (a draw whose experts get 2-5 copies: max_m = 3 drops some)
    logits = torch.randn(tokens, experts, generator=g) * 1.5
    r = M.route(logits, top_k, max_m=max_m)
    scores = torch.softmax(logits, -1)
    ids, w = r.topk_ids.tolist(), r.topk_weights.tolist()
    cmap = plt.get_cmap("tab10")
    tok_color = [cmap(t % 10) for t in range(tokens)]
    fig = plt.figure(figsize=(13, 7.6))
    gs = fig.add_gridspec(2, 3, height_ratios=[1.35, 1], width_ratios=[1, 1.25, 1])

    # (a) routing: the scores, the top-k of each token outlined with its renormalized weight
    ax = fig.add_subplot(gs[0, 0])
    ax.imshow(scores.numpy(), cmap="Greys", vmin=0, vmax=1, aspect="auto")
    for t in range(tokens):
        for s in range(top_k):
            e = ids[t][s]
            ax.add_patch(Rectangle((e - 0.45, t - 0.45), 0.9, 0.9, fill=False, ec=tok_color[t], lw=2.2))
            ax.text(e, t, f"{w[t][s]:.2f}", ha="center", va="center", fontsize=7,
                    color="white" if scores[t, e] > 0.5 else "black")
    ax.set_xticks(range(experts), [f"e{e}" for e in range(experts)])
    ax.set_yticks(range(tokens), [f"t{t}" for t in range(tokens)])
    ax.set_title(f"(a) routing: softmax scores, top-{top_k}\noutlined with their weights\n(renormalized to sum 1)",
                 fontsize=8.5)

    # (b) contiguous layout with dispatch / combine lines: the rows of `row_source` in order, each expert's block
    # followed by its padding (drawn short: the block is padded to a whole 128-row tile)
    ax = fig.add_subplot(gs[0, 1])
    counts, src, mi = r.counts.tolist(), r.row_source.tolist(), r.m_indices.tolist()
    xr, y, row_y, labels = 2.2, 0.0, {}, []
    for e in range(experts):
        top = y
        for row, c in enumerate(src):
            if c >= 0 and mi[row] == e:
                t = c // top_k
                row_y[c] = y
                ax.add_patch(Rectangle((xr, y), 1.6, 0.9, color=tok_color[t], alpha=0.85, lw=0))
                ax.text(xr + 0.8, y + 0.45, f"t{t}", ha="center", va="center", fontsize=7, color="white")
                y += 1
        ax.add_patch(Rectangle((xr, y), 1.6, 1.1, fill=False, hatch="///", ec="0.6", lw=0.6))
        labels.append((e, (top + y + 1.1) / 2))
        y += 1.6
    total = y
    for e, ly in labels:
        ax.text(xr + 1.75, ly, f"e{e}: {counts[e]} rows, padded\nto 128 (m_indices -1)", va="center", fontsize=7)
    for t in range(tokens):
        ty = (t + 0.5) * total / tokens - 0.5
        ax.add_patch(Rectangle((0, ty), 0.9, 0.9, color=tok_color[t], lw=0))
        ax.text(0.45, ty + 0.45, f"t{t}", ha="center", va="center", fontsize=7, color="white")
        for s in range(top_k):
            ax.annotate("", xy=(xr, row_y[t * top_k + s] + 0.45), xytext=(0.9, ty + 0.45),
                        arrowprops=dict(arrowstyle="-|>", color=tok_color[t], lw=0.8, alpha=0.8))
    ax.set_xlim(-0.2, 6.2)
    ax.set_ylim(total, -0.5)
    ax.axis("off")
    ax.set_title("(b) contiguous layout. dispatch: each token\ncopied to its k rows (arrows); combine: the arrows\n"
                 "backwards, w-weighted, summed in slot order", fontsize=8.5)

    # (c) masked layout: max_m slots an expert, the rest dropped and counted
    ax = fig.add_subplot(gs[0, 2])
    ms = r.masked_source.tolist()
    for e in range(experts):
        for i in range(max_m):
            c = ms[e][i]
            if c >= 0:
                t = c // top_k
                ax.add_patch(Rectangle((e, i), 0.92, 0.92, color=tok_color[t], lw=0))
                ax.text(e + 0.46, i + 0.46, f"t{t}", ha="center", va="center", fontsize=7, color="white")
            else:
                ax.add_patch(Rectangle((e, i), 0.92, 0.92, fill=False, ec="0.7", lw=0.6))
    dropped = {}  # expert -> the tokens of its copies past max_m, in token order
    for t in range(tokens):
        for s in range(top_k):
            if r.token_slots[t, s] < 0:
                dropped.setdefault(ids[t][s], []).append(t)
    for e, ts in dropped.items():
        for j, t in enumerate(ts):
            ax.add_patch(Rectangle((e + 0.12, max_m + 0.25 + 0.6 * j), 0.68, 0.5, fill=False, hatch="xxx",
                                   ec=tok_color[t], lw=0.8))
            ax.text(e + 0.46, max_m + 0.5 + 0.6 * j, f"t{t}", ha="center", va="center", fontsize=6.5)
    deepest = max((len(v) for v in dropped.values()), default=0)
    ax.set_xlim(-0.1, experts)
    ax.set_ylim(max_m + 0.4 + 0.6 * deepest, -0.1)
    ax.set_xticks([e + 0.46 for e in range(experts)], [f"e{e}\nm={min(c, max_m)}" for e, c in enumerate(counts)],
                  fontsize=7)
    ax.set_yticks([i + 0.46 for i in range(max_m)], [f"slot {i}" for i in range(max_m)], fontsize=7)
    for sp in ax.spines.values():
        sp.set_visible(False)
    ax.set_title(f"(c) masked layout (E, max_m = {max_m}) and masked_m;\n{int(r.dropped.item())} copies past "
                 "capacity dropped (hatched)\nand counted", fontsize=8.5)

    # (d) expert parallelism: the order of one forward's work, 3 chunks (`EPMoE.forward`)
    ax = fig.add_subplot(gs[1, :])
    chunks = 3
    comp, comm = 1.4, 0.4
    lanes = {"compute stream": comp, "NCCL stream": comm}
    seg = []  # (lane, start, length, label, color)
    t0 = 0.0
    seg.append(("compute stream", t0, 1.0, "route", "#999999"))
    seg.append(("NCCL stream", 1.0, 0.6, "counts a2a", "#c9a227"))
    seg.append(("compute stream", 1.6, 0.25, "host\nsync", "#d05050"))
    t = 1.85
    send_end = {}
    seg.append(("NCCL stream", t, 1.3, "rows c0", "#5f8dd9"))
    send_end[0] = t + 1.3
    comp_t = send_end[0]
    back_t = 0.0
    for c in range(chunks):
        start = max(comp_t, send_end[c])
        if c + 1 < chunks:
            s0 = max(start, back_t)
            seg.append(("NCCL stream", s0, 1.3, f"rows c{c + 1}", "#5f8dd9"))
            send_end[c + 1] = s0 + 1.3
            back_t = s0 + 1.3
        seg.append(("compute stream", start, 0.5, f"layout\nc{c}", "#9fb7e6"))
        seg.append(("compute stream", start + 0.5, 2.6, f"grouped GEMMs, chunk {c}", "#4caf7a"))
        seg.append(("compute stream", start + 3.1, 0.5, f"partial\nc{c}", "#e8b08f"))
        comp_t = start + 3.6
        b0 = max(comp_t, back_t)
        seg.append(("NCCL stream", b0, 1.0, f"partials c{c}", "#d98c5f"))
        back_t = b0 + 1.0
    seg.append(("compute stream", max(comp_t, back_t), 0.8, "add in\nrank order", "#999999"))
    for lane, st, ln, label, col in seg:
        ax.add_patch(Rectangle((st, lanes[lane]), ln * 0.97, 0.75, color=col, lw=0))
        ax.text(st + ln / 2, lanes[lane] + 0.37, label, ha="center", va="center", fontsize=7 if ln > 0.5 else 6)
    end = max(st + ln for _, st, ln, _, _ in seg)
    ax.set_xlim(0, end * 1.01)
    ax.set_ylim(0, 2.4)
    ax.set_yticks([v + 0.37 for v in lanes.values()], list(lanes))
    ax.set_xlabel("time (schematic): chunk c + 1's rows travel while chunk c's grouped GEMMs run, and chunk c's "
                  "partials go back under chunk c + 1's")
    ax.set_title("(d) expert parallelism (`cute_kernels.moe.ep.EPMoE`, chunks = 3): one host sync for every split "
                 "size, then exchanges overlapped with the experts' work", fontsize=9)
    for sp in ("top", "right"):
        ax.spines[sp].set_visible(False)
    fig.tight_layout()
    return save(fig, out, "moe_routing_layouts.png", colors=64)


FIGURES = [moe_routing_layouts, flow_sampler_timeline, voxel_grid_order, qat_grid_ste]


def main(argv=None) -> list[Path]:
    return cli(FIGURES, __doc__.splitlines()[0], HERE, argv)


if __name__ == "__main__":
    main()
