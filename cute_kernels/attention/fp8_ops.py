"""Torch ops of FP8 attention's quantization side: `cute_kernels::hadamard` and `cute_kernels::quantize_attention_fp8`
(kernels: `fp8_quant.py`; torch references and the FP8 forward's emulation: `fp8_reference.py`).

`hadamard(x, signs=None)`: the orthogonal Walsh-Hadamard transform along x's last dim (D in {64, 128, 256}, any
leading dims, bf16/fp16/fp32), of x * signs when a (D,) +-1 vector is given (any float dtype or int8; its values are
trusted, not checked: that would sync). fp32 math, one rounding to x's dtype; bitwise `hadamard_reference`.
Differentiable: the transform is linear and H symmetric, so dx = signs * hadamard(dy).

`quantize_attention_fp8(q, k, v, granularity="head", hadamard=False, signs=None)`: q (B, S, H_q, D), k and v
(B, S_k, H_k, D) bf16/fp16, FlashAttention's layout (GQA: H_q a multiple of H_k), any strides with a unit-stride
last dim. Returns (q8, k8, v8, q_scale, k_scale, v_scale): contiguous e4m3 tensors of the inputs' shapes and fp32
dequant multipliers (x ~= x8 * scale), per head (B, H) or per 128-row block of a head (B, H, ceil(S / 128)); the
rule is the FP8 GEMM quantizers' (scale = max(amax, 1e-4) / 448). With `hadamard=True` q and k (not v) are rotated
by H diag(signs) first (signs default: `fp8_reference.default_signs`, seed `DEFAULT_SIGNS_SEED`) and quantized from
the fp32 rotation. Bitwise `quantize_attention_fp8_reference`. Not differentiable.

Inputs whose strides are not multiples of 8 elements or whose base is not 16-byte aligned are copied first (the
kernels read 128-bit vectors). No host synchronization.
"""

from __future__ import annotations

import torch

from cute_kernels import dtypes
from cute_kernels.attention.fp8_reference import (
    DEFAULT_SIGNS_SEED,  # noqa: F401  (documented beside the op)
    E4M3,
    GRANULARITIES,
    HADAMARD_DIMS,
    blocks,
    check_signs,
    default_signs,
)
from cute_kernels.torch_ops import (
    INDEX32_LIMIT,
    call,
    check_tensor,
    fresh_copy,
    placeholder,
    register_op,
    rows_of,
    tidy_unit_strides,
)
from schedules.attention import FP8_HEAD_DIMS, fp8_quant_cta

QKV_DTYPES = (torch.bfloat16, torch.float16)
MAX_GRID_YZ = 65535  # the quantizer's grid is (blocks, heads, batch)


def _check_signs_for(signs, x, name="x") -> None:
    if signs is None:
        return
    check_signs(signs, x.shape[-1])
    if signs.device != x.device:
        raise ValueError(f"signs is on {signs.device} but {name} is on {x.device}")


def _signs32(signs: torch.Tensor) -> torch.Tensor:
    """The kernels' (D,) fp32 contiguous 16-byte aligned signs (a cast or copy on the device when they are not)."""
    if signs.dtype != torch.float32 or not signs.is_contiguous() or signs.data_ptr() % 16:
        signs = signs.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
    return signs


_default_signs: dict = {}


def _default_signs32(d: int, device) -> torch.Tensor:
    """`default_signs(d)` on `device`, copied there once per device and kept (a CUDA graph may capture later calls)."""
    key = (d, device)
    t = _default_signs.get(key)
    if t is None:
        t = _default_signs[key] = default_signs(d, device)
    return t


def _index64(t: torch.Tensor) -> bool:
    span = 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
    return max(span, t.numel()) > INDEX32_LIMIT


def _readable(t: torch.Tensor, vec: int) -> torch.Tensor:
    """t with 16-byte aligned base and every stride but the last a multiple of `vec` elements, else a copy."""
    t = tidy_unit_strides(t, vec)
    if t.data_ptr() % 16 or any(s % vec for s in t.stride()[:-1]):
        t = tidy_unit_strides(fresh_copy(t), vec)
    return t


