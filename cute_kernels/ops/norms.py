"""Torch ops `cute_kernels::rms_norm`, `::layer_norm` and their backward ops (lessons 4-5).

`rms_norm(x, weight, eps, residual)` and `layer_norm(x, weight, bias, eps, residual)` normalize over
the last dim; math in fp32, one rounding to x's dtype. With `residual`, x + residual (rounded to x's
dtype) is normalized and also returned: `(y, x + residual)`, the fused pre-norm residual stream.
The forward saves rstd (and mean) per row in fp32; the backward recomputes x-hat from them and
writes dx in one pass, dweight/dbias as fp32 per-CTA partials summed here in a fixed order, the cast
fused (`ops.reduction.sum_columns_into`: one small (CTAs, N) launch).

`fp8_out="per_token" | "block128"` (forward only, no autograd; ops `rms_norm_fp8`,
`layer_norm_fp8`): y comes back as float8_e4m3fn with fp32 scales over the M = numel / N rows,
(M, 1) per token or (M, ceil(N / 128)) per 1 x 128 block in the FP8 GEMM's TMA-aligned layout
(`ck.fp8_gemm(y_q, scales, w_q, sw)` reads it without a copy; per-token scales go in as
`scales.expand(-1, ceil(N / 128))`). Bitwise, it is `ck.quantize_1x128` (or its per-token
analogue) of the bf16/fp16/fp32 y the plain op returns: `(y_q, scales)`, `(y_q, scales, x + residual)`.
"""

from __future__ import annotations

import torch

from cute_kernels import dtypes
from cute_kernels.ops._checks import call, check_like, check_tensor, register_op, rows_of
from cute_kernels.ops._rowwise import grid_ctas, launch_params
from cute_kernels.ops.reduction import sum_columns_into


def _check(x, weight, bias, residual):
    check_tensor("x", x, min_ndim=1)
    n = x.shape[-1]
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            check_tensor(name, t)
            if tuple(t.shape) != (n,):
                raise ValueError(f"{name} must have shape ({n},) (x's last dim), got {tuple(t.shape)}")
            if t.device != x.device:
                raise ValueError(f"{name} is on {t.device} but x is on {x.device}")
    if weight is not None and bias is not None and bias.dtype != weight.dtype:
        raise TypeError(f"bias has dtype {bias.dtype} but weight has {weight.dtype}")
    if residual is not None:
        check_like("residual", residual, "x", x)


def _empty(x):
    return x.new_empty(0)


FP8_MODES = ("per_token", "block128")


