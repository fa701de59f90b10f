"""Lab: schedules of the streaming kernel (`schedules.w4a16.W4A16Plan`), int4 and dense, per shape, interleaved
against the GEMV-mainloop path (int4) or ck.gemm and cuBLAS (dense): which plans the op should pick."""

import sys

import torch

import cute_kernels as ck
from cute_kernels.bench import harness as H
from cute_kernels.gemv import ops as G
from cute_kernels.w4a16 import ops as W
from schedules.hardware import num_sms
from schedules.w4a16 import W4A16Plan

read = H.read_bandwidth()
sms = num_sms(0)
print(f"read ceiling {read:.3f} TB/s")
INT4 = [(8, 1, 4, 1), (4, 2, 3, 1), (4, 2, 4, 1), (8, 1, 3, 1), (4, 1, 4, 1), (8, 2, 3, 1), (8, 1, 2, 2)]
DENSE = [(8, 1, 2, 1), (4, 1, 4, 1), (4, 1, 2, 2), (8, 1, 3, 1)]
which = sys.argv[1] if len(sys.argv) > 1 else "both"


def report(name, res, nbytes):
    t = sorted(((r["median_ms"], c) for c, r in res.items()))
    print(f"{name}: " + "  ".join(f"{c} {ms * 1e3:.1f}us/{nbytes / ms / 1e9 / read * 100:.0f}%" for ms, c in t))
    sys.stdout.flush()


if which in ("both", "int4"):
    for m, n, k in [(1, 28672, 8192), (1, 8192, 28672), (1, 28672, 4096), (1, 6144, 4096), (1, 4096, 14336),
                    (8, 28672, 8192), (16, 28672, 8192), (16, 4096, 14336)]:
        x, w = H.randn(m, k, seed=1), H.randn(n, k, seed=2) * 0.02
        p, s, _ = ck.pack_int4(w, 128)
        ref = x.float() @ ck.unpack_int4(p, s, None, 128).float().t()
        fns = {}
        for pl in INT4:
            plan = W4A16Plan(*pl)
            y = torch.empty(m, n, dtype=x.dtype, device="cuda")
            W._stream(x, p, s, None, 128, y, sms, plan)
            assert ((y.float() - ref).norm() / ref.norm()).item() < 8e-3, pl
            fns["%dw%dt%ds%dk" % pl] = (lambda y=y, plan=plan: W._stream(x, p, s, None, 128, y, sms, plan))

        def gemv_mma():
            W.STREAM = False
            out = ck.gemm_w4a16(x, p, s, None, 128)
            W.STREAM = True
            return out
        fns["gemv-mma"] = gemv_mma
        report(f"int4 {m}x{n}x{k}", H.do_bench_interleaved(fns, rep_ms=40), n * k / 2 + n * k / 64)

if which in ("both", "dense"):
    for m, n, k in [(1, 4096, 14336), (1, 28672, 4096), (1, 6144, 4096), (1, 4096, 4096)]:
        x, w = H.randn(m, k, seed=1), H.randn(n, k, seed=2)
        ref = x.float() @ w.float().t()
        fns = {}
        for pl in DENSE:
            plan = W4A16Plan(*pl)
            y = G.skinny(x, w, plan=plan)
            assert ((y.float() - ref).norm() / ref.norm()).item() < 8e-3, pl
            fns["%dw%dt%ds%dk" % pl] = (lambda plan=plan: G.skinny(x, w, plan=plan))
        fns["ck.gemm"] = lambda: ck.gemm(x, w.t())
        fns["cuBLAS"] = lambda: x @ w.t()
        report(f"dense {m}x{n}x{k}", H.do_bench_interleaved(fns, rep_ms=40), n * k * 2)
