"""CPU: the HELD_TUNED plans carry the CTAs per SM their sweeps measured them with.

Where `ctas_per_sm` changes what runs (a register-held plan with `acc_regs`: ptxas's register cap; a `resident_grid`
plan: the size of the persistent grid), a plan entered into HELD_TUNED with settings that rebuild the winner's
tiling but not its CTAs per SM is another kernel than the one measured. Session 15 found one: LayerNorm bwd 32k
(`t512r512u1 c8 mb accr pf`) swept at 2 CTAs an SM (319.0 us), entered at 1; the suites since ran it at 395-403 us.
Every `perf/results/tune_rows/*.md` row that timed a plan of the table's tiling at the table's length is read; a plan
so measured must appear there with its own CTAs per SM."""

import glob
import os
import re

from cute_kernels.rowwise import plan_for_kernel
from schedules.row_tiling import HELD_TUNED

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
FAMILIES = {"rms_fwd": "rmsnorm.fwd", "ln_fwd": "layernorm.fwd", "rms_bwd": "rmsnorm.bwd", "ln_bwd": "layernorm.bwd",
            "fwd": "softmax.fwd", "lsm_fwd": "log_softmax.fwd", "bwd": "softmax.bwd"}


def _sweep_rows() -> dict:
    rows = {}
    for f in glob.glob(os.path.join(ROOT, "perf", "results", "tune_rows", "*.md")):
        with open(f) as fh:
            for line in fh:
                m = re.match(r"\| (\S+) \| (\d+) \| ([^|]+?) \| (\d+) \| ([\d.]+) \|", line)
                if m:
                    k, n, plan, cps, _ = m.groups()
                    plan = plan.replace(" (default)", "")
                    rows.setdefault((k, int(n), plan), set()).add(int(cps))
    return rows


def test_measured_plans_keep_their_ctas_per_sm():
    rows = _sweep_rows()
    assert rows, "no tune_rows results found under perf/results"
    checked, bad = 0, []
    for fam, kernel in FAMILIES.items():
        for most, _ in HELD_TUNED[fam]:
            if most is None:
                continue
            p = plan_for_kernel(kernel, most, 8)
            if not ((p.acc_regs and p.staging == "regs") or p.resident_grid):
                continue  # CTAs per SM only size the grid or cap the registers of these plans
            measured = rows.get((kernel, most, str(p)))
            if measured:
                checked += 1
                if p.ctas_per_sm not in measured:
                    bad.append((kernel, most, str(p), p.ctas_per_sm, sorted(measured)))
    assert checked >= 6, checked
    assert not bad, bad
