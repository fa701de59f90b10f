"""The row-wise family's torch ops (lessons 4-7), all over the last dim.

Torch ops `cute_kernels::rms_norm`, `::layer_norm` and their backward ops (lessons 4-5).

`rms_norm(x, weight, eps, residual)` and `layer_norm(x, weight, bias, eps, residual)` normalize over
the last dim; math in fp32, one rounding to x's dtype. With `residual`, x + residual (rounded to x's
dtype) is normalized and also returned: `(y, x + residual)`, the fused pre-norm residual stream.
The forward saves rstd (and mean) per row in fp32; the backward recomputes x-hat from them and
writes dx in one pass, dweight/dbias as fp32 per-CTA partials summed here in a fixed order, the cast
fused (`cute_kernels.reduction.ops.sum_columns_into`: one small (CTAs, N) launch).

`fp8_out="per_token" | "block128"` (forward only, no autograd; ops `rms_norm_fp8`,
`layer_norm_fp8`): y comes back as float8_e4m3fn with fp32 scales over the M = numel / N rows,
(M, 1) per token or (M, ceil(N / 128)) per 1 x 128 block in the FP8 GEMM's TMA-aligned layout
(`ck.fp8_gemm(y_q, scales, w_q, sw)` reads it without a copy; per-token scales go in as
`scales.expand(-1, ceil(N / 128))`). Bitwise, it is `ck.quantize_1x128` (or its per-token
analogue) of the bf16/fp16/fp32 y the plain op returns: `(y_q, scales)`, `(y_q, scales, x + residual)`.

Torch ops `cute_kernels::softmax`, `::log_softmax`, `::cross_entropy` and their backward ops
(lessons 6-7), all over the last dim.

softmax / log_softmax return x's dtype (fp32 math, one rounding). cross_entropy(logits, target)
returns the per-row loss in fp32 (the public wrapper reduces it: mean over non-ignored rows, sum,
or none); its backward recomputes the probabilities from the logits and the saved fp32
log-sum-exp, so no (M, N) probability tensor is ever stored. Rows longer than one CTA holds are
spread over a thread-block cluster (up to 8 CTAs) that reduces through distributed shared memory.
The cross-entropy forward holds no row: it streams rows of any length like the row sum (long rows
split over CTAs, the partial states merged by a second launch).
"""

from __future__ import annotations

import torch

from cute_kernels import dtypes
from cute_kernels.reduction.ops import sum_columns_into
from cute_kernels.rowwise import CE_FWD
from cute_kernels.rowwise.launch import INDEX32_LIMIT, UNCAPPED, grid_ctas, launch_params
from cute_kernels.torch_ops import call, check_like, check_tensor, register_op, rows_of
from schedules.hardware import num_sms
from schedules.row_tiling import ce_plan, plan_rows


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
    multiple of 4 (`cute_kernels.fp8_gemm.ops.tma_aligned_scales`'s layout)."""
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


# --- softmax, log-softmax, cross-entropy ------------------------------------------------------------
_TARGET_DTYPES = (torch.int64, torch.int32)


def _sm_fake(x):
    check_tensor("x", x, min_ndim=1)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _sm_run(name, x):
    y = _sm_fake(x)
    if y.numel():
        x2 = rows_of(x)
        y2 = y.view(-1, x.shape[-1])
        fn, plan = launch_params(name, x2, y2)
        fn(x2, y2, grid_ctas(x2.shape[0], plan, plan.resident_grid, x.device)[0])  # uncapped unless the plan says
    return y


def _sm_bwd_fake(y, dy):
    check_tensor("y", y, min_ndim=1)
    check_like("dy", dy, "y", y)
    return torch.empty(y.shape, dtype=y.dtype, device=y.device)


def _sm_bwd_run(name, y, dy):
    dx = _sm_bwd_fake(y, dy)
    if dx.numel():
        y2, dy2 = rows_of(y), rows_of(dy)
        dx2 = dx.view(-1, y.shape[-1])
        fn, plan = launch_params(name, y2, dy2, dx2)
        # one CTA per row tile, unless the plan pipelines tiles: then CTAs walk them grid-stride
        fn(y2, dy2, dx2, grid_ctas(y2.shape[0], plan, plan.prefetch, y.device)[0])
    return dx


def _save_y(ctx, inputs, output):
    ctx.save_for_backward(output)


register_op("cute_kernels::softmax_bwd", "(Tensor y, Tensor dy) -> Tensor",
            lambda y, dy: _sm_bwd_run("softmax.bwd", y, dy), _sm_bwd_fake)
register_op("cute_kernels::log_softmax_bwd", "(Tensor y, Tensor dy) -> Tensor",
            lambda y, dy: _sm_bwd_run("log_softmax.bwd", y, dy), _sm_bwd_fake)
register_op("cute_kernels::softmax", "(Tensor x) -> Tensor", lambda x: _sm_run("softmax.fwd", x), _sm_fake,
            lambda ctx, g: call("cute_kernels::softmax_bwd", ctx.saved_tensors[0], g.contiguous()), _save_y)
register_op("cute_kernels::log_softmax", "(Tensor x) -> Tensor", lambda x: _sm_run("log_softmax.fwd", x), _sm_fake,
            lambda ctx, g: call("cute_kernels::log_softmax_bwd", ctx.saved_tensors[0], g.contiguous()), _save_y)


# --- cross-entropy -----------------------------------------------------------------------------------
def _ce_check(logits, target):
    check_tensor("logits", logits, min_ndim=2)
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D (rows, classes), got shape {tuple(logits.shape)}")
    check_tensor("target", target, allowed=_TARGET_DTYPES, min_ndim=1)
    if tuple(target.shape) != (logits.shape[0],):
        raise ValueError(f"target must have shape ({logits.shape[0]},) (one class per row of logits), "
                         f"got {tuple(target.shape)}")
    if logits.shape[1] == 0 and logits.shape[0] > 0:
        raise ValueError("logits must have at least one class (its last dim is 0)")


def _ce_fake(logits, target, ignore_index):
    _ce_check(logits, target)
    m = logits.shape[0]
    return (torch.empty(m, dtype=torch.float32, device=logits.device),
            torch.empty(m, dtype=torch.float32, device=logits.device))


def _ce_kernel(dtype, aligned, index64, mode, tiling):
    """The streamed cross-entropy forward for `tiling` (its schedule) and this pass, from the compile cache."""
    return CE_FWD.compiled(tiling, dtype=dtypes.name_of(dtype), aligned=aligned, index64=index64, mode=mode)


def _ce_rows(x2, t, loss, lse, ignore_index: int, **plan_options) -> None:
    """loss, lse of the (M, N) unit-stride logits x2 (M, N >= 1): a streaming row reduction planned
    by `ce_plan`; long rows are split over CTAs into (m, l) partials that a second launch merges in
    split order (deterministic, no atomics). `plan_options` go to `ce_plan`."""
    m, n = x2.shape
    vec = 16 // x2.element_size()
    aligned = x2.data_ptr() % 16 == 0 and x2.stride(0) % vec == 0
    index64 = max(m * x2.stride(0), n) > INDEX32_LIMIT
    sms = num_sms(x2.device.index or 0)
    plan = ce_plan(m, n, vec if aligned else 1, sms, **plan_options)
    if plan.splits == 1:
        # One CTA per row tile (no grid-stride cap): the block scheduler balances the tail, whatever
        # the occupancy the kernel's registers allow (a cap of 4 CTAs/SM at 3 resident is 1.33 waves).
        _ce_kernel(x2.dtype, aligned, index64, "rows", plan.tiling)(
            x2, t, _dummy_part(x2.device), loss, lse, ignore_index, UNCAPPED)
        return
    part = torch.empty(m, 2 * plan.splits, dtype=torch.float32, device=x2.device)
    _ce_kernel(x2.dtype, aligned, index64, "partial", plan.tiling)(x2, t, part, loss, lse, ignore_index,
                                                                    plan.max_ctas(sms))
    stage2 = plan_rows(m, plan.splits, sms, max_splits=1)
    _ce_kernel(x2.dtype, False, index64, "merge", stage2.tiling)(x2, t, part, loss, lse, ignore_index,
                                                                 stage2.max_ctas(sms))  # x: the target only


_dummies: dict = {}


def _dummy_part(device):
    """The `part` operand of a whole-rows launch (never read or written)."""
    d = _dummies.get(device)
    if d is None:
        d = _dummies[device] = torch.empty(1, 2, dtype=torch.float32, device=device)
    return d


def _ce_cuda(logits, target, ignore_index):
    loss, lse = _ce_fake(logits, target, ignore_index)
    if loss.numel():
        _ce_rows(rows_of(logits), target.to(torch.int64).contiguous(), loss, lse, int(ignore_index))
    return loss, lse


def _ce_bwd_fake(logits, target, dloss, lse, ignore_index):
    return torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)


