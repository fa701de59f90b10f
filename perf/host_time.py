"""Host time per call beside GPU time, for the columns of a `cute_kernels.rowwise.bench` case: is a short case host-bound?

    python3 -m perf.host_time rmsnorm.bwd 131072 1024 [rounds]

For each column (ours, torch, torch.compile, QuACK): the median CUDA-event time as the suite measures it (columns
interleaved, L2 flushed, the GPU spinning before each call), and the host's time to enqueue one call (50 calls
back to back after a sync, no sync between them). A call whose host time exceeds its GPU time plus the spin is
timed by the host, not by its kernels. Repeated `rounds` times in one process (the suite's first backward case read
2x slower than the same kernel's own probe twice, sessions 15 and 17).
"""

from __future__ import annotations

import sys
import time

import torch


def main(argv=None) -> int:
    from cute_kernels.bench import harness as H
    from cute_kernels.rowwise.bench import _calls

    argv = sys.argv[1:] if argv is None else argv
    case, m, n = argv[0], int(argv[1]), int(argv[2])
    rounds = int(argv[3]) if len(argv) > 3 else 3
    dtype = torch.bfloat16
    fam, direction = case.split(".")
    x = H.randn(m, n, dtype=dtype, seed=21)
    t = torch.randint(0, n, (m,), device="cuda") if fam == "cross_entropy" else None
    dy = H.randn(m, n, dtype=dtype, seed=22) if direction == "bwd" else None
    calls = _calls(case, n, dtype, x, t, dy)
    print("| round | column | GPU median us | host us per call |\n|---|---|---|---|")
    for r in range(rounds):
        times = H.do_bench_interleaved(calls)
        for col, f in calls.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(50):
                f()
            host = (time.perf_counter() - t0) / 50 * 1e6
            torch.cuda.synchronize()
            print(f"| {r} | {col} | {times[col]['median_ms'] * 1e3:.1f} | {host:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
