"""GEMV schedule (lesson 3): how many rows of W each thread accumulates at once, and the row tiling
that goes with it, by the number B of columns of x.

Per 128-bit vector of W (8 bf16) a thread does 8*B fp32 FMAs whatever the schedule; what the
register tile of R rows buys is the rest: the B vectors of x are loaded and widened once per R
vectors of W (B/R loads, 8*B/R conversions per vector of W instead of B and 8*B). At B = 8 and
4.2 TB/s the FMAs alone fill half of every SM's issue slots, so R = 4 there (about 94 instructions
per vector of W, ~73% of issue at full bandwidth, against ~160 without the tile). Larger R tiles
cost registers (R*B accumulators, R vectors of W per k-vector in flight), i.e. warps per SM:
  R = 1 (B <= 2): the plain row walk, ~40-60 registers, 4 k-vectors in flight.
  R = 2 (B 3-4): ~110 registers: two 256-thread CTAs per SM, 4 k-vectors (8 of W) in flight.
  R = 4 (B 5-8): ~166 registers: three 128-thread CTAs per SM, 1 k-vector (4 of W) in flight.
`vectors_per_thread` sets threads per row (k-vectors of a row per thread, up to the CTA): the
group's R*B sums cost about one shuffle each (`group_reduce_spread`), a few % of the work at 4-8
per thread. At R = 4 it is 4 so that W 4096 x 4096 makes 1024 row tiles (4 rows each) for the
396 resident CTAs (~2.6 rounds each) rather than 512 (1 or 2 rounds: a third of the second round
idle). `ctas_per_sm` caps the grid at the CTAs resident at the registers above.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from schedules.row_tiling import RowTiling, plan_rows

# R by B: rows of W per thread for each column count of x.
ROW_BLOCK = {1: 1, 2: 1, 3: 2, 4: 2, 5: 4, 6: 4, 7: 4, 8: 4}
# The row tiling by R. R = 1 is the B = 1 schedule measured at 97% of copy bandwidth on 16384^2.
TUNED = {
    1: dict(threads=256, unroll=4, vectors_per_thread=4, ctas_per_sm=4),
    2: dict(threads=256, unroll=4, vectors_per_thread=8, ctas_per_sm=2),
    4: dict(threads=128, unroll=1, vectors_per_thread=4, ctas_per_sm=3),
}


@dataclass(frozen=True)
class GemvPlan:
    tiling: RowTiling
    row_block: int
    ctas_per_sm: int

    def max_ctas(self, num_sms: int) -> int:
        return self.ctas_per_sm * num_sms


@functools.lru_cache(maxsize=4096)
def plan_gemv(rows: int, row_vectors: int, cols: int, num_sms: int) -> GemvPlan:
    """Schedule for W of `rows` rows of `row_vectors` vectors and x of `cols` columns. The row walk
    is `plan_rows`' (threads per row from the row length; rows never split)."""
    r = ROW_BLOCK[cols]
    t = TUNED[r]
    p = plan_rows(-(-rows // r), row_vectors, num_sms, threads=t["threads"], unroll=t["unroll"],
                  ctas_per_sm=t["ctas_per_sm"], vectors_per_thread=t["vectors_per_thread"], max_splits=1)
    tiling = p.tiling
    if tiling.threads_per_row < 8:  # lanes of a row: at least 8 (short rows waste a few lanes)
        tiling = RowTiling(tiling.threads, 8, tiling.unroll)
    return GemvPlan(tiling, r, t["ctas_per_sm"])


# --- the tensor-core kernel (`cute_kernels.gemv.mma`) -------------------------------------------------
# Columns of x from which the op runs the tensor-core kernel (bf16 / fp16, K a multiple of 8, 16-byte aligned rows):
# the FMA kernel is issue-bound there (B = 8: 40-62 % of copy, 0.60-0.75x cuBLAS). H200 (both kernels timed at
# B = 1, 2, 4, 8 on six W shapes): with a CTA per SM or more at two 8-row blocks a CTA (rows >= 16 x SMs) the tensor
# cores win from B = 2 (B = 2: 1.01-1.09x, 16384^2 0.99x; B = 4: 1.10-1.23x; B = 8: 1.40-1.56x); on 1024 rows (128
# CTAs of one block) the FMA kernel keeps B = 2 and 4 (1.30x, 1.12x) and the tensor cores win at 8 (1.18x).
MMA_MIN_COLS = 2
MMA_MIN_COLS_FEW_ROWS = 5
MMA_WARPS_PER_SM = 32  # resident warps aimed at: each keeps `unroll` chunks (2 KB of W at R = 2) in flight


def use_tensor_cores(rows: int, cols: int, num_sms: int) -> bool:
    """Whether the op runs the tensor-core kernel for `rows` rows of W and `cols` columns of x."""
    return cols >= (MMA_MIN_COLS if -(-rows // 16) >= num_sms else MMA_MIN_COLS_FEW_ROWS)


@dataclass(frozen=True)
class GemvMmaPlan:
    warps: int  # per CTA, splitting K in 32-wide chunks
    row_blocks: int  # 8-row blocks of W per CTA
    unroll: int

    def reduce_smem_bytes(self, cols: int) -> int:
        """The warps' fp32 partials in shared memory: 2 C values a lane (4 with columns 8-15) per row block."""
        return 4 * (4 if cols > 8 else 2) * 32 * self.row_blocks * self.warps


@functools.lru_cache(maxsize=4096)
def plan_gemv_mma(rows: int, k: int, num_sms: int) -> GemvMmaPlan:
    """Two 8-row blocks a CTA (one x load for both) where that still gives a CTA per SM, else one; warps
    per CTA (4-16, a power of two) so that about MMA_WARPS_PER_SM warps per SM stream W, and never
    fewer than 2 chunks a warp; 4 chunks loaded ahead at up to 8 warps a CTA, else 2."""
    r = 2 if -(-rows // 16) >= num_sms else 1
    ctas = -(-rows // (8 * r))
    want = max(1, MMA_WARPS_PER_SM * num_sms // ctas)
    warps = 4
    while warps < 16 and warps * 2 <= want and -(-k // 32) >= 2 * warps * 2:
        warps *= 2
    # 4 chunks in flight where the grid is large (<= 8 warps a CTA), else 2: the H200 sweep
    # (perf/tune_gemv.py, B = 8) put these first or within 1.2 % on the five suite shapes
    return GemvMmaPlan(warps, r, 4 if warps <= 8 else 2)

