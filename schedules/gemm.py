"""GEMM schedules (curriculum lesson 10): who computes which output tile, with which warps, when.

A `GemmSchedule` fixes everything about *when and where* a Hopper GEMM runs, none of *how* a tile
is computed (that is `collectives/`):

* warp roles: warpgroup 0 is the producer (one warp issues the TMA loads; it gives its registers
  away with `setmaxnreg.dec` down to `producer_regs`), warpgroups 1 and 2 are consumers (WGMMA and
  epilogue, `setmaxnreg.inc` up to `consumer_regs`). 40 + 2 x 232 registers x 128 threads fit the
  SM's 64K-register file.
* `kind="cooperative"`: both consumer warpgroups work on the same output tile, split along M (each
  owns `tile_m / 2` rows), and share its epilogue.
* `kind="pingpong"`: each consumer warpgroup owns whole tiles, alternating (the CTA's tiles 0, 2, 4...
  go to warpgroup 1, tiles 1, 3, 5... to warpgroup 2). Named barriers order their mainloops so that
  one warpgroup's epilogue overlaps the other's tensor-core work (FA3/CUTLASS ping-pong).
* the tile scheduler: persistent (`persistent=True`: one CTA cluster per set of SMs, each walks its
  share of the output tiles; the TMA pipeline keeps running across tile boundaries) or one tile
  per cluster (`persistent=False`, the baseline). Tiles are visited in groups of `raster_group`
  cluster-rows along M (a "swizzle"), so CTAs running at the same time share A rows and B columns
  in L2.
* clusters of `cluster_m x cluster_n` CTAs: the CTAs of a cluster row share B tiles, those of a
  column share A tiles, loaded once by TMA multicast. A 4-CTA cluster must sit in one GPC: 132 SMs
  hold 32 of them at once, not 33 (`cluster_slots`; the op also asks the occupancy API).
* `wg_epilogue` (cooperative, tile_m 128): each consumer warpgroup stores its own 64 rows with its
  own barrier and buffers, so the two drift apart and one's epilogue overlaps the other's last
  K-blocks on the tensor cores (ping-pong's overlap, inside one tile).
* grouped walks (MoE, only M grouped; `schedules.walks.TileWalk.tile`, chosen when the kernel is traced): B holds
  one weight per expert along its batch mode L. "contiguous": the experts' rows are concatenated
  in A (each expert's block starts at a multiple of the tile), a device vector gives each row's
  expert (-1: padding); a tile's B batch is the expert of its first row and tiles of padding are
  skipped. "masked": A is (max_m, K, E), a device vector gives each expert's valid rows; the walk
  enumerates only the cluster tiles below those counts (expert after expert, raster order inside
  each), so nothing is skipped and no host synchronization is needed.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from schedules.hardware import _gpc_bound_clusters
from schedules.index_math import imin

SMEM_BYTES = 232448  # usable dynamic shared memory per CTA on sm_90 (227 KiB)
BARRIER_BYTES = 1024  # mbarriers and alignment slack
KINDS = ("cooperative", "pingpong")
GROUPINGS = ("none", "contiguous", "masked")


# The gated (SwiGLU) epilogue: B's columns alternate GLU_BLOCK gate and GLU_BLOCK up columns (the 8-column blocks of
# a WGMMA accumulator, so that a thread holds both columns of each product).
GLU_BLOCK = 8


@dataclass(frozen=True)
class GemmSchedule:
    kind: str = "cooperative"
    tile_m: int = 128
    tile_n: int = 256
    tile_k: int = 64
    cluster_m: int = 2
    cluster_n: int = 1
    stages: int = 0  # A/B pipeline stages; 0 = as many as fit in shared memory
    epi_stages: int = 4  # output sub-tile buffers in flight per storing warpgroup
    raster_group: int = 8  # cluster-rows along M per raster group (L2 reuse)
    persistent: bool = True
    producer_regs: int = 40
    consumer_regs: int = 232
    split_k: int = 1  # K splits per output tile (> 1: fp32 partials + a second, summing pass)
    # cooperative at tile_m 128: each consumer warpgroup stores its own 64 rows of the tile (own named barrier,
    # smem buffers and TMA-store warp) instead of both storing 128-row sub-tiles together, so nothing
    # but the stage ring ties the two warpgroups and one's epilogue overlaps the other's K-blocks
    wg_epilogue: bool = False
    # split-K: the last split of a tile to finish sums the fp32 partials (in split order) and stores
    # the tile itself, counted by a per-tile atomic flag: one launch, no summing pass (whose launch and
    # host work cost ~10 us a call: `_SPLIT_LAUNCH_S`)
    split_fixup: bool = False
    # ping-pong at tile_m 64: both consumer warpgroups work on every tile, warpgroup w on the tile's K-blocks
    # w, w + 2, ... (the producer's ring order is unchanged), each with its own accumulator; warpgroup 1 hands
    # its partial to warpgroup 0 through its own (idle) half of the epilogue's shared memory, warpgroup 0 adds
    # it and stores the tile. For grids of at most a tile a CTA (small M), where the other ping-pong warpgroup
    # idles: two K-block chains in flight a tile instead of one. Not bitwise the one-warpgroup sum (two
    # partial sums added at the end). Warpgroup w reads the ring positions of parity w, and the ring needs an even
    # number of stages: then stage s always belongs to warpgroup s % 2, on every tile, as a parity wait needs. With
    # an odd count stage s alternates between the two, and nothing orders them: a warpgroup waiting on stage s's
    # next fill could pass on the parity of the fill before it, which the other warpgroup has not yet seen complete
    # (a TMA load landing late), read the stage early and release it twice; the CTA then exited with loads still in
    # flight, and back-to-back launches failed (`perf/lab/fp8_deep_probe.py`: 11 stages at 64x7168x16384, an
    # unspecified launch failure).
    k_interleave: bool = False
    # Small M (one row of tiles, M <= a_rows < tile_m): A's TMA box covers only the first `a_rows` rows of the tile
    # (8, 16 or 32; 0: the whole tile). A box reaching past M is boundary-checked, which runs slower (the "A padded
    # to 64 rows" column of `gemm_small`: 32x4096x4096 1.26x; DeepGEMM's maintainers say the same of M = 68 against
    # 132); with a_rows = M nothing of the box is out of bounds. The tile's other rows keep whatever shared memory
    # held: their accumulator rows are past M, never stored, and no epilogue mixes rows. K-major A whose K-block
    # is one 128-byte swizzle atom wide (bf16 tile_k 64, 8-bit 128), so a short box is the stage's first rows.
    a_rows: int = 0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.tile_n % 16 or not 16 <= self.tile_n <= 256:
            raise ValueError(f"tile_n must be a multiple of 16 in [16, 256], got {self.tile_n}")
        if self.tile_k % 16:
            raise ValueError(f"tile_k must be a multiple of 16, got {self.tile_k}")
        rows = self.tile_m // self.consumers_per_tile
        if self.tile_m % (64 * self.consumers_per_tile):
            raise ValueError(f"{self.kind}: tile_m must be a multiple of {64 * self.consumers_per_tile}")
        # 192 accumulators fit the consumers' 232 registers: ping-pong 128x192 (QuACK's default sm90 tile)
        # peaks at R215 with no spills (CPU compile); 256 would not
        if rows * self.tile_n // 128 > 192:
            raise ValueError(
                f"{self.kind} {self.tile_m}x{self.tile_n}: {rows * self.tile_n // 128} fp32 accumulators per "
                "thread; at most 192 fit beside the pipeline's registers")
        if self.cluster_m * self.cluster_n > 4 or self.cluster_m not in (1, 2, 4) or self.cluster_n not in (1, 2, 4):
            raise ValueError("cluster must be 1x1, 2x1, 1x2, 2x2, 4x1 or 1x4")
        if self.producer_regs + 2 * self.consumer_regs > 512 or self.producer_regs % 8 or self.consumer_regs % 8:
            raise ValueError("register budget: producer + 2 x consumer <= 512 per thread, multiples of 8")
        if not 1 <= self.split_k <= 16:
            raise ValueError(f"split_k must be in [1, 16], got {self.split_k}")
        if self.split_fixup and self.split_k == 1:
            raise ValueError("split_fixup is an option of split-K (split_k > 1)")
        if self.k_interleave and (self.kind != "pingpong" or self.split_k > 1 or self.tile_m != 64
                                  or self.tile_n > 64):
            raise ValueError("k_interleave is an option of the ping-pong schedule at tile_m 64, tile_n <= 64, without "
                             "split-K (warpgroup 1's partial, 64 x tile_n fp32, goes through its half of the epilogue "
                             "buffers)")
        if self.k_interleave and self.stages % 2:
            raise ValueError(f"k_interleave needs an even number of stages (each stage read by one warpgroup), got "
                             f"{self.stages}")
        if self.a_rows and (self.a_rows not in (8, 16, 32) or self.a_rows >= self.tile_m
                            or self.a_rows % (8 * self.cluster_n)):
            raise ValueError(f"a_rows must be 0 or 8, 16, 32 below tile_m and a multiple of 8 x cluster_n (each CTA "
                             f"of the cluster multicasts whole 8-row swizzle atoms), got {self.a_rows}")
        if self.wg_epilogue and (self.kind != "cooperative" or self.split_k > 1 or self.tile_m != 128):
            raise ValueError("wg_epilogue is an option of the cooperative schedule at tile_m 128 without split-K "
                             "(ping-pong warpgroups and split-K partials already store on their own; at tile_m 256 "
                             "a warpgroup's rows are not one block)")

    # --- warp roles ---------------------------------------------------------------------------
    threads = 384  # 1 producer + 2 consumer warpgroups
    consumer_wgs = 2

    @property
    def consumers_per_tile(self) -> int:
        return 2 if self.kind == "cooperative" else 1

    @property
    def a_step(self) -> int:
        """Short A boxes a stage holds (`a_rows`): the kernel's A ring is a_step times the stages of a_rows rows."""
        return self.tile_m // self.a_rows if self.a_rows else 1

    @property
    def mma_atoms(self) -> tuple[int, int, int]:
        """Warpgroups of the tiled MMA along (M, N, K)."""
        return (self.consumers_per_tile, 1, 1)

    @property
    def store_wgs(self) -> int:
        """Consumer warpgroups that store one output sub-tile together (share a named barrier)."""
        return 1 if self.kind == "pingpong" or self.wg_epilogue else 2

    @property
    def epi_tile(self) -> tuple[int, int]:
        """The output sub-tile that goes registers -> smem -> TMA store at a time."""
        return (64 * self.store_wgs, min(32, self.tile_n))

    @property
    def epi_buffers(self) -> int:
        """Output sub-tile smem buffers: `epi_stages` per group of storing warpgroups."""
        return self.epi_stages * (self.consumer_wgs // self.store_wgs)

    @property
    def cluster_size(self) -> int:
        return self.cluster_m * self.cluster_n

    # --- shared memory ------------------------------------------------------------------------
    def stage_bytes(self, ab_bytes: int) -> int:
        return (self.tile_m + self.tile_n) * self.tile_k * ab_bytes

    def epi_bytes(self, out_bytes: int) -> int:
        return self.epi_buffers * self.epi_tile[0] * self.epi_tile[1] * out_bytes

    def exchange_fits(self, out_bytes: int) -> bool:
        """`k_interleave`: warpgroup 1's fp32 partial (tile_m x tile_n) fits its half of the epilogue buffers."""
        return self.tile_m * self.tile_n * 4 <= self.epi_stages * self.epi_tile[0] * self.epi_tile[1] * out_bytes

    def exchange_error(self, out_bytes: int) -> str | None:
        """Why this `k_interleave` schedule cannot run with `out_bytes`-byte outputs (None when it can)."""
        if not self.k_interleave or self.exchange_fits(out_bytes):
            return None
        return (f"k_interleave: warpgroup 1's {self.tile_m}x{self.tile_n} fp32 partial does not fit its "
                f"{self.epi_stages} epilogue buffers of {out_bytes}-byte outputs")

    def num_stages(self, ab_bytes: int, out_bytes: int) -> int:
        if self.stages:
            return self.stages
        free = SMEM_BYTES - BARRIER_BYTES - self.epi_bytes(out_bytes)
        return self.ring_stages(free // self.stage_bytes(ab_bytes))

    def ring_stages(self, fit: int, cap: int = 8) -> int:
        """The automatic ring depth from the `fit` stages shared memory holds: at most `cap`, at least 2, even under
        `k_interleave`."""
        n = max(2, min(cap, fit))
        return n - n % 2 if self.k_interleave else n

    def smem_bytes(self, ab_bytes: int, out_bytes: int) -> int:
        return self.num_stages(ab_bytes, out_bytes) * self.stage_bytes(ab_bytes) + self.epi_bytes(out_bytes) + BARRIER_BYTES

    def fits(self, ab_bytes: int = 2, out_bytes: int = 2) -> bool:
        return self.smem_bytes(ab_bytes, out_bytes) <= SMEM_BYTES and self.num_stages(ab_bytes, out_bytes) >= 2

    # --- what can be built --------------------------------------------------------------------
    @staticmethod
    def kind_defaults(kind: str) -> dict:
        """Field defaults that follow `kind`: ping-pong's one consumer warpgroup a tile holds 128 x 128 fp32
        accumulators beside the pipeline (128 x 192 is the widest that fits; the dataclass default 256 does not)."""
        return {"tile_n": 128} if kind == "pingpong" else {}

    def build_error(self, ab_bytes: int, out_bytes: int, source: bool = False, a_k_major: bool = True,
                    gated: bool = False) -> str | None:
        """Why this schedule cannot be built for `ab_bytes`-byte operands, `out_bytes`-byte outputs, a fused
        beta * C (`source`), A's major and a gated (half-width) epilogue (None when it can): every rule beyond the
        fields' own checks."""
        if gated:
            err = self.gated_error()
            if err:
                return err
        if not self.fits(ab_bytes, out_bytes):  # the kernel's Storage is exactly smem_bytes
            return (f"{self.num_stages(ab_bytes, out_bytes)} stages + {self.epi_buffers} epilogue buffers need "
                    f"{self.smem_bytes(ab_bytes, out_bytes)} bytes of shared memory > {SMEM_BYTES}")
        if self.split_k > 1 and source:
            return "split_k > 1 does not fuse beta * C (source); use split_k=1"
        err = self.exchange_error(out_bytes)
        if err:
            return err
        if self.a_rows and (not a_k_major or self.tile_k * ab_bytes != 128):
            return (f"a_rows {self.a_rows}: A's short box needs K-major A with a 128-byte K-block "
                    f"(tile_k x {ab_bytes} bytes = {self.tile_k * ab_bytes})")
        return None

    def gated_error(self) -> str | None:
        """Why this schedule cannot run the gated epilogue (SwiGLU over interleaved gate / up column blocks, a tile
        half as wide stored), or None: the whole K in one unit (the split-K and k_interleave epilogues sum partials
        first), and a half tile the store's 32-column sub-tiles divide."""
        if self.split_k > 1 or self.k_interleave:
            return "the gated (swiglu) epilogue needs split_k=1 and no k_interleave"
        if self.tile_n % 64:
            return f"the gated (swiglu) epilogue needs tile_n a multiple of 64, got {self.tile_n}"
        return None

    def __str__(self) -> str:
        p = "p" if self.persistent else "np"
        split = (f"_k{self.split_k}" + ("f" if self.split_fixup else "")) if self.split_k > 1 else ""
        epi = f"_e{self.epi_stages}" if self.epi_stages != 4 else ""  # FP8's 6-stage variant (epi_stages 3)
        epi += "_we" if self.wg_epilogue else ""
        epi += "_ki" if self.k_interleave else ""
        epi += f"_a{self.a_rows}" if self.a_rows else ""
        return (f"{self.kind}_{self.tile_m}x{self.tile_n}x{self.tile_k}_c{self.cluster_m}x{self.cluster_n}"
                f"_s{self.stages}{epi}_r{self.raster_group}_{p}{split}")


# --- split-K ------------------------------------------------------------------------------------
def split_range(s, splits, k_tiles):
    """K-blocks [first, first + count) of split `s` of `splits` over `k_tiles` K-blocks:
    [s * k_tiles // splits, (s + 1) * k_tiles // splits). The ranges partition [0, k_tiles) exactly
    and differ in length by at most one; a range is empty only when splits > k_tiles (the op clamps
    splits to k_tiles; the kernel still writes an empty range's partial, zeros, so the summing pass
    never reads an unwritten slot). Works on Python ints and DSL integers alike; the producer and the
    consumers both call it, so they agree on every unit's K-blocks."""
    first = s * k_tiles // splits
    return first, (s + 1) * k_tiles // splits - first


def effective_splits(s: GemmSchedule, k: int) -> int:
    """The split count worth running for K = k: at most one split per K-block."""
    return max(1, min(s.split_k, -(-k // s.tile_k)))


@functools.lru_cache(maxsize=256)
def clamp_splits(s: GemmSchedule, k: int) -> GemmSchedule:
    """`s` with at most one split per K-block (K = 16 with split_k = 4 runs as one split; cached, so equal calls
    get the same object)."""
    splits = effective_splits(s, k)
    if splits == s.split_k:
        return s
    return dataclasses.replace(s, split_k=splits, split_fixup=s.split_fixup and splits > 1)


@functools.lru_cache(maxsize=256)
def unsplit(s: GemmSchedule) -> GemmSchedule:
    return dataclasses.replace(s, split_k=1, split_fixup=False)


@functools.lru_cache(maxsize=256)
def full_a_box(s: GemmSchedule) -> GemmSchedule:
    """`s` loading A's whole tile (cached: a call's schedule object keys its compiled kernel)."""
    return dataclasses.replace(s, a_rows=0)


def adapted(s: GemmSchedule, k: int, source: bool, gated: bool = False) -> GemmSchedule:
    """A schedule adapted to one call's K and epilogue: split-K clamped to the K-blocks, and run unsplit under a
    fused beta * C or a gated epilogue (the split-K epilogues read no C and sum full-width partials), without
    k_interleave under a gated one."""
    if s.split_k > 1:
        s = clamp_splits(s, k)
        if (source or gated) and s.split_k > 1:
            s = unsplit(s)
    if gated and s.k_interleave:
        s = dataclasses.replace(s, k_interleave=False)
    return s


@functools.lru_cache(maxsize=4096)
def call_schedule(m: int, n: int, k: int, ab_bytes: int, out_bytes: int, a_k_major: bool, source: bool,
                  gated: bool = False) -> GemmSchedule:
    """The schedule the GEMM op runs when the caller gives none: `default_schedule(m, n, k)`, a deep default ring
    (`deepened`) back to as many stages as fit beside wider (fp32) output buffers, `adapted` to K, C and a gated
    epilogue, and the default's short A box (`shortened`) only for K-major A. n: the accumulator's columns (twice
    the output's under a gated epilogue)."""
    s = default_schedule(m, n, k)
    if s.stages and not s.fits(ab_bytes, out_bytes):
        s = dataclasses.replace(s, stages=0)
    s = adapted(s, k, source, gated)
    if s.a_rows and not a_k_major:
        s = full_a_box(s)
    return s


# --- tile order ---------------------------------------------------------------------------------
def cluster_tile(t, clusters_m, clusters_n, group):
    """Cluster coordinates (cm, cn, l) of the `t`-th cluster tile in raster order: groups of
    `group` cluster-rows, M fastest inside a group, then N, then the next group, then the batch.
    Works on Python ints (tests, pictures) and DSL integers (the kernel) alike."""
    per_batch = clusters_m * clusters_n
    l = t // per_batch
    r = t - l * per_batch
    per_group = group * clusters_n
    g = r // per_group
    first_m = g * group
    rows = clusters_m - first_m
    rows = imin(rows, group)
    w = r - g * per_group
    return first_m + w % rows, w // rows, l


def tile_order(tiles_m: int, tiles_n: int, batch: int, s: GemmSchedule) -> list[tuple[int, int, int]]:
    """Every cluster tile in the order the scheduler hands them out (host mirror, for tests and
    pictures): a permutation of the (cluster_m, cluster_n, l) grid."""
    cm, cn = -(-tiles_m // s.cluster_m), -(-tiles_n // s.cluster_n)
    return [cluster_tile(t, cm, cn, s.raster_group) for t in range(cm * cn * batch)]


def cluster_slots(s: GemmSchedule, num_sms: int) -> int:
    """Clusters of `s` that run at once on `num_sms` SMs (one CTA per SM): sms / cluster size for
    pairs, fewer for 4-CTA clusters, which must sit in one GPC (132 SMs: 32, not 33;
    `schedules.hardware._gpc_bound_clusters`; the op also asks the occupancy API)."""
    return _gpc_bound_clusters(num_sms, s.cluster_size)


def grid(tiles_m: int, tiles_n: int, batch: int, s: GemmSchedule, num_sms: int) -> tuple[int, int, int]:
    """Launch grid (cluster_m, cluster_n, clusters): all cluster tiles, or for a persistent
    schedule at most the clusters that fit at once (`cluster_slots`)."""
    cm, cn = -(-tiles_m // s.cluster_m), -(-tiles_n // s.cluster_n)
    total = max(1, cm * cn * batch * s.split_k)
    if s.persistent:
        total = min(total, cluster_slots(s, num_sms))
    return (s.cluster_m, s.cluster_n, total)


def launch_clusters(tiles_m: int, tiles_n: int, batch: int, s: GemmSchedule, num_sms: int,
                    device: int | None = None) -> int:
    """The clusters an op launches: `grid`'s count, and for a persistent schedule of clusters larger
    than pairs no more than the occupancy API reports co-resident on `device`
    (`schedules.hardware.max_active_clusters`, cached; 32 of 4 on an H200): a surplus cluster would
    run its whole share after the others finished. Every GEMM op (bf16, FP8, grouped) asks here."""
    clusters = grid(tiles_m, tiles_n, batch, s, num_sms)[2]
    if s.persistent and s.cluster_size > 2:
        from schedules.hardware import max_active_clusters

        clusters = min(clusters, max_active_clusters(s.cluster_size, device))
    return clusters


def masked_tile_order(masked_m: list[int], tiles_m: int, tiles_n: int, s: GemmSchedule) -> list[tuple[int, int, int]]:
    """Host mirror of the masked walk (tests, pictures): every valid cluster tile (cm, cn, expert)
    in the order the scheduler hands them out."""
    cm, cn = -(-tiles_m // s.cluster_m), -(-tiles_n // s.cluster_n)
    out = []
    for e, rows in enumerate(masked_m):
        r = min(-(-max(rows, 0) // s.tile_m), tiles_m)
        r = min(-(-r // s.cluster_m), cm)
        out += [(*cluster_tile(t, r, cn, s.raster_group)[:2], e) for t in range(r * cn)]
    return out


# --- the choice -------------------------------------------------------------------------------
# Relative tensor-core efficiency of a CTA tile (bigger tiles reuse each smem byte more and hide
# the epilogue better); measured ordering on the H200, coarse on purpose. Ping-pong 64x128 0.7 -> 0.8:
# at 128x7168x2048 (112 tiles either way) it ran 289.6 TFLOP/s against cooperative 128x64's 275.7;
# it now wins single-wave small-M grids.
#
# Ping-pong 128x192 (QuACK's tile: 192 fp32 accumulators a thread) 0.98: timed beside the defaults in five H200 suites,
# it beat them at 8192^3 every time (709 / 734 / 714 / 738 / 737 TFLOP/s against 692 / 713 / 695 / 714 / 717 for
# cooperative 128x256: +2.6-3.4 %) and at 16384x8192x1024 (725-751 against ping-pong 128x128's 705-739), tied at
# 4096x24576x1536 and 4096x14336x4096, won 1.1 % over cooperative 128x192 at 4096x2112x7168, and lost 7-32 % where its
# extra tile columns add a wave (4096^3, 2048^3, 4096x4096x14336, 4096x7168x16384: 5.3 / 1.3 / 5.3 / 9.2 waves against
# 3.9 / 1.0 / 3.9 / 6.8). Fitted per shape from those runs, the efficiency that matches each ratio lies at 0.95-1.0;
# 0.98 makes the model pick it where it won (8192^3, 16384x8192x1024, 4096x2112x7168, 4096x24576x1536) and nowhere it
# lost.
_TILE_EFF = {("cooperative", 128, 256): 1.0, ("pingpong", 128, 192): 0.98, ("cooperative", 256, 128): 0.98,
             ("cooperative", 128, 192): 0.96,
             ("pingpong", 128, 128): 0.93, ("cooperative", 128, 128): 0.9, ("cooperative", 128, 64): 0.75,
             ("pingpong", 64, 128): 0.8, ("pingpong", 64, 256): 0.8, ("pingpong", 64, 64): 0.55}


# The cooperative schedule's epilogue, in K elements of mainloop time per tile: both consumer warpgroups drain and store
# while the tensor cores idle (ping-pong hides it under the other warpgroup's mainloop). ~2 K-blocks of 64
# (docs/kernels/gemm.md: 1.5-3 k clk against 1 k per K-block at 128x256). Fitted to a full H200 suite, where ping-pong
# beat cooperative 128x256 by 6.6 % at 16384x8192x1024 (742 vs 696 TFLOP/s) and 6.3 % at 4096x24576x1536 (761 vs 716),
# the short-K shapes; the other shapes keep their choice.
_COOP_EPILOGUE_K = 128


def estimate(s: GemmSchedule, m: int, n: int, k: int, batch: int = 1, num_sms: int = 132,
             coop_epilogue_k: int = _COOP_EPILOGUE_K) -> float:
    """Model time (arbitrary units) of schedule `s` on (m, n, k): waves of work units (tiles, or
    tiles x splits) over the SMs times the work of one unit divided by the tile's efficiency, plus
    the cooperative schedule's exposed epilogue per tile (`_COOP_EPILOGUE_K`). It captures wave
    quantization (the last, partial wave of tiles), the cost of small tiles and, at short K, of the
    epilogue, which is what the choice between tile shapes and kinds hinges on. Split-K's costs are
    added by `estimate_streaming`, which the choice of split count uses. The FP8 model passes
    `coop_epilogue_k=0` (its choices were measured without the term)."""
    tiles = -(-m // s.tile_m) * -(-n // s.tile_n) * batch
    splits = effective_splits(s, k)
    slots = cluster_slots(s, num_sms) * s.cluster_size
    waves = -(-(tiles * splits) // slots)
    eff = _TILE_EFF.get((s.kind, s.tile_m, s.tile_n), 0.5)
    epi = coop_epilogue_k if s.kind == "cooperative" else 0
    return waves * s.tile_m * s.tile_n * (k / splits + epi) / eff


# The memory side of the model, in `estimate`'s units (an SM's bf16 MACs at efficiency 1). Small-M
# shapes are bound by streaming B, and one CTA's load pipeline pulls only so many bytes per second:
# 64x4096x4096 with 64 CTAs of 64x64 streams (64 + 64) x 4096 x 2 bytes per CTA in 16.4 us and
# 128x7168x2048 (112 CTAs of 64x128) 192 x 2048 x 2 in 13.4 us, both ~64 GB/s per CTA. Split-K buys
# more CTAs (shorter K per unit) with fp32 workspace traffic and a second launch.
_SM_MACS = 989.4e12 / 2 / 132  # bf16 MACs per second per SM (spec)
_HBM_BW = 4.0e12  # bytes per second the chip streams (H200 copy ~4.2 TB/s)
_CTA_BW = 64e9  # bytes per second one CTA's TMA pipeline sustains (measured above)
# The summing pass: its launch, the host work of a second kernel and the tail. Fitted to the H200: at 64x4096x4096 the
# 64x64 ping-pong split in 2 ran 18.7 / 19.5 us (two suites) where this model without the term gives 9.3 (8.2 streaming
# + 1.05 workspace), and unsplit 17.2-17.3 (model 16.4): at 2 us the model split that shape (0.79 / 0.75x cuBLAS;
# unsplit 0.85x).
_SPLIT_LAUNCH_S = 10e-6


def estimate_streaming(s: GemmSchedule, m: int, n: int, k: int, batch: int = 1, num_sms: int = 132) -> float:
    """`estimate` bounded below by the operand streaming: each wave takes at least the time one CTA
    needs to load its unit's A and B K-blocks ((tile_m + tile_n) x K / S x 2 bytes at `_CTA_BW`), the
    whole GEMM at least (M K + K N + M N) x 2 bytes at `_HBM_BW`; split-K adds its workspace
    traffic (the GEMM writes and the summing pass reads 2 x S x M x N x 4 bytes) and the second
    launch. Used to decide the split count for grids too small to fill the SMs."""
    tiles = -(-m // s.tile_m) * -(-n // s.tile_n) * batch
    splits = effective_splits(s, k)
    slots = cluster_slots(s, num_sms) * s.cluster_size
    waves = -(-(tiles * splits) // slots)
    load = waves * (s.tile_m + s.tile_n) * (k / splits) * 2 / _CTA_BW
    chip = (m * k + k * n + m * n) * 2 * batch / _HBM_BW
    t = max(estimate(s, m, n, k, batch, num_sms), max(load, chip) * _SM_MACS)
    if splits > 1:  # `split_fixup`: no summing pass to launch (the last split of a tile sums)
        t += (2 * splits * m * n * 4 * batch / _HBM_BW + (0.0 if s.split_fixup else _SPLIT_LAUNCH_S)) * _SM_MACS
    return t


def best_split(s: GemmSchedule, m: int, n: int, k: int, batch: int = 1, num_sms: int = 132,
               max_split: int = 8) -> GemmSchedule:
    """`s` with the split count (1..max_split, at most one per K-block) of least `estimate_streaming`;
    a split must win by 10% (the model's margin) to be taken. Only grids that leave SMs idle are
    split: a full wave of tiles gains nothing from more, shorter units."""
    tiles = -(-m // s.tile_m) * -(-n // s.tile_n) * batch
    if tiles * s.cluster_size >= num_sms or s.split_k != 1:
        return s
    best, t_best = s, estimate_streaming(s, m, n, k, batch, num_sms)
    for split in range(2, max_split + 1):
        c = dataclasses.replace(s, split_k=split)
        if effective_splits(c, k) < split:
            break
        t = estimate_streaming(c, m, n, k, batch, num_sms)
        if t < 0.9 * t_best:
            best, t_best = c, t
    return best


# `k_interleave` as the default on small-M grids (both ping-pong warpgroups on each tile), per GEMM family. H200: FP8 at
# M <= 128 1.100x the default (geomean of the 7 shapes whose grid gives a CTA at most one tile, 1.04-1.16x each,
# tests/gemm/test_k_interleave_gpu.py passing); bf16 at 64x4096x4096 0.930x (its partial exchange costs more than the
# second warpgroup brings at 64 K-blocks of 64).
K_INTERLEAVE_DEFAULT = {"bf16": False, "fp8": True}


def a_box_for(m: int, cluster_n: int) -> int:
    """The smallest `GemmSchedule.a_rows` that holds M = m rows on clusters `cluster_n` wide (each CTA multicasts
    whole 8-row atoms), or 0 (the whole tile) past 32 rows."""
    return next((r for r in (8, 16, 32) if r >= m and r % (8 * cluster_n) == 0), 0)


# Decode-sized M: A's TMA box cut to the M rows (`GemmSchedule.a_rows`). H200, bf16, against the full 64-row box of the
# same schedule: 32x4096x4096 56.7 -> 71.5 TFLOP/s, at 64x32 with the deep ring 73.9 (cuBLAS 63.7); 16x4096x4096 27.4 ->
# 36.8, 64x32 37.9 (cuBLAS 31.8); 8x7168x2048 13.6 -> 17.8 (cuBLAS 17.5; 64x32 would take two waves there: 15.2). With
# the box inside M the narrowed tile wins again below NARROW_MIN_M rows (`narrowed` takes a short-box schedule at any
# M).
# FP8 (A's and its 1x128 scales' boxes), H200, on the schedule the search chose (narrowed, k-interleaved) against its
# whole box: 1x7168x2048 2.2 -> 3.0 TFLOP/s, 1x4096x7168 2.1 -> 4.0, 16x7168x2048 41.6 -> 48.3, 16x4096x7168 36.6 ->
# 64.8, 32x7168x2048 86.6 -> 96.6, 32x4096x7168 91.0 -> 128.8 (geomean 1.417x; torch._scaled_mm blockwise 37.9 / 48.3 /
# 75.5 / 73.8 where it runs, refusing M = 1). The bf16 GEMM's short box was measured without `k_interleave` (not its
# default at these M).
SHORT_BOX_WITH_K_INTERLEAVE = {"bf16": False, "fp8": True}


def shortened(s: GemmSchedule, m: int, family: str = "bf16") -> GemmSchedule:
    """`s` with A's box cut to the smallest `a_rows` holding m rows (`a_box_for`), for an unsplit 64-row ping-pong
    tile (with `k_interleave` where SHORT_BOX_WITH_K_INTERLEAVE[family]: the measured ones); else `s`. The bf16 op
    drops it again for an M-major A."""
    if (s.kind != "pingpong" or s.tile_m != 64 or s.split_k > 1 or s.a_rows
            or s.k_interleave and not SHORT_BOX_WITH_K_INTERLEAVE[family]):
        return s
    box = a_box_for(m, s.cluster_n)
    return dataclasses.replace(s, a_rows=box) if box else s


def on_one_wave(s: GemmSchedule, m: int, n: int, num_sms: int = 132, batch: int = 1) -> bool:
    """Whether the grid of `s` on (m, n) gives no CTA more than one tile."""
    return -(-m // s.tile_m) * -(-n // s.tile_n) * batch <= cluster_slots(s, num_sms) * s.cluster_size


def interleaved(s: GemmSchedule, m: int, n: int, num_sms: int = 132, batch: int = 1,
                family: str = "bf16") -> GemmSchedule:
    """`s` with `k_interleave` where K_INTERLEAVE_DEFAULT[family] is on and it applies: an unsplit ping-pong
    64 x <= 64 tile whose grid gives no CTA more than one tile (there the second warpgroup has nothing else to do)."""
    if (not K_INTERLEAVE_DEFAULT[family] or s.kind != "pingpong" or s.tile_m != 64 or s.tile_n > 64
            or s.split_k > 1 or s.k_interleave or s.a_rows or not on_one_wave(s, m, n, num_sms, batch)):
        return s
    return dataclasses.replace(s, k_interleave=True, stages=s.stages - s.stages % 2)  # (an even ring: one stage less)


# Small grids: a 64x64 ping-pong tile whose grid leaves most SMs idle is narrowed (64 -> 32 (-> 16) columns) while the
# narrower grid still fits in one wave: more CTAs stream the weights, each reloading its (small) A block.
# - FP8, H200: 64x2112x7168, 33 tiles at 64x64 110 TFLOP/s, 64x32 124, 64x16 130; 64x4096x7168 212 -> 232 at 64x32;
#   128x2112x7168 213 -> 237 at 64x32. Where 64x64 / 64x128 already fill the SMs the narrow tiles lost (0.53-0.77x
#   geomean).
# - bf16, H200: 64x4096x4096, 64 tiles at 64x64 with the 12-stage ring 128.1 TFLOP/s; 64x32 (128 tiles) with the
#   automatic 8 stages 131.3, with its deepest ring (16) 138.7 (1.083x; cuBLAS 142.6). 64x16 was not measured for bf16.
#   At M = 32 the 64x64 tile with its 12-stage ring ran 1.093x the narrowed one: with fewer than half the tile's rows
#   real, each narrowed CTA's A box is mostly out of bounds and twice as many CTAs load it. So bf16 narrows only from
#   NARROW_MIN_M rows (the FP8 suites never measured M < 64), or where A's box is already cut to the M rows
#   (`shortened`: 64x32 1.03x the 64x64 short box).
NARROW_TILE_N = {"bf16": (32,), "fp8": (32, 16)}
NARROW_MIN_M = {"bf16": 33, "fp8": 1}


def narrowed(s: GemmSchedule, m: int, n: int, num_sms: int = 132, batch: int = 1, family: str = "bf16",
             make=None) -> GemmSchedule:
    """`s` (an unsplit 64x64 ping-pong tile, at least NARROW_MIN_M[family] rows) with the narrowest
    NARROW_TILE_N[family] columns whose grid still gives no CTA more than one tile (`on_one_wave`, as `deepened`
    and `interleaved` count it); else `s`. `make(s, tile_n)` builds the narrowed schedule (default: `s` with that
    width and the automatic depth)."""
    if (s.kind != "pingpong" or s.tile_m != 64 or s.tile_n != 64 or s.split_k > 1
            or m < NARROW_MIN_M[family] and not s.a_rows):
        return s
    make = make or (lambda s, tn: dataclasses.replace(s, tile_n=tn, stages=0))
    for tn in NARROW_TILE_N[family]:
        t = make(s, tn)
        if not on_one_wave(t, m, n, num_sms, batch):
            break
        s = t
    return s


# A/B rings deeper than `GemmSchedule.num_stages`' 8 where a 64-row tile's grid gives a CTA one tile: the catalogue
# takes up to 16. H200: bf16 64x4096x4096, 64x64 ping-pong, 12 stages 130.1 TFLOP/s against 8 stages 122.7 (1.06x; PC
# sampling there: 61 % of the samples waiting on the full barrier, too few bytes in flight on 64 of 132 SMs).
# `out_bytes` 2: the op falls back to the automatic depth where a wider output's buffers leave no room
# (`cute_kernels.gemm.ops._gemm_cuda`).
DEEP_RING_STAGES = 16


def deepened(s: GemmSchedule, m: int, n: int, num_sms: int = 132, batch: int = 1) -> GemmSchedule:
    """`s` with the deepest A/B ring (up to DEEP_RING_STAGES) that fits beside bf16 output buffers, for an unsplit
    64-row tile on a grid of one tile a CTA that the automatic depth caps at 8; else `s`."""
    if s.stages or s.split_k > 1 or s.tile_m != 64 or not on_one_wave(s, m, n, num_sms, batch):
        return s
    return deepest_ring(s, s.num_stages(2, 2), lambda c: c.fits(2, 2))


def deepest_ring(s: GemmSchedule, stages: int, fits) -> GemmSchedule:
    """`s` with the most A/B stages past `stages` (up to DEEP_RING_STAGES) for which `fits(schedule)` holds (the
    bf16 GEMM's `GemmSchedule.fits`, the FP8 GEMM's shared-memory count: `schedules.fp8_gemm.deep_fp8`); `s` itself
    where none does."""
    step = 2 if s.k_interleave else 1  # (an even ring under k_interleave)
    first = stages + 1 + (stages + 1) % step
    deep = [c for c in (dataclasses.replace(s, stages=st) for st in range(first, DEEP_RING_STAGES + 1, step))
            if fits(c)]
    return deep[-1] if deep else s


@functools.lru_cache(maxsize=4096)
def default_schedule(m: int, n: int, k: int, kind: str | None = None, num_sms: int = 132) -> GemmSchedule:
    """A good schedule for an (m, n, k) problem without measuring (`cute-kernels schedules gemm`
    measures): the tile with the least modelled time (`estimate`), clustered 2x1 when the tile grid
    allows it (B tiles multicast to two CTAs), else 1x2, else unclustered. Cached: the op calls it
    on every launch, and uncached its ~100 us of Python would show in small GEMMs."""
    best = None
    for (knd, tm, tn) in _TILE_EFF:
        if kind and knd != kind:
            continue
        for cm, cn in ((2, 1), (1, 2), (1, 1)):
            if cm > 1 and -(-m // tm) < 2 or cn > 1 and -(-n // tn) < 2:
                continue
            s = GemmSchedule(kind=knd, tile_m=tm, tile_n=tn, cluster_m=cm, cluster_n=cn)
            t = estimate(s, m, n, k, 1, num_sms)
            if best is None or t < best[0] * 0.999:
                best = (t, s)
            break  # the first cluster shape that fits is the preferred one
    # split-K when the grid leaves SMs idle; else, on such grids, A's box cut to M rows (`shortened`, M <= 32),
    # narrower tiles (`narrowed`), a deeper ring (`deepened`) and both warpgroups on each tile where that is
    # switched on (`interleaved`)
    s = narrowed(shortened(best_split(best[1], m, n, k, 1, num_sms), m), m, n, num_sms)
    return interleaved(deepened(s, m, n, num_sms), m, n, num_sms)


def pipeline_variants(d: GemmSchedule, m: int, n: int) -> dict[str, GemmSchedule]:
    """The pipeline options of schedule `d` worth timing beside it on (m, n) (docs/kernels/gemm.md,
    "How it got here": the pipeline options table), by bench column name; each computes every output element with the
    same WGMMAs in the same K order as `d` (bitwise equal results):

    * "c2x2": 2x2 clusters (A and B both multicast: 24 KiB of L2 reads per CTA and K-block at
      128x256 instead of 32), when `d` is 2x1 and both tile counts are even; 32 clusters of 4 run
      at once on 132 SMs (128 CTAs), the same 16 rounds of 128x256 tiles at 8192^3 as 132 CTAs;
    * "wg_epilogue": cooperative, each consumer warpgroup stores its own rows
      (`GemmSchedule.wg_epilogue`), and "c2x2 wg_epilogue" both;
    * "5 stages": 2 epilogue buffers instead of 4 where that frees a whole A/B stage (cooperative
      128x192: 5 stages instead of 4; CUTLASS and QuACK keep 2 output buffers).
    Only for unsplit schedules."""
    if d.split_k > 1:
        return {}
    out = {}
    tm, tn = -(-m // d.tile_m), -(-n // d.tile_n)
    if (d.cluster_m, d.cluster_n) == (2, 1) and tm % 2 == 0 and tn % 2 == 0:
        out["c2x2"] = dataclasses.replace(d, cluster_n=2)
    if d.kind == "cooperative" and d.tile_m == 128:
        out["wg_epilogue"] = dataclasses.replace(d, wg_epilogue=True)
        if "c2x2" in out:
            out["c2x2 wg_epilogue"] = dataclasses.replace(d, cluster_n=2, wg_epilogue=True)
    deep = dataclasses.replace(d, epi_stages=2)
    if not d.stages and deep.num_stages(2, 2) > d.num_stages(2, 2):
        out[f"{deep.num_stages(2, 2)} stages"] = deep
    return out


def candidates(m: int, n: int, k: int, limit: int = 32) -> list[GemmSchedule]:
    """Schedules worth timing for (m, n, k), pruned by simple rules: the tile must fit the problem
    (no tile more than twice the padded problem), smem must hold >= 3 stages, and the grid should
    have at least a wave of tiles for large-tile configs."""
    out = []
    tiles = [(128, 256), (256, 128), (128, 128), (128, 192), (64, 256), (64, 128), (128, 64), (64, 64)]
    for kind in KINDS:
        for tm, tn in tiles:
            for cm, cn in ((2, 1), (1, 2), (1, 1)):
                try:
                    s = GemmSchedule(kind=kind, tile_m=tm, tile_n=tn, cluster_m=cm, cluster_n=cn)
                except ValueError:
                    continue
                if not s.fits() or s.num_stages(2, 2) < 3:
                    continue
                if tm > 2 * max(m, 64) or tn > 2 * max(n, 64):
                    continue
                if -(-m // tm) % cm or -(-n // tn) % cn:
                    continue  # cluster does not divide the tile grid: idle CTAs (a 2x1 cluster on one tile
                    # row ran a whole second CTA on zero-filled A, in the split-K columns)
                out.append(s)
    d = default_schedule(m, n, k)
    # Split-K variants (2, 3, 4 splits) of the schedules whose grid leaves SMs idle, best modelled
    # first, and their one-launch twins; together at most a quarter of the list.
    splits = [dataclasses.replace(c, split_k=sp) for c in out for sp in (2, 3, 4)
              if -(-m // c.tile_m) * -(-n // c.tile_n) * c.cluster_size < 132
              and effective_splits(dataclasses.replace(c, split_k=sp), k) == sp]
    splits.sort(key=lambda c: estimate_streaming(c, m, n, k))
    splits = [c for c in splits if c != d][:limit // 8]
    # each with its one-launch twin (`split_fixup`: the last split of a tile sums, no summing pass)
    splits = [v for c in splits for v in (c, dataclasses.replace(c, split_fixup=True))]
    base = dataclasses.replace(d, split_k=1)  # the default's tile unsplit, to compare against
    out.sort(key=lambda s: (s not in (d, base), s != d, -(s.tile_m * s.tile_n), s.kind != "cooperative"))
    if d not in out:
        out.insert(0, d)
    extra = [v for v in pipeline_variants(d, m, n).values() if v not in out]  # right after the default
    out = out[:1] + extra + out[1:]
    return out[:limit - len(splits)] + splits
