"""One quick look at `fp8_gemm_grouped_contiguous_swiglu(exchange="local")` (the 128x256 one-CTA tile): its output
against a torch reference on a small shape (dequantized e4m3 output vs silu(gate) * up of the bf16-rounded product:
e4m3's step), then its time at E experts of R rows (H 7168, I 2048), randn data, beside nothing else (compile budget).

    python3 -m perf.lab.glu_local_check [E R]   (default 64 512: moe_ab's T4096 E64 shape, uniform routing)
"""

from __future__ import annotations

import sys

import torch

from cute_kernels.bench import harness as H


def _weights(e, n, k, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.empty(e, n, k, dtype=torch.float8_e4m3fn, device="cuda")
    for j in range(e):
        w[j] = (torch.randn(n, k, generator=g, device="cuda", dtype=torch.bfloat16) * 8).to(torch.float8_e4m3fn)
    s = torch.rand(e, n // 128, k // 128, generator=g, device="cuda") / 448 + 1e-4
    return w, s


def _acts(m, k, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = (torch.randn(m, k, generator=g, device="cuda", dtype=torch.bfloat16) * 8).to(torch.float8_e4m3fn)
    mp = -(-m // 4) * 4
    sa = torch.empty_strided((m, k // 128), (1, mp), dtype=torch.float32, device="cuda")
    sa.copy_(torch.rand(m, k // 128, generator=g, device="cuda") / 448 + 1e-4)
    return a, sa


def check(e=3, rows=(300, 0, 129), i=256, k=512):
    from cute_kernels.fp8_gemm.ops import _glu_contiguous_cuda, contiguous_layout

    idx, spans = contiguous_layout(list(rows))
    idx = idx.cuda()
    a, sa = _acts(idx.numel(), k, 1)
    b, sb = _weights(e, 2 * i, k, 2)
    q, qs = _glu_contiguous_cuda(a, sa, b, sb, idx, exchange="local")
    worst = 0.0
    for x, (r0, n) in enumerate(spans):
        if n == 0:
            continue
        ad = a[r0:r0 + n].float() * sa[r0:r0 + n].repeat_interleave(128, 1)
        bd = b[x].float() * sb[x].repeat_interleave(128, 0).repeat_interleave(128, 1)
        h = (ad @ bd.t()).bfloat16().float()
        y = torch.nn.functional.silu(h[:, :i]) * h[:, i:]
        got = q[r0:r0 + n].float() * qs[r0:r0 + n].repeat_interleave(128, 1)
        err = ((got - y).abs().amax(1) / y.abs().amax(1).clamp_min(1e-30)).max().item()
        worst = max(worst, err)
    return worst


def time_it(e, rows, h=7168, i=2048):
    from cute_kernels.fp8_gemm.ops import _glu_contiguous_cuda, contiguous_layout

    idx, _ = contiguous_layout([rows] * e)
    idx = idx.cuda()
    a, sa = _acts(idx.numel(), h, 3)
    b, sb = _weights(e, 2 * i, h, 4)
    res = H.do_bench(lambda: _glu_contiguous_cuda(a, sa, b, sb, idx, exchange="local"))
    ms = res["median_ms"]
    flops = 2 * e * rows * h * 2 * i
    return ms, flops / ms / 1e9


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    e, rows = (int(argv[0]), int(argv[1])) if argv else (64, 512)
    print(f"local glu vs torch reference: worst row error {check():.4f} of the row amax (e4m3 step 0.0625)", flush=True)
    ms, tf = time_it(e, rows)
    print(f"local glu E{e} rows {rows}: {ms * 1e3:.0f} us, {tf:.0f} TFLOP/s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
