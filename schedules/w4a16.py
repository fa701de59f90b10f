"""W4A16 schedule (small M): the CTA tile of W rows, the consumer warps and their MMA tiles, the stage ring, and the
split of K that fills the GPU with one wave of co-resident CTAs.

The kernel (`cute_kernels.w4a16.kernels`) streams W by TMA: a stage is `tile_n` rows x 256 k of packed int4 (128 bytes
a row, 16 KiB at 128 rows) plus the same 256 k of x (`8 * col_tiles` rows, zero-filled past M). Bytes in flight are
the ring, not registers: 4 stages of 16 KiB and two CTAs an SM keep 128 KiB of W in flight per SM, about three times
the latency-bandwidth product of HBM3e at 18 B/clk/SM. Every consumer warp reads the whole x stage, so x's
shared-memory reads per W byte fall with the rows a warp owns (`m_tiles` 16-row MMA tiles): 2 up to 16 columns,
1 above (the accumulators of 8 column tiles). `splits` cuts K so that tiles x splits is about the CTAs that fit at
once; a split's partial sums go through an fp32 workspace and the last CTA of a tile adds them in split order.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

TILE_K = 256  # k of one W box: a 128-byte row of packed words per W row (the TMA box's 128-byte swizzle)
SMEM_PER_SM = 227 * 1024
MAX_SPLITS = 16  # the last CTA of a tile loads every split's partial at once (a compile-time bound)
# n8 tiles of x's rows (M up to 64), powers of two: the DSL aborts slicing the swizzled x ring at 24 or 40 rows (the
# zero rows TMA fills past M cost MMAs only)
COL_TILES = (1, 2, 4, 8)


@dataclass(frozen=True)
class W4A16Plan:
    consumer_warps: int = 4
    m_tiles: int = 2  # 16-row MMA tiles per consumer warp
    stages: int = 4
    k_boxes: int = 1  # 256-k boxes of W a stage (longer contiguous runs of each W row per DRAM request)

    @property
    def tile_k(self) -> int:
        return TILE_K * self.k_boxes

    @property
    def tile_n(self) -> int:
        return 16 * self.m_tiles * self.consumer_warps

    @property
    def threads(self) -> int:
        return 32 * (self.consumer_warps + 1)  # + the TMA producer warp

    def stage_bytes(self, col_tiles: int, dense: bool = False) -> int:
        """W's box (int4, or 16-bit with `dense`) and x's four, 16-bit."""
        return self.tile_n * self.tile_k * (2 if dense else 1) // (1 if dense else 2) + 8 * col_tiles * self.tile_k * 2

    def smem_bytes(self, col_tiles: int, dense: bool = False) -> int:
        return self.stages * self.stage_bytes(col_tiles, dense) + 16 * self.stages + 64

    def ctas_per_sm(self, col_tiles: int, dense: bool = False) -> int:
        return max(1, min(3, SMEM_PER_SM // self.smem_bytes(col_tiles, dense), 2048 // self.threads))


def col_tiles_of(m: int) -> int:
    t = max(1, -(-m // 8))
    return next(c for c in COL_TILES if c >= t)


# The plans the op picks (the H200 sweep, perf/lab/w4a16_sweep.py): int4 up to 16 rows of x on W of >= 128 rows an SM
# at 4 warps of two tiles, 3 stages; on fewer rows 8 warps of one tile, 4 stages (best or within 3 %); above 16 rows one
# tile, 8 warps (two tiles a warp at 3-4 column tiles spill); dense W at 8 warps, 2 stages.
INT4_PLAN = W4A16Plan(8, 1, 4)
INT4_WIDE_PLAN = W4A16Plan(4, 2, 3)
INT4_MANY_COLS_PLAN = W4A16Plan(8, 1, 3)
DENSE_PLAN = W4A16Plan(8, 1, 2)
DENSE_MANY_COLS_PLAN = W4A16Plan(4, 1, 2)


@functools.lru_cache(maxsize=4096)
def plan_w4a16(m: int, n: int, k: int, num_sms: int, dense: bool = False) -> tuple[W4A16Plan, int, int]:
    """(plan, splits, stages of K a split) for x (m, k) and W (n, k), m <= 64; `dense`: W in 16 bits (four times the
    bytes a row: 128-row tiles of 2 stages = 128 KiB of W a CTA, one CTA an SM)."""
    ct = col_tiles_of(m)
    if dense:
        plan = DENSE_PLAN if ct <= 2 else DENSE_MANY_COLS_PLAN
    else:
        # W of at least 128 rows an SM: two 16-row tiles a warp, 4 warps (28672 x 8192 at M = 1 and 8: 40.0 against
        # 42.8 us; 28672 x 4096: 23.3 against 24.7); fewer rows: one tile (16 x 4096 x 14336: 23.6 against 35.6 us)
        wide = ct <= 2 and n >= 128 * num_sms
        plan = INT4_WIDE_PLAN if wide else INT4_PLAN if ct <= 2 else INT4_MANY_COLS_PLAN
    return (plan, *splits_for(plan, m, n, k, num_sms, dense))


def splits_for(plan: W4A16Plan, m: int, n: int, k: int, num_sms: int, dense: bool = False) -> tuple[int, int]:
    """(splits, 256-k tiles a split): as many splits as keep W tiles x splits within the CTAs resident at once (at
    most MAX_SPLITS), every split non-empty, an even number of tiles a split (the kernel runs stages in pairs)."""
    ct = col_tiles_of(m)
    tiles = -(-n // plan.tile_n)
    k_tiles = max(1, -(-k // plan.tile_k))
    resident = plan.ctas_per_sm(ct, dense) * num_sms
    splits = max(1, min(k_tiles, resident // tiles, MAX_SPLITS))
    per = -(-k_tiles // splits)
    per += per % 2
    return -(-k_tiles // per), per


# Where the op runs the streaming kernel rather than the GEMV mainloop (int4, M <= 16) or the GEMM (dense): the
# H200 sweep has the GEMV mainloop ahead on weights under ~16 MiB of int4 (6144 x 4096: 10.5 against 11.6 us, both
# latency-bound at 10-20 % of the read ceiling), the streaming kernel ahead from 4096 x 14336 (17.0 against 20.4 us)
# and 1.15-1.9x at 28672 rows; dense W only where K is long against N (4096 x 14336: 33.7 against the GEMM's 46 us,
# level with cuBLAS; the GEMM leads or ties on the other decode projections).
STREAM_MIN_WEIGHTS = 32 * 2**20  # N * K
DENSE_MIN_K = 12288


def use_stream(m: int, n: int, k: int, dense: bool = False) -> bool:
    if dense:
        return k >= DENSE_MIN_K
    return m > 16 or n * k >= STREAM_MIN_WEIGHTS
