"""Draw the pictures of the pages of lessons 15-17 (CPU only).

    python3 docs/figures/make_lesson_figures.py            # writes docs/figures/flow_*.png
    python3 docs/figures/make_lesson_figures.py --out DIR  # somewhere else (the test does this)

flow_sampler_timeline: the sampler's host and GPU lanes, eager against one graph replay. The kernel counts per
step come from the code (the plain-torch twin's aten ops counted by a dispatch mode on CPU; ours from the network's
structure); the durations are typical values, labelled as such (the page's table has the measured latencies).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

DPI = 110


def _save(fig, out: Path, name: str) -> Path:
    path = out / name
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    try:  # palette PNG: flat fills need few colours
        from PIL import Image

        with Image.open(path) as im:
            im.convert("RGB").quantize(colors=64).save(path, optimize=True)
    except ImportError:  # pragma: no cover
        pass
    return path


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
    return _save(fig, out, "flow_sampler_timeline.png")


FIGURES = [flow_sampler_timeline]


def main(argv=None) -> list[Path]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE, help="directory for the PNGs (default: docs/figures)")
    ap.add_argument("--only", default="", help="comma-separated figure functions to draw (default: all)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    only = {s for s in args.only.split(",") if s}
    written = [f(args.out) for f in FIGURES if not only or f.__name__ in only]
    for p in written:
        print(f"{p}  {p.stat().st_size / 1024:.0f} KiB")
    return written


if __name__ == "__main__":
    main()
