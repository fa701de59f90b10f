"""When and where work runs: grid shapes, per-thread work assignment, row tiling, and (later)
persistent tile schedulers, warp roles and register budgets.

A schedule is host-side data (a frozen config with a heuristic that picks it per shape) plus the
small `@cute.jit` index helpers that walk the work it assigns.
"""

import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
