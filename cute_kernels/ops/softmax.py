"""Torch ops `cute_kernels::softmax`, `::log_softmax`, `::cross_entropy` and their backward ops
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

import dataclasses

import torch

from cute_kernels import catalog, dtypes
from cute_kernels.ops._checks import call, check_like, check_tensor, register_op, rows_of
from cute_kernels.ops._rowwise import INDEX32_LIMIT, UNCAPPED, grid_ctas, launch_params
from schedules.hardware import num_sms
from schedules.row_tiling import RowPlan, plan_rows

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


_ce_fns: dict[tuple, object] = {}


def _ce_kernel(dtype, aligned, index64, mode, tiling):
    key = (dtype, aligned, index64, mode, tiling)
    fn = _ce_fns.get(key)
    if fn is None:
        fn = _ce_fns[key] = catalog.get("cross_entropy.fwd").compiled(
            dtype=dtypes.name_of(dtype), aligned=aligned, index64=index64, mode=mode, threads=tiling.threads,
            threads_per_row=tiling.threads_per_row, unroll=tiling.unroll)
    return fn


# `plan_rows` settings of the cross-entropy forward. A read-only kernel needs bytes in flight: each
# thread loads its 8 vectors of a pass (128 B) at once and folds them with one max and one rescale
# (`online_softmax.fold` of a list; ~64 registers, 8 CTAs of 128 threads per SM: 128 KiB in
# flight per SM); a 4k bf16 row is 64 threads x 8 vectors, one pass, two rows per CTA (QuACK's
# geometry). Was threads=512, unroll=4 (4k: 34 registers, ptxas sank 2 of the 4 loads behind the
# exps, 3 CTAs of 512 per SM: <= 48 KiB in flight; 2.85 TB/s). `perf.tune_rows --kernels
# cross_entropy.fwd` times other settings against these.
# H200 (perf/results/2026-11-29-h200-a25b01a/tune_rows_ce.md): 4k 2.85 -> 4.01 TB/s (1.10x QuACK).
# Rows of 32k elements and more take 256-thread CTAs, 4 per SM: 64k 3.56 -> 3.99 TB/s (1.09x QuACK).
# 16 vectors a thread (two passes of 8 loaded together): half the threads a row of the 8-vector plan below
# 16k, so a CTA holds twice the rows (session 22, perf/results/2026-12-01-h200-bd7688b/: 1.035x / 1.015x /
# 1.039x / 1.108x / 1.076x at 1k / 2k / 4k / 6144 / 8k; from 12288 the CTA's 128 threads cap the row's threads
# and both settings give the same plan)
CE_FWD_PLAN = dict(threads=128, unroll=8, vectors_per_thread=16, ctas_per_sm=8)
CE_FWD_LONG_PLAN = dict(CE_FWD_PLAN, threads=256, vectors_per_thread=8, ctas_per_sm=4)
CE_FWD_LONG_ROW = 32768


def ce_plan(m: int, n: int, vec: int, sms: int, whole_passes: bool | None = None, **options) -> RowPlan:
    """The plan of the cross-entropy forward for (m, n) logits read in `vec`-element vectors (1: the
    scalar variant) on `sms` SMs: `plan_rows` under CE_FWD_PLAN (CE_FWD_LONG_PLAN for rows of
    CE_FWD_LONG_ROW elements and more), `options` overriding it. `whole_passes` (default: unless `options`
    names the unroll) narrows the unroll so each thread's share of the row is whole passes; a sweep of
    settings passes True to time each setting as the op would run it as its default."""
    if whole_passes is None:
        whole_passes = "unroll" not in options
    base = CE_FWD_LONG_PLAN if n >= CE_FWD_LONG_ROW else CE_FWD_PLAN
    plan = plan_rows(m, n // vec, sms, **{**base, **options})
    t = plan.tiling
    per = -(-(n // vec) // t.threads_per_row)  # vectors a thread of the row walks
    if vec > 1 and plan.splits == 1 and per % t.unroll and whole_passes:
        # whole passes: as many as the planned unroll needs, each as wide as they then take (6144: one pass of 6
        # vectors, not a pass of 8 with 2 masked off; session 20: the partial pass had folded a vector at a time)
        passes = -(-per // t.unroll)
        plan = dataclasses.replace(plan, tiling=dataclasses.replace(t, unroll=-(-per // passes)))
    return plan


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
