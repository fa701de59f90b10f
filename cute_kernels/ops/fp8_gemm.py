"""Torch ops of lesson 13: the FP8 block-scaled GEMM and the quantizers that feed it.

    x_q, sa = ck.quantize_1x128(x)          # activations (M, K): one scale per row per 128 columns
    w_q, sb = ck.quantize_128x128(w)        # weights (N, K): one scale per 128 x 128 block
    y = ck.fp8_gemm(x_q, sa, w_q, sb)       # (M, N) bf16 = (x_q * sa) @ (w_q * sb)^T

Shapes and layouts (validated, errors name the argument):

* a (M, K) and b (N, K): float8_e4m3fn, unit stride along K (b is the weight as stored by
  nn.Linear, "NT"). Other layouts, or K not a multiple of 16, are copied first (zero-padded in K).
* sa (M, ceil(K/128)) float32. The kernel reads it MN-major with the column stride a multiple of 4
  ("TMA-aligned", `tma_aligned_scales`); `quantize_1x128` returns it that way already, any other
  layout is copied into it (M x K/128 x 4 bytes: small beside A).
* sb (ceil(N/128), ceil(K/128)) float32, any strides.
* the result is a new (M, N) tensor of `out_dtype` (bf16 by default, or fp16), fp32 accumulation
  promoted every 128 K (see `collectives.wgmma_mainloop.mma_k_tiles_promoted`).

Quantization (`quantize_1x128`, `quantize_128x128`): per block, amax = max |x| (at least 1e-4),
scale = amax / 448 (448 = e4m3's largest finite value), rounded up to a power of two when
`ue8m0=True` (UE8M0 scales: only an exponent); q = e4m3(x * (1 / scale)), round-to-nearest-even,
saturating (|x * (1/scale)| <= 448 by construction, up to one rounding); the dequantized value is
q * scale. The ops run the DSL kernels of `cute_kernels.kernels.quantize` (the math is
`collectives.quantize`); `quantize_*_reference` are the same arithmetic in torch, bitwise equal to
the kernels and identical on CPU and GPU (every division a true division: torch's CUDA
`tensor / python_scalar` multiplies by the rounded reciprocal instead). NaN elements stay NaN and
do not count in their block's amax; a block holding +-inf gets scale inf (its finite elements
quantize to 0, its infinities to NaN).
"""

from __future__ import annotations

import torch

from cute_kernels import dtypes
from cute_kernels.ops._checks import INDEX32_LIMIT, call, direct_call_ok, register_op

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
BLOCK = 128
OUT_TORCH = (torch.bfloat16, torch.float16)
_fns: dict[tuple, tuple] = {}


def _blocks(x: int) -> int:
    return -(-x // BLOCK)


def _check_operand(name, t, dims: str):
    """An e4m3 CUDA tensor with the dims named in `dims` ("M, K", "E, N, K", ...)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cuda":
        raise ValueError(f"{name} must be on a CUDA device, got device '{t.device}'")
    if t.dtype != E4M3:
        raise TypeError(f"{name} has dtype {t.dtype}; expected torch.float8_e4m3fn (quantize it with "
                        f"ck.quantize_1x128 / ck.quantize_128x128)")
    if t.dim() != dims.count(",") + 1:
        raise ValueError(f"{name} must be {dims.count(',') + 1}-D ({dims}), got shape {tuple(t.shape)}")


def _check_aux(name, t, dtype, shape, what, device):
    """A side tensor (scales, expert ids, counts) of an exact dtype and shape on a's device."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name} has dtype {t.dtype}; expected {dtype} ({what})")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape} ({what}), got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but a is on {device}")


def _check_scale(name, s, shape, what, device):
    _check_aux(name, s, torch.float32, shape, what, device)


def _check(a, sa, b, sb, out_dtype):
    _check_operand("a", a, "M, K")
    _check_operand("b", b, "N, K")
    if a.device != b.device:
        raise ValueError(f"a is on {a.device} but b is on {b.device}")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"a {tuple(a.shape)} and b {tuple(b.shape)}: K differs ({a.shape[1]} vs {b.shape[1]}); "
                         "b is (N, K), the weight as stored")
    m, k = a.shape
    n = b.shape[0]
    _check_scale("sa", sa, (m, _blocks(k)), "one per row of a per 128 columns", a.device)
    _check_scale("sb", sb, (_blocks(n), _blocks(k)), "one per 128 x 128 block of b", a.device)
    if out_dtype is not None and out_dtype not in OUT_TORCH:
        raise TypeError(f"out_dtype must be bfloat16, float16 or None, got {out_dtype}")


