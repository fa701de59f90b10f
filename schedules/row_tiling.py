"""Row tiling for row-wise kernels (reductions now; norms and softmax later).

A CTA of `threads` threads owns `threads // threads_per_row` rows; the `threads_per_row` threads of a
row stride over its 128-bit vectors, `unroll` vectors in flight each. Rows too long to keep enough
CTAs busy are split into `splits` column chunks, one CTA each, whose partial results a second,
small pass combines (never atomics: the result is deterministic).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


def _pow2_at_least(x: int) -> int:
    p = 1
    while p < x:
        p *= 2
    return p


@dataclass(frozen=True)
class RowTiling:
    threads: int = 256
    threads_per_row: int = 256
    unroll: int = 4

    def __post_init__(self):
        tpr = self.threads_per_row
        if self.threads % 32 or not 32 <= self.threads <= 1024:
            raise ValueError(f"threads must be a multiple of 32 in [32, 1024], got {self.threads}")
        if tpr < 1 or tpr & (tpr - 1) or tpr > self.threads:
            raise ValueError(f"threads_per_row must be a power of two <= threads, got {tpr}")
        if self.unroll < 1:
            raise ValueError("unroll must be >= 1")

    @property
    def rows_per_cta(self) -> int:
        return self.threads // self.threads_per_row

    def __str__(self) -> str:
        return f"t{self.threads}r{self.threads_per_row}u{self.unroll}"


@dataclass(frozen=True)
class RowPlan:
    """A tiling, the number of column splits, and the cap on CTAs per split for one problem."""

    tiling: RowTiling
    splits: int
    ctas_per_sm: int = 8

    def max_ctas(self, num_sms: int) -> int:
        return self.ctas_per_sm * num_sms

    def grid(self, rows: int, num_sms: int) -> tuple[int, int]:
        tiles = -(-rows // self.tiling.rows_per_cta)
        return (max(1, min(tiles, self.max_ctas(num_sms))), self.splits)


# Tuned on an H200 with `python3 -m perf.tune` (perf/results/tune.md).
TUNED = dict(threads=512, unroll=8, ctas_per_sm=4)


@functools.lru_cache(maxsize=4096)
def plan_rows(rows: int, row_vectors: int, num_sms: int, *, threads: int = TUNED["threads"],
              unroll: int = TUNED["unroll"], ctas_per_sm: int = TUNED["ctas_per_sm"],
              min_vectors_per_cta: int = 2048, max_splits: int = 4096) -> RowPlan:
    """Pick threads-per-row, column splits and the CTA cap for `rows` rows of `row_vectors` vectors.

    Threads per row: enough that each thread has about `unroll` vectors of its row, up to the CTA.
    Splits: when the row tiles alone leave SMs idle, cut each row into chunks of at least
    `min_vectors_per_cta` vectors until about `ctas_per_sm` CTAs per SM are busy. Otherwise CTAs
    (at most `ctas_per_sm` per SM) walk the row tiles grid-stride.
    """
    tpr = min(threads, _pow2_at_least(max(1, -(-row_vectors // unroll))))
    tiling = RowTiling(threads=threads, threads_per_row=tpr, unroll=unroll)
    row_ctas = -(-max(rows, 1) // tiling.rows_per_cta)
    target = ctas_per_sm * num_sms
    splits = 1
    if row_ctas < target:
        want = -(-target // row_ctas)
        most = max(1, min(max_splits, row_vectors // min_vectors_per_cta))
        splits = max(1, min(want, most))
    return RowPlan(tiling, splits, ctas_per_sm)
