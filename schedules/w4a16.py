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

TILE_K = 256  # k per stage: one 128-byte row of packed words per W row (the TMA box's 128-byte swizzle)
SMEM_PER_SM = 227 * 1024
MAX_COL_TILES = 8  # x rows 1-64 (8 columns of the MMA's N per tile)


@dataclass(frozen=True)
class W4A16Plan:
    consumer_warps: int = 4
    m_tiles: int = 2  # 16-row MMA tiles per consumer warp
    stages: int = 4

    @property
    def tile_n(self) -> int:
        return 16 * self.m_tiles * self.consumer_warps

    @property
    def threads(self) -> int:
        return 32 * (self.consumer_warps + 1)  # + the TMA producer warp

    def stage_bytes(self, col_tiles: int, elem_bytes: int = 2) -> int:
        return self.tile_n * TILE_K // 2 + 8 * col_tiles * TILE_K * elem_bytes

    def smem_bytes(self, col_tiles: int, elem_bytes: int = 2) -> int:
        return self.stages * self.stage_bytes(col_tiles, elem_bytes) + 16 * self.stages + 64

    def ctas_per_sm(self, col_tiles: int) -> int:
        return max(1, min(3, SMEM_PER_SM // self.smem_bytes(col_tiles), 2048 // self.threads))


def col_tiles_of(m: int) -> int:
    return max(1, -(-m // 8))


@functools.lru_cache(maxsize=4096)
def plan_w4a16(m: int, n: int, k: int, num_sms: int) -> tuple[W4A16Plan, int, int]:
    """(plan, splits, k tiles per split) for x (m, k) and W (n, k), m <= 64."""
    ct = col_tiles_of(m)
    # (two 16-row tiles a warp at 3-4 column tiles hold 168 registers and spill: one tile, twice the warps)
    plan = W4A16Plan(4, 2, 4) if ct <= 2 else W4A16Plan(8, 1, 3)
    tiles = -(-n // plan.tile_n)
    k_tiles = max(1, -(-k // TILE_K))
    resident = plan.ctas_per_sm(ct) * num_sms
    splits = max(1, min(k_tiles, resident // tiles))
    per = -(-k_tiles // splits)
    return plan, -(-k_tiles // per), per
