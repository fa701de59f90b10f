"""Which FP8 GEMM schedules fail to launch or compute wrong: each (shape, schedule) in its own process (a launch
failure poisons the CUDA context), checked against the default op (bitwise where the K order is the same, else
DeepGEMM's calc_diff), outputs poisoned with NaN first.

    python3 -m perf.lab.fp8_deep_probe [MxNxK ...]     (default: the fp8_gemm suite's small-M shapes)
    python3 -m perf.lab.fp8_deep_probe --one MxNxK VARIANT
VARIANT: deep (deep_fp8 of the default), default, stages=S (the default with S stages), nointer (no k_interleave).
"""

import dataclasses
import subprocess
from concurrent.futures import ThreadPoolExecutor
import sys

SHAPES = ("64x7168x16384", "64x2112x7168", "64x4096x7168", "32x7168x16384", "16x7168x16384")
VARIANTS = ("default", "deep", "stages=9", "stages=10", "stages=11", "stages=12")


def one(shape: str, variant: str) -> None:
    import torch

    import cute_kernels as ck
    from cute_kernels.fp8_gemm.ops import _fp8_gemm_cuda
    from cute_kernels.bench import harness as H
    from schedules.fp8_gemm import deep_fp8, default_fp8_schedule, fp8_schedule, smem_bytes

    m, n, k = map(int, shape.split("x"))
    d = default_fp8_schedule(m, n, k)
    if variant == "default":
        s = d
    elif variant == "deep":
        s = deep_fp8(d)
    elif variant.startswith("stages="):
        s = dataclasses.replace(d, stages=int(variant[7:]))
    elif variant == "nointer":
        s = fp8_schedule(d.kind, d.tile_m, d.tile_n, cluster_m=d.cluster_m, cluster_n=d.cluster_n)
    else:
        raise SystemExit(f"unknown variant {variant}")
    x, w = H.randn(m, k, seed=1), H.randn(n, k, seed=2)
    a, sa = ck.quantize_1x128(x)
    b, sb = ck.quantize_128x128(w)
    ref = ck.fp8_gemm(a, sa, b, sb)
    torch.cuda.synchronize()
    out = _fp8_gemm_cuda(a, sa, b, sb, schedule=s)
    torch.cuda.synchronize()
    nan = int(out.isnan().sum())
    x64, y64 = out.double(), ref.double()
    diff = float(1 - 2 * (x64 * y64).sum() / (x64 * x64 + y64 * y64).sum())
    print(f"{shape} {variant}: stages {s.stages} smem {smem_bytes(s)} k_interleave {s.k_interleave} a_rows {s.a_rows}"
          f" -> nan {nan}, bitwise {torch.equal(out, ref)}, calc_diff {diff:.2e}", flush=True)


def main(argv):
    if argv[:1] == ["--one"]:
        return one(argv[1], argv[2])
    def run(case):
        shape, v = case
        try:
            r = subprocess.run([sys.executable, "-m", "perf.lab.fp8_deep_probe", "--one", shape, v],
                               capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            return f"{shape} {v}: timed out"
        lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
        ok = [ln for ln in lines if ln.startswith(shape)]
        return ok[-1] if ok else f"{shape} {v}: rc {r.returncode}: " + " | ".join(lines[-3:])[-400:]

    cases = [(shape, v) for shape in (argv or SHAPES) for v in VARIANTS]
    with ThreadPoolExecutor(8) as pool:  # compiles are CPU-bound; the GEMMs are tiny
        for line in pool.map(run, cases):
            print(line, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
