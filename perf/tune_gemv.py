"""Sweep the tensor-core GEMV's schedule (`gemv.mma`: warps per CTA, 8-row blocks per CTA, chunks in
flight) on the GPU for W of the suite's shapes at B = 8; prints TB/s on the bytes of W (L2 flushed,
CUDA-event medians) per shape, best first, and the op's own plan (`schedules.gemv.plan_gemv_mma`).

    python3 -m perf.tune_gemv [--cols 8] [--shapes 4096x4096,16384x16384]
"""

from __future__ import annotations

import argparse
import itertools

import torch

from cute_kernels.bench import harness as H

GRID = dict(warps=(4, 8, 16), row_blocks=(1, 2, 4), unroll=(2, 4))
SHAPES = "4096x4096,8192x8192,16384x16384,1024x16384,14336x4096"


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--cols", type=int, default=8)
    ap.add_argument("--shapes", default=SHAPES)
    a = ap.parse_args(argv)
    from cute_kernels import catalog
    from schedules.gemv import plan_gemv_mma
    from schedules.hardware import num_sms

    fns = {cfg: catalog.get("gemv.mma").compiled(dtype="bf16", cols=a.cols, index64=False,
                                                 **dict(zip(GRID, cfg)))
           for cfg in itertools.product(*GRID.values())}
    for shape in a.shapes.split(","):
        n, k = map(int, shape.split("x"))
        w = H.randn(n, k, dtype=torch.bfloat16, seed=11)
        xt = H.randn(a.cols, k, dtype=torch.bfloat16, seed=12)
        y = torch.empty(n, a.cols, dtype=torch.bfloat16, device="cuda")
        ref = torch.mm(w, xt.t())
        res = []
        for cfg, fn in fns.items():
            fn(w, xt, y)
            assert (y.float() - ref.float()).abs().max() <= 0.05 * ref.float().abs().max(), cfg
            ms = H.do_bench(lambda: fn(w, xt, y))["median_ms"]
            res.append((w.numel() * 2 / ms / 1e9, cfg))
        cub = w.numel() * 2 / H.do_bench(lambda: torch.mm(w, xt.t()))["median_ms"] / 1e9
        p = plan_gemv_mma(n, k, num_sms())
        print(f"## {shape} B={a.cols}: cuBLAS {cub:.3f} TB/s; plan warps={p.warps} row_blocks={p.row_blocks} "
              f"unroll={p.unroll}")
        for tbs, cfg in sorted(res, reverse=True)[:8]:
            print(f"  {tbs:.3f} TB/s  " + " ".join(f"{k_}={v}" for k_, v in zip(GRID, cfg)))
        planned = next(t for t, c in res if c == (p.warps, p.row_blocks, p.unroll))
        print(f"  plan: {planned:.3f} TB/s")


if __name__ == "__main__":
    main()
