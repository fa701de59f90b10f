"""Where the FP8 forward's time goes, by ablation: the same kernel with one piece of its work removed (the results
are wrong on purpose), timed against the intact kernel in interleaved rounds. Each variant's gain bounds what
making that piece free could buy; the pieces' gains need not add up (they overlap).

    python3 -m perf.lab.fp8_attn_ablate [--causal] [--config k=v,...] [B S H D] [variant ...]

`--config`: catalogue config fields of the kernel every variant starts from (e.g. lazy_rescale=0,vt_ldsm=0: the
kernel before those two).

Variants (default: all):
  no_transpose   the transposer warps keep the ring protocol but move no data (V^T stays as it was)
  no_rescale     O is never rescaled (the per-block FMULs of `rescale_rows`)
  no_exp         the probabilities are the exponent's argument (FFMA only, no MUFU ex2)
  no_poly_sum    no row sum either (max and the exponent's FFMA only)
  no_convert     P is not converted to e4m3 (the P V GEMM reads stale registers)
  no_softmax     no softmax at all (no max, exp, sum, convert: the GEMMs, pipelines and barriers alone)

The variants are compiled here with the module-level helpers of `fp8_forward` swapped for cheaper ones during the
trace (never through the compile cache, whose key would not tell them apart).
"""

from __future__ import annotations

import math
import sys

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32

import cute_kernels as ck
from collectives.online_softmax import finite_ref, row_max
from cute_kernels import catalog
from cute_kernels.attention import fp8_forward as F
from cute_kernels.attention import mask_name
from cute_kernels.attention.fp8_ops import _flash_attn_fp8_cuda, _scales_view
from cute_kernels.attention.ops import _bounds, _kernel_view, _scalars
from cute_kernels.bench import harness as H
from cute_kernels.jit import compile_fn
from perf.lab.fp8_attn_ab import parse

VARIANTS = ("no_transpose", "no_rescale", "no_exp", "no_poly_sum", "no_convert", "no_softmax")


@cute.jit
def _no_rescale(o_rows, corr, keep=None, skip_ones: cutlass.Constexpr[bool] = False):
    pass


@cute.jit
def _no_convert(acc, out):
    return out


def _cheap_softmax(exp: bool, total: bool):
    @cute.jit
    def softmax(s_rows, m, lsum, corr, scale_log2, lazy_threshold: cutlass.Constexpr[float] = 0.0, block_scale=None,
                poly_every: cutlass.Constexpr[int] = 0, p_log2_bias=None, sum_scale=None):
        rows = cute.size(s_rows, mode=[0])
        for r in cutlass.range_constexpr(rows):
            raw = cute.arch.warp_reduction_max(row_max(s_rows, r, Float32(-math.inf)), threads_in_group=4)
            mx = cute.arch.fmax(m[r], raw * block_scale) if cutlass.const_expr(block_scale is not None) else \
                cute.arch.fmax(m[r], raw)
            corr[r] = cute.math.exp2(m[r] * scale_log2 - finite_ref(mx) * scale_log2, fastmath=True)
            m[r] = mx
        sc = scale_log2 if cutlass.const_expr(block_scale is None) else scale_log2 * block_scale
        for r in cutlass.range_constexpr(rows):
            ref = finite_ref(m[r]) * scale_log2
            t = Float32(0.0)
            for col in cutlass.range_constexpr(cute.size(s_rows, mode=[1])):
                x = s_rows[r, col] * sc - ref
                if cutlass.const_expr(exp):
                    x = cute.math.exp2(x, fastmath=True)
                s_rows[r, col] = x
                if cutlass.const_expr(total):
                    t = t + x
            lsum[r] = lsum[r] * corr[r] + t
        return cutlass.Boolean(False)  # (lazy callers: never keep)
    return softmax


class _NoTranspose(F.FlashAttnFwdFP8):
    @cute.jit
    def transpose_stage(self, bufs, stage, warp, lane):
        pass  # (the transposer still waits, fences and signals; V^T keeps whatever it held)


class _NoSoftmax(F.FlashAttnFwdFP8):
    @cute.jit
    def block_softmax(self, acc_s, s_rows, tScS, n, row0, tile, row_max, row_sum, corr, sl2, soc, cap, ks, v_ratio,
                      unit, vs=None):
        return cutlass.Boolean(False), unit


def compile_variant(variant: str, p: dict):
    """The kernel of resolved catalogue parameters `p` with `variant`'s piece removed, compiled for sm_90a."""
    saved = {k: getattr(F, k) for k in ("FlashAttnFwdFP8", "rescale_rows", "softmax_rows", "acc_as_a_operand_fp8")}
    try:
        if variant == "no_transpose":
            F.FlashAttnFwdFP8 = _NoTranspose
        elif variant == "no_rescale":
            F.rescale_rows = _no_rescale
        elif variant == "no_exp":
            F.softmax_rows = _cheap_softmax(exp=False, total=True)
        elif variant == "no_poly_sum":
            F.softmax_rows = _cheap_softmax(exp=False, total=False)
        elif variant == "no_convert":
            F.acc_as_a_operand_fp8 = _no_convert
        elif variant == "no_softmax":
            F.FlashAttnFwdFP8 = _NoSoftmax
            F.acc_as_a_operand_fp8 = _no_convert
        elif variant != "intact":
            raise ValueError(f"unknown variant {variant!r}; one of {VARIANTS}")
        kernel, args = catalog.get("flash_attn_fp8").build(p)
        return compile_fn(kernel, args, "sm_90a")
    finally:
        for k, v in saved.items():
            setattr(F, k, v)


def main(argv):
    causal = "--causal" in argv
    argv = [a for a in argv if a != "--causal"]
    cfg = {}
    if "--config" in argv:
        i = argv.index("--config")
        cfg = parse(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    dims = [int(a) for a in argv if a.isdigit()]
    b, s, h, d = dims if dims else (2, 8192, 16, 128)
    variants = [a for a in argv if not a.isdigit()] or list(VARIANTS)
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    q8, k8, v8, qs, ks, vs = ck.quantize_attention_fp8(q, k, v, "block")
    out = torch.empty(b, s, h, d, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(b, h, s, dtype=torch.float32, device="cuda")
    left, right = _bounds(causal, -1, -1, 2 * s)
    spec = catalog.get("flash_attn_fp8")
    p = spec.resolve({"head_dim": d, "mask": mask_name(left, right), "scales": "block", **cfg})
    args = (_kernel_view(q8), _kernel_view(k8), _kernel_view(v8), _kernel_view(out), lse.permute(2, 1, 0),
            _scales_view(qs), _scales_view(ks), _scales_view(vs), *_scalars(d, None, 0.0), left, right)
    fns = {"cached": lambda: _flash_attn_fp8_cuda(q8, k8, v8, qs, ks, vs, causal=causal, config=cfg)}
    for name in ["intact"] + variants:
        fn = compile_variant(name, p)
        fns[name] = lambda fn=fn: fn(*args)
        print(f"compiled {name}", flush=True)
    ms = {n: r["median_ms"] for n, r in H.do_bench_interleaved(fns).items()}
    flops = 4 * b * h * s * s * d / (2 if causal else 1)
    print(f"\n{b}x{s}x{h}x{d} causal={causal}, block scales, config {cfg or 'default'}; gain = intact time / variant "
          "time")
    print("| variant | ms | TFLOP/s | gain |\n|---|---|---|---|")
    for n in fns:
        print(f"| {n} | {ms[n]:.4f} | {flops / ms[n] / 1e9:.0f} | {ms['intact'] / ms[n]:.3f} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
