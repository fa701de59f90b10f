"""Structured probes of `ck.flash_attn_fp8` that split its error by stage (one head, per-head scales of 1):

  uniform  Q = 0: every P is 1, so O is the mean of V's rows: only the V^T path (TMA, transpose, P V) counts.
  onehot   V[key, e] = (key == e): O[r, e] = P[r, e] / l: P's key order in the A operand, column by column (the
           printed key of a column is the reference column nearest in value: a hint, ambiguous where P values tie).
  random   randn-like e4m3 operands against `fp8_attention_reference` (O and LSE).

    python -m perf.lab.fp8_attn_probe [D] [S_k]
"""

import sys

import torch

import cute_kernels as ck
from cute_kernels.attention.fp8_reference import fp8_attention_reference

E4M3 = torch.float8_e4m3fn


def run(q8, k8, v8):
    ones = torch.ones(1, 1, device="cuda", dtype=torch.float32)
    out, lse = ck.flash_attn_fp8(q8, k8, v8, ones, ones, ones, return_lse=True)
    ref = fp8_attention_reference(q8, k8, v8, ones, ones, ones)
    return out.double(), ref, lse


def main(d=128, sk=128, sq=128):
    torch.manual_seed(0)
    rnd = lambda s: (torch.randn(1, s, 1, d, device="cuda") * 0.5).to(E4M3)  # noqa: E731
    q0 = torch.zeros(1, sq, 1, d, device="cuda").to(E4M3)
    out, ref, _ = run(q0, rnd(sk), (v := rnd(sk)))
    print(f"uniform: max err {(out - ref).abs().max().item():.3e} (|O| max {ref.abs().max().item():.3e})")
    bad = (out - ref).abs()[0, :, 0, :] > 1e-2
    print("  bad (row, col) count", int(bad.sum()), "first cols of row 0:", bad[0].nonzero().flatten()[:16].tolist())
    if d >= sk:
        eye = torch.zeros(1, sk, 1, d, device="cuda")
        eye[0, torch.arange(sk), 0, torch.arange(sk)] = 1
        out, ref, _ = run(rnd(sq), rnd(sk), eye.to(E4M3))
        o, r = out[0, 0, 0, :sk], ref[0, 0, 0, :sk]
        print(f"onehot: max err {(out - ref).abs().max().item():.3e}")
        # which key's P landed in column e: match by value on row 0
        match = [int((r - o[e]).abs().argmin()) for e in range(min(sk, 32))]
        print("  row 0 column e holds key:", match)
    out, ref, lse = run(rnd(sq), rnd(sk), rnd(sk))
    print(f"random: max err {(out - ref).abs().max().item():.3e} (|O| max {ref.abs().max().item():.3e}), "
          f"lse finite {bool(torch.isfinite(lse).all())}")


if __name__ == "__main__":
    a = [int(x) for x in sys.argv[1:]]
    main(*a)
