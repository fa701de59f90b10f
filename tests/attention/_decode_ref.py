"""Torch references of decode attention and the attention-state merge (any device), for the CPU and GPU tests."""

from __future__ import annotations

import math

import torch


def gather_cache(cache: torch.Tensor, block_table: torch.Tensor | None, length: int, b: int) -> torch.Tensor:
    """Sequence b's first `length` keys (length, H_kv, D) from a contiguous (B, L, H, D) or paged (P, page, H, D)
    cache."""
    if block_table is None:
        return cache[b, :length]
    page = cache.shape[1]
    pages = block_table[b, :(length + page - 1) // page].long()
    return cache[pages].reshape(-1, *cache.shape[2:])[:length]


def decode_reference(q, k_cache, v_cache, seqlens, block_table=None, causal=False, window=(-1, -1), softcap=0.0,
                     softmax_scale=None, dtype=torch.float32):
    """O (B, q_len, H_q, D) fp32 and LSE (B, H_q, q_len) of q against each sequence's first seqlens[b] keys, every
    op in `dtype` (fp32 / fp64: the reference; the input dtype: what torch gets); masks bottom-right aligned."""
    b, q_len, hq, d = q.shape
    hk = k_cache.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    left, right = window
    if causal:
        right = 0
    outs, lses = [], []
    for i in range(b):
        n = int(seqlens[i])
        k = gather_cache(k_cache, block_table, n, i).to(dtype).repeat_interleave(hq // hk, 1).transpose(0, 1)
        v = gather_cache(v_cache, block_table, n, i).to(dtype).repeat_interleave(hq // hk, 1).transpose(0, 1)
        qh = q[i].to(dtype).transpose(0, 1)  # (H, q_len, D)
        s = (qh @ k.transpose(-1, -2)) * scale
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        t = torch.arange(q_len, device=q.device)[:, None]
        j = torch.arange(n, device=q.device)[None, :]
        ok = torch.ones(q_len, n, dtype=torch.bool, device=q.device)
        if right >= 0:
            ok &= j <= n - q_len + t + right
        if left >= 0:
            ok &= j >= n - q_len + t - left
        s = s.masked_fill(~ok, float("-inf"))
        lse = torch.logsumexp(s.double(), -1).float() if n else torch.full((hq, q_len), float("-inf"))
        lses.append(lse.masked_fill(lse == float("-inf"), float("inf")).to(q.device))
        p = torch.nan_to_num(torch.softmax(s, -1), nan=0.0) if n else s.new_zeros(hq, q_len, 0)
        outs.append((p.to(dtype) @ v).float().transpose(0, 1) if n else torch.zeros(q_len, hq, d, device=q.device))
    return torch.stack(outs), torch.stack(lses)


def merge_reference(o: torch.Tensor, lse: torch.Tensor):
    """The merge of states o (N, B, S, H, D), lse (N, B, H, S) in fp64: (O (B, S, H, D) fp64, LSE (B, H, S))."""
    lse = lse.double()
    empty = torch.isinf(lse)
    lse_t = lse.masked_fill(empty, float("-inf"))  # (N, B, H, S)
    m = lse_t.amax(0)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w = torch.exp(lse_t - m_safe).masked_fill(empty, 0.0)  # (N, B, H, S)
    total = w.sum(0)
    o64 = torch.where(empty.permute(0, 1, 3, 2)[..., None], torch.zeros((), dtype=torch.float64, device=o.device),
                      o.double())
    num = (w.permute(0, 1, 3, 2)[..., None] * o64).sum(0)  # (B, S, H, D)
    den = total.permute(0, 2, 1)[..., None]
    out = torch.where(den > 0, num / den.clamp_min(1e-300), torch.zeros_like(num))
    out_lse = torch.where(total > 0, m_safe + torch.log(total.clamp_min(1e-300)), torch.full_like(total, float("inf")))
    return out, out_lse


FP8_MAX = 448.0


def quantize_cache(cache: torch.Tensor, kind: str):
    """A bf16 / fp16 / fp32 cache (.., H, D) as e4m3 with fp32 dequant scales (x = x8 * s): per head (H,) from the
    whole cache's amax, or per token and head (the cache's shape without D). Returns (cache8, scale)."""
    x = cache.float()
    if kind == "head":
        amax = x.abs().amax(dim=tuple(range(x.dim() - 2)) + (x.dim() - 1,))
        s = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
        return (x / s[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), s
    amax = x.abs().amax(dim=-1)
    s = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    return (x / s[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), s


def dequantize_cache(cache8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The fp32 cache an e4m3 cache and its scales (per head (H,), or per token) stand for."""
    return cache8.float() * (scale[:, None] if scale.dim() == 1 else scale[..., None])
