"""Draw the FlashAttention schedule timelines (docs/kernels/attention.md) by replaying each schedule's
rules, as the kernel orders them, with unit costs.

    python3 docs/figures/make_attention_figures.py      # writes docs/figures/attention_timelines.png

A tiny event replay, not a measurement: one tensor-core queue per SM shared by the warpgroups (a
WGMMA starts when the queue is free, in issue order), each warpgroup's own CUDA cores for the softmax,
a TMA copy per K/V block. The programs below are the kernel's loops in
`cute_kernels/attention/forward.py` (`consumer`, `load_kv`, `load_kv_inline`) written as steps; the ping-pong turns are
the named barriers, the stage ring the mbarriers. Change a cost and the picture follows.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from cute_kernels.figures import save_png  # noqa: E402
from schedules.attention import AttentionSchedule  # noqa: E402

OUT = Path(__file__).resolve().parent
COST = {"load": 0.6, "S": 1.0, "PV": 1.0, "softmax": 1.3, "issue": 0.05}
COLORS = {"load": "#8da0cb", "S": "#66c2a5", "PV": "#1b9e77", "softmax": "#fc8d62"}


def _programs(s: AttentionSchedule, blocks: int):
    """Per actor, the steps of the kernel's loops. Steps: ("load", j), ("need", j) (wait for block j's
    full barrier), ("mma", name, j, sync), ("wait", name, j), ("softmax", j), ("release", j),
    ("turn_wait",), ("turn_give",)."""
    stages = s.num_stages(128)
    progs = {}
    for w in range(s.consumer_wgs):
        p = []
        inline = not s.warp_specialized and w == 0
        if inline:
            p += [("load", j) for j in range(s.prefetch)]
        if s.pingpong:
            p.append(("turn_wait",))
        if not s.overlap:
            for j in range(blocks):
                if inline and s.prefetch == 0:
                    p.append(("load", j))
                p += [("need", j), ("mma", "S", j, False)]
                if s.pingpong:
                    p.append(("turn_give",))
                if inline and s.prefetch and j + s.prefetch < blocks:
                    p.append(("load", j + s.prefetch))
                p += [("wait", "S", j), ("softmax", j)]
                if s.pingpong:
                    p.append(("turn_wait",))
                p += [("mma", "PV", j, False), ("wait", "PV", j), ("release", j)]
        elif blocks:  # the kernel's `if n_count > 0` (a q tile without K/V blocks skips the whole loop)
            # the overlap: S_j and P_{j-1} V_{j-1} issued together; P V waited for after S_j's
            # softmax, or with `double_p` (`overlap_two_p`) one softmax later, before the turn
            p += [("need", 0), ("mma", "S", 0, False)]
            if s.pingpong:
                p.append(("turn_give",))
            p += [("wait", "S", 0), ("softmax", 0)]
            for j in range(1, blocks):
                p.append(("need", j))
                if s.double_p and j >= 2:
                    p += [("wait", "PV", j - 2), ("release", j - 2)]
                if s.pingpong:
                    p.append(("turn_wait",))
                p += [("mma", "S", j, False), ("mma", "PV", j - 1, False)]
                if s.pingpong:
                    p.append(("turn_give",))
                p += [("wait", "S", j), ("softmax", j)]
                if not s.double_p:
                    p += [("wait", "PV", j - 1), ("release", j - 1)]
            if s.double_p and blocks >= 2:
                p += [("wait", "PV", blocks - 2), ("release", blocks - 2)]
            if s.pingpong:
                p.append(("turn_wait",))
            p += [("mma", "PV", blocks - 1, False), ("wait", "PV", blocks - 1), ("release", blocks - 1)]
        if s.pingpong and w < s.consumer_wgs - 1:
            p.append(("turn_give",))  # hands the next warpgroup its last turn
        progs[f"WG {w + 1}"] = p
    if s.warp_specialized:
        progs["producer"] = [("load", j) for j in range(blocks)]
    return progs, stages


def replay(s: AttentionSchedule, blocks: int = 5):
    """[(actor, start, duration, kind, label)] of one CTA's first `blocks` K/V blocks."""
    progs, stages = _programs(s, blocks)
    actors = list(progs)
    t = dict.fromkeys(actors, 0.0)
    pc = dict.fromkeys(actors, 0)
    tc_free, loaded, released, done = 0.0, {}, {}, {}
    turn = ["WG 1", 0.0]
    consumers = [a for a in actors if a.startswith("WG")]
    bars = []

    def start_of(a):
        step = progs[a][pc[a]]
        op = step[0]
        if op == "load":
            j = step[1]
            if j >= stages:  # the stage of block j - stages must be released by every consumer
                if any((c, j - stages) not in released for c in consumers):
                    return math.inf
                return max([t[a]] + [released[(c, j - stages)] for c in consumers])
            return t[a]
        if op == "need":
            return max(t[a], loaded[step[1]]) if step[1] in loaded else math.inf
        if op == "turn_wait":
            return max(t[a], turn[1]) if turn[0] == a else math.inf
        if op == "mma":
            return max(t[a], tc_free)
        if op == "wait":
            return max(t[a], done[(a, step[1], step[2])])
        return t[a]

    while any(pc[a] < len(progs[a]) for a in actors):
        ready = [(start_of(a), i, a) for i, a in enumerate(actors) if pc[a] < len(progs[a])]
        st, _, a = min(ready)
        if st == math.inf:
            raise RuntimeError(f"deadlock in the replay of {s}")
        step = progs[a][pc[a]]
        op = step[0]
        t[a] = st
        if op == "load":
            who = "TMA (producer warp)" if a == "producer" else "TMA (warp 0, in line)"
            bars.append((who, st, COST["load"], "load", str(step[1])))
            loaded[step[1]] = st + COST["load"]
            t[a] = st + (COST["load"] if a == "producer" else COST["issue"])
        elif op == "mma":
            _, name, j, _sync = step
            bars.append((a, st, COST[name], name, f"{name}{j}"))
            bars.append(("tensor cores", st, COST[name], name, a[-1]))
            tc_free = st + COST[name]
            done[(a, name, j)] = tc_free
            t[a] = st + COST["issue"]
        elif op == "softmax":
            bars.append((a, st, COST["softmax"], "softmax", f"sm{step[1]}"))
            t[a] = st + COST["softmax"]
        elif op == "release":
            released[(a, step[1])] = st
        elif op == "turn_give":  # to the next warpgroup: the other one of two, round robin over three
            turn[0], turn[1] = consumers[(consumers.index(a) + 1) % len(consumers)], st
        pc[a] += 1
    return bars


