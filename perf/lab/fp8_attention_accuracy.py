"""The FP8 attention accuracy study (FA3's outlier test), on the CPU: RMSE of the attention output against the fp64
attention of the unquantized (bf16) inputs, for per-head FP8, block FP8 and block FP8 + Hadamard (the emulated
FA3-style FP8 forward of `cute_kernels.attention.fp8_reference`: e4m3 Q / K / V with their scales, P rounded to
e4m3 before P V) and bf16 attention in torch (SDPA on bf16 CPU tensors). Inputs: N(0, 1), and with outliers 0.1 %
of the entries redrawn from N(0, 10^2).

    python3 -m perf.lab.fp8_attention_accuracy [B H S D] [--causal] [--seeds N] [--gpu]

`--gpu` measures the kernels instead of the emulation: `ck.quantize_attention_fp8` + `ck.flash_attn_fp8` for the
three FP8 columns and our bf16 `ck.flash_attn` for the bf16 one (the decomposition columns stay emulated).

Default B 1, H 4, S 1024, D 128. `--long` adds B 1, H 1, S 8192 (FA3's reported numbers reproduce there: per-head
~2.4e-2, block + Hadamard ~9e-3). The issue's bounds on the outlier inputs: block + Hadamard <= 1.2e-2 and <= 0.5x
per-head FP8. The decomposition columns split the block + Hadamard error: P unrounded, and V unquantized.
"""

from __future__ import annotations

import argparse
import time

import torch


def study(b: int, h: int, s: int, d: int, causal: bool, seed: int, gpu: bool = False) -> dict:
    from cute_kernels.attention import fp8_reference as R

    rows = {}
    for outliers in (False, True):
        t0 = time.perf_counter()
        q, k, v = R.attention_inputs(b, s, h, d, outliers, seed=seed)
        if gpu:
            q, k, v = q.cuda(), k.cuda(), v.cuda()
        ref = R.attention_reference(q, k, v, causal)
        row = {}
        for name, gran, had in (("fp8 per-head", "head", False), ("fp8 block", "block", False),
                                ("fp8 block + hadamard", "block", True)):
            if gpu:
                import cute_kernels as ck

                row[name] = R.rmse(ck.flash_attn_fp8(*ck.quantize_attention_fp8(q, k, v, gran, had), causal=causal),
                                   ref)
                continue
            ops = R.quantize_attention_fp8_reference(q, k, v, gran, had)
            row[name] = R.rmse(R.fp8_attention_reference(*ops, causal=causal), ref)
            if had:
                row["(P unrounded)"] = R.rmse(R.fp8_attention_reference(*ops, causal=causal, round_p=False), ref)
                q8, k8, _, qs, ks, _ = ops
                row["(V exact)"] = R.rmse(R.attention_reference(R.dequantize(q8, qs), R.dequantize(k8, ks),
                                                                v.double(), causal), ref)
        if gpu:
            import cute_kernels as ck

            row["bf16 (torch)"] = R.rmse(ck.flash_attn(q, k, v, causal=causal), ref)
            q, k, v = q.cpu(), k.cpu(), v.cpu()
            ref = ref.cpu()
            ops = R.quantize_attention_fp8_reference(q, k, v, "block", True)
            row["(P unrounded)"] = R.rmse(R.fp8_attention_reference(*ops, causal=causal, round_p=False), ref)
            q8, k8, _, qs, ks, _ = ops
            row["(V exact)"] = R.rmse(R.attention_reference(R.dequantize(q8, qs), R.dequantize(k8, ks), v.double(),
                                                            causal), ref)
        else:
            o16 = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal).transpose(1, 2)
            row["bf16 (torch)"] = R.rmse(o16, ref)
        row["seconds"] = time.perf_counter() - t0
        rows[outliers] = row
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shape", nargs="*", type=int, help="B H S D")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--long", action="store_true", help="also B 1, H 1, S 8192, D 128")
    ap.add_argument("--gpu", action="store_true", help="the kernels on CUDA (bf16 column: ck.flash_attn)")
    a = ap.parse_args(argv)
    shapes = [tuple(a.shape) if a.shape else (1, 4, 1024, 128)] + ([(1, 1, 8192, 128)] if a.long else [])
    cols = ["fp8 per-head", "fp8 block", "fp8 block + hadamard", "bf16 (torch)", "(P unrounded)", "(V exact)"]
    what = "ck.flash_attn_fp8 / ck.flash_attn on " + torch.cuda.get_device_name() if a.gpu else \
        "CPU emulation of the FP8 forward"
    print(f"RMSE of O against fp64 attention of the inputs ({what})")
    if a.gpu:
        cols[3] = "bf16 (ck.flash_attn)"
    print("| B H S D | seed | outliers | " + " | ".join(cols) + " | hadamard / per-head |")
    print("|---" * (len(cols) + 4) + "|")
    for b, h, s, d in shapes:
        for seed in range(a.seeds):
            for outliers, row in study(b, h, s, d, a.causal, seed, a.gpu).items():
                if a.gpu:
                    row[cols[3]] = row.pop("bf16 (torch)")
                ratio = row["fp8 block + hadamard"] / row["fp8 per-head"]
                print(f"| {b} {h} {s} {d} | {seed} | {'yes' if outliers else 'no'} | "
                      + " | ".join(f"{row[c]:.2e}" for c in cols) + f" | {ratio:.2f} |", flush=True)


if __name__ == "__main__":
    main()