# --- hadamard ----------------------------------------------------------------------------------------------------
def _hadamard_fake(x, signs=None):
    check_tensor("x", x, min_ndim=1)
    d = x.shape[-1]
    if d not in HADAMARD_DIMS:
        raise ValueError(f"x.shape[-1] (the transform length D) must be one of {HADAMARD_DIMS}, got {d}")
    _check_signs_for(signs, x)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _hadamard_cuda(x, signs=None):
    from cute_kernels.attention import HADAMARD

    y = _hadamard_fake(x, signs)
    if y.numel() == 0:
        return y
    d = x.shape[-1]
    vec = 16 // x.element_size()
    x2 = _readable(rows_of(x), vec)
    y2 = y.view(-1, d)
    s = placeholder(x.device, (d,), torch.float32) if signs is None else _signs32(signs)
    fn = HADAMARD.compiled(dtype=dtypes.name_of(x.dtype), head_dim=d, signed=signs is not None,
                           index64=_index64(x2) or _index64(y2))
    fn(x2, y2, s)
    return y


def _hadamard_setup(ctx, inputs, output):
    ctx.signs = inputs[1] if len(inputs) > 1 else None


def _hadamard_backward(ctx, dy):
    dx = call("cute_kernels::hadamard", dy.contiguous(), None)
    if ctx.signs is not None:
        dx = dx * ctx.signs.to(dx.dtype)
    return dx, None


register_op("cute_kernels::hadamard", "(Tensor x, Tensor? signs=None) -> Tensor", _hadamard_cuda, _hadamard_fake,
            _hadamard_backward, _hadamard_setup)


def hadamard(x: torch.Tensor, signs: torch.Tensor | None = None) -> torch.Tensor:
    """(x * signs) H / sqrt(D) along the last dim (D 64 / 128 / 256), orthogonal; differentiable."""
    return call("cute_kernels::hadamard", x, signs)


