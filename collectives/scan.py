"""Integer prefix sums inside a warp and inside a CTA, for the kernels that number items in order (radix-sort
ranks, segment ids, stream compaction). Integer arithmetic in a fixed order: the same result on every run.

- `warp_inclusive_sum`: Kogge-Stone over the warp by `shfl.sync.up` (5 steps);
- `cta_exclusive_sum`: each thread's exclusive prefix over the CTA's threads in thread order and the CTA's total:
  warp sums, then one shared slot a warp (`cta_scan_slots`) and two barriers; the slots are free again when it
  returns (the second barrier follows every read), so a loop may call it again with the same slots.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32

WARP = 32


@cute.jit
def warp_inclusive_sum(v: Int32) -> Int32:
    """v summed over lanes 0..lane of the warp (every lane must call it)."""
    lane = cute.arch.lane_idx()
    for k in cutlass.range_constexpr(5):
        off = 1 << k
        up = cute.arch.shuffle_sync_up(v, off)
        v = v + cutlass.select_(lane >= off, up, Int32(0))
    return v


def cta_scan_slots(threads: int) -> int:
    """Shared Int32 slots `cta_exclusive_sum` needs for a CTA of `threads` threads."""
    return threads // WARP


@cute.jit
def cta_exclusive_sum(v: Int32, slots: cute.Tensor, threads: cutlass.Constexpr[int]):
    """(v's exclusive prefix over the CTA's threads in thread order, the CTA's total). Every thread of the CTA calls
    it (two barriers inside); `slots`: `cta_scan_slots(threads)` Int32 of shared memory."""
    warps = threads // WARP
    lane = cute.arch.lane_idx()
    warp = cute.arch.warp_idx()
    inc = warp_inclusive_sum(v)
    if lane == WARP - 1:
        slots[warp] = inc
    cute.arch.sync_threads()
    before = Int32(0)
    total = Int32(0)
    for w in cutlass.range_constexpr(warps):
        t = slots[w]
        before = before + cutlass.select_(w < warp, t, Int32(0))
        total = total + t
    cute.arch.sync_threads()
    return before + inc - v, total