def attention_timelines():
    cases = [(AttentionSchedule(kind="fa2"), "fa2: no warp specialization; both warpgroups compute, warp 0 issues "
                                              "the loads in line; GEMMs and softmaxes meet at random"),
             (AttentionSchedule(), "fa3 (ping-pong): a producer warp loads ahead; named barriers hand the tensor "
                                   "cores over, one warpgroup's softmax under the other's GEMMs"),
             (AttentionSchedule(overlap=True), "fa3 + overlap: each warpgroup also issues S(j+1) with PV(j) and "
                                               "runs softmax(j+1) while PV(j) is on the tensor cores")]
    fig, axes = plt.subplots(len(cases), 1, figsize=(13, 8.2), sharex=True)
    horizon = 0.0
    for ax, (s, title) in zip(axes, cases):
        bars = replay(s)
        rows = ["tensor cores", "WG 2", "WG 1", "TMA (warp 0, in line)" if not s.warp_specialized else
                "TMA (producer warp)"]
        y = {r: i for i, r in enumerate(rows)}
        for who, st, dur, kind, label in bars:
            if who not in y:
                continue
            # a warpgroup's row: its GEMMs (while on the tensor cores) below, its softmax above
            lo, hi = (0.0, 0.7) if not who.startswith("WG") else ((0.37, 0.33) if kind == "softmax" else (0.0, 0.33))
            ax.add_patch(Rectangle((st, y[who] + lo), dur * 0.97, hi, color=COLORS[kind]))
            if label:
                ax.text(st + dur / 2, y[who] + lo + hi / 2, label, ha="center", va="center", fontsize=6)
        end = max(st + dur for _, st, dur, _, _ in bars)
        horizon = max(horizon, end)
        busy = sum(dur for who, _, dur, _, _ in bars if who == "tensor cores")
        ax.set_yticks([v + 0.35 for v in y.values()],
                      [r + " (by WG)" if r == "tensor cores" else r for r in y])
        ax.set_ylim(-0.2, len(rows))
        ax.set_title(f"{title}\n{s}: 5 K/V blocks done at t = {end:.1f}, tensor cores busy {busy / end:.0%}",
                     fontsize=8.5, loc="left")
    axes[-1].set_xlim(0, horizon + 0.5)
    handles = [Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    fig.legend(handles, ["TMA load of a K/V block", "S = Q K^T (WGMMA)", "O += P V (WGMMA)",
                         "mask + online softmax (CUDA cores, MUFU ex2)"], fontsize=8, loc="upper center", ncol=4)
    axes[-1].set_xlabel(f"time (unit costs {COST}; a replay of the schedule rules, not a measurement)", fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.965))
    save_png(fig, OUT / "attention_timelines.png", dpi=120)