# --- quantize_attention_fp8 ----------------------------------------------------------------------------------------
def _check_qkv_layout(q, k, v, allowed, dims) -> None:
    """The named errors both FP8 attention ops share: q (B, S_q, H_q, D), k and v (B, S_k, H_k, D) of one dtype in
    `allowed` and one device, unit-stride last dims, D in `dims`, H_q a multiple of H_k, batch and heads within
    the grid."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, allowed=allowed)
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, seqlen, heads, head_dim), got shape {tuple(t.shape)}")
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise ValueError(f"{name} must have a contiguous last dim (stride 1), got strides {tuple(t.stride())}")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but q has {q.dtype}; cast one of them first")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    d = q.shape[-1]
    if d not in dims:
        raise ValueError(f"head dim (q.shape[3]) must be one of {dims}, got {d}")
    if k.shape != v.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have the same shape")
    if k.shape[-1] != d:
        raise ValueError(f"head dims differ: q {d}, k {k.shape[-1]}")
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"batch sizes differ: q {q.shape[0]}, k {k.shape[0]}")
    hq, hk = q.shape[2], k.shape[2]
    if hk == 0 or hq % hk:
        raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({hk}) (GQA/MQA)")
    if q.shape[0] > MAX_GRID_YZ or hq > MAX_GRID_YZ:
        raise ValueError(f"batch ({q.shape[0]}) and heads ({hq}) must be at most {MAX_GRID_YZ} each")


def _check_qkv(q, k, v, granularity, hadamard, signs) -> None:
    _check_qkv_layout(q, k, v, QKV_DTYPES, HADAMARD_DIMS)
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    if signs is not None and not hadamard:
        raise ValueError("signs is given but hadamard=False (the signs randomize the Hadamard rotation)")
    _check_signs_for(signs, q, "q")


def _scales_like(x, granularity):
    b, s, h, _ = x.shape
    shape = (b, h) if granularity == "head" else (b, h, blocks(s))
    return torch.empty(shape, dtype=torch.float32, device=x.device)


def _quantize_fake(q, k, v, granularity="head", hadamard=False, signs=None):
    _check_qkv(q, k, v, granularity, hadamard, signs)
    outs = [torch.empty(t.shape, dtype=E4M3, device=t.device) for t in (q, k, v)]
    return (*outs, *(_scales_like(t, granularity) for t in (q, k, v)))


def _quantize_one(x, x8, scale, granularity, rotate, signs32):
    """Quantize x (B, S, H, D) into x8 and scale (both allocated) with the kernels of `fp8_attn_quant`."""
    from cute_kernels.attention import FP8_ATTN_QUANT

    b, s, h, d = x.shape
    if x.numel() == 0:
        if scale.numel():  # no rows: every block's amax is 0 -> the floor's scale (as the reference)
            from cute_kernels.quantize.ops import _scale_of

            scale.copy_(_scale_of(torch.zeros_like(scale), False))
        return
    x = _readable(x, 8)
    sig = dict(dtype=dtypes.name_of(x.dtype), head_dim=d, hadamard=rotate, index64=_index64(x) or _index64(x8),
               **fp8_quant_cta(d))
    if granularity == "block":
        FP8_ATTN_QUANT.compiled(mode="block", **sig)(x, x8, scale, scale, signs32)
        return
    amax = torch.empty(b, h, blocks(s), dtype=torch.float32, device=x.device)  # every entry written by pass 1
    FP8_ATTN_QUANT.compiled(mode="amax", **sig)(x, x8, amax, amax, signs32)
    FP8_ATTN_QUANT.compiled(mode="head", **sig)(x, x8, scale[:, :, None], amax, signs32)


def _quantize_cuda(q, k, v, granularity="head", hadamard=False, signs=None):
    outs = _quantize_fake(q, k, v, granularity, hadamard, signs)
    d = q.shape[-1]
    if hadamard:
        signs32 = _default_signs32(d, q.device) if signs is None else _signs32(signs)
    else:
        signs32 = placeholder(q.device, (d,), torch.float32)
    for i, (x, rotate) in enumerate(((q, hadamard), (k, hadamard), (v, False))):
        _quantize_one(x, outs[i], outs[3 + i], granularity, rotate, signs32)
    return outs


register_op("cute_kernels::quantize_attention_fp8", "(Tensor q, Tensor k, Tensor v, str granularity='head', "
            "bool hadamard=False, Tensor? signs=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
            _quantize_cuda, _quantize_fake)


def quantize_attention_fp8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, granularity: str = "head",
                           hadamard: bool = False, signs: torch.Tensor | None = None):
    """(q8, k8, v8, q_scale, k_scale, v_scale) for FP8 attention (module docstring); not differentiable."""
    return tuple(call("cute_kernels::quantize_attention_fp8", q, k, v, granularity, hadamard, signs))



# --- flash_attn_fp8: the FP8 forward (kernel `fp8_forward.FlashAttnFwdFP8`) ---------------------------------------
FP8_FWD_DIMS = FP8_HEAD_DIMS  # (the schedules module lists the kernel's head dims)

OUT_DTYPES = (torch.bfloat16, torch.float16)


def _check_fp8_attn(q, k, v, q_scale, k_scale, v_scale, window_left, window_right, softmax_scale, softcap,
                    out_dtype) -> str:
    """The named errors of `flash_attn_fp8`; returns the scales' granularity ("head" or "block")."""
    from cute_kernels.attention.ops import _check_options

    _check_qkv_layout(q, k, v, (E4M3,), FP8_FWD_DIMS)
    b, sq, hq, _ = q.shape
    sk, hk = k.shape[1], k.shape[2]
    grans = set()
    for name, t, h, s in (("q_scale", q_scale, hq, sq), ("k_scale", k_scale, hk, sk), ("v_scale", v_scale, hk, sk)):
        check_tensor(name, t, allowed=(torch.float32,))
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
        if tuple(t.shape) == (b, h):
            grans.add("head")
        elif tuple(t.shape) == (b, h, blocks(s)):
            grans.add("block")
        else:
            raise ValueError(f"{name} must be fp32 of shape (B, H) = {(b, h)} per head or (B, H, ceil(S / 128)) = "
                             f"{(b, h, blocks(s))} per 128-row block, got {tuple(t.shape)}")
    if len(grans) > 1:
        raise ValueError("q_scale, k_scale and v_scale must have the same granularity (all per head or all per "
                         "128-row block)")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be torch.bfloat16 or torch.float16, got {out_dtype}")
    _check_options(window_left, window_right, softmax_scale, softcap)
    return grans.pop()


def _scales_view(t: torch.Tensor) -> torch.Tensor:
    """A (B, H) or (B, H, blocks) fp32 scale as the kernel's (blocks, H, B) (per head: one block)."""
    t = t.contiguous()
    if t.dim() == 2:
        t = t[:, :, None]
    return t.permute(2, 1, 0)


