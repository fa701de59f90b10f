"""Grid-stride schedule (curriculum lesson 1): a fixed-size grid walks any number of work items.

A grid of `G` CTAs of `threads` threads (G at most `ctas_per_sm` per SM; one item per thread when
the work is smaller than that) visits items `gtid, gtid + G*threads, ...`. Each pass a thread owns `unroll` items spaced one
grid apart, so a warp's 32 accesses stay contiguous and each thread has `unroll` independent loads in
flight before it consumes the first one. Passes where every thread's items are in range run without
predicates; only the last pass is guarded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import cutlass
import cutlass.cute as cute


@dataclass(frozen=True)
class GridStride:
    threads: int = 256
    unroll: int = 4
    ctas_per_sm: int = 8

    def __post_init__(self):
        if self.threads % 32 or not 32 <= self.threads <= 1024:
            raise ValueError(f"threads must be a multiple of 32 in [32, 1024], got {self.threads}")
        if self.unroll < 1 or self.ctas_per_sm < 1:
            raise ValueError("unroll and ctas_per_sm must be >= 1")

    def __str__(self) -> str:
        return f"t{self.threads}u{self.unroll}c{self.ctas_per_sm}"

    def max_ctas(self, num_sms: int) -> int:
        """Upper bound on the grid: enough resident CTAs to fill every SM `ctas_per_sm` deep."""
        return self.ctas_per_sm * num_sms

    def grid(self, n_items: int, num_sms: int) -> int:
        """Grid size for `n_items`: one item per thread while that fits under the cap, so small
        problems still spread over every SM; the cap once threads have to loop."""
        return max(1, min(-(-n_items // self.threads), self.max_ctas(num_sms)))


@cute.jit
def strided_fold(
    n_items,
    first,
    stride,
    unroll: cutlass.Constexpr[int],
    load: Callable,
    step: Callable,
    acc,
):
    """Fold `step(acc, j, load(j))` over j = first, first + stride, ... < n_items.

    Each pass issues `unroll` loads before the first `step`, so their latencies overlap. `load` and
    `step` are trace-time callables; `acc` is any DSL value (a dummy for pure elementwise maps) and
    is returned. The visiting order is fixed by (first, stride), which keeps folds deterministic.
    """
    per_pass = stride * unroll
    full_passes = n_items // per_pass
    for p in cutlass.range(full_passes, unroll=1):
        base = p * per_pass + first
        vals = []
        for u in cutlass.range_constexpr(unroll):
            vals.append(load(base + u * stride))
        for u in cutlass.range_constexpr(unroll):
            acc = step(acc, base + u * stride, vals[u])
    base = full_passes * per_pass + first
    for u in cutlass.range_constexpr(unroll):
        j = base + u * stride
        if j < n_items:
            acc = step(acc, j, load(j))
    return acc


MiB = 1 << 20

# Chosen per problem size from `python3 -m perf.tune` on an H200 (perf/results/tune.md):
# (exclusive upper bound on bytes moved, schedule); the last entry covers everything larger.
TUNED: tuple[tuple[int | None, GridStride], ...] = (
    (None, GridStride(threads=128, unroll=4, ctas_per_sm=4)),
)


def pick(bytes_moved: int) -> GridStride:
    """The tuned grid-stride schedule for a problem that moves `bytes_moved` bytes."""
    for bound, sched in TUNED:
        if bound is None or bytes_moved < bound:
            return sched
    return TUNED[-1][1]
