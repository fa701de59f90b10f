"""Exact-arithmetic FP8 GEMM operands and a per-element check (used by tests/fp8_gemm/test_exact_*.py).

DeepGEMM's metric (1 - 2 sum(xy) / sum(x^2 + y^2) < 1e-3) is a global average: a wrong scale on
a few rows or on the last, partial 128-column block of N moves it by less than its bound. These
operands make every element checkable instead:

* the e4m3 values are small integers (|q| <= 3), so each 128-deep block product is an integer
  below 2^11 that the tensor core accumulates exactly (whatever its internal precision beyond
  11 bits);
* the scales are powers of two (2^-6 .. 2^6), independent per (row, K-block) and per (N-block,
  K-block), so the promoted fp32 sum has only fp32 rounding (<= 2^-18 of sum |terms| over <= 60
  K-blocks) and the output only its bf16 rounding (<= 2^-8 relative);
* a scale taken from the wrong row, K-block (pipeline stage) or N-block, or a K-block lost or
  counted twice, changes some elements by a factor of two or more, far outside the bound.

`promoted_reference` is a host mirror of the kernel's arithmetic (fp32 block products, fp32
promotion, bf16 output) for the CPU test that checks the check: it passes the mirror and fails
the mirror with each of those mistakes (tests/fp8_gemm/test_exact_check_cpu.py).
"""

from __future__ import annotations

import torch

E4M3 = torch.float8_e4m3fn
BLOCK = 128
RTOL = 2.0**-7  # bf16 rounding is <= 2^-8 of |ref|; a factor-two margin
ATOL_MAG = 2.0**-16  # of sum |terms|: fp32 promotion rounding is <= 2^-18 of it


def _blocks(x: int) -> int:
    return -(-x // BLOCK)


def int_e4m3(*shape, gen, device, lim: int = 3) -> torch.Tensor:
    return torch.randint(-lim, lim + 1, shape, generator=gen, device=device).float().to(E4M3)


def pow2_scales(*shape, gen, device, span: int = 6) -> torch.Tensor:
    return 2.0 ** torch.randint(-span, span + 1, shape, generator=gen, device=device).float()


def operands(m: int, n: int, k: int, *, device, seed: int = 0, batch: int | None = None):
    """a (m, k), sa (m, KB), b (n, k), sb (NB, KB); with `batch` each has a leading batch dim."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    lead = () if batch is None else (batch,)
    kb = _blocks(k)
    return (int_e4m3(*lead, m, k, gen=gen, device=device), pow2_scales(*lead, m, kb, gen=gen, device=device),
            int_e4m3(*lead, n, k, gen=gen, device=device), pow2_scales(*lead, _blocks(n), kb, gen=gen, device=device))


def _dequant(q: torch.Tensor, rows_scale: torch.Tensor, row_block: int) -> torch.Tensor:
    """fp64 q * scale, scale (rows / row_block, KB) repeated over each row_block x 128 block."""
    r, k = q.shape
    s = rows_scale.double().repeat_interleave(row_block, 0).repeat_interleave(BLOCK, 1)[:r, :k]
    return q.double() * s


def reference(a, sa, b, sb) -> tuple[torch.Tensor, torch.Tensor]:
    """(ref, mag) in fp64: ref = (a * sa) @ (b * sb)^T, mag = |a * sa| @ |b * sb|^T."""
    x, w = _dequant(a, sa, 1), _dequant(b, sb, BLOCK)
    return x @ w.t(), x.abs() @ w.abs().t()


def check(out: torch.Tensor, ref: torch.Tensor, mag: torch.Tensor, what: str = "") -> None:
    """Every element of `out` within its bound of `ref` (NaN: never written)."""
    assert torch.isfinite(out).all(), f"{what}: {(~torch.isfinite(out)).sum().item()} unwritten (NaN) elements"
    err = (out.double() - ref).abs()
    bad = err > RTOL * ref.abs() + ATOL_MAG * mag
    if bad.any():
        idx = bad.nonzero()[0].tolist()
        raise AssertionError(f"{what}: {bad.sum().item()} of {bad.numel()} elements off, first at {idx}: "
                             f"got {out[tuple(idx)].item()}, expected {ref[tuple(idx)].item()}")


def promoted_reference(a, sa, b, sb, *, sa_row_shift=0, sa_stage_shift=0, sb_block_shift=0,
                       k_blocks=None) -> torch.Tensor:
    """Host mirror of the kernel (fp32 block products, fp32 promotion, bf16 out) with optional
    mistakes: A scales from row r + sa_row_shift (mod M), from K-block kb + sa_stage_shift (mod KB),
    B scales from N-block nb + sb_block_shift (clamped), only the first `k_blocks` K-blocks."""
    m, k = a.shape
    n = b.shape[0]
    kbs = _blocks(k)
    acc = torch.zeros(m, n, dtype=torch.float32, device=a.device)
    rows = (torch.arange(m, device=a.device) + sa_row_shift) % m
    nbs = (torch.arange(n, device=a.device) // BLOCK + sb_block_shift).clamp(0, sb.shape[0] - 1)
    for kb in range(kbs if k_blocks is None else k_blocks):
        cols = slice(kb * BLOCK, min(k, (kb + 1) * BLOCK))
        temp = a[:, cols].float() @ b[:, cols].float().t()  # exact: integers < 2^11
        s = sa[rows, (kb + sa_stage_shift) % kbs][:, None] * sb[nbs, kb][None, :]
        acc = acc + temp * s  # one rounding per element, as the kernel's FFMA (temp * s is exact)
    return acc.to(torch.bfloat16)
