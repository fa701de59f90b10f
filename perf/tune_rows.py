"""Sweep the held-row plans (threads, threads per row, vectors per thread, cluster, CTAs per SM) of
the row-wise kernels on the GPU: which plan moves the bytes fastest per (kernel, N), against the
plan `schedules.row_tiling.plan_held_rows` picks today. Feeds HELD_TUNED / plan_held_rows.
Past 4k (16k until session 19) the sweep also times shared-memory staged plans (`staging="smem"`, rows copied by
cp.async and read back per pass; tagged "smem" in the plan column) next to the register plans; up to 4k several
staged rows a CTA.
The backward kernels also get plans that pipeline row tiles (`HeldRowPlan.prefetch`, tagged "pf"):
register plans of at most 16 elements per thread and staged plans (double-buffered) at every N,
each next to its prefetch-off twin; the "x off" column is the twin's time over the plan's.
`--cluster-sync both|mbarrier` adds the mbarrier-synced twins of clustered plans
(`HeldRowPlan.cluster_sync`), "x off" then the barrier twin's time over theirs.
`--hold both|only` adds the hold twins (`HeldRowPlan.hold`: the staged row read once into registers,
tagged "hold") of the staged forward plans (softmax, log-softmax, RMSNorm, LayerNorm) of at most 64
elements per thread, "x off" the re-reading twin's time over theirs. `--kernels log_softmax.fwd`
(not in the default list) times the log-softmax forward.
`--resident-grid both|only` adds (only: times only) the one-wave twins of the clustered backward
plans and the capped-grid twins of every forward plan (forwards otherwise launch a CTA per row tile),
the default's included (`HeldRowPlan.resident_grid`, tagged "rg"), "x off" their SMs-capped
twin's time over theirs.
`--reg-cap both|only` adds the forwards' register plans capped by ptxas at their planned CTAs per SM and at one
more (`HeldRowPlan.reg_cap`, tagged "rcN"), "x off" the uncapped plan's time over theirs.
`--one-tile both|only` adds the forwards' one-CTA register plans built for one CTA per row tile (`HeldRowPlan.one_tile`,
tagged "1t"; no tile loop), also capped at up to 3 more CTAs per SM, "x off" the looping plan's time over theirs.
`--rg-ctas 4,6` adds each capped-grid forward plan without a cluster on grids of those CTAs per SM (the ctas/SM
column): a staged plan's planned CTAs per SM count its staged row alone (LayerNorm fwd 8k's: 8, where its weight
and bias staged beside it let 4 reside).

    python3 -m perf.tune_rows [--n 4096,65536] [--kernels rmsnorm.fwd,...] [--out DIR] [--jobs 16]
                              [--prefetch with|without|only] [--resident-grid off|both|only]
                              [--hold off|both|only] [--reg-cap off|both|only] [--one-tile off|both|only] [--rg-ctas 4,6]
                              [--max-cluster 8|16]

`--kernels cross_entropy.fwd` (not in the default list) times the streaming cross-entropy forward's
`plan_rows` settings instead (`ce_candidates`, against `ops.softmax.CE_FWD_PLAN`, and QuACK's).
`--kernels cross_entropy.bwd` (not in the default list either) times the cross-entropy backward's
plans (`ce_bwd_candidates`: no prefetch, staging or cluster variants; its grid is one CTA per row
tile, so the ctas/SM column does not apply) against HELD_TUNED["ce_bwd"], and QuACK's backward.

Inputs are bf16 (the held-row sweep: fp16 with `--dtype fp16`) with 256 MiB per (M, N) tensor, randn; CUDA-event medians with L2 flushed
(`cute_kernels.bench.harness.do_bench`); timed through the public ops, the plan swapped in by patching
`cute_kernels.rowwise.launch.plan_for` (compiled ahead in parallel worker processes).
"""

from __future__ import annotations

import argparse
import dataclasses
import os

import torch

from cute_kernels.bench import harness as H
from schedules.row_tiling import HeldRowPlan, RowTiling, hold_elems

MiB = 1 << 20
KERNELS = ("rmsnorm.fwd", "layernorm.fwd", "softmax.fwd", "rmsnorm.bwd", "layernorm.bwd", "softmax.bwd")
MOVED = {"fwd": 2, "bwd": 3, "cross_entropy.bwd": 2}  # (M, N) tensors read + written
CE_BWD = "cross_entropy.bwd"
# The largest cluster the candidates use: 8 (portable), or 16 with `--max-cluster 16` (Hopper's non-portable
# size, which the DSL allows on every kernel; the norm backwards past 128k run on it already)
MAX_SWEEP_CLUSTER = 8
DTYPE = torch.bfloat16  # the held-row sweep's rows (`--dtype`)


