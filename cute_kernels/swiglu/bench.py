"""The benchmark suite of SiLU / SwiGLU forward and backward (lessons 9, 11).

Same conventions as every suite (`cute_kernels.bench`): ours vs torch eager vs torch.compile, TB/s over the bytes
each op must move, % of the ceiling measured in the same run, ratios (> 1: ours faster). QuACK has none of
these as a standalone op, so there is no peer column.
"""

from __future__ import annotations

import torch

from cute_kernels.bench import harness as H

MiB = 1 << 20


def swiglu(shapes=None, dtypes=(torch.bfloat16,), quick=False, ceilings=None):
    import torch.nn.functional as F

    import cute_kernels as ck

    shapes = shapes or ([(8192, 8192)] if quick else [(4096, 4096), (8192, 8192), (16384, 14336), (32768, 11008)])
    copy_bw = ceilings["copy"]

    def swiglu_bwd_eager(g, u, d):
        g = g.detach().requires_grad_()
        u = u.detach().requires_grad_()
        return torch.autograd.grad(F.silu(g) * u, (g, u), d)

    fwd_eager = lambda g, u: F.silu(g) * u  # noqa: E731
    fwd_compiled = H.compiled(fwd_eager)
    bwd_compiled = H.compiled(swiglu_bwd_eager)
    silu_compiled = H.compiled(F.silu)
    rows = []
    for dt in dtypes:
        for shape in shapes:
            g, u, d = (H.randn(*shape, dtype=dt, seed=s) for s in (14, 15, 16))
            e = g.numel() * g.element_size()
            cases = [
                ("silu.fwd", 2 * e, lambda: ck.silu(g), {"torch": lambda: F.silu(g), "torch.compile": lambda: silu_compiled(g)}),
                ("swiglu.fwd", 3 * e, lambda: ck.swiglu(g, u),
                 {"torch": lambda: fwd_eager(g, u), "torch.compile": lambda: fwd_compiled(g, u)}),
                ("swiglu.bwd", 5 * e, lambda: torch.ops.cute_kernels.swiglu_backward(g, u, d),
                 {"torch": lambda: swiglu_bwd_eager(g, u, d), "torch.compile": lambda: bwd_compiled(g, u, d)}),
            ]
            for case, nbytes, ours, refs in cases:
                H.progress(f"  {case} {H.dtype_name(dt)} {shape}")
                t = H.do_bench(ours)["median_ms"]
                r = {k: H.do_bench(f)["median_ms"] for k, f in refs.items()}
                rows.append(H.Row(case, H.dtype_name(dt), "x".join(map(str, shape)), nbytes, 0, t, r, "copy", copy_bw))
    checks = []
    big = lambda r: r.bytes >= 3 * 64 * MiB  # noqa: E731
    for case, target in (("swiglu.fwd", 95.0), ("silu.fwd", 95.0), ("swiglu.bwd", 85.0)):
        w = H.worst(rows, lambda r: r.case == case and big(r))
        if w:
            checks.append({"target": f"{case} >= {target:.0f}% of copy bandwidth (>= 64 MiB per tensor)",
                           "measured": f"min {w.pct_ceiling:.1f}% ({w.dtype} {w.shape})", "ok": w.pct_ceiling >= target})
    w = min(rows, key=lambda r: r.ratio("torch.compile"))
    checks.append({"target": ">= 0.97x torch.compile", "measured": f"min {w.ratio('torch.compile'):.3f}x "
                   f"({w.case} {w.dtype} {w.shape})", "ok": w.ratio("torch.compile") >= 0.97})
    return rows, ["torch", "torch.compile"], checks, "", {}


SUITES = {"swiglu": swiglu}
PEERS: dict[str, tuple[str, ...]] = {"swiglu": ()}
