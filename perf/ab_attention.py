"""A/B of attention schedule options against the default, interleaved (`cute_kernels.bench.harness.do_bench_interleaved`):

    python3 -m perf.ab_attention 2 8192 32 64 [causal] late_v_release=True [stages=2 ...]

Each `field=value` is timed as the default schedule with that one field replaced; prints ms and TFLOP/s per column
and the ratio to the default. For options outside `cute-kernels schedules attention`'s list (D = 64's is full)."""

from __future__ import annotations

import sys

import torch

from cute_kernels.bench import harness as H
from perf.probe import schedule_with


def main(argv: list[str]) -> None:
    causal = "causal" in argv
    args = [a for a in argv if a != "causal"]
    b, s, h, d = (int(x) for x in args[:4])
    from cute_kernels.attention.ops import _flash_attn_cuda
    from schedules.attention import default_schedule

    q, k, v = (H.randn(b, s, h, d, seed=i) for i in (1, 2, 3))
    base = default_schedule(d, causal, s)
    cols = {"default": base}
    for kv in args[4:]:
        cols[kv] = schedule_with(base, kv)
    fns = {name: (lambda sc=sc: _flash_attn_cuda(q, k, v, causal, schedule=sc)) for name, sc in cols.items()}
    for name, fn in fns.items():  # compile, and check each option computes the default's bits
        out = fn()
        ref = fns["default"]()
        print(f"{name}: {cols[name]}, bitwise the default: {torch.equal(out[0], ref[0])}")
    res = {n: r["median_ms"] for n, r in H.do_bench_interleaved(fns, rep_ms=100).items()}
    flops = 4 * b * s * s * h * d * (0.5 if causal else 1.0)
    for name, ms in res.items():
        print(f"| {b}x{s}x{h}x{d}{' causal' if causal else ''} | {name} | {ms:.4f} | {flops / ms / 1e9:.1f} | "
              f"{res['default'] / ms:.3f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
