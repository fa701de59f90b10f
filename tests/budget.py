"""The default run's compile budget: each family's CPU tests (tests/<family>/) run by default up to about a minute
of measured time; the rest of its parametrized cases are marked `sweep` (run them with `make sweep`, i.e.
`pytest -m sweep`). So CI stays short as families are added, and every case still runs somewhere.

Per family, in this order: the first case of every test function (so each check runs by default), then the other
cases from the cheapest up while the family's total stays within `BUDGET_S`. Costs are the per-test seconds of a
measured run, committed in `compile_costs.json` beside this file; a test that is not listed costs 0 (it runs by
default until the table is refreshed). Refresh it from a timed run of the default tests:

    pytest -n 2 --durations=0 -m 'not sweep' tests > run.log; python3 -m tests.budget refresh run.log

GPU tests are never budgeted (they skip without a GPU and run by family on the device); nor are tests/core,
tests/study and tests/lab (infrastructure, not a family).
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

BUDGET_S = 60.0
COSTS = Path(__file__).with_name("compile_costs.json")
UNBUDGETED = ("core", "study", "lab")


def load_costs() -> dict[str, float]:
    return json.loads(COSTS.read_text()) if COSTS.exists() else {}


def _family(nodeid: str) -> str | None:
    parts = nodeid.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else None


def over_budget(items, costs: dict[str, float]) -> list:
    """The items (pytest items with .nodeid, .originalname, keywords) to mark `sweep`."""
    by_family = defaultdict(list)
    for it in items:
        fam = _family(it.nodeid)
        if fam is None or fam in UNBUDGETED or "gpu" in it.keywords or "sweep" in it.keywords:
            continue
        by_family[fam].append(it)
    out = []
    for fam, its in by_family.items():
        seen, first, rest = set(), [], []
        for it in its:
            fn = it.nodeid.split("[")[0]
            (rest if fn in seen else first).append(it)
            seen.add(fn)
        total = sum(costs.get(it.nodeid, 0.0) for it in first)
        for it in sorted(rest, key=lambda i: costs.get(i.nodeid, 0.0)):
            c = costs.get(it.nodeid, 0.0)
            if total + c <= BUDGET_S:
                total += c
            else:
                out.append(it)
    return out


def refresh(log: str) -> dict[str, float]:
    """The costs of the tests the log timed, merged into the table: a test the run did not time keeps its cost (a
    default run skips the sweep cases; dropping theirs would put them all back into the default run)."""
    costs: dict[str, float] = defaultdict(float)
    for line in Path(log).read_text().splitlines():
        m = re.match(r"\s*([\d.]+)s (?:call|setup|teardown)\s+(tests/\S+)", line)
        if m:
            costs[m.group(2)] += float(m.group(1))
    out = {**load_costs(), **{k: round(v, 2) for k, v in costs.items() if v >= 0.05}}
    out = dict(sorted(out.items()))
    COSTS.write_text(json.dumps(out, indent=0, sort_keys=True) + "\n")
    return out


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "refresh":
    print(f"{len(refresh(sys.argv[2]))} test costs -> {COSTS}")