def _flash_attn_fp8_fake(q, k, v, q_scale, k_scale, v_scale, causal=False, window_left=-1, window_right=-1,
                         softcap=0.0, out_dtype=torch.bfloat16, softmax_scale=None):
    _check_fp8_attn(q, k, v, q_scale, k_scale, v_scale, window_left, window_right, softmax_scale, softcap, out_dtype)
    b, sq, hq, d = q.shape
    return (torch.empty(b, sq, hq, d, dtype=out_dtype, device=q.device),
            torch.empty(b, hq, sq, dtype=torch.float32, device=q.device))


def _flash_attn_fp8_cuda(q, k, v, q_scale, k_scale, v_scale, causal=False, window_left=-1, window_right=-1,
                         softcap=0.0, out_dtype=torch.bfloat16, softmax_scale=None, config=None):
    """The op's CUDA body; `config`: catalogue config fields (tile_n, stages, exp2_poly) for the lab's A/B runs."""
    from cute_kernels.attention import FLASH_ATTN_FP8, mask_name
    from cute_kernels.attention.ops import _bounds, _kernel_view, _scalars

    gran = _check_fp8_attn(q, k, v, q_scale, k_scale, v_scale, window_left, window_right, softmax_scale, softcap,
                           out_dtype)
    b, sq, hq, d = q.shape
    sk = k.shape[1]
    out = torch.empty(b, sq, hq, d, dtype=out_dtype, device=q.device)
    lse = torch.empty(b, hq, sq, dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out, lse
    if sk == 0:
        out.zero_()
        lse.fill_(float("inf"))
        return out, lse
    left, right = _bounds(causal, window_left, window_right, sq + sk)
    fn = FLASH_ATTN_FP8.compiled(head_dim=d, out_dtype=dtypes.name_of(out_dtype), mask=mask_name(left, right),
                                 softcap=softcap > 0, scales=gran, **(config or {}))
    fn(_kernel_view(q), _kernel_view(k), _kernel_view(v), _kernel_view(out), lse.permute(2, 1, 0),
       _scales_view(q_scale), _scales_view(k_scale), _scales_view(v_scale), *_scalars(d, softmax_scale, softcap),
       left, right)
    return out, lse


register_op("cute_kernels::flash_attn_fp8", "(Tensor q, Tensor k, Tensor v, Tensor q_scale, Tensor k_scale, "
            "Tensor v_scale, bool causal=False, int window_left=-1, int window_right=-1, float softcap=0.0, "
            "ScalarType out_dtype=bfloat16, float? softmax_scale=None) -> (Tensor, Tensor)",
            _flash_attn_fp8_cuda, _flash_attn_fp8_fake)


def flash_attn_fp8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_scale: torch.Tensor, k_scale: torch.Tensor,
                   v_scale: torch.Tensor, causal: bool = False, window: tuple[int, int] = (-1, -1),
                   softcap: float = 0.0, out_dtype: torch.dtype = torch.bfloat16, return_lse: bool = False,
                   softmax_scale: float | None = None):
    """FlashAttention forward of e4m3 q (B, S_q, H_q, D), k, v (B, S_k, H_kv, D) (GQA; D 64 / 128 / 256) with fp32
    dequant scales per head (B, H) or per 128-row block (B, H, ceil(S / 128)), as `quantize_attention_fp8` makes
    them: softmax(softmax_scale (q8 q_scale)(k8 k_scale)^T [softcap] [mask]) (v8 v_scale), P rounded to e4m3
    (`fp8_reference.fp8_attention_reference`). Masks as `flash_attn` (causal bottom-right aligned, window (left,
    right), -1 unbounded). Returns O in `out_dtype` (bf16 / fp16), and with `return_lse` also the fp32 LSE
    (B, H_q, S_q), natural log. Not differentiable."""
    if not (isinstance(window, (tuple, list)) and len(window) == 2):
        raise ValueError(f"window must be a pair (left, right) of ints, -1 for unbounded, got {window!r}")
    out, lse = call("cute_kernels::flash_attn_fp8", q, k, v, q_scale, k_scale, v_scale, bool(causal),
                    int(window[0]), int(window[1]), float(softcap), out_dtype, softmax_scale)
    return (out, lse) if return_lse else out

