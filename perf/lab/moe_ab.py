"""The FP8 MoE layer's pieces timed in one interleaved run: the layer with and without the fused first GEMM
(`fp8_gemm_grouped_contiguous_swiglu`), the fused GEMM under its schedules and both exchanges, the unfused GEMM (default wide tile and
the fused one's 128 x 128 1x2) with `swiglu_quantize`, the one-CTA variant ("local", 128 x 256), the second GEMM, the quantizing dispatch and the combine.

    python3 -m perf.lab.moe_ab [T H I E k ...]   (default: 4096 7168 2048 256 8 and 16384 ... 256 8, 4096 ... 64 8)
"""

from __future__ import annotations

import importlib
import sys

import torch

from cute_kernels.bench import harness as H


def study(t, h, i, e, k):
    import cute_kernels as ck
    from cute_kernels.moe.bench import _experts
    from schedules.fp8_gemm import fp8_schedule

    fo = importlib.import_module("cute_kernels.fp8_gemm.ops")
    mo = importlib.import_module("cute_kernels.moe.ops")
    w13, s13, w2, s2 = _experts(e, h, i)
    router = (H.randn(e, h, seed=4) * 0.05).bfloat16()
    x = H.randn(t, h, seed=5)
    logits = ck.gemm(x, router.t(), out_dtype=torch.float32)
    r = ck.moe_route(logits, k)
    xq, sx = ck.moe_dispatch(x, r, quantize="1x128")
    idx = r.m_indices
    hh = ck.fp8_gemm_grouped_contiguous(xq, sx, w13, s13, idx)
    gq, sg = ck.swiglu_quantize(hh[:, :i], hh[:, i:])
    y = ck.fp8_gemm_grouped_contiguous(gq, sg, w2, s2, idx)
    sq = fp8_schedule("cooperative", 128, 128, cluster_m=1, cluster_n=2)

    rows_t, n_rows = r.token_rows, r.m_indices.shape[0]
    q_buf = torch.empty(n_rows, h, dtype=torch.float8_e4m3fn, device=x.device)
    s_row = torch.empty(n_rows, h // 128, dtype=torch.float32, device=x.device)

    def dispatch_rowmajor(to_m_major):
        # the quantizing dispatch with its scales row-major (each row's scales in one run of sectors) instead of
        # M-major (one sector of 8 rows a K-block: partial sectors written by 8 different tokens' CTAs)
        from cute_kernels.torch_ops import placeholder
        mo._launch("dispatch", x, q_buf, rows_t, placeholder(x.device, (1, k), torch.float32), scales=s_row)
        return fo.tma_aligned_scales(s_row) if to_m_major else s_row

    def dispatch_with(**flags):
        # the quantizing dispatch op with `moe.ops` flags set for the call, their values restored after it
        def f():
            old = {k: getattr(mo, k) for k in flags}
            for k, v in flags.items():
                setattr(mo, k, v)
            try:
                return ck.moe_dispatch(x, r, quantize="1x128")
            finally:
                for k, v in old.items():
                    setattr(mo, k, v)
        return f

    def layer(fused):
        def f():
            mo.FUSED_GLU = fused
            return ck.moe(x, router, w13, s13, w2, s2, k)
        return f

    fns = {
        "layer fused": layer(True),
        "layer unfused": layer(False),
        "gemm1 fused (6 stages)": lambda: fo._glu_contiguous_cuda(xq, sx, w13, s13, idx),
        "gemm1 fused (5 stages)": lambda: fo._glu_contiguous_cuda(
            xq, sx, w13, s13, idx, fp8_schedule("cooperative", 128, 128, cluster_m=1, cluster_n=2, epi_stages=4)),
        "gemm1 fused full exchange": lambda: fo._glu_contiguous_cuda(xq, sx, w13, s13, idx, exchange="full"),
        "gemm1 fused local 128x256": lambda: fo._glu_contiguous_cuda(xq, sx, w13, s13, idx, exchange="local"),
        "gemm1 (default tile)": lambda: fo._contiguous_cuda(xq, sx, w13, s13, idx),
        "gemm1 (128x128 1x2)": lambda: fo._contiguous_cuda(xq, sx, w13, s13, idx, None, sq),
        "swiglu_quantize": lambda: ck.swiglu_quantize(hh[:, :i], hh[:, i:]),
        "gemm2": lambda: fo._contiguous_cuda(gq, sg, w2, s2, idx),
        "dispatch (quantizing)": lambda: ck.moe_dispatch(x, r, quantize="1x128"),
        "dispatch (row-major scales)": lambda: dispatch_rowmajor(False),
        "dispatch (row-major scales + M-major copy)": lambda: dispatch_rowmajor(True),
        "dispatch (bf16)": lambda: ck.moe_dispatch(x, r),
        "dispatch op M-major scales": dispatch_with(DISPATCH_ROW_MAJOR_SCALES=False),
        "dispatch op transpose copy": dispatch_with(DISPATCH_SCALES_COPY="transpose"),
        "combine": lambda: ck.moe_combine(y, r, r.topk_weights),
        "route": lambda: ck.moe_route(logits, k),
        "router gemm": lambda: ck.gemm(x, router.t(), out_dtype=torch.float32),
    }
    res = H.do_bench_interleaved(fns, rep_ms=60, max_reps=60)
    mo.FUSED_GLU = True
    lines = [f"T{t} H{h} I{i} E{e} k{k}: " + ", ".join(f"{n} {v['median_ms'] * 1e3:.0f}" for n, v in res.items())]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    vals = [int(v) for v in argv]
    shapes = [tuple(vals[j:j + 5]) for j in range(0, len(vals), 5)] or [
        (4096, 7168, 2048, 256, 8), (16384, 7168, 2048, 256, 8), (4096, 7168, 2048, 64, 8)]
    for s in shapes:
        print(study(*s), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
