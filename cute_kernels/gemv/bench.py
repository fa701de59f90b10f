"""The benchmark suite of GEMV (lesson 3): bytes counted are W's only (x and y are < 0.1% of them).

Same conventions as every suite (`cute_kernels.bench`): ours vs torch eager vs torch.compile, TB/s over the bytes
each op must move, % of the ceiling measured in the same run, ratios (> 1: ours faster). QuACK has none of
these as a standalone op, so there is no peer column.
"""

from __future__ import annotations

import torch

from cute_kernels.bench import harness as H

MiB = 1 << 20


GEMV_MMA = "ours tensor cores"  # cute_kernels.gemv.mma where the op's default is the FMA kernel
GEMV_FMA = "ours FMA kernel"  # cute_kernels.gemv.kernels where the default is the tensor-core one


def gemv(shapes=None, dtypes=(torch.bfloat16,), quick=False, ceilings=None):
    import cute_kernels as ck
    from cute_kernels.gemv.ops import _gemv_cuda
    from schedules.gemv import use_tensor_cores
    from schedules.hardware import num_sms

    shapes = shapes or ([(4096, 4096), (16384, 16384)] if quick else
                        [(4096, 4096), (8192, 8192), (16384, 16384), (14336, 4096), (4096, 14336), (1024, 16384)])
    cols = (1, 8) if quick else (1, 2, 4, 8)
    copy_bw = ceilings["copy"]
    compiled = H.compiled(lambda w, x: w @ x)
    rows = []
    for dt in dtypes:
        for n, k in shapes:
            w = H.randn(n, k, dtype=dt, seed=11)
            for b in cols:
                x = H.randn(b, k, dtype=dt, seed=12).t()  # (K, B) with contiguous columns
                H.progress(f"  gemv {H.dtype_name(dt)} {n}x{k} B={b}")
                t = H.do_bench(lambda: ck.gemv(w, x))["median_ms"]
                refs = {"torch": H.do_bench(lambda: w @ x)["median_ms"],
                        "torch.compile": H.do_bench(lambda: compiled(w, x))["median_ms"]}
                # the other kernel of the op at this B (decides `schedules.gemv.MMA_MIN_COLS`)
                alt = GEMV_FMA if use_tensor_cores(n, b, num_sms()) else GEMV_MMA
                refs[alt] = H.do_bench(lambda: _gemv_cuda(w, x, tensor_cores=alt == GEMV_MMA))["median_ms"]
                rows.append(H.Row("gemv", H.dtype_name(dt), f"{n}x{k} B={b}", w.numel() * w.element_size(),
                                  2 * n * k * b, t, refs, "copy", copy_bw))
    checks = []
    square = H.worst(rows, lambda r: r.shape.split(" ")[0] in ("4096x4096", "8192x8192", "16384x16384"))
    if square:
        checks.append({"target": ">= 90% of copy bandwidth (bytes of W), W 4096-16384 square",
                       "measured": f"min {square.pct_ceiling:.1f}% ({square.dtype} {square.shape})",
                       "ok": square.pct_ceiling >= 90.0})
    for alt in (GEMV_MMA, GEMV_FMA):
        geo, sel = H.option_speedup(rows, alt)
        if sel:
            checks.append({"target": f"{alt} faster than ours (geomean of {len(sel)}; decides use_tensor_cores)",
                           "measured": f"{geo:.3f}x", "ok": geo > 1.0})
    extra = ""
    if square:  # context for the 4096^2 rows: what a copy of W's bytes reaches at that size
        sel = [r for r in rows if r.shape.endswith("B=1")]
        extra = "## B = 1 beside a copy of the same bytes (W)\n\n" + H.same_bytes_copy(sel, lambda r: r.bytes, copy_bw)
    return rows, ["torch", "torch.compile", GEMV_MMA, GEMV_FMA], checks, extra, {}


SUITES = {"gemv": gemv}
PEERS: dict[str, tuple[str, ...]] = {"gemv": ()}
