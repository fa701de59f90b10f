"""When and where work runs: grid shapes, per-thread work assignment, row tiling, persistent tile schedulers,
warp roles, register budgets, cooperative vs ping-pong, tile / stage / cluster configs and how they are chosen.

A schedule is host-side data (a frozen dataclass, with the heuristic that picks it per shape and the checks of
what can be built); these modules import no DSL. The device side, the `@cute.jit` index arithmetic that walks the
work a schedule assigns, is `schedules.walks`. Schedules know no kernel, op or benchmark.
"""

import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

CUTE_KERNELS_LAYER = True  # this is cute-kernels' own layer (checked by `cute_kernels` against a shadowing package)
