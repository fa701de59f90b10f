"""Torch ops of the FP8 quantizers that feed the FP8 GEMM (lesson 13), and their torch references.

Quantization (`quantize_1x128`, `quantize_128x128`): per block, amax = max |x| (at least 1e-4),
scale = amax / 448 (448 = e4m3's largest finite value), rounded up to a power of two when
`ue8m0=True` (UE8M0 scales: only an exponent); q = e4m3(x * (1 / scale)), round-to-nearest-even,
saturating (|x * (1/scale)| <= 448 by construction, up to one rounding); the dequantized value is
q * scale. The ops run the DSL kernels of `cute_kernels.quantize.kernels` (the math is
`collectives.quantize`); `quantize_*_reference` are the same arithmetic in torch, bitwise equal to
the kernels and identical on CPU and GPU (every division a true division: torch's CUDA
`tensor / python_scalar` multiplies by the rounded reciprocal instead). NaN elements stay NaN and
do not count in their block's amax; a block holding +-inf gets scale inf (its finite elements
quantize to 0, its infinities to NaN).
"""

from __future__ import annotations

import torch

from cute_kernels import dtypes
from cute_kernels.torch_ops import INDEX32_LIMIT, direct_call_ok, register_op

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
BLOCK = 128


def _blocks(x: int) -> int:
    return -(-x // BLOCK)


# --- quantization: torch references and the kernels' ops ----------------------------------------------
def _check_quant_input(name, x):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"{name} has dtype {x.dtype}; supported: bfloat16, float16, float32")
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D, got shape {tuple(x.shape)}")


def _amax(x: torch.Tensor, dim) -> torch.Tensor:
    """max |x| over `dim`, NaN ignored (the kernels' max.f32)."""
    a = x.abs()
    return torch.where(torch.isnan(a), torch.zeros_like(a), a).amax(dim=dim)


def _scale_of(amax: torch.Tensor, ue8m0: bool) -> torch.Tensor:
    # A tensor divisor: a true (correctly rounded) division on every device, as the kernels' div.rn.
    s = amax.float().clamp(min=1e-4) / torch.full_like(amax, E4M3_MAX, dtype=torch.float32)
    if ue8m0:  # 2^ceil(log2 s), on the bits (exact on every device): bump the exponent if any mantissa bit
        bits = s.view(torch.int32)
        exp = (bits >> 23) + ((bits & 0x7FFFFF) != 0).to(torch.int32)
        s = (exp << 23).view(torch.float32)
    return s


def quantize_1x128_reference(x: torch.Tensor, ue8m0: bool = False):
    """(q (M, K) e4m3, sa (M, ceil(K/128)) fp32 in the GEMM's TMA-aligned MN-major layout)."""
    m, k = x.shape
    kb = _blocks(k)
    xp = torch.nn.functional.pad(x.float(), (0, kb * BLOCK - k)).view(m, kb, BLOCK)
    s = _scale_of(_amax(xp, 2), ue8m0)  # (M, KB)
    q = (xp * torch.reciprocal(s).unsqueeze(2)).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).view(m, kb * BLOCK)[:, :k]
    mp = -(-m // 4) * 4
    sa = torch.zeros(kb, mp, dtype=torch.float32, device=x.device)
    sa[:, :m] = s.t()
    return q.contiguous(), sa[:, :m].t()


def quantize_128x128_reference(w: torch.Tensor, ue8m0: bool = False):
    """(q (N, K) e4m3, sb (ceil(N/128), ceil(K/128)) fp32 row-major)."""
    n, k = w.shape
    nb, kb = _blocks(n), _blocks(k)
    wp = torch.nn.functional.pad(w.float(), (0, kb * BLOCK - k, 0, nb * BLOCK - n)).view(nb, BLOCK, kb, BLOCK)
    s = _scale_of(_amax(wp, (1, 3)), ue8m0)  # (NB, KB)
    q = (wp * torch.reciprocal(s).view(nb, 1, kb, 1)).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).view(nb * BLOCK, kb * BLOCK)[:n, :k]
    return q.contiguous(), s.contiguous()


def dequantize_1x128(q: torch.Tensor, sa: torch.Tensor) -> torch.Tensor:
    """fp32 q * sa (sa repeated over each row's 128-column blocks)."""
    return q.float() * sa.repeat_interleave(BLOCK, dim=1)[:, : q.shape[1]]


