"""Grid-stride schedule (curriculum lesson 1): a fixed-size grid walks any number of work items.

A grid of at most `ctas_per_sm` CTAs per SM (fewer when one pass covers the problem) of `threads`
threads walks the items in passes. In each pass a thread owns `unroll` items and issues all their
loads before it consumes the first, so `unroll` loads per thread are in flight; a warp's 32
accesses are always contiguous. `order` chooses how a pass is laid out (see `GridStride`). Passes
in which every thread's items are in range run without predicates; only the last is guarded.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

ORDERS = ("grid", "cta")


@dataclass(frozen=True)
class GridStride:
    """`order` says which items one pass of a thread touches:
    - "grid": its `unroll` items are one grid (G * threads items) apart; a pass of the whole grid
      covers G * threads * unroll contiguous items, each CTA a strided comb of them.
    - "cta": a CTA's pass covers `threads * unroll` contiguous items (its threads' items are
      `threads` apart), and the CTA then jumps a grid ahead: fewer DRAM pages open per CTA.
    `reverse`: CTA b takes the items CTA G - 1 - b would. The hardware starts CTAs in block order, so
    a one-pass grid then walks memory from the end down: the second pass of a two-pass op (a reduce,
    then a map over the same tensor) meets first what the reduce read last, still in L2.
    """

    threads: int = 256
    unroll: int = 4
    ctas_per_sm: int = 8
    order: str = "grid"
    reverse: bool = False

    def __post_init__(self):
        if self.threads % 32 or not 32 <= self.threads <= 1024:
            raise ValueError(f"threads must be a multiple of 32 in [32, 1024], got {self.threads}")
        if self.unroll < 1 or self.ctas_per_sm < 0:
            raise ValueError("unroll must be >= 1 and ctas_per_sm >= 0 (0: uncapped)")
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {self.order!r}")

    def __str__(self) -> str:
        return f"t{self.threads}u{self.unroll}c{self.ctas_per_sm}{self.order[0]}{'r' if self.reverse else ''}"

    def max_ctas(self, num_sms: int) -> int:
        """Upper bound on the grid: `ctas_per_sm` CTAs for every SM; 0 means no cap (one pass,
        the hardware block scheduler balances the CTAs, as in torch's elementwise kernels)."""
        return self.ctas_per_sm * num_sms if self.ctas_per_sm else 2**31 - 1

    def items_per_cta_pass(self) -> int:
        return self.threads * (self.unroll if self.order == "cta" else 1)

    def grid(self, n_items: int, num_sms: int) -> int:
        """Grid size for `n_items`: as many CTAs as one pass needs while that fits under the cap
        (small problems still spread over every SM), the cap once CTAs have to loop."""
        return max(1, min(-(-n_items // self.items_per_cta_pass()), self.max_ctas(num_sms)))

    def thread_walk(self, bidx, gdim, tidx):
        """(first item, stride between a pass's items, stride between passes) of one thread; works
        on host ints and on DSL integers alike."""
        t, u = self.threads, self.unroll
        if self.reverse:
            bidx = gdim - 1 - bidx
        if self.order == "cta":
            return bidx * (t * u) + tidx, t, gdim * (t * u)
        return bidx * t + tidx, gdim * t, gdim * (t * u)

    def index32_ok(self, n: int, vec: int, num_sms: int) -> bool:
        """Whether a 32-bit kernel walking `n` elements in `vec`-element vectors under this schedule
        keeps every index below 2^31: the pass stride, the guarded last pass (up to
        (n_items // pass_stride + 1) * pass_stride - 1, past n_items: after one complete pass over
        2^30 + 512 scalar items it reaches 2^31 + 1023) and the scalar tail (tail start + thread
        index, past n by up to `threads` - 1). A wrapped index is negative and passes its `< n` guard."""
        items = n // vec
        _, _, pass_stride = self.thread_walk(0, self.grid(items, num_sms), 0)
        return (items // pass_stride + 1) * pass_stride <= 2**31 - 1 and n + self.threads - 1 <= 2**31 - 1


# Chosen with `python3 -m perf.tune` on an H200: for each op, the config
# whose slowest size (8 MiB and 512 MiB, bf16) is closest to that size's best. All three favour the
# uncapped, CTA-contiguous grid: one pass, balanced by the hardware block scheduler.
TUNED: dict[str, GridStride] = {
    "copy": GridStride(threads=128, unroll=2, ctas_per_sm=0, order="cta"),
    "add": GridStride(threads=128, unroll=4, ctas_per_sm=0, order="cta"),
    "axpby": GridStride(threads=256, unroll=4, ctas_per_sm=0, order="cta"),
}


_SMALL: dict[tuple, GridStride] = {}

MiB = 1 << 20
# Mid-size classes (bytes per tensor, upper bound exclusive) measured with `python3 -m perf.small` on the H200, every
# schedule timed interleaved with torch: add at 64 MiB ran 0.94x torch with the tuned 4 vectors per thread and 0.997x
# with one; at 4-16 MiB a grid capped at 16 CTAs per SM walking grid-stride (1.00-1.02x) beat one pass of many small
# CTAs (0.96-0.98x). Sizes outside the classes keep `TUNED` (>= 256 MiB) or the small-size rule below.
SIZE_CLASSES: dict[str, tuple[tuple[int, int, GridStride], ...]] = {
    "copy": ((2 * MiB, 16 * MiB, GridStride(threads=128, unroll=1, ctas_per_sm=16, order="cta")),),
    "add": ((0, 2 * MiB, GridStride(threads=128, unroll=1, ctas_per_sm=16, order="cta")),
            (2 * MiB, 32 * MiB, GridStride(threads=128, unroll=2, ctas_per_sm=16, order="cta")),
            (32 * MiB, 256 * MiB, GridStride(threads=128, unroll=1, ctas_per_sm=0, order="cta"))),
}


def pick(op: str, tensor_bytes: int, num_sms: int = 132) -> GridStride:
    """The schedule for elementwise `op` on tensors of `tensor_bytes` bytes each: the measured
    size class (`SIZE_CLASSES`) when one covers the size, else the tuned config with fewer
    vectors per thread for small tensors: at least two CTAs per SM. ncu at 1 MiB (fp32 add, 3 MiB
    moved) showed the tuned config's 128 CTAs of 4 vectors per thread at 4.0 us against torch's
    256 CTAs at 3.46 us: with under one CTA per SM, too few loads are in flight to cover DRAM
    latency."""
    for lo, hi, cls in SIZE_CLASSES.get(op, ()):
        if lo <= tensor_bytes < hi:
            return cls
    s = TUNED[op]
    vectors = tensor_bytes // 16
    unroll = s.unroll
    while unroll > 1 and vectors < 2 * num_sms * s.threads * unroll:
        unroll //= 2
    if unroll == s.unroll:
        return s
    key = (op, unroll)
    small = _SMALL.get(key)
    if small is None:  # one object per variant: the op layer keys its cache by identity
        small = _SMALL[key] = dataclasses.replace(s, unroll=unroll)
    return small
