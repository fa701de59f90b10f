"""INT4 weight packing for the W4A16 GEMM: quantization in groups along K and the register-friendly nibble order.

Quantization of W (N, K) in groups of `group_size` columns (32, 64, 128 or K):
- symmetric: s = amax / 7 over the group (rounded to the weight dtype first), q = clamp(round(w / s), -8, 7), stored
  as the nibble q + 8 with the implicit zero point 8;
- asymmetric (GPTQ's convention): s = (max - min) / 15, z = clamp(round(-min / s), 0, 15), q = clamp(round(w / s)
  + z, 0, 15); stored as q with the zero point z.
The dequantized weight is (q - z) * s rounded once to the weight dtype; `unpack_int4` computes exactly that.
(An all-zero group gets s = 1, so q = z and the weights dequantize to 0.)

Packed layout: int32 (N, K / 8), row-major. K is cut into spans of 32 (one 16-byte vector of four words, what one
lane of the tensor-core kernel loads). In each span, word m (0-3) holds the span's elements 8m .. 8m + 7 with
nibble j (bits 4j .. 4j + 3) = element 8m + 2j for j < 4 and nibble j + 4 = element 8m + 2j + 1: a shift by 4j
and one `lop3` (mask 0x000F000F, or 0x43004300) turn word m into the 16-bit pair (element 8m + 2j, 8m + 2j + 1),
the adjacent pair an MMA fragment register holds (`collectives.int4`).
"""

from __future__ import annotations

import torch

GROUP_SIZES = (32, 64, 128)


def _check_group(k: int, group_size: int) -> int:
    g = k if group_size in (-1, None, k) else int(group_size)
    if g not in GROUP_SIZES and g != k:
        raise ValueError(f"group_size must be 32, 64, 128 or K (= {k}, per channel), got {group_size}")
    if k % 32 or k % g:
        raise ValueError(f"K = {k} must be a multiple of 32 and of group_size {g}")
    return g


def nibble_order(k: int) -> torch.Tensor:
    """perm (K,): packed nibble i (word i // 8, bits 4 (i % 8)) holds element perm[i] of the row."""
    i = torch.arange(k)
    span, w = i // 32, (i % 32) // 8
    j = i % 8
    elem = 8 * w + torch.where(j < 4, 2 * j, 2 * (j - 4) + 1)
    return span * 32 + elem


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """q (N, K) integers in [0, 15] -> int32 (N, K / 8) in the packed order."""
    n, k = q.shape
    perm = nibble_order(k).to(q.device)
    nib = q[:, perm].to(torch.int64).view(n, k // 8, 8)
    shifts = (4 * torch.arange(8, device=q.device, dtype=torch.int64))
    words = (nib << shifts).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def unpack_nibbles(w_packed: torch.Tensor) -> torch.Tensor:
    """int32 (N, K / 8) -> q (N, K) int32 in [0, 15] in element order (the inverse of `pack_nibbles`)."""
    n, kw = w_packed.shape
    k = 8 * kw
    words = w_packed.to(torch.int64) & 0xFFFFFFFF
    shifts = 4 * torch.arange(8, device=w_packed.device, dtype=torch.int64)
    nib = ((words[..., None] >> shifts) & 0xF).view(n, k)
    q = torch.empty_like(nib)
    q[:, nibble_order(k).to(w_packed.device)] = nib
    return q.to(torch.int32)


def pack_int4(w: torch.Tensor, group_size: int = 128, symmetric: bool = True):
    """Quantize W (N, K) (bf16 / fp16 / fp32; the scales take W's dtype, fp32 W gives bf16 scales) to int4 in groups
    along K and pack it: returns (w_packed int32 (N, K / 8), scales (N, K / g), zeros (N, K / g) or None), the
    zero points as integer values in the scales' dtype."""
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        raise ValueError(f"w must be a 2-D (N, K) tensor, got {getattr(w, 'shape', type(w).__name__)}")
    if not w.is_floating_point():
        raise TypeError(f"w must be floating point, got {w.dtype}")
    n, k = w.shape
    g = _check_group(k, group_size)
    sdt = w.dtype if w.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
    wf = w.float().view(n, k // g, g)
    if symmetric:
        amax = wf.abs().amax(-1)
        s = torch.where(amax > 0, amax / 7.0, torch.ones_like(amax)).to(sdt)
        q = torch.clamp(torch.round(wf / s.float()[..., None]), -8, 7) + 8
        zeros = None
    else:
        lo, hi = wf.amin(-1).clamp(max=0), wf.amax(-1).clamp(min=0)
        s = torch.where(hi > lo, (hi - lo) / 15.0, torch.ones_like(hi)).to(sdt)
        z = torch.clamp(torch.round(-lo / s.float()), 0, 15)
        q = torch.clamp(torch.round(wf / s.float()[..., None]) + z[..., None], 0, 15)
        zeros = z.to(sdt)
    return pack_nibbles(q.view(n, k).to(torch.int32)), s, zeros


def unpack_int4(w_packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None = None,
                group_size: int = 128) -> torch.Tensor:
    """The dequantized weight (N, K) in the scales' dtype: (q - z) * s rounded once (z = 8 without zero points)."""
    n, kw = w_packed.shape
    k = 8 * kw
    g = _check_group(k, group_size)
    q = unpack_nibbles(w_packed).float().view(n, k // g, g)
    z = torch.full((n, k // g), 8.0, device=w_packed.device) if zeros is None else zeros.float()
    return ((q - z[..., None]) * scales.float()[..., None]).view(n, k).to(scales.dtype)