def dequantize_128x128(q: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
    """fp32 q * sb (sb repeated over each 128 x 128 block)."""
    n, k = q.shape
    return q.float() * sb.repeat_interleave(BLOCK, dim=0).repeat_interleave(BLOCK, dim=1)[:n, :k]


def _quant_1x128_fake(x, ue8m0=False):
    _check_quant_input("x", x)
    m, k = x.shape
    mp = -(-m // 4) * 4
    return (torch.empty(m, k, dtype=E4M3, device=x.device),
            torch.empty_strided((m, _blocks(k)), (1, mp), dtype=torch.float32, device=x.device))


def _quant_128x128_fake(w, ue8m0=False):
    _check_quant_input("w", w)
    n, k = w.shape
    return torch.empty(n, k, dtype=E4M3, device=w.device), torch.empty(_blocks(n), _blocks(k), device=w.device)


_QUANT_CTAS_PER_SM = {"quantize.1x128": 4, "quantize.128x128": 2}  # at the kernels' 64 registers


def _quant_launch(name, x, q, scales, ue8m0):
    """Run kernel `name` on x (R, K) -> q, scales (both allocated by the caller)."""
    from cute_kernels import catalog
    from cute_kernels.quantize import ALIGN_ELEMS
    from schedules.hardware import num_sms

    r, k = x.shape
    if x.stride(1) != 1:
        x = x.contiguous()
    if r == 1:  # a single row: its stride is never followed; give it one the aligned variant accepts
        x = x.as_strided((1, k), (-(-k // ALIGN_ELEMS) * ALIGN_ELEMS, 1))
    aligned = k % ALIGN_ELEMS == 0 and x.stride(0) % ALIGN_ELEMS == 0 and x.data_ptr() % 16 == 0
    index64 = max(r * x.stride(0), r * k) > INDEX32_LIMIT
    # scalar variant: one pass (two took 73 registers, past the 64 the CTA count assumes)
    fn = catalog.get(name).compiled(dtype=dtypes.name_of(x.dtype), aligned=aligned, index64=index64, ue8m0=ue8m0,
                                    passes=2 if aligned else 1)
    fn(x, q, scales, _QUANT_CTAS_PER_SM[name] * num_sms(x.get_device()))


def _quant_1x128_cuda(x, ue8m0=False):
    q, sa = _quant_1x128_fake(x, ue8m0)
    if q.numel():
        _quant_launch("quantize.1x128", x, q, sa, ue8m0)
    return q, sa


def _quant_128x128_cuda(w, ue8m0=False):
    q, sb = _quant_128x128_fake(w, ue8m0)
    if q.numel():
        _quant_launch("quantize.128x128", w, q, sb, ue8m0)
    return q, sb


def _device_checked(fn, name):
    def impl(x, ue8m0=False):
        if isinstance(x, torch.Tensor) and x.device.type != "cuda":
            raise ValueError(f"{name} must be on a CUDA device, got device '{x.device}'")
        return fn(x, ue8m0)

    return impl


register_op("cute_kernels::quantize_1x128", "(Tensor x, bool ue8m0=False) -> (Tensor, Tensor)",
            _quant_1x128_cuda, _device_checked(_quant_1x128_fake, "x"))
register_op("cute_kernels::quantize_128x128", "(Tensor w, bool ue8m0=False) -> (Tensor, Tensor)",
            _quant_128x128_cuda, _device_checked(_quant_128x128_fake, "w"))


def quantize_1x128(x: torch.Tensor, ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations (M, K) bf16/fp16/fp32 -> (e4m3 (M, K), fp32 scales (M, ceil(K/128)) in the
    layout `fp8_gemm` reads without a copy). `ue8m0`: power-of-two scales."""
    if direct_call_ok(x) and x.is_cuda:
        return _quant_1x128_cuda(x, ue8m0)
    return torch.ops.cute_kernels.quantize_1x128(x, ue8m0)


def quantize_128x128(w: torch.Tensor, ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights (N, K) -> (e4m3 (N, K), fp32 scales (ceil(N/128), ceil(K/128)))."""
    if direct_call_ok(w) and w.is_cuda:
        return _quant_128x128_cuda(w, ue8m0)
    return torch.ops.cute_kernels.quantize_128x128(w, ue8m0)
