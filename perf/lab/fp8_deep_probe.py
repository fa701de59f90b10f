"""Which FP8 GEMM schedules fail to launch or compute wrong: each (shape, schedule) in its own process (a launch
failure poisons the CUDA context), checked against the default op (bitwise where the K order is the same, else
DeepGEMM's calc_diff) and for NaNs.

    python3 -m perf.lab.fp8_deep_probe [MxNxK ...]     (default: the fp8_gemm suite's small-M shapes)
    python3 -m perf.lab.fp8_deep_probe [--times T] [MxNxK ...] [VARIANT ...]   (each T times back to back)
    python3 -m perf.lab.fp8_deep_probe --one MxNxK VARIANT [T]
    python3 -m perf.lab.fp8_deep_probe --repeat MxNxK   (columns queued back to back: which sequence fails)
Environment: FP8_PROBE_ODD=1 lets odd rings under k_interleave through (refused since they fail), FP8_PROBE_SYNC=1
checks every launch against the default (synchronizing after each).
VARIANT: comma-separated changes to the default schedule: deep (deep_fp8), stages=S, nointer (no k_interleave).
"""

import dataclasses
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

SHAPES = ("64x7168x16384", "64x2112x7168", "64x4096x7168", "32x7168x16384", "16x7168x16384")
VARIANTS = ("default", "deep", "stages=10", "stages=12", "nointer,stages=11")


def allow_odd_rings() -> None:
    """Let odd rings under `k_interleave` past `GemmSchedule`'s check, in this process only (`FP8_PROBE_ODD=1`): to
    show on a GPU that the odd ring, not its size, is what fails (9 stages odd and smaller than the even 10)."""
    import schedules.gemm as g

    check = g.GemmSchedule.__post_init__

    def post(self):
        if self.k_interleave and self.stages % 2:
            object.__setattr__(self, "k_interleave", False)
            check(self)
            object.__setattr__(self, "k_interleave", True)
        else:
            check(self)

    g.GemmSchedule.__post_init__ = post


if os.environ.get("FP8_PROBE_ODD") == "1":
    allow_odd_rings()


def schedule_of(m: int, n: int, k: int, variant: str):
    """The default schedule of (m, n, k) changed by `variant`'s comma-separated modifiers, in order."""
    from schedules.fp8_gemm import deep_fp8, default_fp8_schedule, fp8_schedule

    s = default_fp8_schedule(m, n, k)
    for mod in variant.split(","):
        if mod == "default":
            continue
        if mod == "deep":
            s = deep_fp8(s)
        elif mod.startswith("stages="):
            s = dataclasses.replace(s, stages=int(mod[7:]))
        elif mod == "nointer":
            s = dataclasses.replace(fp8_schedule(s.kind, s.tile_m, s.tile_n, cluster_m=s.cluster_m,
                                                 cluster_n=s.cluster_n), stages=s.stages)
        else:
            raise SystemExit(f"unknown variant {mod}")
    return s


def one(shape: str, variant: str, times: int = 1) -> None:
    import torch

    import cute_kernels as ck
    from cute_kernels.bench import harness as H
    from cute_kernels.fp8_gemm.bench import _diff as calc_diff
    from cute_kernels.fp8_gemm.ops import _fp8_gemm_cuda
    from schedules.fp8_gemm import smem_bytes

    m, n, k = map(int, shape.split("x"))
    s = schedule_of(m, n, k, variant)
    x, w = H.randn(m, k, seed=1), H.randn(n, k, seed=2)
    a, sa = ck.quantize_1x128(x)
    b, sb = ck.quantize_128x128(w)
    ref = ck.fp8_gemm(a, sa, b, sb)
    torch.cuda.synchronize()
    sync, bad = os.environ.get("FP8_PROBE_SYNC") == "1", 0
    for _ in range(times):  # queued back to back, as a benchmark's warm-up rounds (FP8_PROBE_SYNC=1: each checked)
        out = _fp8_gemm_cuda(a, sa, b, sb, schedule=s)
        if sync:
            bad += not torch.equal(out, ref)
    torch.cuda.synchronize()
    nan = int(out.isnan().sum())
    diff = calc_diff(out, ref)
    print(f"{shape} {variant} x{times}: stages {s.stages} smem {smem_bytes(s)} k_interleave {s.k_interleave} a_rows {s.a_rows}"
          f" -> nan {nan}, bitwise {torch.equal(out, ref)}, calc_diff {diff:.2e}"
          + (f", launches not bitwise the default {bad}" if sync else ""), flush=True)


def repeat(shape: str) -> None:
    """The suite's small-M columns queued back to back without synchronizing (as its warm-up rounds do): each alone
    200 times, then each followed by the deep ring, synchronizing and reporting after every stage."""
    import torch

    import cute_kernels as ck
    from cute_kernels.bench import harness as H
    from cute_kernels.fp8_gemm.ops import _fp8_gemm_cuda

    m, n, k = map(int, shape.split("x"))
    x, w = H.randn(m, k, seed=1), H.randn(n, k, seed=2)
    a, sa = ck.quantize_1x128(x)
    b, sb = ck.quantize_128x128(w)
    d, deep, nointer = (schedule_of(m, n, k, v) for v in ("default", "deep", "nointer"))
    cols = {"default": lambda: ck.fp8_gemm(a, sa, b, sb),
            "deep": lambda: _fp8_gemm_cuda(a, sa, b, sb, schedule=deep),
            "plain": lambda: _fp8_gemm_cuda(a, sa, b, sb, promote_overlap=False, sb_ahead=False),
            "nointer": lambda: _fp8_gemm_cuda(a, sa, b, sb, schedule=nointer),
            "ahead": lambda: _fp8_gemm_cuda(a, sa, b, sb, schedule=d, sb_ahead=True),
            "flush": H._flush_l2}
    for f in cols.values():
        f()
    torch.cuda.synchronize()
    stages = [[nm] * 200 for nm in cols] + [[nm, "deep"] * 100 for nm in cols if nm != "deep"]
    for seq in stages:
        print(f"{'+'.join(dict.fromkeys(seq))} x{len(seq)} ...", end=" ", flush=True)
        for nm in seq:
            cols[nm]()
        torch.cuda.synchronize()
        print("ok", flush=True)


def main(argv):
    if argv[:1] == ["--one"]:
        return one(argv[1], argv[2], int(argv[3]) if len(argv) > 3 else 1)
    if argv[:1] == ["--repeat"]:
        return repeat(argv[1])
    def run(case):
        shape, v = case
        try:
            r = subprocess.run([sys.executable, "-m", "perf.lab.fp8_deep_probe", "--one", shape, v, str(times)],
                               capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            return f"{shape} {v}: timed out"
        lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
        ok = [ln for ln in lines if ln.startswith(shape)]
        return ok[-1] if ok else f"{shape} {v}: rc {r.returncode}: " + " | ".join(lines[-3:])[-400:]

    times = 1
    if argv[:1] == ["--times"]:
        times, argv = int(argv[1]), argv[2:]
    variants = [a for a in argv if "x" not in a] or VARIANTS
    cases = [(shape, v) for shape in ([a for a in argv if "x" in a] or SHAPES) for v in variants]
    with ThreadPoolExecutor(8) as pool:  # compiles are CPU-bound; the GEMMs are tiny
        for line in pool.map(run, cases):
            print(line, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
