"""Torch ops of the MoE family: dispatch and combine between token rows and a grouped GEMM's layout.

    rows = ck.moe_dispatch(x, r, layout="contiguous")      # (T k + E 127, H) or (E, max_m, H)
    out = ck.moe_combine(y, r, r.topk_weights, layout="contiguous")   # (T, H)

r is a `Routing` (`cute_kernels.moe.reference.route`, the routing kernel still to come): each token's k slots name
their row of the contiguous layout (`token_rows`) or their masked slot (`token_slots`), -1 for none. The ops under
them, `cute_kernels::moe_dispatch_rows(x, rows, num_rows, weights=None)` and `cute_kernels::moe_combine_rows(y, rows,
weights)`, take that (T, k) int32 map directly. Layout rows no slot names are left unwritten (the grouped GEMM skips
or ignores them; combine never reads them). Combine sums a token's slots in slot order in fp32 and rounds once:
bit-identical run to run.

Autograd: dispatch and combine are each other's transposes. d(dispatch)/dx is combine with unit weights; combine's
gradient to y is the weighted dispatch (w[t, s] g[t] into each slot's row), to the weights the per-slot dot
<g[t], y[row]> (in torch: a gather and a sum).
"""

from __future__ import annotations

import torch

from cute_kernels import dtypes
from cute_kernels.torch_ops import call, check_tensor, register_op
from schedules.hardware import num_sms

ROW_TORCH = (torch.bfloat16, torch.float16)
MAX_TOP_K = 16
MAX_CTAS_PER_SM = 16  # CTAs of 128 threads resident an SM; past that the CTAs loop over tokens


def _check_rows(name, t, rows, weights=None):
    check_tensor(name, t, allowed=ROW_TORCH)
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D (rows, H), got shape {tuple(t.shape)}")
    if not isinstance(rows, torch.Tensor) or rows.dtype != torch.int32 or rows.dim() != 2:
        raise TypeError(f"rows must be an int32 (tokens, top_k) tensor, got "
                        f"{getattr(rows, 'dtype', type(rows).__name__)} {tuple(getattr(rows, 'shape', ()))}")
    if not 1 <= rows.shape[1] <= MAX_TOP_K:
        raise ValueError(f"rows has top_k = {rows.shape[1]} columns; 1 to {MAX_TOP_K} are supported")
    if rows.device != t.device:
        raise ValueError(f"rows is on {rows.device} but {name} is on {t.device}")
    if weights is not None:
        if not isinstance(weights, torch.Tensor) or weights.shape != rows.shape:
            raise ValueError(f"weights must have rows' shape {tuple(rows.shape)}, got "
                             f"{tuple(getattr(weights, 'shape', ()))}")
        if not weights.is_floating_point() or weights.device != t.device:
            raise TypeError(f"weights must be a floating-point tensor on {t.device}, got {weights.dtype} on "
                            f"{weights.device}")


def _kernel_ok(t: torch.Tensor) -> bool:
    """Rows of whole 16-byte vectors: unit inner stride, H and the row stride multiples of 8, 16-byte base."""
    return t.shape[1] % 8 == 0 and t.stride(1) == 1 and t.stride(0) % 8 == 0 and t.data_ptr() % 16 == 0


def _launch(direction, src, dst, rows, weights, weighted=False):
    from cute_kernels.moe import MOE_TOKEN_ROWS

    fn = MOE_TOKEN_ROWS.compiled(direction=direction, dtype=dtypes.name_of(src.dtype), top_k=rows.shape[1],
                                 weighted=weighted)
    fn(src, dst, rows, weights, MAX_CTAS_PER_SM * num_sms(src.get_device()))


def _dispatch_cuda(x, rows, num_rows: int, weights=None):
    _check_rows("x", x, rows, weights)
    if rows.shape[0] != x.shape[0]:
        raise ValueError(f"rows has {rows.shape[0]} tokens but x has {x.shape[0]}")
    out = torch.empty(num_rows, x.shape[1], dtype=x.dtype, device=x.device)
    if x.shape[0] == 0 or x.shape[1] == 0 or num_rows == 0:
        return out
    w = weights.float() if weights is not None else torch.empty(rows.shape, dtype=torch.float32, device=x.device)
    if not _kernel_ok(x):
        x = x.contiguous()
    if not _kernel_ok(x) or not _kernel_ok(out):  # H not a multiple of 8: torch
        ok = rows >= 0
        tok = torch.arange(x.shape[0], device=x.device).unsqueeze(1).expand_as(rows)
        vals = x[tok[ok]].float() * (w[ok].unsqueeze(1) if weights is not None else 1.0)
        out[rows[ok].long()] = vals.to(x.dtype)
        return out
    _launch("dispatch", x, out, rows, w, weights is not None)
    return out


def _dispatch_fake(x, rows, num_rows: int, weights=None):
    _check_rows("x", x, rows, weights)
    return torch.empty(num_rows, x.shape[1], dtype=x.dtype, device=x.device)


