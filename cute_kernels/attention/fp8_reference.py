"""Torch references of FP8 attention's quantization side (FA3's FP8 path), and an emulation of the FP8 forward.

- `hadamard_reference(x, signs)`: the orthogonal Walsh-Hadamard transform along the last dim (Sylvester order,
  H[i, j] = (-1)^popcount(i & j) / sqrt(D)), optionally of x * signs (the randomized H diag(s)). fp32 math in the
  kernel's order (butterflies of stride 1, 2, 4, ..., D/2, then one multiply by RN(1 / sqrt(D))), one rounding to
  x's dtype: bitwise what `ck.hadamard` computes.
- `quantize_attention_fp8_reference(q, k, v, granularity, hadamard, signs)`: e4m3 q8, k8, v8 and fp32 dequant
  multipliers, per head (B, H) or per 128-row block of one head (B, H, ceil(S / 128)). The scale rule is the FP8
  GEMM quantizers' (`cute_kernels.quantize.ops._amax` / `_scale_of`, `collectives.quantize` in the kernels):
  scale = max(amax, 1e-4) / 448, q = e4m3(x * (1 / scale)). With `hadamard`, q and k are rotated by the same
  H diag(s) first (Q H (K H)^T = Q K^T: the attention needs no inverse) and quantized from the fp32 rotation, with
  no rounding to 16 bits between; v is not rotated.
- `fp8_attention_reference(...)`: what an FA3-style FP8 forward computes from those operands, in fp64: S = (q8 k8^T)
  x q_scale x k_scale x softmax_scale (scales per head or per 128-row / 128-key block), the exact row max, P =
  exp(S - rowmax) in [0, 1] rounded to e4m3 without extra scaling (FA3: P goes into the FP8 P V GEMM as is), the
  row sum of the unrounded P (FA3 sums the fp32 exponentials), O = (P8 v8) x v_scale / rowsum with v's scale
  applied per 128-key block. Causal (bottom-right aligned) and GQA.

`DEFAULT_SIGNS_SEED` seeds the default sign vector (`default_signs`): a torch.Generator on the CPU seeded with it
draws D values in {0, 1} (`torch.randint`), mapped to +-1. The same D gives the same vector on every device and run.
"""

from __future__ import annotations

import math

import torch

from cute_kernels.quantize.ops import _amax, _scale_of

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
BLOCK = 128  # rows (sequence positions) of one head per block scale
HADAMARD_DIMS = (64, 128, 256)
DEFAULT_SIGNS_SEED = 20240711  # FA3's FP8 path was released July 2024; any fixed seed would do
GRANULARITIES = ("head", "block")


