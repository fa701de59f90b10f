"""The FP8 attention quantizer's CTA shapes side by side: `fp8_attn_quant`'s (threads, cluster) configs on the
`attention_fp8_quant` suite's shapes (block scales, Hadamard), each checked bitwise against the default, timed in
interleaved rounds (`harness.do_bench_interleaved`: CUDA-event medians, L2 flushed), as % of a same-run copy.

    python3 -m perf.lab.fp8_quant_ab ["threads=256,cluster=2" ...]   (no argument: a few per head dim)
"""

import sys

import torch

from cute_kernels.attention import FP8_ATTN_QUANT
from cute_kernels.attention import fp8_reference as R
from cute_kernels.bench import harness as H
from perf.lab.fp8_attn_ab import parse

SHAPES = ((4, 4096, 32, 128), (8, 4096, 16, 64), (2, 8192, 8, 256))
DEFAULT = ({}, {"cluster": 2}, {"threads": 256, "cluster": 2}, {"threads": 256, "cluster": 4},
           {"threads": 256, "cluster": 4, "elems": 16}, {"threads": 256, "cluster": 4, "elems": 32},
           {"elems": 16})


def main(argv):
    cfgs = [parse(a) for a in argv] or list(DEFAULT)
    cfgs = [{}] + [c for c in cfgs if c]
    names = [",".join(f"{k}={v}" for k, v in c.items()) or "default" for c in cfgs]
    print("| shape | copy TB/s | " + " | ".join(f"{n} % copy" for n in names) + " |")
    print("|---|---|" + "---|" * len(names))
    for b, s, h, d in SHAPES:
        x = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
        signs = R.default_signs(d, "cuda")
        nb = (s + 127) // 128
        fns, outs = {}, {}
        for n, c in zip(names, cfgs):
            try:
                fn = FP8_ATTN_QUANT.compiled(dtype="bf16", head_dim=d, mode="block", hadamard=True, index64=False, **c)
            except ValueError as e:
                print(f"{n} at D {d}: {e}")
                continue
            x8 = torch.empty(b, s, h, d, device="cuda", dtype=torch.float8_e4m3fn)
            sc = torch.empty(b, h, nb, device="cuda")
            fns[n] = lambda fn=fn, x8=x8, sc=sc: fn(x, x8, sc, sc, signs)
            fns[n]()
            outs[n] = (x8.view(torch.uint8).clone(), sc.clone())
        same = {n: torch.equal(outs[n][0], outs["default"][0]) and torch.equal(outs[n][1], outs["default"][1])
                for n in outs}
        dst = torch.empty_like(x)
        fns["copy"] = lambda: dst.copy_(x)
        ms = {k: r["median_ms"] for k, r in H.do_bench_interleaved(fns).items()}
        moved = x.numel() * 3  # 2 bytes read, 1 written an element (scales aside)
        copy_bw = 2 * x.numel() * 2 / ms["copy"] / 1e9
        cells = [f"{moved / ms[n] / 1e9 / copy_bw * 100:.1f}{'' if same[n] else ' (DIFFERS)'}" if n in ms else "n/a"
                 for n in names]
        print(f"| {b}x{s}x{h}x{d} | {copy_bw:.3f} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