def _combine_cuda(y, rows, weights):
    _check_rows("y", y, rows, weights)
    t = rows.shape[0]
    out = torch.empty(t, y.shape[1], dtype=y.dtype, device=y.device)
    if t == 0 or y.shape[1] == 0:
        return out
    if y.shape[0] == 0:  # no rows at all: every slot empty
        return out.zero_()
    if not _kernel_ok(y):
        y = y.contiguous()
    if not _kernel_ok(y):
        return _combine_torch(y, rows, weights).to(y.dtype)
    _launch("combine", y, out, rows, weights.float())
    return out


def _combine_torch(y, rows, weights):
    acc = torch.zeros(rows.shape[0], y.shape[1], dtype=torch.float32, device=y.device)
    for s in range(rows.shape[1]):
        r = rows[:, s].long()
        acc += torch.where((r >= 0).unsqueeze(1), weights[:, s].float().unsqueeze(1) * y[r.clamp(min=0)].float(), 0.0)
    return acc


def _combine_fake(y, rows, weights):
    _check_rows("y", y, rows, weights)
    return torch.empty(rows.shape[0], y.shape[1], dtype=y.dtype, device=y.device)


def _dispatch_setup(ctx, inputs, output):
    x, rows, num_rows, weights = inputs
    ctx.save_for_backward(rows, weights)


def _dispatch_backward(ctx, g):
    """dx[t] = sum over slots of (w[t, s]) g[rows[t, s]]: combine."""
    rows, weights = ctx.saved_tensors
    w = weights if weights is not None else torch.ones(rows.shape, dtype=torch.float32, device=g.device)
    return combine_rows(g.contiguous(), rows, w), None, None, None


def _combine_setup(ctx, inputs, output):
    y, rows, weights = inputs
    ctx.save_for_backward(y, rows, weights)


def _combine_backward(ctx, g):
    """dy: the weighted dispatch of g into each slot's row (rows no slot names get 0); dw[t, s] = <g[t], y[row]>."""
    y, rows, weights = ctx.saved_tensors
    gy = gw = None
    if ctx.needs_input_grad[0]:
        gy = dispatch_rows(g.contiguous(), rows, y.shape[0], weights)
        named = torch.zeros(y.shape[0], dtype=torch.int32, device=y.device)  # (no host sync: a scatter, not a mask)
        named.scatter_reduce_(0, rows.clamp(min=0).long().flatten(), (rows >= 0).int().flatten(), reduce="amax")
        gy = torch.where(named.unsqueeze(1) > 0, gy, torch.zeros((), dtype=gy.dtype, device=gy.device))
    if ctx.needs_input_grad[2]:
        r = rows.long()
        dots = (g.float().unsqueeze(1) * y[r.clamp(min=0)].float()).sum(-1)
        gw = torch.where(r >= 0, dots, 0.0).to(weights.dtype)
    return gy, None, gw


register_op("cute_kernels::moe_dispatch_rows", "(Tensor x, Tensor rows, int num_rows, Tensor? weights=None) -> Tensor",
            _dispatch_cuda, _dispatch_fake, _dispatch_backward, _dispatch_setup)
register_op("cute_kernels::moe_combine_rows", "(Tensor y, Tensor rows, Tensor weights) -> Tensor",
            _combine_cuda, _combine_fake, _combine_backward, _combine_setup)


def dispatch_rows(x, rows, num_rows: int, weights=None):
    return call("cute_kernels::moe_dispatch_rows", x, rows, int(num_rows), weights)


def combine_rows(y, rows, weights):
    return call("cute_kernels::moe_combine_rows", y, rows, weights)


def _layout_rows(r, layout: str):
    if layout == "contiguous":
        return r.token_rows, r.m_indices.shape[0]
    if layout == "masked":
        return r.token_slots, r.masked_source.numel()
    raise ValueError(f"layout must be 'contiguous' or 'masked', got {layout!r}")


def moe_dispatch(x: torch.Tensor, r, layout: str = "contiguous", quantize: str | None = None):
    """x (T, H) into the layout of routing r: (T k + E 127, H) contiguous or (E, max_m, H) masked; with
    quantize="1x128" the e4m3 rows and their 1x128 scales (`quantize_1x128`; the fused quantizing dispatch is still
    to come)."""
    rows, n = _layout_rows(r, layout)
    out = dispatch_rows(x, rows, n)
    if layout == "masked":
        out = out.view(*r.masked_source.shape, x.shape[1])
    if quantize is None:
        return out
    if quantize != "1x128":
        raise ValueError(f"quantize must be None or '1x128', got {quantize!r}")
    from cute_kernels.quantize.ops import quantize_1x128

    q, s = quantize_1x128(out.reshape(-1, x.shape[1]))
    return q.view(out.shape), s.reshape(*out.shape[:-1], -1)


def moe_combine(y: torch.Tensor, r, topk_weights: torch.Tensor, layout: str = "contiguous") -> torch.Tensor:
    """out[t] = sum over t's slots (in order) of topk_weights[t, s] * y[its row], fp32, rounded once; y in the
    layout of routing r ((rows, H), or (E, max_m, H) masked); differentiable in y and topk_weights."""
    rows, _ = _layout_rows(r, layout)
    return combine_rows(y.reshape(-1, y.shape[-1]), rows, topk_weights)