def blocks(s: int) -> int:
    """128-row blocks of a sequence of s rows."""
    return -(-s // BLOCK)


def default_signs(d: int, device="cpu") -> torch.Tensor:
    """The fixed +-1 vector (d,) fp32 that `hadamard=True` uses when no signs are given (seed `DEFAULT_SIGNS_SEED`)."""
    g = torch.Generator(device="cpu")
    g.manual_seed(DEFAULT_SIGNS_SEED)
    bits = torch.randint(0, 2, (d,), generator=g)
    return (bits * 2 - 1).to(torch.float32).to(device)


def hadamard_scale(d: int) -> torch.Tensor:
    """RN_fp32(1 / sqrt(d)): the normalization both the kernel and the reference multiply by (exact for 64, 256)."""
    return torch.tensor(1.0 / math.sqrt(d), dtype=torch.float32)


def hadamard_fp32(x: torch.Tensor, signs: torch.Tensor | None = None) -> torch.Tensor:
    """The normalized (randomized) Hadamard transform of x along its last dim, in fp32, not rounded."""
    d = x.shape[-1]
    y = x.float()
    if signs is not None:
        y = y * signs.to(device=y.device, dtype=torch.float32)
    lead = y.shape[:-1]
    h = 1
    while h < d:  # the butterfly of stride h: (a, b) -> (a + b, a - b) for elements i, i + h with i & h == 0
        z = y.reshape(*lead, d // (2 * h), 2, h)
        a, b = z[..., 0, :], z[..., 1, :]
        y = torch.stack((a + b, a - b), dim=-2).reshape(*lead, d)
        h *= 2
    return y * hadamard_scale(d).to(y.device)


def hadamard_reference(x: torch.Tensor, signs: torch.Tensor | None = None) -> torch.Tensor:
    """`ck.hadamard`'s result: `hadamard_fp32` rounded once to x's dtype."""
    return hadamard_fp32(x, signs).to(x.dtype)


def hadamard_matrix(d: int, dtype=torch.float64) -> torch.Tensor:
    """The normalized Sylvester Hadamard matrix H (d, d): x @ H is the transform of x's rows."""
    i = torch.arange(d)
    bits = i[:, None] & i[None, :]
    pop = torch.zeros_like(bits)
    while bool(bits.any()):
        pop += bits & 1
        bits = bits >> 1
    return (1 - 2 * (pop % 2)).to(dtype) / math.sqrt(d)


# --- quantization ----------------------------------------------------------------------------------------------------
def block_amax(x32: torch.Tensor) -> torch.Tensor:
    """max |x| (NaN ignored) of each 128-row block of each head of x (B, S, H, D) fp32: (B, H, ceil(S / 128))."""
    b, s, h, d = x32.shape
    nb = blocks(s)
    xp = torch.nn.functional.pad(x32, (0, 0, 0, 0, 0, nb * BLOCK - s)).view(b, nb, BLOCK, h, d)
    return _amax(xp, (2, 4)).permute(0, 2, 1).contiguous()


def scale_rows(scale: torch.Tensor, s: int) -> torch.Tensor:
    """The dequant multiplier of every row: (B, H) or (B, H, ceil(S / 128)) scales as (B, H, S)."""
    if scale.dim() == 2:
        return scale[:, :, None].expand(*scale.shape, s)
    return scale.repeat_interleave(BLOCK, dim=2)[:, :, :s]


def quantize_fp8_reference(x32: torch.Tensor, granularity: str):
    """(x8 (B, S, H, D) e4m3, scale (B, H) or (B, H, ceil(S / 128)) fp32) of fp32 values x32 (B, S, H, D)."""
    amax = block_amax(x32)
    if granularity == "head":  # no rows (S = 0): amax 0, the floor's scale
        amax = amax.amax(dim=2) if amax.shape[2] else amax.new_zeros(amax.shape[:2])
    scale = _scale_of(amax, False)
    inv = scale_rows(torch.reciprocal(scale), x32.shape[1]).permute(0, 2, 1)[..., None]  # (B, S, H, 1)
    x8 = (x32 * inv).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return x8.contiguous(), scale.contiguous()


def check_signs(signs: torch.Tensor, d: int) -> None:
    """Named errors for a signs vector that is not (d,) of a float or int8 dtype (its values are not read)."""
    if not isinstance(signs, torch.Tensor):
        raise TypeError(f"signs must be a torch.Tensor or None, got {type(signs).__name__}")
    if signs.dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8):
        raise TypeError(f"signs has dtype {str(signs.dtype).replace('torch.', '')}; supported: a float dtype or int8")
    if signs.shape != (d,):
        raise ValueError(f"signs must have shape ({d},) (the head dim), got {tuple(signs.shape)}")


def quantize_attention_fp8_reference(q, k, v, granularity: str = "head", hadamard: bool = False, signs=None):
    """(q8, k8, v8, q_scale, k_scale, v_scale): see the module docstring."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    qf, kf, vf = q.float(), k.float(), v.float()
    if hadamard:
        d = q.shape[-1]
        if signs is None:
            signs = default_signs(d, q.device)
        check_signs(signs, d)
        qf, kf = hadamard_fp32(qf, signs), hadamard_fp32(kf, signs)
    (q8, qs), (k8, ks), (v8, vs) = (quantize_fp8_reference(t, granularity) for t in (qf, kf, vf))
    return q8, k8, v8, qs, ks, vs


def dequantize(x8: torch.Tensor, scale: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
    """x8 * scale (B, S, H, D) in `dtype`."""
    return x8.to(dtype) * scale_rows(scale.to(dtype), x8.shape[1]).permute(0, 2, 1)[..., None]


# --- attention -------------------------------------------------------------------------------------------------------
def _heads_first(x: torch.Tensor, groups: int, dtype) -> torch.Tensor:
    """(B, S, H, D) -> (B, H * groups, S, D) in `dtype` (GQA: each K/V head repeated for its query heads)."""
    return x.to(dtype).permute(0, 2, 1, 3).repeat_interleave(groups, dim=1)


def _causal_mask(sq: int, sk: int, device) -> torch.Tensor:
    """True where query i may not see key j (bottom-right aligned: j > i + sk - sq)."""
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    return j > i + (sk - sq)


def attention_reference(q, k, v, causal: bool = False, softmax_scale: float | None = None, dtype=torch.float64):
    """softmax(scale Q K^T) V of unquantized (B, S, H, D) tensors in `dtype`, GQA, causal; (B, S_q, H_q, D)."""
    hq, hk, d = q.shape[2], k.shape[2], q.shape[3]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    qq, kk, vv = q.to(dtype).permute(0, 2, 1, 3), _heads_first(k, hq // hk, dtype), _heads_first(v, hq // hk, dtype)
    s = (qq @ kk.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(_causal_mask(q.shape[1], k.shape[1], q.device), float("-inf"))
    p = torch.softmax(s, dim=-1)
    return (p @ vv).permute(0, 2, 1, 3)


def fp8_attention_reference(q8, k8, v8, q_scale, k_scale, v_scale, causal: bool = False,
                            softmax_scale: float | None = None, round_p: bool = True):
    """The FA3-style FP8 forward (module docstring) in fp64: (B, S_q, H_q, D) fp64. `round_p=False` keeps P
    unrounded (what the quantized operands alone cost)."""
    f64 = torch.float64
    b, sq, hq, d = q8.shape
    sk, hk = k8.shape[1], k8.shape[2]
    g = hq // hk
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    qs = scale_rows(q_scale.to(f64), sq)  # (B, Hq, Sq)
    ks = scale_rows(k_scale.to(f64), sk).repeat_interleave(g, dim=1)  # (B, Hq, Sk)
    vs = scale_rows(v_scale.to(f64), sk).repeat_interleave(g, dim=1)
    qq, kk, vv = q8.to(f64).permute(0, 2, 1, 3), _heads_first(k8, g, f64), _heads_first(v8, g, f64)
    s = (qq @ kk.transpose(-1, -2)) * qs[..., :, None] * ks[..., None, :] * scale
    if causal:
        s = s.masked_fill(_causal_mask(sq, sk, q8.device), float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # a row that sees no key: P = 0, O = 0
    p = torch.exp(s - m)
    if round_p:
        p32 = p.to(torch.float32)  # the kernel's fp32 exponentials: summed as they are, rounded to e4m3 for P V
        rowsum = p32.to(f64).sum(dim=-1, keepdim=True)
        p = p32.to(E4M3).to(f64)
    else:
        rowsum = p.sum(dim=-1, keepdim=True)
    o = (p * vs[..., None, :]) @ vv  # v's scale per key (per 128-key block, or per head)
    o = o / torch.where(rowsum > 0, rowsum, torch.ones_like(rowsum))
    return o.permute(0, 2, 1, 3)


def rmse(out: torch.Tensor, ref: torch.Tensor) -> float:
    """sqrt(mean((out - ref)^2)) in fp64: FA3's accuracy metric."""
    return (out.double() - ref.double()).pow(2).mean().sqrt().item()


def attention_inputs(b: int, s: int, h: int, d: int, outliers: bool, hk: int | None = None, seed: int = 0,
                     dtype=torch.bfloat16, outlier_fraction: float = 1e-3, outlier_std: float = 10.0):
    """FA3's accuracy test inputs: q (B, S, H, D), k, v (B, S, Hk, D) drawn from N(0, 1), and with `outliers` a
    fraction (0.1 %) of the entries of each replaced by draws from N(0, outlier_std^2); rounded to `dtype`."""
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    hk = hk or h
    out = []
    for heads in (h, hk, hk):
        x = torch.randn(b, s, heads, d, generator=g)
        if outliers:
            pick = torch.rand(x.shape, generator=g) < outlier_fraction
            x = torch.where(pick, torch.randn(x.shape, generator=g) * outlier_std, x)
        out.append(x.to(dtype))
    return tuple(out)


def accuracy_table(b: int = 1, h: int = 4, s: int = 1024, d: int = 128, causal: bool = False, seed: int = 0):
    """{outliers: {method: RMSE of O against the fp64 attention of the (bf16) inputs}} for FA3's test: per-head FP8,
    block FP8, block FP8 + Hadamard (the emulated FP8 forward), and bf16 attention in torch (SDPA on bf16 tensors)."""
    table = {}
    for outliers in (False, True):
        q, k, v = attention_inputs(b, s, h, d, outliers, seed=seed)
        ref = attention_reference(q, k, v, causal)
        row = {}
        for name, gran, had in (("fp8 per-head", "head", False), ("fp8 block", "block", False),
                                ("fp8 block + hadamard", "block", True)):
            ops = quantize_attention_fp8_reference(q, k, v, gran, had)
            row[name] = rmse(fp8_attention_reference(*ops, causal=causal), ref)
        o16 = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal).transpose(1, 2)
        row["bf16 (torch)"] = rmse(o16, ref)
        table[outliers] = row
    return table