def _fp8_scales(m: int, n: int, mode: str, device):
    """fp32 scales of an FP8 y: (M, 1) per token, or (M, ceil(N/128)) MN-major, K-block stride a
    multiple of 4 (`ops.fp8_gemm.tma_aligned_scales`'s layout)."""
    if mode == "per_token":
        return torch.empty(m, 1, dtype=torch.float32, device=device)
    mp = -(-m // 4) * 4
    return torch.empty_strided((m, -(-n // 128)), (1, mp), dtype=torch.float32, device=device)


def _fwd_fake(kind, x, weight, bias, residual, eps, fp8_out="none"):
    _check(x, weight, bias, residual)
    m = x.numel() // x.shape[-1] if x.shape[-1] else x.shape[:-1].numel()
    fp8 = fp8_out != "none"
    out = torch.empty(x.shape, dtype=torch.float8_e4m3fn if fp8 else x.dtype, device=x.device)
    res_out = torch.empty(x.shape, dtype=x.dtype, device=x.device) if residual is not None else _empty(x)
    mean = torch.empty(m, dtype=torch.float32, device=x.device) if kind == "layer" else _empty(x).float()
    rstd = torch.empty(m, dtype=torch.float32, device=x.device)
    if fp8:
        return out, res_out, mean, rstd, _fp8_scales(m, x.shape[-1], fp8_out, x.device)
    return out, res_out, mean, rstd


def _fwd_cuda(kind, x, weight, bias, residual, eps, fp8_out="none"):
    outs = _fwd_fake(kind, x, weight, bias, residual, eps, fp8_out)
    out, res_out, mean, rstd = outs[:4]
    scales = outs[4] if fp8_out != "none" else None
    if out.numel() == 0:
        return outs
    x2 = rows_of(x)
    r2 = rows_of(residual) if residual is not None else None
    name = ("rmsnorm" if kind == "rms" else "layernorm") + ".fwd"
    wt = weight if weight is not None else bias
    sig = dict(weight=weight is not None, residual=residual is not None,
               w_dtype=dtypes.name_of(wt.dtype) if wt is not None else dtypes.name_of(x.dtype))
    if kind == "layer":
        sig["bias"] = bias is not None
    if scales is not None:
        sig["fp8_out"] = fp8_out
    o2, ro2 = out.view(-1, x.shape[-1]), res_out.view(-1, x.shape[-1]) if residual is not None else None
    fn, plan = launch_params(name, x2, r2, o2, ro2, weight, bias, **sig)
    cap, _ = grid_ctas(x2.shape[0], plan, plan.resident_grid, x.device)  # forwards: uncapped unless the plan says
    fn(x2, weight, bias if kind == "layer" else None, r2, o2, ro2, mean if kind == "layer" else None, rstd,
       scales, float(eps), cap)
    return outs


def _bwd_fake(kind, x, weight, has_bias, dy, dres, mean, rstd):
    """dx in x's dtype; dweight and dbias in the weight's dtype (fp32 without a weight); empty when absent."""
    n = x.shape[-1]
    wdt = weight.dtype if weight is not None else torch.float32
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dw = torch.empty(n, dtype=wdt, device=x.device) if weight is not None else _empty(x)
    db = torch.empty(n, dtype=wdt, device=x.device) if has_bias else _empty(x)
    return dx, dw, db


def _bwd_cuda(kind, x, weight, has_bias, dy, dres, mean, rstd):
    dx, dw, db = _bwd_fake(kind, x, weight, has_bias, dy, dres, mean, rstd)
    n = x.shape[-1]
    if x.numel() == 0:
        return dx, dw.zero_(), db.zero_()
    x2, dy2 = rows_of(x), rows_of(dy)
    dr2 = rows_of(dres) if dres is not None else None
    dx2 = dx.view(-1, n)
    name = ("rmsnorm" if kind == "rms" else "layernorm") + ".bwd"
    sig = dict(weight=weight is not None, residual=dres is not None,
               w_dtype=dtypes.name_of(weight.dtype) if weight is not None else dtypes.name_of(x.dtype))
    if kind == "layer":
        sig["bias"] = has_bias
    fn, plan = launch_params(name, x2, dy2, dr2, dx2, weight, **sig)
    cap, ctas = grid_ctas(x2.shape[0], plan, True, x.device)
    dw_p = torch.empty(ctas, n, dtype=torch.float32, device=x.device) if weight is not None else None
    db_p = torch.empty(ctas, n, dtype=torch.float32, device=x.device) if has_bias else None
    fn(x2, weight, dy2, dr2, mean if kind == "layer" else None, rstd, dx2, dw_p, db_p, cap)
    if weight is not None:
        sum_columns_into(dw_p, dw)
    if has_bias:
        sum_columns_into(db_p, db)
    return dx, dw, db


# --- registration ---------------------------------------------------------------------------------
def _rms_fwd_fake(x, weight, residual, eps):
    out, res_out, _, rstd = _fwd_fake("rms", x, weight, None, residual, eps)
    return out, res_out, rstd


def _rms_fwd_cuda(x, weight, residual, eps):
    out, res_out, _, rstd = _fwd_cuda("rms", x, weight, None, residual, eps)
    return out, res_out, rstd


def _ln_fwd_fake(x, weight, bias, residual, eps):
    return _fwd_fake("layer", x, weight, bias, residual, eps)


def _ln_fwd_cuda(x, weight, bias, residual, eps):
    return _fwd_cuda("layer", x, weight, bias, residual, eps)


def _rms_bwd_fake(x, weight, dy, dres, rstd):
    return _bwd_fake("rms", x, weight, False, dy, dres, None, rstd)[:2]


def _rms_bwd_cuda(x, weight, dy, dres, rstd):
    return _bwd_cuda("rms", x, weight, False, dy, dres, None, rstd)[:2]


def _ln_bwd_fake(x, weight, has_bias, dy, dres, mean, rstd):
    return _bwd_fake("layer", x, weight, has_bias, dy, dres, mean, rstd)


def _ln_bwd_cuda(x, weight, has_bias, dy, dres, mean, rstd):
    return _bwd_cuda("layer", x, weight, has_bias, dy, dres, mean, rstd)


def _rms_setup(ctx, inputs, output):
    x, weight, residual, _ = inputs
    out, res_out, rstd = output
    ctx.mark_non_differentiable(rstd)
    ctx.has_res = residual is not None
    ctx.save_for_backward(res_out if ctx.has_res else x, weight, rstd)


def _rms_backward(ctx, g_out, g_res, g_rstd):
    x, weight, rstd = ctx.saved_tensors
    dres = g_res if ctx.has_res and g_res is not None else None
    dx, dw = call("cute_kernels::rms_norm_bwd", x, weight, g_out.contiguous(), dres, rstd)
    return dx, (dw if weight is not None else None), (dx if ctx.has_res else None), None


def _ln_setup(ctx, inputs, output):
    x, weight, bias, residual, _ = inputs
    out, res_out, mean, rstd = output
    ctx.mark_non_differentiable(mean, rstd)
    ctx.has_res, ctx.has_bias = residual is not None, bias is not None
    ctx.bias_dtype = bias.dtype if bias is not None else None
    ctx.save_for_backward(res_out if ctx.has_res else x, weight, mean, rstd)


def _ln_backward(ctx, g_out, g_res, g_mean, g_rstd):
    x, weight, mean, rstd = ctx.saved_tensors
    dres = g_res if ctx.has_res and g_res is not None else None
    dx, dw, db = call("cute_kernels::layer_norm_bwd", x, weight, ctx.has_bias, g_out.contiguous(), dres, mean, rstd)
    return (dx, dw if weight is not None else None, db.to(ctx.bias_dtype) if ctx.has_bias else None,
            dx if ctx.has_res else None, None)


register_op("cute_kernels::rms_norm", "(Tensor x, Tensor? weight, Tensor? residual, float eps) -> (Tensor, Tensor, Tensor)",
            _rms_fwd_cuda, _rms_fwd_fake, _rms_backward, _rms_setup)
register_op("cute_kernels::rms_norm_bwd",
            "(Tensor x, Tensor? weight, Tensor dy, Tensor? dres, Tensor rstd) -> (Tensor, Tensor)",
            _rms_bwd_cuda, _rms_bwd_fake)
register_op("cute_kernels::layer_norm",
            "(Tensor x, Tensor? weight, Tensor? bias, Tensor? residual, float eps) -> (Tensor, Tensor, Tensor, Tensor)",
            _ln_fwd_cuda, _ln_fwd_fake, _ln_backward, _ln_setup)
register_op("cute_kernels::layer_norm_bwd",
            "(Tensor x, Tensor? weight, bool has_bias, Tensor dy, Tensor? dres, Tensor mean, Tensor rstd) "
            "-> (Tensor, Tensor, Tensor)",
            _ln_bwd_cuda, _ln_bwd_fake)


def _rms_fp8_fake(x, weight, residual, eps, fp8_out):
    _check_fp8_mode(fp8_out)
    out, res_out, _, _, scales = _fwd_fake("rms", x, weight, None, residual, eps, fp8_out)
    return out, scales, res_out


def _rms_fp8_cuda(x, weight, residual, eps, fp8_out):
    _check_fp8_mode(fp8_out)
    out, res_out, _, _, scales = _fwd_cuda("rms", x, weight, None, residual, eps, fp8_out)
    return out, scales, res_out


def _ln_fp8_fake(x, weight, bias, residual, eps, fp8_out):
    _check_fp8_mode(fp8_out)
    out, res_out, _, _, scales = _fwd_fake("layer", x, weight, bias, residual, eps, fp8_out)
    return out, scales, res_out


def _ln_fp8_cuda(x, weight, bias, residual, eps, fp8_out):
    _check_fp8_mode(fp8_out)
    out, res_out, _, _, scales = _fwd_cuda("layer", x, weight, bias, residual, eps, fp8_out)
    return out, scales, res_out


def _check_fp8_mode(fp8_out):
    if fp8_out not in FP8_MODES:
        raise ValueError(f"fp8_out must be None, 'per_token' or 'block128', got {fp8_out!r}")


register_op("cute_kernels::rms_norm_fp8",
            "(Tensor x, Tensor? weight, Tensor? residual, float eps, str fp8_out) -> (Tensor, Tensor, Tensor)",
            _rms_fp8_cuda, _rms_fp8_fake)
register_op("cute_kernels::layer_norm_fp8",
            "(Tensor x, Tensor? weight, Tensor? bias, Tensor? residual, float eps, str fp8_out) "
            "-> (Tensor, Tensor, Tensor)",
            _ln_fp8_cuda, _ln_fp8_fake)


# --- public wrappers ------------------------------------------------------------------------------
def _fp8_result(q, scales, res_out, residual):
    return (q, scales, res_out) if residual is not None else (q, scales)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6,
             residual: torch.Tensor | None = None, fp8_out: str | None = None):
    """RMSNorm over the last dim: x / sqrt(mean(x^2) + eps) * weight. With `residual`, normalizes
    s = x + residual and returns (y, s). With `fp8_out` ("per_token" or "block128"): y as e4m3
    plus fp32 scales, (y_q, scales) or (y_q, scales, s) (module docstring)."""
    if fp8_out is not None:
        _check_fp8_mode(fp8_out)
        return _fp8_result(*call("cute_kernels::rms_norm_fp8", x, weight, residual, float(eps), fp8_out), residual)
    out, res_out, _ = call("cute_kernels::rms_norm", x, weight, residual, float(eps))
    return (out, res_out) if residual is not None else out


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
               eps: float = 1e-5, residual: torch.Tensor | None = None, fp8_out: str | None = None):
    """LayerNorm over the last dim: (x - mean) / sqrt(var + eps) * weight + bias (biased variance,
    as torch). With `residual`, normalizes s = x + residual and returns (y, s). `fp8_out`: as
    `rms_norm`."""
    if fp8_out is not None:
        _check_fp8_mode(fp8_out)
        return _fp8_result(*call("cute_kernels::layer_norm_fp8", x, weight, bias, residual, float(eps), fp8_out),
                           residual)
    out, res_out, _, _ = call("cute_kernels::layer_norm", x, weight, bias, residual, float(eps))
    return (out, res_out) if residual is not None else out