def _ce_bwd_cuda(logits, target, dloss, lse, ignore_index):
    dx = _ce_bwd_fake(logits, target, dloss, lse, ignore_index)
    if dx.numel():
        x2 = rows_of(logits)
        fn, plan = launch_params("cross_entropy.bwd", x2, dx)
        fn(x2, target.to(torch.int64).contiguous(), dloss.float().contiguous(), lse, dx, int(ignore_index),
           grid_ctas(x2.shape[0], plan, False, logits.device)[0])
    return dx


def _ce_setup(ctx, inputs, output):
    logits, target, ignore_index = inputs
    ctx.mark_non_differentiable(output[1])
    ctx.ignore_index = ignore_index
    ctx.save_for_backward(logits, target, output[1])


def _ce_backward(ctx, g_loss, g_lse):
    logits, target, lse = ctx.saved_tensors
    dx = call("cute_kernels::cross_entropy_bwd", logits, target, g_loss, lse, ctx.ignore_index)
    return dx, None, None


register_op("cute_kernels::cross_entropy_bwd",
            "(Tensor logits, Tensor target, Tensor dloss, Tensor lse, int ignore_index) -> Tensor",
            _ce_bwd_cuda, _ce_bwd_fake)
register_op("cute_kernels::cross_entropy", "(Tensor logits, Tensor target, int ignore_index) -> (Tensor, Tensor)",
            _ce_cuda, _ce_fake, _ce_backward, _ce_setup)


# --- public wrappers ------------------------------------------------------------------------------
def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """softmax over the last dim (fp32 math, output in x's dtype)."""
    _last_dim(x, dim)
    return call("cute_kernels::softmax", x)


def log_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """log-softmax over the last dim (fp32 math, output in x's dtype)."""
    _last_dim(x, dim)
    return call("cute_kernels::log_softmax", x)


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, reduction: str = "mean",
                  ignore_index: int = -100) -> torch.Tensor:
    """Cross-entropy of (rows, classes) logits against integer targets, as torch.nn.functional.cross_entropy
    (reduction 'mean' averages over rows whose target is not `ignore_index`). fp32 result."""
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    loss, _ = call("cute_kernels::cross_entropy", logits, target, int(ignore_index))
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / (target != ignore_index).sum()


def _last_dim(x, dim):
    if isinstance(x, torch.Tensor) and dim not in (-1, x.dim() - 1):
        raise ValueError(f"dim must be the last dim (-1), got {dim}; move that dim last first")
