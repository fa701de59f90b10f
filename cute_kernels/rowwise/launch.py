"""What the row-wise ops share: the plan and compiled kernel for an (M, N) input (`_checks.rows_of`)."""

from __future__ import annotations

import dataclasses

import torch

from cute_kernels import catalog, dtypes
from cute_kernels.rowwise import ACC_REGS_KERNELS, config_of, plan_for_kernel, tuning_of
from cute_kernels.torch_ops import INDEX32_LIMIT, UNCAPPED  # noqa: F401 (re-exported to the row-wise ops)
from schedules.hardware import max_active_clusters, num_sms
from schedules.row_tiling import max_held_row

_fns: dict[tuple, tuple] = {}  # (compiled kernel, its plan)


def vector_ok(*ts) -> bool:
    """128-bit variant: every operand's base 16-byte aligned, N and every row stride multiples of
    the vector (the held-row kernels have no scalar tail)."""
    vec = 16 // ts[0].element_size()
    for t in ts:
        if t is None:
            continue
        if t.data_ptr() % 16 or t.shape[-1] % vec or (t.dim() == 2 and t.shape[0] > 1 and t.stride(0) % vec):
            return False
    return True


def plan_for(name: str, dtype: torch.dtype, n: int, aligned: bool):
    """The held-row plan kernel `name` uses for rows of `n` elements (ValueError naming x past its capacity)."""
    vec = _vec(dtype, aligned)
    try:
        return plan_for_kernel(name, n, vec)
    except ValueError:
        most = max_held_row(tuning_of(name), vec)
        kind = ("16-byte vectors" if aligned else
                "scalar loads: the base, the row stride or N x element size is not a multiple of 16 bytes")
        raise ValueError(f"x: rows of {n} elements are longer than {name} holds on chip: at most {most} for "
                         f"{str(dtype).split('.')[-1]} rows ({kind})") from None


def kernel_params(name: str, dtype: torch.dtype, n: int, aligned: bool, index64: bool = False, **signature) -> dict:
    """The catalogue parameters of the kernel the ops run for (M, n) rows: what `launch_params`
    compiles, and what a test or bench can precompile (`cute_kernels.precompile.precompile`)."""
    plan = launch_plan(name, plan_for(name, dtype, n, aligned), dtype, n, aligned, index64, signature)
    return dict(dtype=dtypes.name_of(dtype), aligned=aligned, index64=index64, **config_of(plan, name), **signature)


def launch_plan(name: str, plan, dtype: torch.dtype, n: int, aligned: bool, index64: bool, signature: dict):
    """`plan` (`plan_for`'s) as the kernel is built for this signature: its 64-bit alternative (`wide_plan`) for
    tensors past 2^31 elements, then one whose shared memory the signature's operands fit (`fitted`)."""
    return fitted(name, without_reg_cap(wide_plan(name, plan, dtype, n, aligned) if index64 else plan, signature, index64), dtype, n,
                  aligned, signature)


def without_reg_cap(plan, signature: dict, index64: bool = False):
    """`plan` without its register cap (`HeldRowPlan.reg_cap`) beside a residual, an FP8 output, an fp32 weight or
    64-bit indexing: the caps were measured on the plain signature, and these leave them no room (CPU compile: RMSNorm
    fwd 8k capped at 3 CTAs an SM, 16-24 B spilled beside the 1x128-block output; RMSNorm fwd 12288 at 3 and LayerNorm
    fwd 8k at 4, 8-152 B beside the residual, the per-token output, an fp32 weight or 64-bit indexing). Its grid
    stays the plan's (grid-stride, at most one wave more; a one-tile plan: a CTA a tile)."""
    other = (signature.get("residual") or signature.get("fp8_out") not in (None, "none") or index64
             or signature.get("w_dtype") == "fp32")
    return dataclasses.replace(plan, reg_cap=False) if plan.reg_cap and other else plan


def _vec(dtype: torch.dtype, aligned: bool) -> int:
    return 16 // dtype.itemsize if aligned else 1


def wide_plan(name: str, plan, dtype: torch.dtype, n: int, aligned: bool):
    """For tensors past 2^31 elements (64-bit indexing): the production plan's `i64` alternative where its entry
    has one (`schedules.row_tiling.plan_for_rows`: a plan whose 64-bit address math would spill), else `plan`; a
    plan that is not the production one (a test's, a sweep's) is kept."""
    vec = _vec(dtype, aligned)
    try:
        return plan_for_kernel(name, n, vec, index64=True) if plan == plan_for_kernel(name, n, vec) else plan
    except ValueError:
        return plan


