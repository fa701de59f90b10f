"""Small-size study of the elementwise kernels (1-8 MiB, where launch and DRAM latency dominate):
times every schedule of a grid against torch, per size, through the compiled function called
directly (no host overhead in the figure). Feeds `schedules.grid_stride.pick`'s size classes.
copy is also timed under every TMA bulk schedule (`BULK`: chunk bytes x pieces per chunk), which
feeds `schedules.bulk_chunks.SIZE_CLASSES`.

    python3 -m perf.small [--out DIR]
"""

from __future__ import annotations

import argparse
import itertools

import torch

from cute_kernels.bench import harness as H
from schedules.bulk_chunks import CHUNKS, PIECES, BulkChunks
from schedules.grid_stride import GridStride

MiB = 1 << 20
GRID = dict(threads=(128, 256, 512), unroll=(1, 2, 4, 8), ctas_per_sm=(0, 8, 16), order=("cta",))
BULK = tuple(BulkChunks(c, p) for c in CHUNKS for p in PIECES)  # copy only


def _bulk_params(dt_name: str, s: BulkChunks) -> dict:
    return dict(dtype=dt_name, mode="bulk", chunk_bytes=s.chunk_bytes, pieces=s.pieces)


def study(ops=("copy", "add"), sizes_mib=(1, 2, 4, 8), dtypes=(torch.bfloat16, torch.float32), jobs: int = 16):
    """Every schedule of GRID (and for copy of BULK) against torch, per (op, dtype, size), all
    columns timed in the same interleaved rounds (`H.do_bench_interleaved`). `ctas_per_sm` only sets
    the launch's grid cap (a runtime argument): one compiled kernel per (threads, unroll, order)."""
    from cute_kernels import catalog
    from cute_kernels import dtypes as D
    from cute_kernels.precompile import item, precompile
    from schedules.grid_stride import pick
    from schedules.hardware import num_sms

    sms = num_sms()
    ref = {"copy": lambda x, y: x.clone(), "add": torch.add, "axpby": lambda x, y: 2.0 * x + (-0.5) * y}
    code = list(itertools.product(GRID["threads"], GRID["unroll"], GRID["order"]))
    items = []
    for op, dt in itertools.product(ops, dtypes):
        for t, u, o in code:
            items.append(item(f"elementwise.{op}", dict(dtype=D.name_of(dt), threads=t, unroll=u, ctas_per_sm=0,
                                                         order=o)))
        if op == "copy":
            items += [item("elementwise.copy", _bulk_params(D.name_of(dt), b)) for b in BULK]
    if jobs > 1:
        H.progress(f"precompiling {len(items)} variants")
        precompile(items, jobs)
    lines = ["| op | dtype | MiB | torch us | best us | best config | x torch | tuned config | tuned us | x torch (tuned) "
             "| best bulk config | bulk us | x torch (bulk) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    bulk_lines = ["| dtype | MiB | " + " | ".join(f"x torch {b}" for b in BULK) + " |", "|---|---|" + "---|" * len(BULK)]
    for op, dt, mib in itertools.product(ops, dtypes, sizes_mib):
        n = mib * MiB // torch.tensor([], dtype=dt).element_size()
        x, y = H.randn(n, dtype=dt, seed=1), H.randn(n, dtype=dt, seed=2)
        out = torch.empty_like(x)
        fns = {"torch": lambda: ref[op](x, y)}
        for t, u, o in code:
            fn = catalog.get(f"elementwise.{op}").compiled(dtype=D.name_of(dt), threads=t, unroll=u, ctas_per_sm=0,
                                                            order=o)
            for c in GRID["ctas_per_sm"]:
                sched = GridStride(t, u, c, o)
                fns[str(sched)] = (lambda f, mc: lambda: f(x, y, out, 1.0, 1.0, mc))(fn, sched.max_ctas(sms))
        if op == "copy":
            for b in BULK:
                fn = catalog.get("elementwise.copy").compiled(**_bulk_params(D.name_of(dt), b))
                fns[str(b)] = (lambda f: lambda: f(x, y, out, 1.0, 1.0, 0))(fn)
        res = {k: v["median_ms"] for k, v in H.do_bench_interleaved(fns, rep_ms=20, max_reps=200).items()}
        t_ref = res.pop("torch")
        best = min(res, key=res.get)
        tuned = str(pick(op, n * x.element_size()))
        bulk = {k: v for k, v in res.items() if k.startswith("bulk")}
        b_cells = "| - | - | - |"
        if bulk:
            bb = min(bulk, key=bulk.get)
            b_cells = f"| {bb} | {bulk[bb]*1e3:.2f} | {t_ref/bulk[bb]:.3f} |"
            bulk_lines.append(f"| {D.name_of(dt)} | {mib} | " + " | ".join(f"{t_ref/bulk[str(b)]:.3f}" for b in BULK)
                              + " |")
        lines.append(f"| {op} | {D.name_of(dt)} | {mib} | {t_ref*1e3:.2f} | {res[best]*1e3:.2f} | {best} | "
                     f"{t_ref/res[best]:.3f} | {tuned} | {res.get(tuned, float('nan'))*1e3:.2f} | "
                     f"{t_ref/res.get(tuned, float('nan')):.3f} {b_cells}")
        H.progress(lines[-1])
    if len(bulk_lines) > 2:
        lines += ["", "copy under every bulk schedule (torch time / bulk time):", ""] + bulk_lines
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--sizes", default="1,2,4,8", help="MiB per tensor, comma list")
    ap.add_argument("--ops", default="copy,add")
    a = ap.parse_args(argv)
    table = study(ops=tuple(a.ops.split(",")), sizes_mib=tuple(int(v) for v in a.sizes.split(",")))
    print(table)
    if a.out:
        import os

        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "small.md"), "w") as f:
            f.write(f"# Elementwise at small sizes\n\n{H.environment()}\n\n{table}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