def _orders(q_tiles: int, heads: int, group: int):
    """Launch order of the causal tiles (m_block, head) of one batch under the three tile orders, each tile's
    work its K/V block count (square tiles: m_block + 1)."""
    from schedules.attention import block_coords, grouped_coords, tile_coords

    plain = [tile_coords(*block_coords(x, y, 0, False), q_tiles, True)[:2] for y in range(heads) for x in range(q_tiles)]
    heads_first = [tile_coords(*block_coords(x, 0, z, True), q_tiles, True)[:2]
                   for z in range(q_tiles) for x in range(heads)]
    grouped = [tile_coords(*grouped_coords(t, q_tiles, heads, 1, group), q_tiles, True)[:2]
               for t in range(q_tiles * heads)]
    return {"one CTA a tile, grid (q, H, B): longest first within a head": plain,
            "heads_first: longest first over the whole grid (every head's K/V in flight)": heads_first,
            f"l2_groups ({group} heads a group): longest first within a group": grouped}


def _loads(order, workers: int, static: bool, work=lambda tile: tile[0] + 1) -> list[float]:
    """Each SM's busy time after `order`'s tiles (`work(tile)` each; the toy grid's: m_block + 1) on `workers` SMs:
    handed out in order to the first free SM (the block scheduler, the dynamic walk), or tile t to SM t mod workers
    (a persistent grid's static stride)."""
    free = [0.0] * workers
    for t, tile in enumerate(order):
        w = t % workers if static else min(range(workers), key=free.__getitem__)
        free[w] += work(tile)
    return free


def _makespan(order, workers: int, static: bool) -> float:
    """Finish time of `order`'s tiles (`_loads`)."""
    return max(_loads(order, workers, static))


