"""Sustained runs with the SM clock and board power sampled: is a compute-bound kernel limited by
its schedule or by the clock the power cap leaves it?

Each target (a `perf.probe` spec) runs back to back for `--seconds` (after a warm-up of the same
length, so the board reaches its steady power state) while `nvidia-smi` samples `clocks.sm`,
`power.draw` and `power.limit` every 100 ms. Printed per target: the achieved rate (from CUDA
events over the whole stretch, L2 not flushed: the operands of these shapes do not fit in it anyway),
the median SM clock and power while it ran, and the rate per clock: achieved FLOP/s over what the
tensor cores deliver at that clock (dense bf16/fp16 4096 FLOP/clk/SM, fp8 8192; H100/H200 spec
989 / 1979 TFLOP/s at 1.83 GHz). A kernel at 95 % of its clock's peak with the clock well below
the boost is bound by power, not by its pipeline.

    python3 -m perf.clocks [--seconds 3] ["gemm bf16 8192 8192 8192" "torch.mm bf16 8192 8192 8192" ...]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import threading
import time

import torch

DEFAULT = ("gemm bf16 8192 8192 8192", "torch.mm bf16 8192 8192 8192", "quack.gemm bf16 8192 8192 8192",
           "fp8_gemm e4m3 4096 7168 16384", "torch.fp8_gemm e4m3 4096 7168 16384",
           "flash_attn bf16 2 8192 16 128", "fa4.flash_attn bf16 2 8192 16 128")
FLOP_PER_CLK_SM = {"bf16": 4096, "fp16": 4096, "e4m3": 8192}


def _target(spec: str):
    """(callable, FLOPs per call, dtype name) of a `perf.probe` spec (GEMM, FP8 GEMM, attention)."""
    from perf.probe import target

    f, dt, shape = target(spec.split())
    op = spec.split()[0]
    if "flash_attn" in op:
        bsz, s, h, d, causal = shape
        return f, 4 * bsz * h * s * s * d // (2 if causal else 1), dt
    if "gemm" in op or op == "torch.mm":
        m, n, k = shape
        return f, 2 * m * n * k, dt
    raise ValueError(f"not a compute-bound target: {spec!r}")


class _Sampler:
    """nvidia-smi every 100 ms in a background process; `samples` of (clock MHz, power W, limit W)."""

    def __init__(self):
        self.samples, self._stop = [], threading.Event()
        self._p = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,power.limit",
                                    "--format=csv,noheader,nounits", "-lms", "100", "-i", "0"],
                                   stdout=subprocess.PIPE, text=True)
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()
        self.on = False

    def _read(self):
        for line in self._p.stdout:
            if self.on:
                try:
                    self.samples.append(tuple(float(v) for v in line.split(",")))
                except ValueError:
                    pass

    def close(self):
        self._p.terminate()


def _run_for(f, seconds: float) -> tuple[int, float]:
    """Calls of `f` back to back for about `seconds`; (calls, GPU seconds by CUDA events)."""
    f()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    f()
    torch.cuda.synchronize()
    per = max(time.perf_counter() - t0, 1e-5)
    n = max(1, int(seconds / per))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        f()
    end.record()
    end.synchronize()
    return n, start.elapsed_time(end) / 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("targets", nargs="*", default=list(DEFAULT))
    ap.add_argument("--seconds", type=float, default=3.0)
    a = ap.parse_args(argv)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    try:
        smp = _Sampler()
    except OSError as e:
        print(f"nvidia-smi not available ({e}): rates only")
        smp = None
    rows = ["| target | TFLOP/s | SM clock MHz (median, min-max) | power W (median / limit) | "
            "peak at that clock | % of it |", "|---|---|---|---|---|---|"]
    for spec in a.targets:
        try:
            f, flops, dt = _target(spec)
        except Exception as e:  # a peer that is not importable, a refused shape
            print(f"{spec}: {type(e).__name__}: {str(e)[:160]}", flush=True)
            continue
        _run_for(f, a.seconds)  # warm-up: compile, caches, and the board's power state
        if smp:
            smp.samples.clear()
            smp.on = True
        n, secs = _run_for(f, a.seconds)
        if smp:
            smp.on = False
        rate = flops * n / secs
        clk = [s[0] for s in smp.samples] if smp else []
        pw = [s[1] for s in smp.samples] if smp else []
        lim = smp.samples[-1][2] if smp and smp.samples else float("nan")
        if clk:
            mhz = statistics.median(clk)
            peak = FLOP_PER_CLK_SM[dt] * sms * mhz * 1e6
            rows.append(f"| {spec} | {rate / 1e12:.1f} | {mhz:.0f} ({min(clk):.0f}-{max(clk):.0f}) | "
                        f"{statistics.median(pw):.0f} / {lim:.0f} | {peak / 1e12:.0f} | {100 * rate / peak:.1f} |")
        else:
            rows.append(f"| {spec} | {rate / 1e12:.1f} | n/a | n/a | n/a | n/a |")
        print(rows[-1], flush=True)
        torch.cuda.empty_cache()
        time.sleep(1.0)  # let the board cool a little between targets
    if smp:
        smp.close()
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
