"""Row tiling for row-wise kernels (reductions now; norms and softmax later).

A CTA of `threads` threads owns `threads // threads_per_row` rows; the `threads_per_row` threads of a
row stride over its 128-bit vectors, `unroll` vectors in flight each. Rows too long to keep enough
CTAs busy are split into `splits` column chunks, one CTA each, whose partial results a second,
small pass combines (never atomics: the result is deterministic).
"""

from __future__ import annotations

import dataclasses
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


# Tuned on an H200 with `python3 -m perf.tune`: the setting with the best worst case over six shapes (0.977 of the
# per-shape best).
TUNED = dict(threads=512, unroll=8, ctas_per_sm=4)


@functools.lru_cache(maxsize=4096)
def plan_rows(rows: int, row_vectors: int, num_sms: int, *, threads: int = TUNED["threads"],
              unroll: int = TUNED["unroll"], ctas_per_sm: int = TUNED["ctas_per_sm"],
              min_vectors_per_cta: int = 2048, max_splits: int = 4096,
              vectors_per_thread: int | None = None) -> RowPlan:
    """Pick threads-per-row, column splits and the CTA cap for `rows` rows of `row_vectors` vectors.

    Threads per row: enough that each thread has about `vectors_per_thread` (default `unroll`)
    vectors of its row, up to the CTA.
    Splits: when the row tiles alone leave SMs idle, cut each row into chunks of at least
    `min_vectors_per_cta` vectors until about `ctas_per_sm` CTAs per SM are busy. Otherwise CTAs
    (at most `ctas_per_sm` per SM) walk the row tiles grid-stride.
    """
    tpr = min(threads, _pow2_at_least(max(1, -(-row_vectors // (vectors_per_thread or unroll)))))
    tiling = RowTiling(threads=threads, threads_per_row=tpr, unroll=unroll)
    row_ctas = -(-max(rows, 1) // tiling.rows_per_cta)
    target = ctas_per_sm * num_sms
    splits = 1
    if row_ctas < target:
        want = -(-target // row_ctas)
        most = max(1, min(max_splits, row_vectors // min_vectors_per_cta))
        splits = max(1, min(want, most))
    return RowPlan(tiling, splits, ctas_per_sm)


# ---------------------------------------------------------------------------------------------
# Rows held in registers (norms, softmax, cross-entropy): the row is loaded once, reduced, and
# the output computed from registers, so a row must fit in the registers of one CTA or a cluster.
# ---------------------------------------------------------------------------------------------
# `plan_rows` settings of the cross-entropy forward. A read-only kernel needs bytes in flight: each
# thread loads its 8 vectors of a pass (128 B) at once and folds them with one max and one rescale
# (`online_softmax.fold` of a list; ~64 registers, 8 CTAs of 128 threads per SM: 128 KiB in
# flight per SM); a 4k bf16 row is 64 threads x 8 vectors, one pass, two rows per CTA (QuACK's
# geometry). Against threads=512, unroll=4 (4k: 34 registers, ptxas sank 2 of the 4 loads behind the
# exps, 3 CTAs of 512 per SM: <= 48 KiB in flight), H200: 4k 2.85 -> 4.01 TB/s (1.10x QuACK).
# `perf.tune_rows --kernels cross_entropy.fwd` times other settings against these.
# Rows of 32k elements and more take 256-thread CTAs, 4 per SM: 64k 3.56 -> 3.99 TB/s (1.09x QuACK).
# 16 vectors a thread (two passes of 8 loaded together): half the threads a row of the 8-vector plan below 16k, so a CTA
# holds twice the rows (H200: 1.035x / 1.015x / 1.039x / 1.108x / 1.076x at 1k / 2k / 4k / 6144 / 8k; from 12288 the
# CTA's 128 threads cap the row's threads and both settings give the same plan)
CE_FWD_PLAN = dict(threads=128, unroll=8, vectors_per_thread=16, ctas_per_sm=8)
CE_FWD_LONG_PLAN = dict(CE_FWD_PLAN, threads=256, vectors_per_thread=8, ctas_per_sm=4)
CE_FWD_LONG_ROW = 32768


def ce_plan(m: int, n: int, vec: int, sms: int, whole_passes: bool | None = None, **options) -> RowPlan:
    """The plan of the cross-entropy forward for (m, n) logits read in `vec`-element vectors (1: the
    scalar variant) on `sms` SMs: `plan_rows` under CE_FWD_PLAN (CE_FWD_LONG_PLAN for rows of
    CE_FWD_LONG_ROW elements and more), `options` overriding it. `whole_passes` (default: unless `options`
    names the unroll) narrows the unroll so each thread's share of the row is whole passes; a sweep of
    settings passes True to time each setting as the op would run it as its default."""
    if whole_passes is None:
        whole_passes = "unroll" not in options
    base = CE_FWD_LONG_PLAN if n >= CE_FWD_LONG_ROW else CE_FWD_PLAN
    plan = plan_rows(m, n // vec, sms, **{**base, **options})
    t = plan.tiling
    per = -(-(n // vec) // t.threads_per_row)  # vectors a thread of the row walks
    if vec > 1 and plan.splits == 1 and per % t.unroll and whole_passes:
        # whole passes: as many as the planned unroll needs, each as wide as they then take (6144: one pass of 6
        # vectors, not a pass of 8 with 2 masked off: a partial pass folded a vector at a time)
        passes = -(-per // t.unroll)
        plan = dataclasses.replace(plan, tiling=dataclasses.replace(t, unroll=-(-per // passes)))
    return plan


@dataclass(frozen=True)
class HeldRowPlan:
    """`tiling.unroll` is the number of 128-bit vectors each thread holds (vpt); a row spans
    `cluster_n` CTAs of a cluster (1: one CTA), `tiling.threads_per_row` threads in each."""

    tiling: RowTiling
    cluster_n: int = 1
    ctas_per_sm: int = 2
    # "regs": each thread loads its vectors into registers and computes from them; "smem": it copies
    # them with cp.async into a shared-memory buffer of the CTA's rows (every byte in flight at
    # once, few registers) and reads them back from there for each pass (`collectives.rowwise`).
    staging: str = "regs"
    # Software pipelining across row tiles (the backward kernels, which walk tiles grid-stride):
    # while a CTA computes tile i its threads already have tile i+1's row loads in flight, in a
    # second register set ("regs") or the second of two staging buffers ("smem": cp.async groups,
    # wait_group 1). Same fp32 math in the same order: the output is bitwise that of prefetch off.
    # With `hold` (the staged forwards): ONE buffer, refilled with tile i+1's row as soon as tile i's is
    # read out of it into registers (each thread copies and reads only its own slots), so the next row's
    # loads run under this one's reductions, cluster exchange and stores at no extra shared memory.
    prefetch: bool = False
    # How the CTAs of a cluster exchange a row's partial results (`collectives.reduce.cluster_reduce`):
    # "barrier": remote stores then a cluster barrier (arrive.release / wait.acquire: ptxas emits
    # MEMBAR.ALL.GPU before it, which waits for the previous tile's global stores, and CCTL.IVALL
    # after); "mbarrier": `st.async` remote stores that complete a transaction count on the receiving
    # CTA's mbarrier, which its threads wait on (no fence, no cluster-wide barrier per tile). Same
    # values folded in the same order: the output is bitwise that of "barrier".
    cluster_sync: str = "barrier"
    # The capped (persistent) grid of the backward kernels (`cute_kernels.rowwise.launch.grid_ctas`).
    # False: `ctas_per_sm` x SMs clusters, i.e. `cluster_n` times the CTAs that fit at `ctas_per_sm`
    # per SM: several waves, the last nearly empty (RMSNorm 64k, clusters of 4: 132 clusters where 32
    # fit, 5 waves), and one fp32 dweight partial row per cluster. True: `ctas_per_sm` x the clusters
    # co-resident (`schedules.hardware.max_active_clusters`, 32 of 4 on an H200): one wave, 4x fewer
    # partial rows. Only the dweight/dbias summation order changes. No effect without a cluster.
    # The forwards launch one CTA per row tile (uncapped) unless this is set: then they walk the tiles
    # on the capped grid above (without a cluster `ctas_per_sm` x SMs CTAs), which pays a staged plan's
    # per-CTA weight copy and its barrier once per CTA instead of once per tile (LayerNorm fwd 1k: four
    # rows a CTA, 1k weight + 1k bias staged for 8 KiB of rows). Same math per row: bitwise the same.
    resident_grid: bool = False
    # With "smem" staging: the staged row is read from shared memory once, right after it lands, and
    # then held in registers like "regs" (the buffer is only the landing zone of the cp.async copies:
    # every byte in flight at once, no register tied to a load in flight). The passes then do not
    # re-read the buffer and the softmax forward computes one exp per element instead of two (the
    # staged re-read path recomputes them): ncu, softmax 2048x65536 staged t256 u16 c2 executed 90.7 M
    # warp instructions against QuACK's 44.5 M (same bytes), 2 CTAs/SM at 120 registers against its 3
    # at 80. Only for rows a thread's registers hold (`HOLD_ELEMS`); same values, same order: bitwise
    # the re-reading staged kernel's output.
    hold: bool = False
    # The norm backwards' dweight/dbias accumulators in registers for any plan (not only the staged
    # plans of at most `NormBwd.ACC_REG_ELEMS` that get them by default); a register-held plan then
    # asks ptxas for `ctas_per_sm` CTAs per SM (a register cap: uncapped, LayerNorm 4k t512 u1 with
    # prefetch went 48 -> 96 registers, i.e. one CTA per SM; capped at 2 it compiles to 64 without
    # spills). No shared-memory read-modify-write per row (29.7 % short-scoreboard stalls, LayerNorm 4k);
    # the same adds in the same order: bitwise the shared-memory accumulators' result.
    acc_regs: bool = False
    # LayerNorm forward: the row's mean and variance in ONE reduction (each thread's (count, mean, M2), merged
    # pairwise by Chan's formula: `collectives.reduce.welford_merge`) instead of two (the sum, then the sum of
    # squared deviations): one cluster exchange a row instead of two for clustered rows. Off by default
    # (a one-exchange version that merged 64 parts serially lost; this one merges through the butterfly).
    welford: bool = False
    # How a clustered row's CTA partials are folded once they land (`collectives.reduce.cluster_reduce`): "serial",
    # each thread folds the cluster's slots in rank order (cluster_n - 1 dependent ops: at 16 CTAs a softmax state
    # takes 15 merges of two exps each, per thread); "tree", lane l of the row loads slot l % cluster_n and a
    # butterfly of log2(cluster_n) stages leaves the result in every lane, as `group_reduce` combines warps. Other
    # bits than "serial" (another fixed order), deterministic. Needs threads_per_row >= cluster_n. Built for softmax
    # fwd 256k (ncu: 70.4 M warp instructions against QuACK's 45.8 M, 0.85x); timed in the sweep of the butterfly
    # fold above HELD_TUNED.
    cluster_fold: str = "serial"
    # A register plan (staging "regs") that asks ptxas for `ctas_per_sm` CTAs per SM (a register cap, as `acc_regs`
    # does for the backwards); the capped grid (`resident_grid`) is then sized for CTAs that are really co-resident.
    # Uncapped, ptxas sizes a register plan for its own ILP: LayerNorm fwd 8k (256 threads x 32 elements) took 126
    # registers, 2 CTAs an SM, where a cap of 3 compiles to 80 without spills; RMSNorm fwd 8k (128 x 64) 168, 3 an SM,
    # where 4 fit 128 (CPU compile). Same math: bitwise the uncapped plan.
    reg_cap: bool = False
    # A forward on the uncapped grid (one CTA per row tile, `resident_grid` off) built for exactly that: the tile loop
    # traced for one trip, the grid sized by the tiles alone. Without the loop's carried state ptxas fits the same row
    # in fewer registers (CPU compile: RMSNorm fwd 8k, 512 threads x 16 elements, capped at 4 CTAs an SM,
    # 56 B spilled with the loop and none without; 256 x 32 at 3 CTAs 80 -> 60 registers): Triton's geometry for
    # torch.compile's RMSNorm (512 threads, 32 registers, 92 % of warps active against our 35 %, ncu at 16384 x 8192).
    # Same math: bitwise the looping kernel.
    one_tile: bool = False

    def __post_init__(self):
        if self.staging not in STAGINGS:
            raise ValueError(f"staging must be one of {STAGINGS}, got {self.staging!r}")
        if self.hold and self.staging != "smem":
            raise ValueError(f"hold=True reads a staged row once into registers: it needs staging='smem' "
                             f"(got {self.staging!r})")
        if self.cluster_sync not in CLUSTER_SYNCS:
            raise ValueError(f"cluster_sync must be one of {CLUSTER_SYNCS}, got {self.cluster_sync!r}")
        if self.reg_cap and (self.staging != "regs" or self.acc_regs):
            raise ValueError("reg_cap caps a register plan's registers at its ctas_per_sm: staging='regs' without "
                             f"acc_regs (which caps them already); got plan staging {self.staging!r}, "
                             f"acc_regs {self.acc_regs}")
        if self.one_tile and (self.resident_grid or self.prefetch):
            raise ValueError("one_tile builds a forward for one CTA per row tile: not with resident_grid or prefetch "
                             f"(a CTA walking several tiles); got resident_grid {self.resident_grid}, prefetch "
                             f"{self.prefetch}")
        if self.cluster_fold not in CLUSTER_FOLDS:
            raise ValueError(f"cluster_fold must be one of {CLUSTER_FOLDS}, got {self.cluster_fold!r}")
        if self.cluster_fold == "tree" and self.tiling.threads_per_row < self.cluster_n:
            raise ValueError(f"cluster_fold='tree' spreads the cluster's {self.cluster_n} partials over the row's "
                             f"lanes: threads_per_row {self.tiling.threads_per_row} is fewer")

    @property
    def stages(self) -> int:
        """Staging buffers a row group has for each row tensor: 2 when prefetching the next tile, else 1
        (and 1 for a held row: its buffer is refilled once read)."""
        return 2 if self.prefetch and not self.hold else 1

    def row_smem_bytes(self, vec: int, rows: tuple = (), params: tuple = (), accumulators: int = 0) -> int:
        """Row-sized shared memory (bytes) of a CTA for `vec`-element vectors: with "smem" staging
        a buffer per staged row tensor (`rows`: their element sizes in bytes) for each of the
        CTA's rows (two with `prefetch`), and one per staged (N,) operand (`params`: weight, bias);
        plus, either way, `accumulators` fp32 row slices per row group (the norms' backward
        dweight/dbias)."""
        t = self.tiling
        chunk = t.threads_per_row * t.unroll * vec  # elements of a row one CTA holds
        total = accumulators * 4 * chunk * t.rows_per_cta
        if self.staging == "smem":
            total += chunk * (t.rows_per_cta * sum(rows) * self.stages + sum(params))
        return total

    def staged_residency(self, row_bytes: int, min_regs: int = 64) -> int:
        """CTAs per SM that ptxas is asked to fit (`.minnctapersm`) under shared-memory staging, for
        `row_bytes` of row-sized shared memory per CTA: what shared memory (228 KB per SM, 1 KB of
        it reserved per CTA) and threads (2048 per SM) allow, but never fewer than `min_regs`
        registers per thread (a tighter cap would spill the passes' working set)."""
        t = self.tiling.threads
        return max(1, min(2048 // t, 65536 // (t * min_regs), SMEM_PER_SM // (row_bytes + 2048)))

    def __str__(self) -> str:
        s = f"{self.tiling} c{self.cluster_n}"
        s = s if self.staging == "regs" else f"{s} {self.staging}"
        s = f"{s} mb" if self.cluster_sync == "mbarrier" else s
        s = f"{s} rg" if self.resident_grid else s  # forwards: a capped grid, also without a cluster
        s = f"{s} hold" if self.hold else s
        s = f"{s} accr" if self.acc_regs else s
        s = f"{s} wf" if self.welford else s
        s = f"{s} tf" if self.cluster_fold == "tree" and self.cluster_n > 1 else s
        s = f"{s} rc{self.ctas_per_sm}" if self.reg_cap else s
        s = f"{s} 1t" if self.one_tile else s
        return f"{s} pf" if self.prefetch else s

    def capacity(self, vec: int) -> int:
        """Longest row (elements) this plan holds."""
        return self.tiling.threads_per_row * self.tiling.unroll * vec * self.cluster_n

    def max_ctas(self, num_sms: int) -> int:
        return self.ctas_per_sm * num_sms


# Elements of one held tensor per thread: `target` is what the planner aims for (more threads per row below it), `max`
# the most before a row spills into a cluster. The norms' forward also holds the weight (64 fp32 x + weight spill at 128
# registers, i.e. at 512 threads); backward kernels hold x and dy. Each family has settings per row length: (longest row
# in elements, settings), the last entry (None) for the rest. Chosen from `perf/tune_rows.py` on an H200 (bf16, 256 MiB
# per tensor): one row per 128-thread CTA beats two rows per 256 at 4k (RMSNorm 3.90 -> 4.14 TB/s, LayerNorm 2.74 ->
# 3.75, softmax 3.88 -> 4.18); long rows want more CTAs resident (128-256 threads, larger clusters) rather than
# 512-thread CTAs of one per SM (softmax 64k 2.40 -> 3.03 TB/s, RMSNorm 64k 1.98 -> 2.33). Configurations that spill are
# left out.
_NORM_FWD = dict(target_elems=32, max_elems=32, min_threads=256, max_tpr=512)
_BWD = dict(target_elems=16, max_elems=32, min_threads=256, max_tpr=512)
# LayerNorm backward in a cluster: the cluster stage's extra registers spill at 32 elements.
_LN_BWD = dict(target_elems=16, max_elems=32, min_threads=256, max_tpr=512, cluster_elems=16)
_ONE_ROW_128 = dict(target_elems=32, max_elems=32, min_threads=128, max_tpr=128)
_FWD = dict(target_elems=64, max_elems=64, min_threads=128, max_tpr=256)
_RMS_FWD = dict(target_elems=64, max_elems=64, min_threads=128, max_tpr=128)
_LN_FWD = dict(target_elems=32, max_elems=32, min_threads=128, max_tpr=256)
# Rows of 32k-128k elements staged in shared memory (`staging="smem"`): `perf/tune_rows.py` on the H200 (bf16, 256 MiB
# per tensor), best staged plan over the best register plan: RMSNorm 64k t256 r256 u8 c4 2.36 -> 3.33 TB/s, 128k (c8)
# 1.96 -> 3.20; LayerNorm 64k 2.00 -> 2.29, 128k 1.65 -> 2.09; softmax 64k t256 r256 u16 c2 3.00 -> 3.40, 128k (c4) 2.74
# -> 3.23. Freed of the held row, registers let 3-4 CTAs of 256 threads share an SM where the register plans fit 1-2.
# `regs`: the register settings for rows the staged plans were not measured on: fp32 (vec 4: twice the bytes per
# element) and rows that are not 16-byte aligned (vec 1: cp.async cannot stage them).
_STAGED_NORM_FWD = dict(target_elems=64, max_elems=64, min_threads=256, max_tpr=256, staging="smem")
_STAGED_FWD = dict(target_elems=128, max_elems=128, min_threads=256, max_tpr=256, staging="smem")
# Softmax / log-softmax forward at 32k-128k: 64 elements per thread in 256-thread CTAs (QuACK's geometry: 64k in
# clusters of 4, 128k of 8), the landed row held in registers (`HeldRowPlan.hold`: one exp per element, 3 CTAs per SM at
# 80 registers), clusters synced by mbarrier. H200 sweep, over the re-reading staged default t256 u16: 64k 3.40 -> 3.86
# TB/s, 128k 3.23 -> 3.60.
_STAGED_FWD_HOLD = dict(target_elems=64, max_elems=64, min_threads=256, max_tpr=256, staging="smem",
                        cluster_sync="mbarrier", hold=True, staged_regs=80)
# Staged norms whose cluster meets on mbarriers (`cluster_sync="mbarrier"`: no MEMBAR.ALL.GPU before a cluster barrier
# per row tile): H200 sweep, each the best plan, over the barrier-synced default: RMSNorm 64k t128 r128 u8 c8 3.30 ->
# 3.60 TB/s; LayerNorm 64k t256 r256 u4 c8 2.27 -> 2.50, 128k t256 r256 u8 c8 2.08 -> 2.24. (LayerNorm backward 64k t512
# u4 c4 mb measured 1.107x but spills 48 bytes: left out.)
_STAGED_RMS_FWD_MB = dict(target_elems=64, max_elems=64, min_threads=128, max_tpr=128, staging="smem",
                          cluster_sync="mbarrier")
_STAGED_LN_FWD_MB = dict(target_elems=32, max_elems=32, min_threads=256, max_tpr=256, staging="smem",
                         cluster_sync="mbarrier")
# Softmax / log-softmax backward at 32k-64k, y and dy staged: 65536, t256 r256 u8 c4, 2.78 -> 4.16 TB/s
# (H200; measured at 64k only, so the entry stops there).
_STAGED_BWD = dict(target_elems=64, max_elems=64, min_threads=256, max_tpr=256, staging="smem", staged_rows=2,
                   staged_regs=128)
# Norm backward past 32k: the persistent grid capped at the clusters that are co-resident (one wave,
# `HeldRowPlan.resident_grid`; a grid of `ctas_per_sm` x SMs clusters ran in up to 9 waves and wrote as many fp32
# weight-gradient partial rows). H200 sweep over those defaults: 64k, staged t256 r256 u4 c8: RMSNorm 2.16 ->
# 2.55 TB/s, LayerNorm 1.57 -> 2.01; 128k RMSNorm t512 u4 c8 2.05 -> 2.38. At 16k it lost (0.93x).
_STAGED_NORM_BWD_RG = dict(target_elems=32, max_elems=32, min_threads=256, max_tpr=256, staging="smem",
                           staged_rows=2, staged_regs=128, resident_grid=True)
# RMSNorm backward at 4k: one 16-byte vector per thread of a 512-thread CTA (a row per CTA), the next row tile
# prefetched into a second register set, 2 CTAs per SM (264 CTAs: half the fp32 dweight partial rows of t128 u4 at 4 per
# SM). H200 sweep: 222.6 us against 246.4 without prefetch and 229.5 (bench) for t128 u4.
_BWD_4K_PF = dict(target_elems=8, max_elems=8, min_threads=512, max_tpr=512, prefetch=True, regs_per_thread=64)
# LayerNorm backward at 4k: 256 threads a row, two 16-byte vectors each, the next row tile prefetched, the dweight/dbias
# accumulators in registers (`HeldRowPlan.acc_regs`, ptxas capped at the plan's 2 CTAs per SM): H200 sweep, 242.0 us
# (3.33 TB/s) against 271.1 for the one-row t256 u4 default (1.12x) and 263.9 with smem accumulators.
_LN_BWD_4K_ACCR = dict(target_elems=16, max_elems=16, min_threads=256, max_tpr=256, prefetch=True, acc_regs=True)
# Rows past what the tuned plans hold (the RMSNorm / LayerNorm forwards past 256k): staged in shared memory, 64
# elements a thread, clusters of 8, CTAs of 512 threads (262144 bf16 elements: 64 KiB staged per tensor and CTA).
# Correctness plans, UNMEASURED for speed; 16-bit rows only (fp32 and scalar rows keep the register plans).
_LONG_FWD = dict(target_elems=64, max_elems=64, min_threads=512, max_tpr=512, staging="smem")
# The norm backwards past 128k: a non-portable cluster of 16 CTAs (Hopper allows 16 with the attribute the DSL sets on
# every kernel), 32 elements a thread at 512 threads: x and dy staged (64 KiB), the weight (32 KiB) and the fp32 dweight
# / dbias accumulators (64 KiB each): 160 KiB a CTA for RMSNorm, 224 KiB for LayerNorm (CPU compile: 113 / 125
# registers, no spills; RMSNorm's one accumulator, in registers, writes its partial row from them: 96 KiB). The H200
# co-schedules them (GPU tests at 262144 pass; 1024 x 262144 RMSNorm 651 us per call against QuACK's 902, LayerNorm
# 948.5). Correctness plans, untuned.
_LONG_NORM_BWD_16 = dict(_STAGED_NORM_BWD_RG, max_cluster=16)
# H200 sweep of the 16k-32k band and 256k (bf16, 256 MiB per tensor), each the best plan over the default it replaced:
# RMSNorm 16k staged t128 u4 c4 mb 174.5 -> 152.2 us, 32k staged t128 u8 c4 mb 217.2 -> 134.3; LayerNorm 16k staged t256
# u4 c2 mb hold 213.9 -> 156.9, 32k t256 u8 c2 mb hold 236.2 -> 167.1, 256k (c8, 512 threads) mb hold 263.4 -> 235.7;
# softmax 32k staged t256 u8 c2 mb hold 179.8 -> 138.0, 256k staged t256 u16 c8 (re-reading) 248.9 -> 173.5; LayerNorm
# backward 16k t512 u2 c2 mb pf (one CTA per SM) 319.2 -> 284.9, 32k t512 u1 c8 mb pf 496.0 -> 359.5.
_STAGED_RMS_FWD_16K = dict(_STAGED_RMS_FWD_MB, target_elems=32, max_elems=32)
_LN_BWD_16K = dict(_LN_BWD, max_elems=16, cluster_sync="mbarrier", prefetch=True)
_LN_BWD_32K = dict(_LN_BWD, target_elems=8, max_elems=8, cluster_elems=8, cluster_sync="mbarrier", prefetch=True)
# H200 backward sweep, each the best plan over the default it replaced: RMSNorm 1k four rows of 64 threads a 256-thread
# CTA, 4 CTAs per SM, 339.8 -> 203.6 us; LayerNorm 1k the same geometry 286.9 -> 249.4; softmax 32k one staged row of
# 256 threads x 16 vectors, one CTA per SM, 214.8 -> 191.9. 16-bit aligned rows only (`regs`: fp32 and scalar rows keep
# the plans of before). Not taken: RMSNorm 128k prefetching (337.9 -> 314.7 us) spills 48 B at 512 threads.
_BWD_1K = dict(target_elems=16, max_elems=16, min_threads=256, max_tpr=256, regs_per_thread=64)
_STAGED_BWD_32K = dict(_STAGED_BWD, target_elems=128, max_elems=128)
# H200 sweep (bf16, 256 MiB per tensor), each the best plan over the default it replaced, measured at the length named
# only (the brackets around them keep the plans of before): LayerNorm fwd 1k four staged rows of 32 threads a 128-thread
# CTA, held (8 CTAs per SM against 4: the held row took 128 registers), 154.7 -> 138.3 us; RMSNorm fwd 1k eight rows a
# 256-thread CTA 134.5 -> 130.4, 2k one row of 128 threads x 16 elements 138.8 -> 127.4; softmax / log-softmax fwd 16k
# one staged row of 128 threads x 128 elements: log-softmax 182.2 -> 133.6 (it ran 70 % of copy on the register plan
# that gives softmax 90 %), softmax 141.8 -> 138.9. Not taken: RMSNorm fwd 128k staged t128 u16 c8 mb (153.2 -> 148.0):
# the fused FP8-output RMSNorm shares the plan and spills 64 B at 16 vectors a thread.
_LN_FWD_1K = dict(target_elems=32, max_elems=32, min_threads=128, max_tpr=32, staging="smem", hold=True)
_RMS_FWD_1K = dict(_ONE_ROW_128, min_threads=256)
_RMS_FWD_2K = dict(target_elems=16, max_elems=16, min_threads=128, max_tpr=128, regs_per_thread=96)
_STAGED_FWD_16K = dict(target_elems=128, max_elems=128, min_threads=128, max_tpr=128, staging="smem")
# RMSNorm backward sweep with mbarrier-synced clusters (H200): 16k one row of 512 threads x 16 elements in clusters of
# 2, prefetching, one CTA per SM, 287.6 -> 228.9 us (ncu of the old plan, clusters of 8 on the cluster barrier: 14 % of
# warp stalls on MEMBAR); 32k one staged row of 256 threads x 64 elements in clusters of 2, prefetching (198 registers,
# one CTA per SM) 305.2 -> 264.2; 64k the staged resident-grid plan prefetching on mbarriers 286.5 -> 266.6. Not taken
# (they spill 40-48 B at 512 threads): the 512-thread register plans prefetching 32 elements, 32k 248.9 us and 128k
# (resident, clusters of 8) 265.6 against 338.0.
_RMS_BWD_16K = dict(_BWD, max_elems=16, cluster_sync="mbarrier", prefetch=True)
_RMS_BWD_32K = dict(_STAGED_BWD, cluster_sync="mbarrier", prefetch=True)
_RMS_BWD_64K = dict(_STAGED_NORM_BWD_RG, cluster_sync="mbarrier", prefetch=True)
# LayerNorm backward sweep with the dweight/dbias accumulators in registers (`acc_regs`; ncu of the plan before at 32k:
# 35 % short-scoreboard stalls on the smem accumulators), each the best plan over the default it replaced: 16k 285.3 ->
# 276.8 us, 32k 361.0 -> 319.0, 64k (the staged resident-grid plan on mbarriers, prefetching) 392.7 -> 302.5.
_LN_BWD_16K_ACCR = dict(_LN_BWD_16K, acc_regs=True)
# At 32k the sweep's winner runs 2 CTAs an SM (the register cap of its accumulators: 64 a thread), hence
# `regs_per_thread` 64: with the inherited 128 (1 CTA an SM) the suites measured 4096x32768 at 394.8 / 402.6 us,
# slower than the 359-361 of the plan before it.
_LN_BWD_32K_ACCR = dict(_LN_BWD_32K, acc_regs=True, regs_per_thread=64)
_LN_BWD_64K_ACCR = dict(_RMS_BWD_64K, acc_regs=True)
# Forward sweep on Hopper's non-portable 16-CTA clusters (`perf.tune_rows --max-cluster 16`; H200, bf16, 256 MiB per
# tensor; each plan's output within 1.8e-3 of the default's), each the best plan over the default: at 256k a CTA of the
# 8-CTA plans staged 64 KiB of x (and the norms 64 KiB of weight), 2-3 CTAs an SM; on 16 CTAs half that: RMSNorm 256k
# t256 u8 c16 (4 CTAs per SM) 181.7 -> 163.7 us (the sweep's best, t128 u16 c16 mb at 157.4, holds 128 elements a
# thread: the fused FP8-output RMSNorm, which shares the plan, spills 64 B there even at 255 registers), 128k t128 u8
# c16 mb (8 per SM) 153.1 -> 141.3; LayerNorm 256k t256 u8 c16 mb hold 237.0 -> 211.6; softmax 256k t256 u8 c16 mb hold
# 162.9 against 173.9 (log-softmax shares the entry: its re-reading c16 twin tied with the default there, 164.4 / 164.5;
# the hold plan untimed for it). No gain: LayerNorm, softmax and log-softmax at 128k (0.999-1.007x), the norm backwards
# at 256k (already on 16 CTAs). The entries stop at 256k: past it the 8-CTA plans' limits stand (the 16-CTA ones would
# widen their CTAs to 1M-element rows, unmeasured).
_C16_RMS_FWD_256K = dict(target_elems=64, max_elems=64, min_threads=256, max_tpr=256, staging="smem", max_cluster=16)
_C16_RMS_FWD_128K = dict(target_elems=64, max_elems=64, min_threads=128, max_tpr=128, staging="smem",
                         cluster_sync="mbarrier", max_cluster=16)
_C16_HOLD_FWD_256K = dict(target_elems=64, max_elems=64, min_threads=256, max_tpr=256, staging="smem",
                          cluster_sync="mbarrier", hold=True, max_cluster=16)
# H200 sweep of the norm backwards at 64k-128k (`perf.tune_rows --acc-regs both --resident-grid both --cluster-sync
# mbarrier`; bf16, 256 MiB per tensor; outputs within 4.7e-4 of the default's), each the best plan over the default:
# LayerNorm 128k one row of 512 threads x 32 elements held in registers, clusters of 8, one CTA per SM, 459.7 -> 385.7
# us (the staged plan before it: 2 CTAs an SM); RMSNorm 128k the same geometry staged, double-buffered, accumulators in
# registers, 333.5 -> 289.9; RMSNorm 64k 512 threads x 16 elements in registers, clusters of 8 on mbarriers,
# accumulators in registers, 2 CTAs per SM, 265.3 -> 225.2. No gain: LayerNorm 64k (1.001x), both at 256k
# (1.002-1.004x).
_LN_BWD_128K = dict(target_elems=32, max_elems=32, min_threads=512, max_tpr=512, resident_grid=True)
_LN_BWD_128K_I64 = dict(_STAGED_NORM_BWD_RG, target_elems=64, max_elems=64)  # the plan before it, staged
_RMS_BWD_128K = dict(_LN_BWD_128K, staging="smem", staged_rows=2, staged_regs=128, prefetch=True, acc_regs=True)
_RMS_BWD_64K_ACCR = dict(target_elems=16, max_elems=16, min_threads=512, max_tpr=512, cluster_sync="mbarrier",
                         resident_grid=True, acc_regs=True, regs_per_thread=64)
# Forward sweep of the held rows refilled (`perf.tune_rows --hold both --fwd-prefetch only`; H200, bf16, 256 MiB per
# tensor): once a tile's row is in registers its staging buffer takes the next tile's row (`HeldRowPlan.prefetch` with
# `hold`), each CTA walking its tiles on the capped grid (`resident_grid`). Same math, bitwise the held plan (GPU
# tests/rowwise/test_fwd_prefetch_gpu.py). Each the best plan over the default: LayerNorm 64k 180.7 -> 145.5 us (1.24x),
# 128k 199.1 -> 147.5 (1.35x), 256k 210.9 -> 149.2 (1.41x), on the defaults' own tilings; RMSNorm 256k 512 threads x 32
# elements in 16-CTA clusters, 2 CTAs an SM, 163.8 -> 152.0 (1.08x). No gain: RMSNorm 64k / 128k (0.95-0.97x), softmax
# and log-softmax 64k-256k (0.90-0.97x).
# The same sweep at 16k-32k, bitwise twins of the defaults:
# LayerNorm 16k held on the capped grid without the refill 157.1 -> 140.7 us (1.12x; refilled 144.7), 32k refilled
# 167.1 -> 142.8 (1.17x; 512 threads x 64 elements, one CTA of a row, 140.0 but other bits and unchecked beside a
# residual); RMSNorm 16k held on the capped grid 152.9 -> 142.4 (1.07x). No gain: RMSNorm 32k, softmax 16k / 32k.
_REFILL = dict(hold=True, resident_grid=True, prefetch=True)
# Backward sweep of the held rows (`perf.tune_rows --kernels layernorm.bwd --hold only --resident-grid both
# --max-cluster 16`; H200, bf16, 256 MiB per tensor; dx bitwise the default's): once a tile's x and dy are read out of
# their staging buffers into registers (16-bit), the one buffer per tensor takes the next tile (`hold` + `prefetch` on
# `NormBwd`; the double buffer does not fit beside the shared dweight/dbias slots). LayerNorm 128k: the register plan's
# geometry staged, 386.2 -> 352.4 us (1.10x); 256k: the 16-CTA staged plan, 484.8 -> 389.3 (1.25x; held without the
# refill 458.8). No gain at 64k (0.88x).
# The same sweep of RMSNorm: 128k the staged plan `_RMS_BWD_128K` without its register accumulators, held and
# refilled, 292.6 -> 273.0 us (1.07x); 256k as LayerNorm's, 335.6 -> 308.3 (1.09x); both bitwise the defaults.
# LayerNorm 16k-32k: no gain (0.95-0.97x).
_NORM_BWD_128K_REFILL = dict(_LN_BWD_128K, staging="smem", staged_rows=2, staged_regs=128, hold=True, prefetch=True)
# With 64-bit indexing the 256k plan spills 40-48 B at its 128 registers: the staged plan before it runs there.
_NORM_BWD_256K_REFILL = dict(_LONG_NORM_BWD_16, hold=True, prefetch=True, i64=_LONG_NORM_BWD_16)
_REFILL_RMS_FWD_256K = dict(target_elems=32, max_elems=32, min_threads=512, max_tpr=512, staging="smem",
                            max_cluster=16, **_REFILL)
# Sweep of the softmax forward holding 128 elements a thread (`perf.tune_rows --kernels softmax.fwd, log_softmax.fwd --n
# 16384,32768 --hold both --fwd-prefetch both`; H200, bf16, 256 MiB per tensor): at 16k the default's own tiling (one
# row of 128 threads x 128 elements) held, one exp an element, 3 CTAs an SM at 168 registers: softmax 138.7 -> 130.7 us
# (1.061x), log-softmax 133.1 -> 131.2 (1.015x), both bitwise the default. No gain at 32k (0.97-0.99x; the 64-element
# hold there stays).
# With 64-bit indexing the held plan spills 8 B at its 168 registers (softmax; log-softmax fp16): the re-reading plan
# before it runs there.
# Sweep of the butterfly cluster fold (`perf.tune_rows --cluster-fold only --max-cluster 16`, 64k-256k; H200): the
# defaults' twins folding by the butterfly, at 256k softmax 162.9 -> 155.8 us (1.046x), log-softmax 159.4 -> 154.6
# (1.031x), RMSNorm 153.4 -> 149.7 (1.024x). Within 1.1 % at 64k-128k (softmax 1.008-1.011x, RMSNorm 1.000-1.002x,
# LayerNorm 0.992-1.005x): the serial fold stays there.
# (With 64-bit indexing the 256k softmax spills 24 B at its 80 registers, under either fold.)
# Sweep of LayerNorm fwd 4k-8k (`--hold both --resident-grid both --fwd-prefetch both`; H200, bf16, 256 MiB per tensor):
# at 8k the default's register plan (256 threads x 32 elements, 2 CTAs an SM) on the capped grid, 199.4 -> 170.6 us
# (1.169x), bitwise; with its weight and bias then held in registers across the CTA's row tiles (`params_in_regs`) 157.4
# us (1.275x the uncapped plan; y * w + b contracted into one FMA: within a bf16 ulp of the per-tile loads). No gain at
# 4k (0.957-0.996x).
_LN_FWD_8K = dict(_LN_FWD, resident_grid=True)
# Sweep of the other row-wise kernels at 8k (the suite's 16384x8192 row had them at 66-86 % of copy on the plans
# before): softmax fwd one row of 256 threads x 32 elements, 146.4 -> 129.0 us (1.135x), log-softmax 147.4 -> 140.5
# (1.049x); RMSNorm fwd one row of 128 threads x 64 elements (was 32 in clusters of 2), 161.9 -> 139.3 (1.163x); RMSNorm
# bwd one staged row of 256 threads x 32 elements, the next tile prefetched, 283.4 -> 208.8 (1.357x). Each other bits
# than the default (another reduction order).
_FWD_8K = dict(target_elems=32, max_elems=32, min_threads=256, max_tpr=256)
_RMS_BWD_8K = dict(_STAGED_BWD, target_elems=32, max_elems=32, prefetch=True)
_STAGED_FWD_16K_HOLD = dict(_STAGED_FWD_16K, hold=True, staged_regs=168, i64=dict(_STAGED_FWD_16K, regs=_FWD))
# 8k sweep with the register cap and the staged candidates past 4k (`perf.tune_rows --kernels
# layernorm.fwd,rmsnorm.fwd,log_softmax.fwd --n 8192 --reg-cap both --resident-grid both --hold both --fwd-prefetch
# both`; H200, bf16, 256 MiB per tensor), each the best plan over the default: LayerNorm fwd one staged row of 128
# threads x 64 elements, held and refilled on the capped grid (8 CTAs an SM), 155.8 -> 145.1 us (1.074x; the plan style
# of LayerNorm 16k-64k); RMSNorm fwd 256 threads x 32 elements capped at 3 CTAs an SM (80 registers; uncapped 2), 139.8
# -> 136.7 (1.022x); log-softmax one staged row of 128 threads x 64 elements, not held (8 CTAs an SM), 140.6 -> 129.4
# (1.086x): its own family ("lsm_fwd"), the softmax's 256 x 32 plan measured 98 % of copy there (the staged plan untimed
# for softmax). (The RMSNorm and LayerNorm plans gave way to the one-tile plans below; the staged LayerNorm plan stays
# defined for the tests of the capped grid.)
# Sweep at 6144 and 12288 (the 8k and 16k buckets' middles, vectors per thread what covers the row): softmax /
# log-softmax bwd one staged row of 256 threads x 32 elements (y and dy in shared memory) at 6144, 203.5 -> 185.3 us
# (1.098x), of 512 x 32 at 12288, 211.9 -> 186.2 (1.138x), against the 512-thread register plan; LayerNorm fwd 12288 the
# 16k entry refilled (`_REFILL`), 148.5 -> 143.9 (1.032x; at 16k the refill lost, 144.7 against 140.7). The sweep timed
# the 6144 plan at 4 vectors a thread (capacity 8192); the entry plans 3 there, timed on its own: 184.3 us against 185.4
# for 4, and 184.7 at 12288 (4.36-4.37 TB/s).
_STAGED_BWD_6K = dict(target_elems=32, max_elems=32, min_threads=256, max_tpr=256, staging="smem", staged_rows=2,
                      staged_regs=128)
_STAGED_BWD_12K = dict(_STAGED_BWD_6K, min_threads=512, max_tpr=512)
# Softmax bwd at 16384 (H200) against the register plan (198.4 us): the 12288 plan (512 threads x 32 elements, staged)
# 185.9 (1.067x) but 8 B spilled (CPU compile, 32-bit indexing); 128 threads x 64 elements staged in clusters of 2,
# 188.3 (1.054x), clean, taken. With 64-bit indexing that one spills 24 B and the 512-thread plan none: it runs there.
_STAGED_BWD_16K = dict(target_elems=64, max_elems=64, min_threads=128, max_tpr=128, staging="smem", staged_rows=2,
                       staged_regs=128)
_LN_FWD_8K_STAGED = dict(target_elems=64, max_elems=64, min_threads=128, max_tpr=128, staging="smem", **_REFILL)
_LSM_FWD_8K = dict(target_elems=64, max_elems=64, min_threads=128, max_tpr=128, staging="smem")
# Sweep of the forwards built for one CTA per row tile (`perf.tune_rows --kernels rmsnorm.fwd,layernorm.fwd --n
# 6144,8192,12288,16384 --one-tile both --reg-cap both`; H200, bf16, 256 MiB per tensor): no tile loop to carry, the
# uncapped grid, torch.compile's geometry (ncu: 92 % of warps active against our 35 %). Each over the default: RMSNorm
# fwd 6144 256 threads x 24 elements 144.9 -> 128.7 us (1.126x), 8192 256 x 32 136.5 -> 129.5 (1.054x; 512 x 16 capped
# at 4 CTAs an SM 129.1), 12288 256 x 48 capped at 3 CTAs an SM 140.0 -> 131.5 (1.064x), 16384 512 x 32 capped at 2
# 140.4 -> 132.4 (1.090x; uncapped 133.0, taken); LayerNorm fwd 6144 256 x 24 capped at 4 CTAs an SM 146.6 -> 137.5
# (1.066x), 8192 512 x 16 capped at 4 144.6 -> 133.9 (1.080x; 256 x 32 the same, but it spilled 8 B under the cap).
# LayerNorm 12288 / 16384: the defaults stay (0.972x / 0.979x). Other bits than the defaults at 8k-16k (another
# reduction order), within a bf16 ulp. The caps were measured on the plain signature: beside a residual, an FP8 output
# or 64-bit indexing they spilled 8-152 B (CPU compile): there the plans run uncapped
# (`cute_kernels.rowwise.launch.without_reg_cap`).
_RMS_FWD_8K_1T = dict(_FWD_8K, one_tile=True)
_RMS_FWD_12K_1T = dict(target_elems=48, max_elems=48, min_threads=256, max_tpr=256, regs_per_thread=80, reg_cap=True,
                       one_tile=True)
_RMS_FWD_16K_1T = dict(target_elems=32, max_elems=32, min_threads=512, max_tpr=512, one_tile=True)
_LN_FWD_6K_1T = dict(_FWD_8K, regs_per_thread=64, reg_cap=True, one_tile=True)
_LN_FWD_8K_1T = dict(target_elems=16, max_elems=16, min_threads=512, max_tpr=512, regs_per_thread=32, reg_cap=True,
                     one_tile=True)
# One-tile sweep at 1024 and 6144: softmax fwd 6144 256 x 24 capped at 5 CTAs an SM 138.5 -> 126.9 us (1.092x; uncapped
# 127.8), log-softmax 6144 the same plan 134.6 -> 126.8 (1.061x, against its staged 8k entry); RMSNorm fwd 1024 the
# default's tiling (256 threads, 8 rows of 32 x 4 vectors) 130.2 -> 128.2 (1.016x); LayerNorm fwd 1024 128 threads (4
# rows of 32 x 4 vectors) capped at 6 CTAs an SM 138.2 -> 133.9 (1.032x, against the staged held plan; at 7 133.2, but
# 8 B spilled there). Softmax 1024: the default stays (best 1.011x).
_FWD_6K_1T = dict(_FWD_8K, regs_per_thread=48, reg_cap=True, one_tile=True)
_LN_FWD_1K_1T = dict(_ONE_ROW_128, max_tpr=32, regs_per_thread=80, reg_cap=True, one_tile=True)
HELD_TUNED = {
    # softmax and log-softmax (log-softmax hold: 64k 3.61 -> 3.87 TB/s, 128k 3.40 -> 3.63)
    "fwd": ((4096, _ONE_ROW_128), (6144, dict(_FWD_6K_1T, regs=_FWD_8K)), (8192, _FWD_8K), (16384, dict(_STAGED_FWD_16K_HOLD, regs=_FWD)),
            (131072, dict(_STAGED_FWD_HOLD, regs=_FWD)),
            (262144, dict(_C16_HOLD_FWD_256K, staged_regs=80, cluster_fold="tree", regs=_FWD)), (None, _FWD)),
    "rms_fwd": ((512, _ONE_ROW_128), (1024, dict(_RMS_FWD_1K, one_tile=True, regs=_ONE_ROW_128)),
                (2048, dict(_RMS_FWD_2K, regs=_ONE_ROW_128)),
                (4096, _ONE_ROW_128), (8192, dict(_RMS_FWD_8K_1T, regs=_RMS_FWD)), (12288, dict(_RMS_FWD_12K_1T, regs=_ONE_ROW_128)),
                (16384, dict(_RMS_FWD_16K_1T, regs=_ONE_ROW_128)),
                (65536, dict(_STAGED_RMS_FWD_MB, regs=_RMS_FWD)),
                (131072, dict(_C16_RMS_FWD_128K, regs=_NORM_FWD)), (262144, dict(_REFILL_RMS_FWD_256K, cluster_fold="tree", regs=_NORM_FWD)),
                (None, dict(_LONG_FWD, regs=_NORM_FWD))),
    # LayerNorm 32k-128k: the landed row held (`hold`: 64k 2.50 -> 2.75 TB/s, 128k 2.26 -> 2.45); RMSNorm's hold
    # measured 1.000x: not taken
    "ln_fwd": ((512, _ONE_ROW_128), (1024, dict(_LN_FWD_1K_1T, regs=_ONE_ROW_128)), (4096, _ONE_ROW_128), (6144, dict(_LN_FWD_6K_1T, regs=_LN_FWD_8K)),
               (8192, dict(_LN_FWD_8K_1T, regs=_LN_FWD_8K)),
               (12288, dict(_STAGED_LN_FWD_MB, **_REFILL, regs=_LN_FWD)),
               (16384, dict(_STAGED_LN_FWD_MB, hold=True, resident_grid=True, regs=_LN_FWD)),
               (32768, dict(_STAGED_NORM_FWD, cluster_sync="mbarrier", **_REFILL, regs=_LN_FWD)),
               (65536, dict(_STAGED_LN_FWD_MB, **_REFILL, regs=_LN_FWD)),
               # scalar and fp32 rows: 16 values a thread in clusters of 16 (32 in clusters of 8 spilled 496 B on
               # scalar rows, which hold x, weight and bias; GPU-checked)
               (131072, dict(_STAGED_NORM_FWD, cluster_sync="mbarrier", **_REFILL,
                             regs=dict(_NORM_FWD, max_elems=16, max_cluster=16))),
               (262144, dict(_C16_HOLD_FWD_256K, **_REFILL, regs=_NORM_FWD)),
               (None, dict(_LONG_FWD, cluster_sync="mbarrier", hold=True, regs=_NORM_FWD))),
    # softmax / log-softmax backward staged from 16k (in the suite: the staged plan at 64k 99 % and
    # 256k 91 % of copy, the register plans between them 73 % at 32k and 63 % at 128k)
    "bwd": ((4096, _BWD), (6144, dict(_STAGED_BWD_6K, regs=_BWD)), (8192, _BWD), (12288, dict(_STAGED_BWD_12K, regs=_BWD)),
            (16384, dict(_STAGED_BWD_16K, regs=_BWD, i64=dict(_STAGED_BWD_12K, regs=_BWD))), (32768, dict(_STAGED_BWD_32K, regs=_BWD)), (None, dict(_STAGED_BWD, regs=_BWD))),
    "rms_bwd": ((1024, dict(_BWD_1K, regs=_ONE_ROW_128)), (2048, _ONE_ROW_128), (4096, _BWD_4K_PF), (8192, dict(_RMS_BWD_8K, regs=dict(target_elems=16, max_elems=16, min_threads=128, max_tpr=128))),
                (16384, dict(_RMS_BWD_16K, regs=dict(target_elems=16, max_elems=16, min_threads=128, max_tpr=128))),
                (32768, dict(_RMS_BWD_32K, regs=_BWD)), (65536, dict(_RMS_BWD_64K_ACCR, regs=dict(_BWD, resident_grid=True),
                                                                      # 64-bit: 64 B spilled at 64 registers
                                                                      i64=dict(_RMS_BWD_64K, regs=dict(_BWD, resident_grid=True)))),
                (131072, dict(_NORM_BWD_128K_REFILL, regs=dict(_BWD, resident_grid=True),
                              i64=dict(_RMS_BWD_128K, regs=dict(_BWD, resident_grid=True)))),
                (262144, dict(_NORM_BWD_256K_REFILL, regs=dict(_BWD, resident_grid=True))),
                (None, dict(_LONG_NORM_BWD_16, regs=dict(_BWD, resident_grid=True)))),
    # 8k (and fp32 / scalar rows to 16k): 512-thread CTAs, two per SM in the grid (registers allow one
    # resident: the second wave balances the tail), measured at 16k: 2.08 -> 2.40 TB/s.
    "ln_bwd": ((1024, dict(_BWD_1K, regs=dict(_ONE_ROW_128, min_threads=256))), (2048, dict(_ONE_ROW_128, min_threads=256)), (4096, dict(_LN_BWD_4K_ACCR, regs=dict(_ONE_ROW_128, min_threads=256))), (8192, dict(_LN_BWD, regs_per_thread=64)),
               (16384, dict(_LN_BWD_16K_ACCR, regs=dict(_LN_BWD, regs_per_thread=64))), (32768, dict(_LN_BWD_32K_ACCR, regs=_LN_BWD)), (65536, dict(_LN_BWD_64K_ACCR, regs=dict(_LN_BWD, resident_grid=True))),
               # (64-bit indexing: the 128k plan spills 48 B at its 128 registers; the staged plan before it does not)
               (131072, dict(_NORM_BWD_128K_REFILL, regs=_LN_BWD_128K, i64=dict(_LN_BWD_128K_I64, regs=_LN_BWD))),
               (262144, dict(_NORM_BWD_256K_REFILL, regs=_LN_BWD)),
               (None, dict(_LONG_NORM_BWD_16, regs=_LN_BWD))),
    # Cross-entropy backward: no reduction (lse is saved), a read-x / write-dx copy bound by bytes in
    # flight. UNMEASURED (CPU compile reports only; time with `perf.tune_rows --kernels
    # cross_entropy.bwd`): 64 elements (8 bf16 vectors, 128 B) per thread loaded together, 128-256
    # thread CTAs: 4k = two rows of 64 threads per CTA (QuACK's geometry), 52 registers, 9 CTAs/SM
    # (~144 KiB in flight per SM); 16k+ = 256 threads per row, a long row cut over grid y (4 CTAs
    # at 64k, no cluster launch: `cute_kernels.rowwise.softmax.CrossEntropyBwd`), 47 registers. Against
    # target_elems=32, min_threads=256, max_tpr=512: 4k = 4 vectors per thread, 71 registers, 3
    # CTAs of 256 per SM (48 KiB in flight); 64k = 512 threads in clusters of 2, 1 CTA per SM.
    "ce_bwd": ((None, dict(target_elems=64, max_elems=64, min_threads=128, max_tpr=256)),),
}

# log-softmax forward: the softmax's entries but at 8k
HELD_TUNED["lsm_fwd"] = tuple((most, dict(_LSM_FWD_8K, regs=_FWD_8K) if most == 8192 else st)
                              for most, st in HELD_TUNED["fwd"])


def held_settings(tuning: str, n: int) -> dict:
    """`plan_held_rows` settings of family `tuning` for rows of `n` elements."""
    for most, settings in HELD_TUNED[tuning]:
        if most is None or n <= most:
            return settings
    raise AssertionError("the last entry of a HELD_TUNED family covers every row length")


def plan_for_rows(tuning: str, n: int, vec: int, staged: bool = True, index64: bool = False) -> HeldRowPlan:
    """The held-row plan of family `tuning` (a HELD_TUNED key) for rows of `n` elements in
    `vec`-element vectors; ValueError when no cluster holds the row. Staged settings give way to
    their `regs` register settings for rows of other than 16-bit vectors (vec != 8) and where `staged`
    is False (a signature whose operands leave the staged rows no room: `cute_kernels.rowwise.launch.fitted`).
    `index64` (tensors past 2^31 elements): an entry's `i64` settings where it has them (a plan whose
    64-bit address math would spill at its register cap; the held backwards' `i64` plans, the unheld ones before
    them, also run beside an fp32 weight: `cute_kernels.rowwise.launch.fitted`)."""
    st = held_settings(tuning, n)
    if index64 and "i64" in st:
        st = st["i64"]
    st = {k: v for k, v in st.items() if k != "i64"}
    if "regs" in st:
        st = st["regs"] if vec != 8 or not staged else {k: v for k, v in st.items() if k != "regs"}
    return _plan(n, vec, st)


def _plan(n: int, vec: int, st: dict) -> HeldRowPlan:
    extra = ("acc_regs", "welford", "cluster_fold", "reg_cap", "one_tile")  # properties of the plan, not the planning
    props = {k: st[k] for k in extra if st.get(k)}
    plan = plan_held_rows(n, vec, **{k: v for k, v in st.items() if k not in extra})
    if props.get("cluster_fold") == "tree" and plan.cluster_n == 1:
        del props["cluster_fold"]
    return dataclasses.replace(plan, **props) if props else plan


@functools.lru_cache(maxsize=256)
def max_held_row(tuning: str, vec: int) -> int:
    """Longest row (elements, a multiple of `vec`) family `tuning` holds: the planner's own answer
    (`plan_for_rows` on doubling, then bisected, vector counts; the shorter brackets hold their rows)."""
    def holds(nv: int) -> bool:
        try:
            plan_for_rows(tuning, nv * vec, vec)
            return True
        except ValueError:
            return False

    lo = 1
    while lo < 1 << 30 and holds(2 * lo):
        lo *= 2
    hi = 2 * lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if holds(mid) else (lo, mid)
    return lo * vec


# The norm backwards' dweight/dbias accumulators (`cute_kernels.rowwise.norms.NormBwd`): in registers where the plan
# asks (`acc_regs`) or a staged plan has at most NORM_BWD_ACC_REG_ELEMS fp32 of them a thread, else in shared memory.
NORM_BWD_ACC_REG_ELEMS = 32


def bwd_acc_in_regs(plan: HeldRowPlan, vec: int, accumulators: int) -> bool:
    """(A held plan keeps them in shared memory unless it asks: its held x and dy take those registers; LayerNorm
    256k without a bias, 32 accumulators beside the held rows, spilled 72 B at 128 registers.)"""
    return plan.acc_regs or (plan.staging == "smem" and not plan.hold
                             and accumulators * plan.tiling.unroll * vec <= NORM_BWD_ACC_REG_ELEMS)


def bwd_direct_partial(plan: HeldRowPlan, vec: int, accumulators: int) -> bool:
    """Whether the norm backward writes its partial rows straight from register accumulators: in registers, and one
    row group a CTA (nothing to fold over row groups in shared memory)."""
    return bwd_acc_in_regs(plan, vec, accumulators) and plan.tiling.rows_per_cta == 1


def bwd_smem_accumulators(plan: HeldRowPlan, vec: int, accumulators: int) -> int:
    """fp32 row slices of shared memory the norm backward's `accumulators` take a row group: none where the partial
    rows are written from the registers (`bwd_direct_partial`), else one each (register sums are folded over the
    CTA's row groups there)."""
    return 0 if bwd_direct_partial(plan, vec, accumulators) else accumulators


MAX_CLUSTER = 8  # the portable cluster size on Hopper (16 where a HELD_TUNED entry asks: non-portable)
STAGINGS = ("regs", "smem")
HOLD_ELEMS = 64  # `HeldRowPlan.hold`: the most elements per thread a held staged row may have (fp32 registers)
# ... for the softmax forward (and log-softmax) and RMSNorm's: 128, QuACK's 16k geometry (128 threads x 128 elements;
# the softmax holds its exps in fp32 at 167 registers, 3 CTAs an SM,
# `cute_kernels.rowwise.softmax.SoftmaxFwd.held_regs`; RMSNorm 127, 227 beside a residual; LayerNorm beside a
# residual spilled at 255: 64 there). The staged re-reading plan it replaces at 16k computes every exp twice: ncu,
# softmax 8192x16384, 90.3 M warp instructions against QuACK's 38.7 M (same bytes; 68.6 % issue-active against
# 30.6 %).
WIDE_HOLD_ELEMS = 128

CLUSTER_SYNCS = ("barrier", "mbarrier")
CLUSTER_FOLDS = ("serial", "tree")
SMEM_PER_CTA = 227 * 1024  # the most dynamic shared memory one CTA may opt into on Hopper
SMEM_PER_SM = 228 * 1024


def hold_elems(kernel: str) -> int:
    """The most elements per thread kernel `kernel` ("softmax.fwd", ...) may hold (`HeldRowPlan.hold`)."""
    return WIDE_HOLD_ELEMS if kernel in ("softmax.fwd", "log_softmax.fwd", "rmsnorm.fwd") else HOLD_ELEMS


@functools.lru_cache(maxsize=4096)
def plan_held_rows(n: int, vec: int, *, target_elems: int = 32, max_elems: int = 64, min_threads: int = 256,
                   max_tpr: int = 512, max_cluster: int = MAX_CLUSTER, regs_per_thread: int = 128,
                   cluster_elems: int | None = None, staging: str = "regs", prefetch: bool = False,
                   staged_rows: int = 1, staged_regs: int = 64, cluster_sync: str = "barrier",
                   resident_grid: bool = False, hold: bool = False) -> HeldRowPlan:
    """Threads per row, vectors per thread and cluster size for rows of `n` elements in `vec`-element
    vectors, held in registers.

    Threads per row: the power of two that gives each thread about `target_elems` elements, up to
    `max_tpr`. Vectors per thread: as many as then cover the row (3 at 6144 elements on 256 threads,
    where the power of two left a quarter of the held registers masked off); for scalar rows the power of two. A row longer than
    `max_tpr * max_elems` elements is spread over a cluster of up to `max_cluster` CTAs whose
    partial reductions meet in distributed shared memory, each CTA then holding at most
    `cluster_elems` (default `max_elems`) per thread. Raises ValueError past that.
    CTAs: at least `min_threads` threads (several short rows per CTA); `ctas_per_sm` from a
    register estimate of `regs_per_thread`, used by kernels that walk rows grid-stride.
    `staging="smem"`: the row goes through shared memory (cp.async), so `max_elems` may exceed
    what registers hold; CTAs per SM are then those `HeldRowPlan.staged_residency` fits (one
    16-byte buffer slot per held vector, 64 registers per thread, 2048 threads per SM).
    Scalar rows (vec == 1) stay in registers: cp.async moves 4, 8 or 16 bytes, not one element.
    `prefetch`: the plan pipelines row tiles (`HeldRowPlan.prefetch`; staged: two buffers per row).
    `staged_rows`, `staged_regs`: with staging, the row tensors staged (backward: y and dy, 2) and
    the registers per thread the kernel keeps (backward: 128), which bound the CTAs per SM.
    `cluster_sync`: how a clustered plan's CTAs meet (`HeldRowPlan.cluster_sync`); one CTA: "barrier".
    `resident_grid`: the backward's persistent grid capped at the co-resident clusters (a launch
    setting, `HeldRowPlan.resident_grid`).
    `hold`: a staged row is read once into registers after it lands (`HeldRowPlan.hold`; set
    `staged_regs` to what the held row needs).
    """
    if staging not in STAGINGS:
        raise ValueError(f"staging must be one of {STAGINGS}, got {staging!r}")
    if vec == 1:
        staging = "regs"
    nv = max(1, -(-n // vec))
    vpt_target = max(1, target_elems // vec)
    vpt_max = max(1, max_elems // vec)
    tpr = min(max_tpr, _pow2_at_least(-(-nv // vpt_target)))
    cluster = 1
    # vectors per thread: what covers the row, not the next power of two (a row of 6144 at 256 threads: 3 vectors a
    # thread, not 4 with one masked off: a quarter of the registers and the CTAs per SM they bound went idle). Scalar
    # rows (the slow path) keep the power of two: the softmax backward at 769 spilled 8 B at 13 a thread.
    cover = (lambda v: v) if vec > 1 else _pow2_at_least
    vpt = cover(-(-nv // tpr))
    if vpt > vpt_max:
        vpt_max = max(1, (cluster_elems or max_elems) // vec)
        cluster = _pow2_at_least(-(-nv // (tpr * vpt_max)))
        while cluster > max_cluster and tpr < 512:  # wider CTAs before giving up
            tpr *= 2
            cluster = _pow2_at_least(-(-nv // (tpr * vpt_max)))
        if cluster > max_cluster:
            raise ValueError(
                f"rows of {n} elements exceed what {max_cluster} CTAs hold in registers "
                f"({max_cluster * tpr * vpt_max * vec} elements)")
        vpt = cover(-(-nv // (tpr * cluster)))
    threads = max(tpr, min_threads)
    ctas_per_sm = max(1, min(8, 65536 // (threads * regs_per_thread)))
    sync = cluster_sync if cluster > 1 else "barrier"
    hold = hold and staging == "smem"
    plan = HeldRowPlan(RowTiling(threads=threads, threads_per_row=tpr, unroll=vpt), cluster, ctas_per_sm, staging,
                       prefetch, sync, resident_grid, hold)
    if staging == "smem":
        staged = plan.row_smem_bytes(vec, rows=(16 // vec,) * staged_rows)
        if staged > SMEM_PER_CTA:
            raise ValueError(f"plan {plan} stages {staged} bytes of shared memory per CTA "
                             f"(at most {SMEM_PER_CTA})")
        plan = HeldRowPlan(plan.tiling, cluster, min(16, plan.staged_residency(staged, staged_regs)), staging,
                           prefetch, sync, resident_grid, hold)
    return plan