def attention_tile_orders():
    q_tiles, heads, group, workers = 8, 6, 2, 8
    orders = _orders(q_tiles, heads, group)
    fig, axes = plt.subplots(1, len(orders), figsize=(14, 3.6))
    for ax, (title, order) in zip(axes, orders.items()):
        pos = {tile: i for i, tile in enumerate(order)}
        grid_ = [[pos[(m, h)] for m in range(q_tiles)] for h in range(heads)]
        ax.imshow(grid_, cmap="viridis_r", aspect="auto")
        for h in range(heads):
            for m in range(q_tiles):
                ax.text(m, h, f"{pos[(m, h)]}", ha="center", va="center", fontsize=7,
                        color="white" if pos[(m, h)] < len(order) / 2 else "black")
        ax.set_xticks(range(q_tiles), [f"q{m}\n{m + 1}b" for m in range(q_tiles)], fontsize=7)
        ax.set_yticks(range(heads), [f"h{h}" for h in range(heads)], fontsize=7)
        ax.set_title(f"{title}\nmakespan on {workers} SMs: in order {_makespan(order, workers, False):.0f}, "
                     f"static stride {_makespan(order, workers, True):.0f} (ideal "
                     f"{math.ceil(sum(m + 1 for m, _ in order) / workers)})", fontsize=7.5, loc="left")
    fig.suptitle(f"Causal tiles ({q_tiles} q tiles x {heads} heads; q tile m needs m + 1 K/V blocks): the number "
                 "is each tile's launch position (`schedules.attention`)", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    save_png(fig, OUT / "attention_tile_orders.png", dpi=120)


def attention_causal_tail():
    """Per-SM busy time of D = 256 causal, B2 S8k H8 (16 (b, h), 64 q tiles of 128 rows, 80-key blocks;
    a tile's work is its blocks + 1.5 for its prologue and epilogue), the tiles handed in order to the first free
    SM, under the plain order, L2 groups of 3 heads (24 MiB / 8 MiB, the rule before 9b459cb) and the power-of-two
    groups of `l2_group_heads` (2 heads). The same model as tests/test_attention_cpu.py."""
    from collectives.attention_mask import MaskKind, n_block_range
    from schedules.attention import grouped_coords, l2_group_heads

    sk, tm, tn, heads, sms = 8192, 128, 80, 16, 132
    q_tiles = sk // tm
    work = {}
    for m in range(q_tiles):
        lo, hi = n_block_range(m, tm, tn, sk, sk, -1, 0, MaskKind(left=False, right=True))
        for h in range(heads):
            work[(m, h)] = hi - lo + 1.5
    ideal = sum(work.values()) / sms

    def grouped(g):
        return [(q_tiles - 1 - grouped_coords(t, q_tiles, heads, 1, g)[0], grouped_coords(t, q_tiles, heads, 1, g)[1])
                for t in range(q_tiles * heads)]

    orders = {"one CTA a tile (plain order; ncu: SMs active 89.6 % of elapsed)":
              [(q_tiles - 1 - m, h) for h in range(heads) for m in range(q_tiles)],
              "L2 groups of 3 heads (the 24 MiB rule before 9b459cb; measured 0.964x plain)": grouped(3),
              f"L2 groups of {l2_group_heads(sk, 256, 1)} heads (power of two, 9b459cb; unmeasured)":
              grouped(l2_group_heads(sk, 256, 1))}
    fig, ax = plt.subplots(figsize=(9, 3.8))
    for (name, order), color in zip(orders.items(), ("#d95f02", "#7570b3", "#1b9e77")):
        load = sorted(_loads(order, sms, False, work.__getitem__))
        ax.plot(range(sms), load, color=color, label=f"{name}: {ideal / max(load):.3f} of ideal")
    ax.axhline(ideal, color="black", lw=0.8, ls="--", label="ideal (all work spread evenly)")
    ax.set_xlabel("SMs, sorted by the time their last tile ends")
    ax.set_ylabel("busy time (K/V blocks)")
    ax.set_title("D = 256 causal, B2 S8k H8 on 132 SMs: where the plain order's tail comes from", fontsize=9,
                 loc="left")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    save_png(fig, OUT / "attention_causal_tail.png", dpi=120)


if __name__ == "__main__":
    attention_timelines()
    attention_tile_orders()
    attention_causal_tail()
    print("wrote attention_timelines.png, attention_tile_orders.png, attention_causal_tail.png")
