"""Warp and CTA-level reductions (curriculum lesson 2), shared by every row-wise kernel.

Threads are grouped into rows of `group` consecutive threads (a power of two). Within a warp the
butterfly `shfl.sync.bfly` leaves the group's result in every lane; groups wider than a warp add a
second stage through shared memory (one slot per warp), after which every thread of the group holds
the result. The combination order is fixed, so results are bit-for-bit reproducible.
"""

from __future__ import annotations

import operator
from typing import Callable

import cutlass
import cutlass.cute as cute

WARP = 32


@cute.jit
def warp_reduce(val, op: Callable, group: cutlass.Constexpr[int] = WARP):
    """Butterfly reduction over aligned groups of `group` (<= 32) lanes; every lane gets its group's result."""
    offset = group // 2
    while cutlass.const_expr(offset > 0):
        val = op(val, cute.arch.shuffle_sync_bfly(val, offset=offset))
        offset = offset // 2
    return val


def group_smem_slots(threads: int, group: int) -> int:
    """Shared-memory slots `group_reduce` needs for a CTA of `threads` (0 when groups fit in a warp)."""
    return threads // WARP if group > WARP else 0


@cute.jit
def group_reduce(val, op: Callable, group: cutlass.Constexpr[int], smem: cute.Tensor, init):
    """Reduce `val` over groups of `group` consecutive threads (power of two, <= CTA size).

    `smem` holds `group_smem_slots(threads, group)` elements of val's type (unused when the group fits
    in a warp). Every thread of a group returns the group's result. Ends with the slots free for reuse
    only after the caller's next barrier.
    """
    val = warp_reduce(val, op, min(group, WARP))
    if cutlass.const_expr(group > WARP):
        warps_per_group = group // WARP
        lane = cute.arch.lane_idx()
        warp = cute.arch.warp_idx()
        if lane == 0:
            smem[warp] = val
        cute.arch.barrier()
        first = (warp // warps_per_group) * warps_per_group
        partial = init
        if lane < warps_per_group:
            partial = smem[first + lane]
        val = warp_reduce(partial, op, warps_per_group)
    return val


add = operator.add
