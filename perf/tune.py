"""Schedule tuning on the GPU: time a small grid of configs per kernel on large randn inputs and
rank them. The winners become the catalogue defaults (recorded in perf/results/tune.md).

    python3 -m perf.tune [--out DIR] [--jobs N]
"""

from __future__ import annotations

import argparse
import itertools
import sys

import torch

from cute_kernels.bench import harness as H
from schedules.grid_stride import GridStride

MiB = 1 << 20
EW_GRID = dict(threads=(128, 256), unroll=(2, 4, 8), ctas_per_sm=(4, 16, 0), order=("grid", "cta"))
RED_GRID = dict(threads=(256, 512), unroll=(2, 4, 8), ctas_per_sm=(4, 8, 16))


def _ew_variants(ops, dtype):
    for op, (t, u, c, o) in itertools.product(ops, itertools.product(*EW_GRID.values())):
        yield op, dict(dtype=dtype, threads=t, unroll=u, ctas_per_sm=c, order=o)


def tune_elementwise(ops=("copy", "add", "axpby"), sizes_mib=(8, 512)):
    from cute_kernels import catalog
    from schedules.hardware import num_sms

    sms = num_sms()
    rows = []
    for mib in sizes_mib:
        n = mib * MiB // 2
        x, y = H.randn(n, seed=1), H.randn(n, seed=2)
        out = torch.empty_like(x)
        for op, p in _ew_variants(ops, "bf16"):
            fn = catalog.get(f"elementwise.{op}").compiled(**p)
            mc = GridStride(p["threads"], p["unroll"], p["ctas_per_sm"], p["order"]).max_ctas(sms)
            t = H.do_bench(lambda fn=fn, mc=mc, x=x, y=y, out=out: fn(x, y, out, 1.0, 1.0, mc), rep_ms=60)["median_ms"]
            moved = (2 if op == "copy" else 3) * n * 2
            rows.append((f"elementwise.{op}", mib, p["threads"], p["unroll"], f'{p["ctas_per_sm"]}{p["order"][0]}', t,
                         moved / t / 1e9))
        del x, y, out
    return rows


def tune_reduction(shapes=((1, 1 << 27), (1, 1 << 29), (32768, 4096), (65536, 8192), (1 << 20, 256), (16384, 2048))):
    from cute_kernels.reduction.ops import _rows_of, _sum_rows

    rows = []
    for m, n in shapes:
        x = H.randn(m, n, seed=3)
        x2 = _rows_of(x)
        out = torch.empty(m, dtype=torch.bfloat16, device="cuda")
        for t, u, c in itertools.product(*RED_GRID.values()):
            ms = H.do_bench(lambda t=t, u=u, c=c, x2=x2, out=out: _sum_rows(x2, out, threads=t, unroll=u, ctas_per_sm=c),
                            rep_ms=60)["median_ms"]
            rows.append(("reduction.row_sum", f"{m}x{n}", t, u, c, ms, x.numel() * 2 / ms / 1e9))
        del x, x2
    return rows


def precompile_variants(jobs: int):
    from cute_kernels.precompile import item, precompile

    items = [item(f"elementwise.{op}", p) for op, p in _ew_variants(("copy", "add", "axpby"), "bf16")]
    for t, u, tpr in itertools.product(RED_GRID["threads"], RED_GRID["unroll"], (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)):
        if tpr > t:
            continue
        for d, o in (("bf16", "bf16"), ("bf16", "fp32"), ("fp32", "bf16")):
            for aligned in (True, False):
                items.append(item("reduction.row_sum", {"dtype": d, "out_dtype": o, "threads": t, "unroll": u,
                                                        "threads_per_row": tpr, "aligned": aligned}))
    n, _, secs = precompile(list(dict.fromkeys(items)), jobs)
    H.progress(f"precompiled {n} tuning variants in {secs:.1f} s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--jobs", type=int, default=16)
    args = ap.parse_args(argv)
    precompile_variants(args.jobs)
    lines = ["# Schedule tuning (bf16, randn, L2 flushed, CUDA-event medians)", "",
             f"{H.environment()}", "", "| kernel | size | threads | unroll | ctas/SM (+order) | ms | TB/s |", "|---|---|---|---|---|---|---|"]
    table = tune_elementwise() + tune_reduction()
    lines += ["| " + " | ".join(str(v) if not isinstance(v, float) else f"{v:.4f}" for v in r) + " |" for r in table]
    # Per kernel: rank configs by their slowest ratio to the best config of each size (robust choice).
    lines += ["", "## Configs ranked by worst-case fraction of the best, per kernel", ""]
    best = {}
    for r in table:
        best[(r[0], r[1])] = min(best.get((r[0], r[1]), 1e9), r[5])
    summary = []
    for kernel in dict.fromkeys(r[0] for r in table):
        score = {}
        for r in table:
            if r[0] == kernel:
                cfg = (r[2], r[3], r[4])
                score[cfg] = min(score.get(cfg, 1.0), best[(r[0], r[1])] / r[5])
        ranked = sorted(score.items(), key=lambda kv: -kv[1])[:5]
        summary.append(f"{kernel}: " + "; ".join(f"t{c[0]} u{c[1]} c{c[2]} {v:.3f}" for c, v in ranked))
        for r in table:
            if r[0] == kernel and (r[2], r[3], r[4]) == ranked[0][0]:
                summary.append(f"    at {r[1]}: {r[6]:.3f} TB/s ({best[(r[0], r[1])] / r[5]:.3f} of best)")
    summary.append("best per (kernel, size):")
    for r in table:
        if r[5] == best[(r[0], r[1])]:
            summary.append(f"    {r[0]} {r[1]}: t{r[2]} u{r[3]} c{r[4]} {r[6]:.3f} TB/s")
    lines += summary
    text = "\n".join(lines)
    print("\n".join(summary))
    if args.out:
        from pathlib import Path

        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "tune.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
