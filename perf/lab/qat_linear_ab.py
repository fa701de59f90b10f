"""QATLinear's fake-quant overhead over its GEMM (4096^3 bf16, training mode) with the weight's per-channel observer +
fake-quant in one pass (`ops.ONE_PASS_ROWS`, `qat.observe_rows`: w read once) and in two, with the quantize pass
walking x from its end down (`ops.QUANTIZE_DESCENDING`: it meets what the observer's reduce pass left in L2 first)
and from its start, the one-pass rows with and without the next row's copies in flight (`ops.OBSERVE_ROWS_PREFETCH`),
and the two observed fake-quants alone, all columns in one interleaved run.

    python3 -m perf.lab.qat_linear_ab [M K N]

H100 (2026-12-07): GEMM 187.7 us; QATLinear 257.5 us one-pass (37.2 %), 268.2 two-pass (42.9 %); the activation's
per-tensor observed fake-quant 40.9 us, the weight's 32.3 one-pass / 43.2 two-pass. (Storing the activation's y
evict-first, `st.global.cs`, so that x might stay in L2 between the reduce and quantize passes, left 40.9 us as it
was: dropped.)
"""

from __future__ import annotations

import math
import sys

import torch

from cute_kernels.bench import harness as H


def _with(ops, fn, **flags):
    """fn run with `qat.ops` flags set for the call, their values restored after it."""

    def run():
        saved = {k: getattr(ops, k) for k in flags}
        for k, v in flags.items():
            setattr(ops, k, v)
        try:
            return fn()
        finally:
            for k, v in saved.items():
                setattr(ops, k, v)

    return run


def main(m=4096, k=4096, n=4096):
    import cute_kernels as ck
    from cute_kernels.qat import QATLinear, ops

    lin = QATLinear(k, n, bias=True, device="cuda", dtype=torch.bfloat16).train()
    x = H.randn(m, k, dtype=torch.bfloat16, seed=5).requires_grad_()
    w = lin.weight.detach()
    on = torch.ones(1, dtype=torch.long, device="cuda")

    def state(c):
        f = dict(device="cuda", dtype=torch.float32)
        return [
            torch.full((c,), math.inf, **f),
            torch.full((c,), -math.inf, **f),
            torch.ones(c, **f),
            torch.zeros(c, dtype=torch.int32, device="cuda"),
        ]

    sa, sw = state(1), state(n)
    xd = x.detach().requires_grad_()  # (a leaf of its own: the mask is kept, as in training)
    wd = w.clone().requires_grad_()
    act = lambda: ck.fake_quant_observed(xd, on, on, *sa, 0.01, 0, 255, 0, False, False)  # noqa: E731
    wgt = lambda: ck.fake_quant_observed(wd, on, on, *sw, 0.01, -128, 127, 0, True, True)  # noqa: E731
    cols = {
        "gemm": lambda: ck.gemm(x.detach(), w.t(), lin.bias.detach()),
        "qat one-pass": _with(ops, lambda: lin(x), ONE_PASS_ROWS=True, QUANTIZE_DESCENDING=True),
        "qat one-pass ascending": _with(ops, lambda: lin(x), ONE_PASS_ROWS=True, QUANTIZE_DESCENDING=False),
        "qat one-pass, rows single buffer": _with(ops, lambda: lin(x), ONE_PASS_ROWS=True, OBSERVE_ROWS_PREFETCH=False),
        "qat two-pass": _with(ops, lambda: lin(x), ONE_PASS_ROWS=False, QUANTIZE_DESCENDING=True),
        "act observed": _with(ops, act, QUANTIZE_DESCENDING=True),
        "act observed ascending": _with(ops, act, QUANTIZE_DESCENDING=False),
        "weight observed one-pass": _with(ops, wgt, ONE_PASS_ROWS=True, OBSERVE_ROWS_PREFETCH=True),
        "weight observed one-pass single buffer": _with(ops, wgt, ONE_PASS_ROWS=True, OBSERVE_ROWS_PREFETCH=False),
        "weight observed two-pass": _with(ops, wgt, ONE_PASS_ROWS=False, QUANTIZE_DESCENDING=True),
        "weight observed two-pass ascending": _with(ops, wgt, ONE_PASS_ROWS=False, QUANTIZE_DESCENDING=False),
    }
    t = H.do_bench_interleaved(cols)
    g = t["gemm"]["median_ms"]
    copy_bw = H.copy_bandwidth()
    print(f"QATLinear {m}x{k}x{n} bf16 ({torch.cuda.get_device_name()})")
    print("| column | us | overhead over the GEMM |")
    print("|---|---|---|")
    for name, r in t.items():
        us = 1e3 * r["median_ms"]
        over = f"{100 * (r['median_ms'] / g - 1):.1f} %" if name.startswith("qat") else ""
        print(f"| {name} | {us:.1f} | {over} |")
    print(f"copy bandwidth {copy_bw:.2f} TB/s")


if __name__ == "__main__":
    main(*[int(a) for a in sys.argv[1:4]])
