"""FP8 forward variants side by side (catalogue config fields of `flash_attn_fp8`): each checked against
`fp8_attention_reference` on a small case (max |O - ref|, LSE), then timed in interleaved rounds
(`harness.do_bench_interleaved`: CUDA-event medians, L2 flushed) at the bench's headline shapes, as TFLOP/s.

    python3 -m perf.lab.fp8_attn_ab [--full] [--head] ["exp2_poly=4" "stages=3" ...]   (no variant: exp2_poly 2 / 4 / 8)

Default: D 128, S 8k, not causal (one compile a variant); `--full` adds causal and D 256. `--head`: every column on
per-head scales (`quantize_attention_fp8(..., "head")`), where K/V blocks need not divide the 128-key scale block
(FA3's FP8 tile at D 128 is 128 x 224: e.g. "tile_n=192,stages=2" "tile_n=224,stages=2"), beside the block-scale
default ("block default", on its own block-quantized inputs).
"""

import sys

import torch

import cute_kernels as ck
from cute_kernels.attention.fp8_ops import _flash_attn_fp8_cuda
from cute_kernels.attention.fp8_reference import fp8_attention_reference
from cute_kernels.bench import harness as H


def parse(spec: str) -> dict:
    """"k=v,k=v" (integer values) as a config dict."""
    return {k: int(v) for k, v in (kv.split("=") for kv in spec.split(",") if kv)}


def check(cfgs: list[dict], granularity: str = "block") -> list[str]:
    """Each config's max |O - ref| on one small case (the reference computed once)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 1000, 2, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    args = ck.quantize_attention_fp8(q, k, v, granularity)
    ref = fp8_attention_reference(*args)
    out = []
    for cfg in cfgs:
        o, lse = _flash_attn_fp8_cuda(*args, config=cfg)
        out.append(f"max|O-ref| {(o.double() - ref).abs().max().item():.2e}, "
                   f"finite {bool(torch.isfinite(o).all() and torch.isfinite(lse).all())}")
    return out


def main(argv):
    full, head = "--full" in argv, "--head" in argv
    gran = "head" if head else "block"
    argv = [a for a in argv if a not in ("--full", "--head")]
    cfgs = [parse(a) for a in argv] or [{"exp2_poly": p} for p in (2, 4, 8)]
    cfgs = [{}] + cfgs
    names = [",".join(f"{k}={v}" for k, v in c.items()) or "default" for c in cfgs]
    for n, line in zip(names, check(cfgs, gran)):
        print(f"{n}: {line}", flush=True)
    cols = names + (["block default"] if head else [])
    print(f"scales: {gran}")
    print("| shape | causal | " + " | ".join(cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    for b, s, h, d in ((2, 8192, 16, 128), (2, 8192, 8, 256))[:2 if full else 1]:
        for causal in (False, True)[:2 if full else 1]:
            g = torch.Generator(device="cuda").manual_seed(1)
            q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
            args = ck.quantize_attention_fp8(q, k, v, gran)
            fns = {n: (lambda c=c: _flash_attn_fp8_cuda(*args, causal=causal, config=c)) for n, c in zip(names, cfgs)}
            if head:
                blk = ck.quantize_attention_fp8(q, k, v, "block")
                fns["block default"] = lambda: _flash_attn_fp8_cuda(*blk, causal=causal, config={})
            ms = {k: r["median_ms"] for k, r in H.do_bench_interleaved(fns).items()}
            flops = 4 * b * h * s * s * d / (2 if causal else 1)
            print(f"| {b}x{s}x{h}x{d} | {causal} | " + " | ".join(f"{flops / ms[n] / 1e9:.0f}" for n in cols) + " |",
                  flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