def fitted(name: str, plan, dtype: torch.dtype, n: int, aligned: bool, signature: dict):
    """`plan`, or where its staged rows leave this signature's operands no room in shared memory (an fp32 weight
    beside RMSNorm's 32k rows or LayerNorm's 256k: 256 KiB a CTA) the register plan its family keeps for the length
    (HELD_TUNED's `regs` settings), else the plan with its dweight / dbias accumulators in registers (a norm
    backward's shared slots freed: `schedules.row_tiling.bwd_smem_accumulators`; a held backward plan without its
    hold and refill first)."""
    if plan.staging != "smem":
        return plan
    if plan.hold and name.endswith(".bwd") and signature.get("w_dtype") == "fp32" and dtype.itemsize == 2:
        # a held backward beside an fp32 weight: the widened staged weight takes the held rows' registers (RMSNorm
        # 128k-256k spilled 16-32 B): the entry's `i64` plan (the unheld plan before it) where the plan is the
        # production one
        vec = _vec(dtype, aligned)
        if plan == plan_for_kernel(name, n, vec):
            plan = plan_for_kernel(name, n, vec, index64=True)
    spec = catalog.get(name)

    def error(p):  # (the spec's check names the shared memory a plan needs past SMEM_PER_CTA)
        try:
            spec.resolve(dict(dtype=dtypes.name_of(dtype), aligned=aligned, **config_of(p, name), **signature))
            return None
        except ValueError as e:
            return e

    first = error(plan)
    if first is None:
        return plan
    try:
        regs = plan_for_kernel(name, n, _vec(dtype, aligned), staged=False)
    except ValueError:  # no register plan holds rows this long
        regs = None
    # a held plan's staged twin (its registers are then free for the accumulators: LayerNorm 128k-256k beside an
    # fp32 weight spilled 208-224 B held with register accumulators, 112 B unheld)
    unheld = dataclasses.replace(plan, hold=False, prefetch=False) if plan.hold and name.endswith(".bwd") else plan
    accr = dataclasses.replace(unheld, acc_regs=True) if name in ACC_REGS_KERNELS and not unheld.acc_regs else None
    for alt in (regs, unheld, accr):
        if alt is not None and alt != plan and error(alt) is None:
            return alt
    raise first


def launch_params(name: str, x2: torch.Tensor, *others, **signature):
    """(compiled kernel, plan) for kernel `name` on the (M, N) matrix x2 (+ operands that must
    share its vector class)."""
    m, n = x2.shape
    aligned = vector_ok(x2, *others)
    index64 = max(m * max(x2.stride(0), n), n) > INDEX32_LIMIT
    # The call's own key first: the plan choice (`plan_for`, ~5-10 us of Python a call; the norm backwards' whole
    # autograd call takes 165-330 us of host time) is made once per length and signature. Keyed by the
    # `plan_for` in use, held alive by the key (tests and `perf.tune_rows` patch it), and by the call's argument
    # order (a call site always passes its keywords in one order).
    fast = (name, plan_for, x2.dtype, n, aligned, index64, tuple(signature.items()))
    hit = _fns.get(fast)
    if hit is not None:
        return hit
    plan = plan_for(name, x2.dtype, n, aligned)
    key = (name, x2.dtype, aligned, index64, plan, tuple(sorted(signature.items())))
    hit = _fns.get(key)
    if hit is None:  # the kernel and the plan it was built for (`launch_plan` may swap it)
        plan = launch_plan(name, plan, x2.dtype, n, aligned, index64, signature)
        sig = dict(dtype=dtypes.name_of(x2.dtype), aligned=aligned, index64=index64, **signature)
        params = {**config_of(plan, name), **sig}
        hit = _fns[key] = (catalog.get(name).compiled(plan, **sig), grid_plan(name, plan, params))
    _fns[fast] = hit
    return hit


def grid_ctas_per_sm(name: str, plan, params: dict) -> int:
    """CTAs per SM a forward's capped grid (`HeldRowPlan.resident_grid`) is sized by: whole waves. A staged plan's own
    count covers its staged rows alone, not the weights beside them; where what its kernel fits for this signature
    (`NormFwd.resident_ctas`) does not divide it, the largest multiple of that fit within it. (LayerNorm
    fwd at 6144, staged 128 x 48 held beside its weight and bias, is planned at 8 CTAs an SM and fits 6: a grid of 8
    an SM ran a quarter of its CTAs in a second wave, 0.2290 ms against 0.2146 for the power-of-two plan before it, 4
    of 8 resident, two even waves. The measured defaults, 2 or 4 of 4 or 8, keep their grids.)"""
    if not (name.endswith(".fwd") and plan.resident_grid and plan.staging == "smem"):
        return plan.ctas_per_sm
    spec = catalog.get(name)
    fit = spec.build(spec.resolve(params))[0].resident_ctas()
    return plan.ctas_per_sm if fit >= plan.ctas_per_sm else plan.ctas_per_sm // fit * fit


def grid_plan(name: str, plan, params: dict):
    """`plan` with the CTAs per SM its grid is sized by (`grid_ctas_per_sm`): the plan `launch_params` returns."""
    c = grid_ctas_per_sm(name, plan, params)
    return plan if c == plan.ctas_per_sm else dataclasses.replace(plan, ctas_per_sm=c)


def grid_ctas(rows: int, plan, capped: bool, device) -> tuple[int, int]:
    """(max_ctas argument, CTAs the kernel will launch along x: clusters, with a cluster) for `rows`
    rows. Capped: `plan.ctas_per_sm` per SM, or with `plan.resident_grid` and a cluster that many
    times the clusters co-resident (one wave; `HeldRowPlan.resident_grid`)."""
    tiles = -(-rows // plan.tiling.rows_per_cta)
    index = device.index or 0
    if not capped:
        cap = UNCAPPED
    elif plan.resident_grid and plan.cluster_n > 1:
        cap = plan.ctas_per_sm * max_active_clusters(plan.cluster_n, index)
    else:
        cap = plan.max_ctas(num_sms(index))
    return cap, max(1, min(tiles, cap))


def max_row_length(name: str, dtype: torch.dtype) -> int:
    """Longest row kernel family `name` holds (aligned rows)."""
    return max_held_row(tuning_of(name), 16 // torch.tensor([], dtype=dtype).element_size())
