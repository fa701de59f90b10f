"""`cute-kernels schedules gemm --shape M N K`: time the candidate schedules of one GEMM shape on the
GPU and rank them (lesson 10's "compare schedules").

The candidates come from `schedules.gemm.candidates` (at most ~32, pruned by tile/smem/cluster
rules), are compiled ahead in parallel worker processes (disk cache), then timed with the harness
(CUDA-event medians, L2 flushed, randn bf16). Prints a ranked table with TFLOP/s and the ratio to
cuBLAS and writes schedules_<shape>.{md,json,png} when --out is given.
"""

from __future__ import annotations

import json
import os

import torch

from perf import harness as H


def search(m: int, n: int, k: int, out_dir: str | None = None, limit: int = 32, jobs: int | None = None) -> int:
    from cute_kernels.ops.gemm import _gemm_cuda
    from cute_kernels.precompile import precompile
    from cute_kernels.specs_gemm import GEMM, params_for
    from schedules.gemm import candidates, default_schedule

    cands = candidates(m, n, k, limit)
    items = [("gemm", tuple(sorted(GEMM.resolve(params_for(s)).items()))) for s in cands]
    H.progress(f"compiling {len(items)} candidate schedules ...")
    count, secs = precompile(items, jobs or min(16, os.cpu_count() or 1))
    H.progress(f"compiled {count} in {secs:.1f} s")
    a, b = H.randn(m, k, seed=1), H.randn(k, n, seed=2)
    flops = 2 * m * n * k
    t_ref = H.do_bench(lambda: torch.matmul(a, b))["median_ms"]
    rows = []
    for i, s in enumerate(cands):
        t = H.do_bench(lambda: _gemm_cuda(a, b, schedule=s), rep_ms=80)["median_ms"]
        rows.append((s, t))
        H.progress(f"  [{i + 1}/{len(cands)}] {s}: {flops / t / 1e9:.0f} TFLOP/s")
    rows.sort(key=lambda r: r[1])
    d = default_schedule(m, n, k)
    lines = [f"# GEMM schedules for {m}x{n}x{k} (bf16)", "", str(H.environment()), "",
             f"cuBLAS (torch.matmul): {flops / t_ref / 1e9:.1f} TFLOP/s", "",
             "| rank | schedule | ms | TFLOP/s | x cuBLAS | default |", "|---|---|---|---|---|---|"]
    for r, (s, t) in enumerate(rows, 1):
        lines.append(f"| {r} | {s} | {t:.4f} | {flops / t / 1e9:.1f} | {t_ref / t:.3f} | {'*' if s == d else ''} |")
    text = "\n".join(lines)
    print(text)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        stem = os.path.join(out_dir, f"schedules_{m}x{n}x{k}")
        with open(stem + ".md", "w") as f:
            f.write(text + "\n")
        with open(stem + ".json", "w") as f:
            json.dump({"shape": [m, n, k], "cublas_ms": t_ref,
                       "rows": [{"schedule": str(s), "ms": t} for s, t in rows]}, f, indent=1)
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            fig, ax = plt.subplots(figsize=(8, 0.28 * len(rows) + 1.5))
            ax.barh([str(s) for s, _ in rows][::-1], [flops / t / 1e9 for _, t in rows][::-1])
            ax.axvline(flops / t_ref / 1e9, color="k", ls=":", label="cuBLAS")
            ax.set_xlabel("TFLOP/s")
            ax.tick_params(axis="y", labelsize=7)
            ax.legend()
            ax.set_title(f"GEMM {m}x{n}x{k} bf16 schedules", fontsize=10)
            fig.tight_layout()
            fig.savefig(stem + ".png", dpi=100)
            plt.close(fig)
        except ImportError as e:
            H.progress(f"plot skipped: {e}")
    return 0