def candidates(n: int, vec: int = 8, bwd: bool = False, prefetch: str = "with") -> list[HeldRowPlan]:
    """Plans that hold a row of `n` elements with 16-64 elements per thread (bwd, and rows up to 4k: from
    8, one 16-byte vector a thread, Triton's LayerNorm at 1k), CTAs of
    128-512 threads, clusters of up to MAX_SWEEP_CLUSTER, and no more than 2x padding; for the backward kernels
    also `prefetch_candidates` ("with"), only those and their twins ("only"), or none ("without")."""
    if bwd and prefetch == "only":
        return list(dict.fromkeys(p for q in prefetch_candidates(n, vec) for p in (q, _twin(q, vec))))
    out = []
    # (forwards of 8k and up also on 1024 threads a row: torch.compile's Triton RMSNorm at 16k, 16 elements a thread)
    for tpr in (32, 64, 128, 256, 512) + ((1024,) if not bwd and n >= 8192 else ()):
        for elems in ((8, 16, 32) if bwd else (8, 16, 32, 64) if n <= 4096 else (16, 32, 64)):
            vpt = elems // vec
            cluster = 1
            while tpr * elems * cluster < n:
                cluster *= 2
            if cluster > MAX_SWEEP_CLUSTER or tpr * elems * cluster >= 2 * n or (elems == 8 and not bwd and cluster > 1):
                continue
            vpt = min(vpt, -(-n // (vec * tpr * cluster)))  # the vectors that cover the row (as `plan_held_rows`)
            for threads in sorted({max(tpr, 128), max(tpr, 256)}):
                regs = 128 if bwd else 96
                cps = max(1, min(8, 65536 // (threads * regs)))
                for c in ((cps, 2 * cps) if bwd else (cps,)):
                    out.append(HeldRowPlan(RowTiling(threads, tpr, vpt), cluster, c))
    if n >= STAGED_FROM:
        out += staged_candidates(n, vec, bwd)
    elif not bwd:
        out += small_staged_candidates(n, vec)
    if bwd and prefetch == "with":
        pf = prefetch_candidates(n, vec)
        out += pf + [_twin(p, vec) for p in pf]
    return list(dict.fromkeys(out))


def ce_bwd_candidates(n: int, vec: int = 8) -> list[HeldRowPlan]:
    """Plans of the cross-entropy backward (no reduction: a copy of x to dx bound by bytes in flight):
    16-128 elements per thread, CTAs of 128-512 threads, a row over up to 8 CTAs (grid y, from 128
    threads per row), no more than 2x padding. ctas_per_sm as `plan_held_rows` sets it (unused: the
    op launches one CTA per row tile), so the default plan is recognized among them."""
    out = []
    for tpr in (32, 64, 128, 256, 512):
        for elems in (16, 32, 64, 128):
            cluster = 1
            while tpr * elems * cluster < n:
                cluster *= 2
            if cluster > 8 or tpr * elems * cluster >= 2 * n or (cluster > 1 and tpr < 128):
                continue
            for threads in sorted({max(tpr, 128), max(tpr, 256)}):
                cps = max(1, min(8, 65536 // (threads * 128)))
                out.append(HeldRowPlan(RowTiling(threads, tpr, elems // vec), cluster, cps))
    return list(dict.fromkeys(out))


# One staged row a CTA (`staged_candidates`) from past 4k; several rows a CTA (`small_staged_candidates`) up to 4k.
# (Until session 19 the first began at 16k, so the 4k-16k band had no staged candidate at all: the 8k row, found
# the suite's weakest that session, was swept on register plans only.)
STAGED_FROM = 4097
PREFETCH_MAX_ELEMS = 16  # register prefetch: past this the second register set costs 170-190 registers


def prefetch_candidates(n: int, vec: int = 8) -> list[HeldRowPlan]:
    """Backward plans that fetch the next row tile while computing this one: the register plans
    of `candidates` with at most PREFETCH_MAX_ELEMS elements per thread (a second register set),
    and the staged plans of `staged_candidates` (a second staging buffer) at every N."""
    regs = [p for p in candidates(n, vec, bwd=True, prefetch="without")
            if p.staging == "regs" and p.tiling.unroll * vec <= PREFETCH_MAX_ELEMS]
    return [dataclasses.replace(p, prefetch=True) for p in regs] + staged_candidates(n, vec, True, prefetch=True)


# Register-capped twins (`--reg-cap`) -> the uncapped plan each was made from (its CTAs per SM were the planner's)
_REG_CAP_SOURCE: dict = {}


def reg_cap_twins(p: HeldRowPlan) -> list[HeldRowPlan]:
    """`p` (a register plan) capped at its planned CTAs per SM and at one more (`HeldRowPlan.reg_cap`), where the
    threads fit an SM."""
    out = []
    for c in (p.ctas_per_sm, p.ctas_per_sm + 1):
        if c * p.tiling.threads <= 2048 and c <= 16:
            q = dataclasses.replace(p, reg_cap=True, ctas_per_sm=c)
            _REG_CAP_SOURCE[q] = p
            out.append(q)
    return out


# One-tile twins (`--one-tile`) -> the looping plan each was made from (its capped twins past its own CTAs: the plan)
_ONE_TILE_SOURCE: dict = {}


def one_tile_twins(p: HeldRowPlan) -> list[HeldRowPlan]:
    """`p` (a one-CTA register plan of a forward on the uncapped grid) built for one CTA per row tile
    (`HeldRowPlan.one_tile`), and so built capped at up to 3 more CTAs per SM than it plans, where the threads fit an
    SM: the registers the tile loop's state took go to occupancy (RMSNorm fwd 8k, 512 threads x 16 elements: 4 CTAs
    an SM at 32 registers). Staged and clustered plans: none (their registers are not what bounds them)."""
    if p.resident_grid or p.prefetch or p.one_tile or p.staging != "regs" or p.cluster_n > 1 or p.acc_regs:
        return []
    out = [dataclasses.replace(p, one_tile=True)]
    for c in range(p.ctas_per_sm + 1, min(16, 2048 // p.tiling.threads, p.ctas_per_sm + 3) + 1):
        out.append(dataclasses.replace(p, one_tile=True, reg_cap=True, ctas_per_sm=c))
    for q in out:
        _ONE_TILE_SOURCE.setdefault(q, p)
    return out


def _twin(p: HeldRowPlan, vec: int = 8, bwd: bool = False) -> HeldRowPlan:
    """`p` with shared-memory accumulators when it forces register ones, on the SMs-capped grid when it
    has the resident one, with the cluster barrier when it syncs by mbarrier, else `p` without
    prefetch (a staged twin gets the CTAs per SM of its single buffer)."""
    if p.cluster_fold != "serial":  # (the sweep's last option: every other plan may have this twin)
        return dataclasses.replace(p, cluster_fold="serial")
    if p.one_tile:  # the looping plan it was made from
        return _ONE_TILE_SOURCE.get(p, dataclasses.replace(p, one_tile=False))
    if p.reg_cap:  # the plan it capped
        return _REG_CAP_SOURCE.get(p, dataclasses.replace(p, reg_cap=False))
    if p.prefetch and p.hold:  # a forward refilling its held row's buffer: the same plan without the refill
        return dataclasses.replace(p, prefetch=False)
    if p.welford:
        return dataclasses.replace(p, welford=False)
    if p.acc_regs:
        return dataclasses.replace(p, acc_regs=False)
    if p.hold and bwd:  # a held backward: the same plan re-reading its buffers (the grid it had)
        return dataclasses.replace(p, hold=False, ctas_per_sm=_staged(p.tiling, p.cluster_n, vec, True, False).ctas_per_sm)
    if p.hold:  # the re-reading plan, with the CTAs per SM of its own register floor
        return dataclasses.replace(_staged(p.tiling, p.cluster_n, vec, False, False), cluster_sync=p.cluster_sync)
    if p.resident_grid:
        return dataclasses.replace(p, resident_grid=False)
    if p.cluster_sync != "barrier":
        return dataclasses.replace(p, cluster_sync="barrier")
    if p.staging == "smem":
        return _staged(p.tiling, p.cluster_n, vec, True, False)
    return dataclasses.replace(p, prefetch=False)


def _staged(tiling: RowTiling, cluster: int, vec: int, bwd: bool, prefetch: bool) -> HeldRowPlan:
    p = HeldRowPlan(tiling, cluster, 1, "smem", prefetch)
    rows = (16 // vec,) * (2 if bwd else 1)
    cps = min(16, p.staged_residency(p.row_smem_bytes(vec, rows), 128 if bwd else 64))
    return dataclasses.replace(p, ctas_per_sm=cps)


def staged_candidates(n: int, vec: int = 8, bwd: bool = False, prefetch: bool = False) -> list[HeldRowPlan]:
    """Shared-memory staged plans: CTAs of 128, 256 or 512 threads (one row each), 32-128 elements per
    thread, clusters of 1-MAX_SWEEP_CLUSTER, no more than 2x padding; CTAs per SM as shared memory allows (the
    kernels ask ptxas for that many); `prefetch`: double-buffered. (512 threads since session 14: on 16-CTA
    clusters a 256k row at 32 elements a thread, e.g. the LayerNorm forward holding it at 64 registers.)"""
    out = []
    for tpr in (128, 256, 512):
        for elems in (32, 64, 128):
            cluster = 1
            while tpr * elems * cluster < n:
                cluster *= 2
            if cluster > MAX_SWEEP_CLUSTER or tpr * elems * cluster >= 2 * n:
                continue
            vpt = min(elems // vec, -(-n // (vec * tpr * cluster)))  # the vectors that cover the row
            out.append(_staged(RowTiling(tpr, tpr, vpt), cluster, vec, bwd, prefetch))
    return out


def small_staged_candidates(n: int, vec: int = 8) -> list[HeldRowPlan]:
    """Forward plans for rows up to 4k (shorter than STAGED_FROM) staged in shared memory: several rows per CTA
    (32-128 threads a row in CTAs of 128 or 256), 16-32 elements per thread, no cluster. A staged
    row frees the registers a held one takes (LayerNorm forward at 1k: 128 registers held, 48
    staged), so more CTAs share an SM (shared memory bounds them instead)."""
    out = []
    for tpr in (32, 64, 128):
        for elems in (16, 32):
            if tpr * elems < n or tpr * elems >= 2 * n:
                continue
            for threads in sorted({max(tpr, 128), max(tpr, 256)}):
                out.append(_staged(RowTiling(threads, tpr, elems // vec), 1, vec, False, False))
    return out


def _call(kernel: str, n: int, m: int, peer: bool = False):
    """The timed call: the forward, or the backward of a retained graph (as `cute_kernels.rowwise.bench`);
    `peer`: QuACK's (cross-entropy backward only)."""
    import cute_kernels as ck

    fam, direction = kernel.split(".")
    x = H.randn(m, n, dtype=DTYPE, seed=1)
    if kernel == CE_BWD:  # the loss per row (reduction "none"), its gradient all ones
        tgt = torch.randint(0, n, (m,), device="cuda")
        if peer:
            from quack.cross_entropy import cross_entropy as f  # patches CuTe classes: bench process only
        else:
            f = ck.cross_entropy
        xg = x.detach().requires_grad_()
        y = f(xg, tgt, reduction="none")
        return lambda: torch.autograd.grad(y, xg, torch.ones_like(y), retain_graph=True)
    w = H.randn(n, dtype=DTYPE, seed=2)
    b = H.randn(n, dtype=DTYPE, seed=3)
    f = {"rmsnorm": lambda x: ck.rms_norm(x, w, 1e-6), "layernorm": lambda x: ck.layer_norm(x, w, b, 1e-5),
         "softmax": ck.softmax, "log_softmax": ck.log_softmax}[fam]
    if direction == "fwd":
        return lambda: f(x)
    dy = H.randn(m, n, dtype=DTYPE, seed=4)
    xg = x.detach().requires_grad_()
    y = f(xg)
    y = y[0] if isinstance(y, tuple) else y
    return lambda: torch.autograd.grad(y, xg, dy, retain_graph=True)


def _hold_twin(p: HeldRowPlan, vec: int = 8, kernel: str = "softmax.fwd") -> HeldRowPlan:
    """`p` holding its staged row in registers, with the CTAs per SM the kernel asks for (its
    `held_min_regs`). The norm backwards hold x and dy; a prefetching backward plan's twin refills its one
    buffer per tensor once they are read out (`HeldRowPlan.stages` 1: where the double buffer did not fit)."""
    from cute_kernels.rowwise.norms import NormBwd, NormFwd
    from cute_kernels.rowwise.softmax import SoftmaxFwd

    q = dataclasses.replace(p, hold=True)
    bwd = kernel.endswith(".bwd")
    if kernel.startswith(("rmsnorm", "layernorm")):
        regs = (NormBwd if bwd else NormFwd).held_min_regs
    else:
        regs = SoftmaxFwd.held_regs(p.tiling.unroll * vec)
    rows = (16 // vec,) * (2 if bwd else 1)
    return dataclasses.replace(q, ctas_per_sm=min(16, q.staged_residency(q.row_smem_bytes(vec, rows), regs)))


def _holdable(p: HeldRowPlan, kernel: str, vec: int = 8) -> bool:
    return p.staging == "smem" and not p.hold and p.tiling.unroll * vec <= hold_elems(kernel)


def _timed_with(obj, attr: str, value, fn, what: str, output: bool = False):
    """Median ms of `fn()` (`fn` builds the timed call) with `obj.attr` set to `value`, restored
    after; None (reported) when the call fails. `output`: (ms, one more call's output as fp32, a backward's
    dx), from the same built call (inputs made once); (None, None) when it fails."""
    orig = getattr(obj, attr)
    setattr(obj, attr, value)
    try:
        call = fn()
        ms = H.do_bench(call)["median_ms"]
        if not output:
            return ms
        out = call()
        return ms, (out[0] if isinstance(out, tuple) else out).float()
    except Exception as e:
        H.progress(f"  {what}: {type(e).__name__}: {str(e)[:120]}")
        return (None, None) if output else None
    finally:
        setattr(obj, attr, orig)


def _max_err(out, ref) -> float:
    """max |out - ref| / max |ref| (inf when out is missing or not finite): a plan that merges its
    cluster wrongly or leaves elements unwritten shows orders of magnitude above the bf16 rounding."""
    if out is None or not torch.isfinite(out).all():
        return float("inf")
    return ((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


ERR_OK = 2e-2  # bf16 outputs of two reduction orders differ by a few units in the last place


def plan_params(k: str, p: HeldRowPlan) -> dict:
    """The catalogue parameters `sweep` compiles kernel `k` with under plan `p`: the sweep's dtype (`DTYPE`), aligned
    rows, 32-bit indexing, the norms with a weight of that dtype (LayerNorm's backward also a bias)."""
    from cute_kernels import dtypes
    from cute_kernels.rowwise import config_of

    name = dtypes.name_of(DTYPE)
    params = dict(dtype=name, aligned=True, index64=False, **config_of(p, k))
    if k.startswith(("rmsnorm", "layernorm")):
        params.update(weight=True, residual=False, w_dtype=name)
    if k == "layernorm.bwd":
        params["bias"] = True
    return params


def _with_twins(ps: list, mode: str, twins: list, bwd: bool = False) -> list:
    """A sweep's plans with an option's `twins` (mode "both": added to them), or (mode "only") just the
    twins and the plans `_twin` pairs them with."""
    return (ps + twins) if mode == "both" else (twins + [_twin(p, bwd=bwd) for p in twins])


def plan_candidates(k: str, n: int, default: HeldRowPlan, prefetch: str = "with", cluster_sync: str = "barrier",
                    resident_grid: str = "off", hold: str = "off", acc_regs: str = "off", welford: str = "off",
                    fwd_prefetch: str = "off", cluster_fold: str = "off", reg_cap: str = "off",
                    rg_ctas: tuple = (), one_tile: str = "off") -> list[HeldRowPlan]:
    """The plans `sweep` times for kernel `k` at rows of `n` (bf16) beside its `default`: the candidates and the twins
    the options ask for (`main`'s help)."""
    from cute_kernels.rowwise import (
        ACC_REGS_KERNELS,
        HOLD_KERNELS,
        ONE_TILE_KERNELS,
        PREFETCH_HOLD_ONLY,
        REG_CAP_KERNELS,
        WELFORD_KERNELS,
    )

    if k == CE_BWD:  # no prefetch, staging or cluster to vary
        ps = ce_bwd_candidates(n)
    else:
        ps = candidates(n, bwd=k.endswith(".bwd"), prefetch=prefetch)
        if k.endswith(".bwd") and prefetch != "without":  # the default plan, prefetching
            ps.append(dataclasses.replace(default, prefetch=True))
        # twins of the clustered plans (and of the default): mbarrier-synced, and (backward) on the
        # one-wave grid (same kernel, another grid); "both" adds them, the other non-off mode keeps
        # only the twin pairs
        for mode, off, change in ((cluster_sync, "barrier", dict(cluster_sync="mbarrier")),
                                  (resident_grid, "off", dict(resident_grid=True))):
            if mode != off:  # forwards: every plan has a capped twin (backwards: clustered ones)
                ps = _with_twins(ps, mode, [dataclasses.replace(p, **change) for p in [default] + ps
                                            if p.cluster_n > 1
                                            or (change.get("resident_grid") and k.endswith(".fwd"))])
        if reg_cap != "off" and k in REG_CAP_KERNELS:  # register plans capped (after the capped-grid
            # twins: those too)
            ps = _with_twins(ps, reg_cap, [q for p in [default] + ps
                                           if p.staging == "regs" and not (p.reg_cap or p.acc_regs)
                                           for q in reg_cap_twins(p)])
        if hold != "off" and k in HOLD_KERNELS:  # after the mbarrier twins: those too
            held = [p for p in [default] + ps if _holdable(p, k)]
            if k.endswith(".bwd"):  # the backwards: each staged plan held, and held + refilled
                held = held + [dataclasses.replace(p, prefetch=True) for p in held if not p.prefetch]
            ps = _with_twins(ps, hold, [_hold_twin(p, kernel=k) for p in held], bwd=k.endswith(".bwd"))
        if fwd_prefetch != "off" and k in PREFETCH_HOLD_ONLY:  # held rows refilled, on the capped grid
            ps = _with_twins(ps, fwd_prefetch, [dataclasses.replace(p, prefetch=True, resident_grid=True)
                                                for p in [default] + ps if p.hold and not p.prefetch])
        if rg_ctas and k.endswith(".fwd"):  # capped-grid forwards on grids of other CTAs per SM (a staged
            # plan's planned CTAs per SM may count its row alone; its kernel fits what shared memory allows)
            ps = ps + [dataclasses.replace(p, ctas_per_sm=c) for p in [default] + ps
                       if p.resident_grid and p.cluster_n == 1 for c in rg_ctas if c != p.ctas_per_sm]
        if one_tile != "off" and k in ONE_TILE_KERNELS:  # one CTA a row tile, no tile loop (after the capped twins:
            # those too)
            ps = _with_twins(ps, one_tile, list(dict.fromkeys(q for p in [default] + ps for q in one_tile_twins(p))))
        if acc_regs != "off" and k in ACC_REGS_KERNELS:  # register accumulators, any plan
            ps = _with_twins(ps, acc_regs, [dataclasses.replace(p, acc_regs=True) for p in [default] + ps
                                            if not p.acc_regs])
        if welford != "off" and k in WELFORD_KERNELS:  # one (count, mean, M2) reduction, any plan
            ps = _with_twins(ps, welford, [dataclasses.replace(p, welford=True) for p in [default] + ps
                                           if not p.welford])
        if cluster_fold != "off" and k != CE_BWD:  # the cluster's partials folded by a butterfly, last:
            # every clustered plan above (held, refilled, ...) gets its twin
            ps = _with_twins(ps, cluster_fold, [dataclasses.replace(p, cluster_fold="tree")
                                                for p in [default] + ps
                                                if p.cluster_n > 1 and p.cluster_fold == "serial"
                                                and p.tiling.threads_per_row >= p.cluster_n],
                             bwd=k.endswith(".bwd"))
    return ps


def sweep(kernels, ns, jobs: int, prefetch: str = "with", cluster_sync: str = "barrier",
          resident_grid: str = "off", hold: str = "off", acc_regs: str = "off", welford: str = "off",
          fwd_prefetch: str = "off", cluster_fold: str = "off", reg_cap: str = "off", rg_ctas: tuple = (),
          one_tile: str = "off"):
    from cute_kernels.precompile import item, precompile
    from cute_kernels.rowwise import launch as R

    plans = {}
    items = []
    for k in kernels:
        for n in ns:
            try:
                default = R.plan_for(k, DTYPE, n, True)
            except ValueError as e:  # the op refuses this width (rows past the kernel's limit): nothing to compare with
                H.progress(f"  skip {k} {n}: {str(e)[:120]}")
                continue
            keep = []
            ps = plan_candidates(k, n, default, prefetch, cluster_sync, resident_grid, hold, acc_regs, welford,
                                 fwd_prefetch, cluster_fold, reg_cap, rg_ctas, one_tile)
            for p in dict.fromkeys(ps):
                params = plan_params(k, p)
                try:  # a staged plan past the shared memory of a CTA is refused by the spec
                    items.append(item(k, params))
                except ValueError as e:
                    H.progress(f"  skip {k} {n} {p}: {str(e)[:120]}")
                    continue
                keep.append(p)
            plans[(k, n)] = default, keep
    if jobs > 1:
        H.progress(f"precompiling {len(items)} variants on {jobs} workers")
        try:
            precompile(list(dict.fromkeys(items)), jobs)
        except Exception as e:  # a variant the spec rejects: compile lazily instead
            H.progress(f"  precompile: {type(e).__name__}: {str(e)[:200]}")
    ceil = H.copy_bandwidth() if hasattr(H, "copy_bandwidth") else None
    orig = R.plan_for
    lines = ["| kernel | N | plan | ctas/SM | us | TB/s | x default | x off | max err |",
             "|---|---|---|---|---|---|---|---|---|"]
    best_rows = []
    for (k, n), (default, ps) in plans.items():
        m = max(1, 128 * MiB // n)
        res = []
        errs = {}
        ref = None
        for p in [default] + [p for p in ps if p != default]:
            # only the kernel under test (the forward of a backward's graph keeps its own plan)
            def patch(name, dtype, nn, aligned, _p=p, _k=k):
                return _p if name == _k else orig(name, dtype, nn, aligned)

            # every plan's output against the default's (fresh outputs: the timed call allocates them)
            t, out = _timed_with(R, "plan_for", patch, lambda: _call(k, n, m), f"{k} {n} {p}", output=True)
            if t is None:
                continue
            if ref is None:  # the default's, or the first plan that ran
                ref = out
            errs[p] = _max_err(out, ref)
            if errs[p] > ERR_OK:  # a wrong plan must never rank: report it, leave it out
                H.progress(f"  {k} {n} {p}: WRONG, max err {errs[p]:.2e} against the default")
                lines.append(f"| {k} | {n} | {p} WRONG | {p.ctas_per_sm} | | | | | {errs[p]:.2e} |")
                continue
            del out
            res.append((t, p))
            torch.cuda.empty_cache()
        ref = None
        if not res:
            continue
        t0 = res[0][0]
        nbytes = MOVED.get(k, MOVED[k.split(".")[1]]) * m * n * 2
        times = {p: t for t, p in res}
        ranked = sorted(res, key=lambda r: r[0])
        shown = ranked[:4] + [res[0]]
        best_pf = next((r for r in ranked if r[1].prefetch), None)
        if best_pf is not None and best_pf not in shown:
            shown.append(best_pf)  # the fastest prefetching plan, wherever it ranks
        def twin_of(**kw):  # the default with one option changed; None where that plan is invalid
            try:
                return dataclasses.replace(default, **kw)
            except ValueError:
                return None
        # (each default's twin built once, not per ranked plan)
        tw = {k: twin_of(**{k: v}) for k, v in (("one_tile", True), ("cluster_fold", "tree"), ("welford", True),
                                                ("resident_grid", True), ("cluster_sync", "mbarrier"))}
        for want in (lambda q: q.one_tile,  # the fastest one-tile plan
                     lambda q: q == tw["one_tile"],  # the default's twin
                     lambda q: q.cluster_fold == "tree",  # the fastest butterfly-folded plan
                     lambda q: q == tw["cluster_fold"],  # the default's twin
                     lambda q: q.welford,  # the fastest one-reduction LayerNorm plan
                     lambda q: q == tw["welford"],  # the default's twin
                     lambda q: q.acc_regs,  # the fastest plan with register accumulators
                     lambda q: q.hold,  # the fastest plan holding a staged row
                     lambda q: q.resident_grid,  # the fastest one-wave plan
                     lambda q: q == tw["resident_grid"],  # the default's twin
                     lambda q: q.cluster_sync == "mbarrier",  # the fastest mbarrier-synced plan
                     lambda q: q == tw["cluster_sync"]):  # the default's twin
            r = next((r for r in ranked if want(r[1])), None)
            if r is not None and r not in shown:
                shown.append(r)
        for t, p in shown:
            tag = " (default)" if p == default else ""
            twin = _twin(p, bwd=k.endswith(".bwd")) if (p.prefetch or p.cluster_sync != "barrier" or p.resident_grid or p.hold
                                or p.acc_regs or p.welford or p.cluster_fold != "serial" or p.one_tile) else None
            off = f"{times[twin] / t:.3f}" if twin in times else ""
            lines.append(f"| {k} | {n} | {p}{tag} | {p.ctas_per_sm} | {t * 1e3:.1f} | "
                         f"{nbytes / t / 1e9:.3f} | {t0 / t:.3f} | {off} | {errs.get(p, 0.0):.1e} |")
        best_rows.append((k, n, ranked[0]))
        if k == CE_BWD:  # the peer, after every plan of ours at this N (importing it patches CuTe)
            try:
                t = H.do_bench(_call(k, n, m, peer=True))["median_ms"]
                lines.append(f"| {k} | {n} | QuACK cross_entropy backward | | {t * 1e3:.1f} | "
                             f"{nbytes / t / 1e9:.3f} | {t0 / t:.3f} | | |")
                shown = shown + [None]
            except Exception as e:
                H.progress(f"  quack: {type(e).__name__}: {str(e)[:120]}")
            torch.cuda.empty_cache()
        print("\n".join(lines[-len(shown):]), flush=True)
    return lines, ceil


# --- cross-entropy forward: a streaming row reduction (`plan_rows` settings, not a held-row plan) ------
CE_FWD = "cross_entropy.fwd"


def ce_candidates() -> list[dict]:
    """`ops.softmax.ce_plan` settings of the cross-entropy forward: CTAs of 128-512 threads, 4 or 8
    vectors per thread per pass (loaded together), each thread's share of the row one or two passes
    (`vectors_per_thread`), CTAs per SM (the split passes' grid) from a 64-register estimate."""
    out = []
    for threads in (128, 256, 512):
        for unroll in (4, 8):
            for passes in (1, 2):
                out.append(dict(threads=threads, unroll=unroll, vectors_per_thread=unroll * passes,
                                ctas_per_sm=max(1, 1024 // threads)))
    return out


def _ce_passes(plan, m: int, sms: int):
    """(mode, plan) of each launch `ops.softmax._ce_rows` makes under `plan`."""
    if plan.splits == 1:
        return [("rows", plan)]
    from schedules.row_tiling import plan_rows

    return [("partial", plan), ("merge", plan_rows(m, plan.splits, sms, max_splits=1))]


def sweep_ce(ns, jobs: int) -> list[str]:
    """Time `ce_candidates` (and QuACK's forward, when importable) on bf16 (M, N) logits of 256 MiB
    through `cute_kernels.cross_entropy`, the plan swapped in by patching the ops' `ce_plan`
    (`schedules.row_tiling.ce_plan`, imported into `cute_kernels.rowwise.ops`)."""
    import importlib

    import cute_kernels as ck
    from cute_kernels.precompile import item, precompile
    from schedules import row_tiling as RT

    S = importlib.import_module("cute_kernels.rowwise.ops")

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    orig = S.ce_plan

    def cands_at(n):  # the op's default settings at this width first
        d = dict(RT.CE_FWD_LONG_PLAN if n >= RT.CE_FWD_LONG_ROW else RT.CE_FWD_PLAN)
        return d, [d] + [c for c in ce_candidates() if c != d]

    items = []
    for n in ns:
        m = max(1, 128 * MiB // n)
        for c in cands_at(n)[1]:
            for mode, plan in _ce_passes(orig(m, n, 8, sms, whole_passes=True, **c), m, sms):
                t = plan.tiling
                items.append(item(CE_FWD, dict(dtype="bf16", aligned=mode != "merge", index64=False, mode=mode,
                                               threads=t.threads, threads_per_row=t.threads_per_row, unroll=t.unroll)))
    if jobs > 1:
        H.progress(f"precompiling {len(set(items))} variants on {jobs} workers")
        precompile(list(dict.fromkeys(items)), jobs)
    lines = ["| kernel | N | plan | splits | us | TB/s | x default |", "|---|---|---|---|---|---|---|"]
    for n in ns:
        m = max(1, 128 * MiB // n)
        x = H.randn(m, n, dtype=torch.bfloat16, seed=1)
        tgt = torch.randint(0, n, (m,), device="cuda")
        res, seen = [], set()
        default, cands = cands_at(n)
        for c in cands:
            plan = orig(m, n, 8, sms, whole_passes=True, **c)
            if plan in seen:  # another setting's plan at this N (threads per row capped by the CTA)
                continue
            seen.add(plan)
            t = _timed_with(S, "ce_plan",
                            lambda mm, nn, vec, s, _c=c, **o: orig(mm, nn, vec, s, whole_passes=True, **{**_c, **o}),
                            lambda: (lambda: ck.cross_entropy(x, tgt, reduction="none")), f"{CE_FWD} {n} {c}")
            if t is None:
                continue
            res.append((t, c))
        try:
            from quack.cross_entropy import cross_entropy as qce  # patches CuTe classes: bench process only

            res.append((H.do_bench(lambda: qce(x, tgt, reduction="none"))["median_ms"], "quack"))
        except Exception as e:
            H.progress(f"  quack: {type(e).__name__}: {str(e)[:120]}")
        if not res:
            continue
        t0 = res[0][0]
        for t, c in sorted(res, key=lambda r: r[0]):
            if c == "quack":
                desc, splits = "QuACK cross_entropy", ""
            else:
                plan = orig(m, n, 8, sms, whole_passes=True, **c)
                desc = f"{plan.tiling} vpt{c['vectors_per_thread']} ctas/SM {c['ctas_per_sm']}"
                desc += " (default)" if c == default else ""
                splits = str(plan.splits)
            lines.append(f"| {CE_FWD} | {n} | {desc} | {splits} | {t * 1e3:.1f} | {m * n * 2 / t / 1e9:.3f} | "
                         f"{t0 / t:.3f} |")
        print("\n".join(lines[-len(res):]), flush=True)
        torch.cuda.empty_cache()
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", default="4096,16384,65536,131072")
    ap.add_argument("--kernels", default=",".join(KERNELS))
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--out", default=None)
    ap.add_argument("--prefetch", choices=("with", "without", "only"), default="with",
                    help="backward kernels: also time prefetching plans (with), none (without), or only them and "
                         "their prefetch-off twins (only)")

    def twin_option(flag, help):  # an option adding the plans' twins: off, both (plans and twins), only (the pairs)
        ap.add_argument(flag, choices=("off", "both", "only"), default="off", help=help)

    ap.add_argument("--cluster-sync", choices=("barrier", "both", "mbarrier"), default="barrier",
                    help="clustered plans: the cluster barrier only (barrier), also their mbarrier-synced twins "
                         "(both), or only the twin pairs (mbarrier); 'x off' is then the barrier twin's time over "
                         "the plan's")
    twin_option("--hold",
                help="also the hold twins of staged plans of <= 64 elements per thread (both), or only the twin "
                     "pairs (only); 'x off' is then the re-reading twin's time over the plan's. The norm "
                     "backwards: each staged plan held, and held + refilled (one buffer; 'x off' against held)")
    twin_option("--acc-regs",
                help="norm backwards: also every plan with its dweight/dbias accumulators in registers "
                     "(both: HeldRowPlan.acc_regs), or only the twin pairs (only); 'x off' is then the "
                     "shared-memory twin's time over the plan's")
    twin_option("--welford",
                help="LayerNorm forward: also every plan with its mean and variance in one reduction (both: "
                     "HeldRowPlan.welford), or only the twin pairs (only); 'x off' is then the two-reduction "
                     "twin's time over the plan's")
    twin_option("--resident-grid",
                help="clustered backward plans: also their one-wave twins, forwards: every plan's capped-grid twin "
                     "(both: HeldRowPlan.resident_grid), or only the twin pairs (only); 'x off' is then the "
                     "twin's time (SMs-capped / uncapped) over the plan's")
    twin_option("--fwd-prefetch",
                help="staged forwards (norms, softmax, log-softmax): also every held plan refilling its buffer with "
                     "the next tile on the capped "
                     "grid (both: HeldRowPlan.prefetch + hold + resident_grid), or only the twin pairs (only); 'x "
                     "off' is then the held plan's time without the refill over the plan's")
    twin_option("--cluster-fold",
                help="clustered plans: also their twins folding the cluster's partials by a butterfly (both: "
                     "HeldRowPlan.cluster_fold 'tree'), or only the twin pairs (only); 'x off' is then the "
                     "rank-order (serial) twin's time over the plan's")
    twin_option("--reg-cap",
                help="forwards: also every register plan capped by ptxas at its planned CTAs per SM and at "
                     "one more (both: HeldRowPlan.reg_cap, tagged rcN), or only the twin pairs (only); 'x off' is "
                     "then the uncapped plan's time over the plan's")
    ap.add_argument("--rg-ctas", default="",
                    help="comma list of CTAs per SM: also each capped-grid forward plan without a cluster (the default "
                         "and the twins above) on a grid of that many CTAs per SM (the ctas/SM column; a staged plan's "
                         "kernel still asks ptxas for what shared memory allows)")
    twin_option("--one-tile",
                help="forwards on the uncapped grid: also each one-CTA register plan built for one CTA per row "
                     "tile, and capped at up to 3 more CTAs per SM (both: HeldRowPlan.one_tile, tagged 1t), "
                     "or only the twin pairs (only); 'x off' is then the looping plan's time over the plan's")
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16",
                    help="the rows' (and the norms' weights') dtype of the held-row sweep (the cross-entropy sweep: "
                         "bf16)")
    ap.add_argument("--max-cluster", type=int, choices=(8, 16), default=8,
                    help="the largest cluster of the candidate plans: 8 (portable) or 16 (non-portable)")
    a = ap.parse_args(argv)
    global MAX_SWEEP_CLUSTER, DTYPE
    MAX_SWEEP_CLUSTER = a.max_cluster
    DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype]
    kernels = a.kernels.split(",")
    ns = [int(v) for v in a.n.split(",")]
    lines = []
    if CE_FWD in kernels:  # its own sweep: streaming settings, not held-row plans
        kernels.remove(CE_FWD)
        lines = sweep_ce(ns, a.jobs)
    if kernels:
        held, _ = sweep(kernels, ns, a.jobs, a.prefetch, a.cluster_sync, a.resident_grid, a.hold, a.acc_regs,
                        a.welford, a.fwd_prefetch, a.cluster_fold, a.reg_cap,
                        tuple(int(c) for c in a.rg_ctas.split(",") if c), a.one_tile)
        lines = held + ([""] + lines if lines else [])
    text = f"# held-row plan sweep ({a.dtype}, 256 MiB per tensor)\n\n" + "\n".join(lines) + "\n"
    print(text)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "tune_rows.md"), "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
