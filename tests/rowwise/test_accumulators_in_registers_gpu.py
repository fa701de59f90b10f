"""GPU: the norm backwards with their dweight/dbias accumulators forced into registers
(`HeldRowPlan.acc_regs`) against the same plans with shared-memory accumulators: the same adds in
the same order, so dx, dweight and dbias must be equal bit for bit; plus fp32 references. Plans with
and without prefetch, held in registers (the CTAs-per-SM register cap) and staged in shared memory;
several tiles per CTA (ragged last wave); 0 and 1 rows, strided rows.

    python3 -m pytest -q -m gpu tests/rowwise/test_accumulators_in_registers_gpu.py
"""

import dataclasses

import pytest

from cute_kernels.rowwise import launch as R
from schedules.row_tiling import plan_held_rows
from tests.helpers import poison_empty, run_with_plans
from tests.rowwise.test_bwd_prefetch_gpu import _bitwise, _check_ref, _grads, _inputs, _reference

pytestmark = pytest.mark.gpu

NORMS_BWD = ("rmsnorm.bwd", "layernorm.bwd")
# (threads, elements a thread, staging, prefetch, CTAs per SM): LayerNorm 4k's candidate (512 x 8,
# prefetch, 2 per SM: 64 registers), the 4k default's shape (128 x 32 per row, 2 rows), a staged plan
PLANS = {"t512_pf": (512, 8, "regs", True, 2), "t256_u4": (256, 32, "regs", False, 1),
         "smem": (256, 32, "smem", False, 2)}


def _plan_for(setting, acc_regs):
    threads, elems, staging, prefetch, cps = PLANS[setting]
    orig = R.plan_for

    def plan_for(name, dtype, n, aligned):
        if name not in NORMS_BWD:
            return orig(name, dtype, n, aligned)
        vec = 16 // dtype.itemsize if aligned else 1
        p = plan_held_rows(n, vec, target_elems=elems, max_elems=elems, min_threads=threads,
                           max_tpr=threads, staging=staging if vec > 1 else "regs")
        return dataclasses.replace(p, prefetch=prefetch, ctas_per_sm=cps, acc_regs=acc_regs)

    return plan_for


CASES = [(3001, 4096), (531, 4096), (133, 16384), (0, 4096), (1, 4096), (701, 769)]


@pytest.mark.parametrize("m,n", CASES, ids=[f"{m}x{n}" for m, n in CASES])
@pytest.mark.parametrize("setting", list(PLANS))
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_register_accumulators_bitwise(op, setting, m, n, monkeypatch):
    poison_empty(monkeypatch)
    x, dy, w, b, r, ds = _inputs(m, n, strided=(m == 531))
    args = (op, x, dy, w, b, r, ds)
    shared, _ = run_with_plans(monkeypatch, _plan_for(setting, False), lambda: _grads(*args))
    regs, plans = run_with_plans(monkeypatch, _plan_for(setting, True), lambda: _grads(*args))
    if m:
        used = [p for name, p in plans.items() if name in NORMS_BWD]
        assert used and all(p.acc_regs for p in used), plans
    names = {"rms_norm": ("dx", "dweight"), "layer_norm": ("dx", "dweight", "dbias")}[op]
    for a, c, what in zip(shared, regs, names):
        _bitwise(a, c, f"{op} {setting} {what}")
    for o, ref, what in zip(regs, _reference(*args), names):
        _check_ref(o, ref, f"{op} {setting} {what}")


@pytest.mark.parametrize("m,n", [(267, 16384), (3, 16384), (133, 32768), (133, 65536), (1, 65536)],
                         ids=lambda v: str(v))
def test_layernorm_bwd_production_plans_bitwise(m, n, monkeypatch):
    """LayerNorm backward's default plans at 16k-64k (register accumulators in clusters of 2-8 on
    mbarriers, prefetching; 64k staged on the resident grid) against themselves with shared-memory
    accumulators: bit for bit, and the fp32 reference."""
    orig = R.plan_for

    def flipped(name, dtype, nn, aligned):
        p = orig(name, dtype, nn, aligned)
        return dataclasses.replace(p, acc_regs=False) if name == "layernorm.bwd" else p

    poison_empty(monkeypatch)
    x, dy, w, b, r, ds = _inputs(m, n, strided=(m == 133 and n == 32768))
    args = ("layer_norm", x, dy, w, b, r, ds)
    regs, plans = run_with_plans(monkeypatch, orig, lambda: _grads(*args))
    shared, _ = run_with_plans(monkeypatch, flipped, lambda: _grads(*args))
    if m:
        assert plans["layernorm.bwd"].acc_regs, plans
    for a, c, what in zip(shared, regs, ("dx", "dweight", "dbias")):
        _bitwise(a, c, f"layer_norm {n} {what}")
    for o, ref, what in zip(regs, _reference(*args), ("dx", "dweight", "dbias")):
        _check_ref(o, ref, f"layer_norm {n} {what}")
