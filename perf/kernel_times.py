"""Where one call's GPU time goes, kernel by kernel: a `perf.probe` target run under torch.profiler
(CUDA activity only), each kernel's mean duration per call, and the GPU's busy time per call (first
kernel start to last kernel end of each busy stretch; idle gaps over 50 us, the host's own time, left
out) beside the kernels' sum: the difference is launch latency between back-to-back kernels.

    python3 -m perf.kernel_times "rmsnorm.bwd bf16 32768 4096" ["quack:rmsnorm.bwd bf16 32768 4096" ...]

Useful where a benchmark's time exceeds its main kernel's ncu duration (the norms' backward: the
fp32 weight-gradient partials summed and cast by torch after the kernel).
"""

from __future__ import annotations

import sys
from collections import defaultdict

import torch


def _target(spec: str):
    """The probe's callable for `spec` ("op dtype shape..."), without running it."""
    from perf.probe import target

    return target(spec.split())[0]


def profile(spec: str, reps: int = 20) -> str:
    f = _target(spec)
    for _ in range(5):
        f()
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprof

    spans, per = [], defaultdict(float)
    with tprof(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            torch.cuda.synchronize()
            f()
            torch.cuda.synchronize()
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.name
           and not e.name.startswith(("cudaDeviceSynchronize", "Memcpy", "Memset"))]
    evs.sort(key=lambda e: e.time_range.start)
    # busy stretches: kernels whose start follows a gap of > 50 us open a new one (a call's own host
    # time can split it, so per-call figures divide by `reps`, not by the stretches)
    groups, cur, last_end = [], [], None
    for e in evs:
        if last_end is not None and e.time_range.start - last_end > 50:
            groups.append(cur)
            cur = []
        cur.append(e)
        last_end = max(last_end or 0, e.time_range.end)
    if cur:
        groups.append(cur)
    for g in groups:
        spans.append(max(e.time_range.end for e in g) - g[0].time_range.start)
        for e in g:
            per[e.name] += (e.time_range.end - e.time_range.start) / reps
    lines = [f"## {spec}: {reps} calls ({len(groups)} busy stretches), GPU busy {sum(spans) / reps:.1f} us per "
             f"call (gaps > 50 us left out), kernels {sum(per.values()):.1f} us"]
    for name, us in sorted(per.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {us:8.1f} us  {name[:110]}")
    return "\n".join(lines)


if __name__ == "__main__":
    for spec in sys.argv[1:]:
        try:
            print(profile(spec), flush=True)
        except Exception as e:  # one target failing should not hide the others
            print(f"## {spec}: {type(e).__name__}: {str(e)[:200]}", flush=True)
