"""FP8 quantizer benchmark suite (and the norms' fused FP8 output): `ck.quantize_1x128`
(activations) and `ck.quantize_128x128` (weights) in GB/s against the copy ceiling (bytes: x read
once, e4m3 and fp32 scales written), beside the torch reference (the same rounding, eager) and
torch.compile of it; and RMSNorm with `fp8_out="block128"` against the unfused pipeline
(ck.rms_norm then ck.quantize_1x128) and torch's rms_norm + the reference quantizer."""

from __future__ import annotations

import torch

from cute_kernels.bench import harness as H

MiB = 1 << 20
ACT = [(4096, 7168), (16384, 7168), (32768, 4096), (8192, 2048), (769, 200)]
WGT = [(7168, 7168), (24576, 1536), (4096, 16384), (2112, 7168)]
NORM = [(16384, 4096), (16384, 7168), (4096, 7168)]
QUICK_ACT, QUICK_WGT, QUICK_NORM = [(16384, 7168)], [(7168, 7168)], [(16384, 7168)]


def _bytes(x, q, s) -> int:
    return x.numel() * x.element_size() + q.numel() + s.numel() * 4


def quant(quick=False, ceilings=None, shapes=None):
    import cute_kernels as ck
    from cute_kernels.quantize.ops import quantize_1x128_reference, quantize_128x128_reference

    copy_bw = ceilings["copy"]
    compiled = {"1x128": H.compiled(quantize_1x128_reference),
                "128x128": H.compiled(quantize_128x128_reference)}
    ours = {"1x128": ck.quantize_1x128, "128x128": ck.quantize_128x128}
    eager = {"1x128": quantize_1x128_reference, "128x128": quantize_128x128_reference}
    rows = []
    act, wgt, norm = (QUICK_ACT, QUICK_WGT, QUICK_NORM) if quick else (ACT, WGT, NORM)
    if shapes:  # --shape M K: both quantizers and the fused norm at that shape
        act = wgt = norm = [tuple(s) for s in shapes]
    cases = [("1x128", s) for s in act] + [("128x128", s) for s in wgt]
    for kind, (m, k) in cases:
        x = H.randn(m, k, seed=5)
        H.progress(f"  quantize_{kind} {m}x{k}")
        q, s = ours[kind](x)
        q_ref, s_ref = eager[kind](x)
        exact = torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(s, s_ref)
        del q_ref, s_ref
        t = H.do_bench(lambda: ours[kind](x))["median_ms"]
        refs = {"torch reference": H.do_bench(lambda: eager[kind](x))["median_ms"]}
        try:
            refs["torch.compile"] = H.do_bench(lambda: compiled[kind](x))["median_ms"]
        except Exception as e:  # noqa: BLE001  (a compile failure is a missing column, not a failed suite)
            H.progress(f"    torch.compile failed: {str(e).splitlines()[0][:120]}")
        rows.append(H.Row(f"quantize_{kind}", "bf16", f"{m}x{k}", _bytes(x, q, s), 0, t, refs, "copy", copy_bw,
                          note="bitwise = reference" if exact else "DIFFERS from the reference"))
    for m, n in norm:
        x, w = H.randn(m, n, seed=6), H.randn(n, seed=7)
        H.progress(f"  rms_norm fp8_out=block128 {m}x{n}")
        q, s = ck.rms_norm(x, w, fp8_out="block128")
        t = H.do_bench(lambda: ck.rms_norm(x, w, fp8_out="block128"))["median_ms"]
        refs = {"ck.rms_norm + ck.quantize_1x128": H.do_bench(lambda: ck.quantize_1x128(ck.rms_norm(x, w)))["median_ms"],
                "torch rms_norm + reference": H.do_bench(
                    lambda: quantize_1x128_reference(torch.nn.functional.rms_norm(x, (n,), w, 1e-6)))["median_ms"]}
        rows.append(H.Row("rms_norm_fp8", "bf16", f"{m}x{n}", _bytes(x, q, s) + n * 2, 0, t, refs, "copy", copy_bw,
                          note="fp8_out=block128"))
    checks = []
    big = [r for r in rows if r.case.startswith("quantize") and r.bytes >= 100 * MiB]
    if big:
        worst = min(big, key=lambda r: r.pct_ceiling)
        checks.append({"target": ">= 90% of copy bandwidth (quantizers, >= 100 MiB moved)",
                       "measured": f"min {worst.pct_ceiling:.1f}% ({worst.case} {worst.shape})",
                       "ok": worst.pct_ceiling >= 90.0})
    bad = [r for r in rows if "DIFFERS" in r.note]
    checks.append({"target": "bitwise equal to the torch reference", "measured": f"{len(bad)} shapes differ",
                   "ok": not bad})
    fused = [r for r in rows if r.case == "rms_norm_fp8"]
    if fused:
        worst = min(fused, key=lambda r: r.ratio("ck.rms_norm + ck.quantize_1x128"))
        checks.append({"target": "fused RMSNorm + FP8 faster than norm then quantizer",
                       "measured": f"min {worst.ratio('ck.rms_norm + ck.quantize_1x128'):.2f}x ({worst.shape})",
                       "ok": worst.ratio("ck.rms_norm + ck.quantize_1x128") > 1.0})
    return rows, ["torch reference", "torch.compile", "ck.rms_norm + ck.quantize_1x128",
                  "torch rms_norm + reference"], checks, "", {}


SUITES = {"quant": quant}
PEERS: dict[str, tuple[str, ...]] = {"quant": ()}