# --- layouts the kernel reads -------------------------------------------------------------------
def tma_aligned_scales(sa: torch.Tensor) -> torch.Tensor:
    """sa (M, KB), or (L, M, KB) for a batch of them (grouped GEMMs), as the kernel reads it: unit
    stride along M, K-block stride a multiple of 4 elements (16 bytes) and at least M, batch stride
    a multiple of 4, 16-byte aligned base. Returns sa itself when it already is, else a copy
    (DeepGEMM's `get_mn_major_tma_aligned_tensor`)."""
    m, kb = sa.shape[-2:]
    if (sa.stride(-2) == 1 and sa.stride(-1) % 4 == 0 and sa.stride(-1) >= m and sa.data_ptr() % 16 == 0
            and (sa.dim() == 2 or sa.stride(0) % 4 == 0)):
        return sa
    mp = -(-m // 4) * 4
    buf = torch.empty(*sa.shape[:-2], kb, mp, dtype=sa.dtype, device=sa.device)
    buf[..., :m] = sa.transpose(-1, -2)
    return buf[..., :m].transpose(-1, -2)


def _k_major(x: torch.Tensor) -> torch.Tensor:
    """x (rows, K) with unit stride along K, a 16-byte aligned row stride and base (TMA's rules),
    copied (K zero-padded to a multiple of 16) when it is not."""
    rows, k = x.shape
    if x.stride(1) == 1 and x.stride(0) % 16 == 0 and k % 16 == 0 and x.data_ptr() % 16 == 0:
        return x
    kp = -(-k // 16) * 16
    buf = torch.zeros(rows, kp, dtype=x.dtype, device=x.device)
    buf[:, :k] = x
    return buf


def _as3(x: torch.Tensor) -> torch.Tensor:
    """(rows, cols) -> (rows, cols, 1) with a batch stride TMA accepts (never followed)."""
    return x.unsqueeze(-1).as_strided((*x.shape, 1), (*x.stride(), 16 * (x.shape[0] + x.shape[1]) * 4))


def _compiled(out_dtype, sched, device, promote_overlap=False, sb_smem=False, wg_turns=False, promote_halves=False,
              sb_ahead=False):
    key = (out_dtype, sched, device, promote_overlap, sb_smem, wg_turns, promote_halves, sb_ahead)
    hit = _fns.get(key)
    if hit is None:
        from cute_kernels.specs_fp8 import FP8_GEMM, params_for
        from schedules.hardware import num_sms

        extra = {"promote_overlap": True} if promote_overlap else {}
        if sb_smem:
            extra["sb_smem"] = True
        if wg_turns:
            extra["wg_turns"] = True
        if promote_halves:
            extra["promote_halves"] = True
        if sb_ahead:
            extra["sb_ahead"] = True
        fn = FP8_GEMM.compiled(**params_for(sched, out_dtype=dtypes.name_of(out_dtype)), **extra)
        hit = _fns[key] = (fn, num_sms(device))
    return hit


# B scales from global one K-block ahead (`sb_ahead`): off until the H200 has run its bitwise tests and the
# suite's "ours sb ahead" column (session 12 desk: at M = 64 / 128 every K-block's promotion waited for the
# L2 latency of its own B-scale load; 320-370 ns a K-block at 64x7168x16384 and 64x2112x7168 alike).
SB_AHEAD_DEFAULT = False


def _fp8_gemm_cuda(a, sa, b, sb, out_dtype=None, schedule=None, promote_overlap=None, sb_smem=None,
                   wg_turns=False, promote_halves=False, sb_ahead=None):
    """The op's CUDA body. Options (catalogue `fp8_gemm`): `schedule` (any
    `schedules.fp8_gemm.fp8_schedule`, e.g. the wide 128x192), `promote_overlap` (None: on with `sb_ahead`
    where `schedules.fp8_gemm.small_m_promotion` says, M <= 128 and K >= 1024; else off),
    `promote_halves` (each K-block's WGMMAs in two column halves, one promoted while the other runs;
    default off, any tile: the wide ones included),
    `wg_turns` (cooperative: K-block WGMMAs issued in turn by the two warpgroups; default off),
    `sb_smem` (B scales staged in smem per tile; None: `schedules.fp8_gemm.use_sb_smem` decides,
    on for cooperative tiles at M >= 1024; K > 65536 runs without it: same bits), `sb_ahead` (B scales read
    from global one K-block ahead where they are not staged; None: SB_AHEAD_DEFAULT)."""
    from schedules.fp8_gemm import SB_SMEM_MAX_K, default_fp8_schedule, small_m_promotion, use_sb_smem
    from schedules.gemm import launch_clusters

    _check(a, sa, b, sb, out_dtype)
    out_dtype = out_dtype or torch.bfloat16
    m, k = a.shape
    n = b.shape[0]
    if m == 0 or n == 0:
        return torch.empty(m, n, dtype=out_dtype, device=a.device)
    if k == 0:
        return torch.zeros(m, n, dtype=out_dtype, device=a.device)
    a, b = _k_major(a), _k_major(b)
    sa = tma_aligned_scales(sa)
    npad = -(-n // 8) * 8
    out = torch.empty(m, npad, dtype=out_dtype, device=a.device)
    d = out[:, :n] if npad != n else out
    # promote_overlap is built for the 64/128-column tiles only: its default search leaves the wide ones out
    sched = schedule or default_fp8_schedule(m, n, k, wide=False if promote_overlap else None)
    if sched.a_rows and m > sched.a_rows:
        raise ValueError(f"schedule {sched}: a_rows {sched.a_rows} loads only A's first {sched.a_rows} rows; got "
                         f"{m} rows")
    if sched.split_k > 1:  # at most one split per 128-deep K-block
        from cute_kernels.ops.gemm import _clamp_split

        sched = _clamp_split(sched, k)
    if promote_overlap is None:  # the small-M default: overlap with the scales a K-block ahead
        promote_overlap = small_m_promotion(sched, m, k) and not (promote_halves or wg_turns)
        if promote_overlap and sb_ahead is None:
            sb_ahead = True
    if sb_smem is None:
        sb_smem = use_sb_smem(sched, m)
    sb_smem = sb_smem and k <= SB_SMEM_MAX_K
    if sb_ahead is None:
        sb_ahead = SB_AHEAD_DEFAULT
    sb_ahead = sb_ahead and not (sb_smem or promote_halves)  # scales from global only
    fn, sms = _compiled(out_dtype, sched, a.get_device(), promote_overlap, sb_smem,
                        wg_turns and sched.kind == "cooperative", promote_halves, sb_ahead)
    max_clusters = launch_clusters(-(-m // sched.tile_m), -(-n // sched.tile_n), 1, sched, sms, a.get_device())
    if sched.split_k > 1:  # one launch: each split promotes its K-blocks, the last split of a tile sums
        from cute_kernels.ops.gemm import split_buffers

        ws, flags = split_buffers(sched, 1, m, npad, a.device)
        fn(_as3(a), _as3(b), out.unsqueeze(-1), _as3(sa), _as3(sb), ws.permute(1, 2, 0), flags, max_clusters)
        return d
    fn(_as3(a), _as3(b), _as3(d), _as3(sa), _as3(sb), max_clusters)
    return d


def _fp8_gemm_fake(a, sa, b, sb, out_dtype=None):
    _check(a, sa, b, sb, out_dtype)
    return torch.empty(a.shape[0], b.shape[0], dtype=out_dtype or torch.bfloat16, device=a.device)


register_op("cute_kernels::fp8_gemm", "(Tensor a, Tensor sa, Tensor b, Tensor sb, ScalarType? out_dtype=None) -> Tensor",
            _fp8_gemm_cuda, _fp8_gemm_fake)


def fp8_gemm(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor,
             out_dtype: torch.dtype | None = torch.bfloat16) -> torch.Tensor:
    """(a * sa) @ (b * sb)^T: a (M, K) and b (N, K) float8_e4m3fn, sa (M, ceil(K/128)) and
    sb (ceil(N/128), ceil(K/128)) float32 block scales; returns (M, N) `out_dtype`."""
    return call("cute_kernels::fp8_gemm", a, sa, b, sb, out_dtype)


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
    from cute_kernels.specs_quant import ALIGN_ELEMS
    from schedules.hardware import num_sms

    r, k = x.shape
    if x.stride(1) != 1:
        x = x.contiguous()
    if r == 1:  # a single row: its stride is never followed; give it one the aligned variant accepts
        x = x.as_strided((1, k), (-(-k // ALIGN_ELEMS) * ALIGN_ELEMS, 1))
    aligned = k % ALIGN_ELEMS == 0 and x.stride(0) % ALIGN_ELEMS == 0 and x.data_ptr() % 16 == 0
    index64 = max(r * x.stride(0), r * k) > INDEX32_LIMIT
    key = (name, x.dtype, aligned, index64, ue8m0)
    fn = _fns.get(key)
    if fn is None:  # scalar variant: one pass (two took 73 registers, past the 64 the CTA count assumes)
        fn = _fns[key] = catalog.get(name).compiled(dtype=dtypes.name_of(x.dtype), aligned=aligned,
                                                    index64=index64, ue8m0=ue8m0, passes=2 if aligned else 1)
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
