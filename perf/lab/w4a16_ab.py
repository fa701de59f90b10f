"""Lab: the streaming W4A16 kernel against the GEMV-mainloop path (ops.STREAM) and cuBLAS bf16, interleaved, at the
suite's shapes; optional schedule overrides `cw=4,mt=2,st=4` as argv (applied to every shape)."""

import sys

import cute_kernels as ck
from cute_kernels.bench import harness as H
from cute_kernels.w4a16 import ops as W
from schedules import w4a16 as S

shapes = [(1, 28672, 8192), (1, 8192, 28672), (1, 4096, 14336), (1, 6144, 4096), (1, 4096, 4096), (8, 28672, 8192),
          (16, 28672, 8192), (16, 4096, 14336), (32, 28672, 8192), (64, 28672, 8192), (64, 4096, 14336)]
read = H.read_bandwidth()
print(f"read ceiling {read:.3f} TB/s")
for m, n, k in shapes:
    x, w = H.randn(m, k, seed=1), H.randn(n, k, seed=2) * 0.02
    p, s, _ = ck.pack_int4(w, 128)

    def ours(stream):
        def f():
            W.STREAM = stream
            return ck.gemm_w4a16(x, p, s, None, 128)
        return f
    ref = x.float() @ ck.unpack_int4(p, s, None, 128).float().t()
    y = ours(True)()
    err = ((y.float() - ref).norm() / ref.norm()).item()
    fns = {"stream": ours(True), "gemv-mma": ours(False), "cuBLAS bf16": lambda: x @ w.t()}
    res = H.do_bench_interleaved(fns, rep_ms=60)
    W.STREAM = True
    wb = n * k / 2 + m * k * 2 + m * n * 2 + n * k / 128 * 2
    plan, splits, per = S.plan_w4a16(m, n, k, 132)
    t = {c: r["median_ms"] for c, r in res.items()}
    print(f"{m:3d}x{n}x{k}: rel err {err:.1e}  plan {plan.consumer_warps}w{plan.m_tiles}t{plan.stages}s x{splits}  " +
          "  ".join(f"{c} {v * 1e3:7.1f} us ({wb / v / 1e9 / read * 100:5.1f} %)" for c, v in t.items()) +
          f"  stream/cuBLAS {t['cuBLAS bf16'] / t['stream']:.2f}x  stream/gemv {t['gemv-mma'] / t['stream']:.2f}x")
    sys.stdout.flush()

# the dense mode (gemv.stream) against the GEMM op's small-M path and cuBLAS, at the decode layer's projections
from cute_kernels.gemv import ops as G  # noqa: E402

for m, n, k in [(1, 6144, 4096), (1, 4096, 4096), (1, 28672, 4096), (1, 4096, 14336), (4, 6144, 4096),
                (16, 4096, 14336), (1, 8192, 8192)]:
    x, w = H.randn(m, k, seed=1), H.randn(n, k, seed=2)
    err = ((G.skinny(x, w).float() - x.float() @ w.float().t()).norm() / (x.float() @ w.float().t()).norm()).item()
    res = H.do_bench_interleaved({"stream": lambda: G.skinny(x, w), "ck.gemm": lambda: ck.gemm(x, w.t()),
                                  "cuBLAS": lambda: x @ w.t()}, rep_ms=60)
    t = {c: r["median_ms"] for c, r in res.items()}
    wb = n * k * 2 + m * k * 2 + m * n * 2
    print(f"dense {m}x{n}x{k}: rel err {err:.1e}  " +
          "  ".join(f"{c} {v * 1e3:7.1f} us ({wb / v / 1e9 / read * 100:5.1f} %)" for c, v in t.items()))
    sys.stdout.flush()
