"""Schedules of the FP8 block-scaled GEMM (curriculum lesson 13): the Hopper GEMM's schedules
(`schedules.gemm.GemmSchedule`) restricted to what two-level accumulation allows.

* tile_k = 128: one pipeline stage is one scale block along K (A scales are 1x128, B scales
  128x128), so the promotion happens once per stage.
* two fp32 accumulators per thread (the running sum and the block's temporary): a consumer
  warpgroup's rows x tile_n / 128 values each, at most `MAX_PROMOTED_ACC` together with the
  temporary so nothing spills (cooperative 128x128: 64 + 64; 128x256 would need 256 registers).
* tile_n divides 128 or is a multiple of 128, so a tile column's B-scale block is known when the
  kernel is traced; or, as explicit schedules only, a cooperative 128-row tile of `WIDE_TILE_N`
  columns (160, 192: 2 x 80 / 2 x 96 registers per thread, `MAX_WIDE_ACC`) whose tiles start
  inside a scale block and span two: each 8-column group picks its block's scale from the tile's
  runtime offset (`collectives.block_scales.element_slots`).
* each stage also holds the tile's A scales (tile_m fp32, one TMA box), so the stage count is
  recomputed here with those bytes included.

Grouped (MoE) walks (`schedules.walks.TileWalk.tile`): "contiguous" needs the cooperative kind
(padding tiles are skipped, which the ping-pong turn order cannot absorb) and cluster_m = 1 (two
M tiles of a cluster may belong to different experts, so they cannot share B by multicast; A is
shared along N instead); "masked" runs every schedule (its walk never skips a tile).
"""

from __future__ import annotations

import functools

from schedules.gemm import BARRIER_BYTES, GROUPINGS, SMEM_BYTES, GemmSchedule, estimate

SCALE_BLOCK = 128  # K (and B's N) elements per scale
MAX_PROMOTED_ACC = 128  # fp32 registers per thread for accumulator + temporary
M_ALIGN = 128  # contiguous grouping: each expert's rows start at a multiple of this (DeepGEMM's)
# Tiles `default_fp8_schedule` searches at every M, then the wide tiles it adds at M >= WIDE_MIN_M. The wide search
# ("ours wide search" in cute_kernels/fp8_gemm/bench.py: 128x192 or 128x160 at five of the six M = 4096 shapes) beat the
# 128x128 search by 1.048x geomean on the H200 (4096x7168x16384 1094 -> 1177 TFLOP/s, 4096x2112x7168 952 -> 1041,
# 4096x4096x7168 unchanged); below M = 1024 it was never measured, so small-M decode shapes keep the 64/128-column
# tiles.
DEFAULT_FP8_TILES = (("cooperative", 128, 128), ("pingpong", 64, 128), ("cooperative", 128, 64),
                     ("pingpong", 64, 64))
WIDE_TILE_N = (192, 160)
WIDE_FP8_TILES = tuple(("cooperative", 128, n) for n in WIDE_TILE_N)
FP8_TILES = DEFAULT_FP8_TILES + WIDE_FP8_TILES
WIDE_MIN_M = 1024
MAX_WIDE_ACC = 192  # fp32 registers per thread for accumulator + temporary on a wide tile (2 x 96 at 192)
_FP8_EFF = {("cooperative", 128, 128): 1.0, ("pingpong", 64, 128): 0.8, ("cooperative", 128, 64): 0.75,
            ("pingpong", 64, 64): 0.55,
            # first guesses (1.5x the columns per barrier / epilogue of 128x128), not re-fitted: the search
            # they steer measured 1.048x over the 128x128 one at M = 4096 (see WIDE_MIN_M)
            ("cooperative", 128, 192): 1.04, ("cooperative", 128, 160): 1.0}


def acc_per_thread(s: GemmSchedule) -> int:
    return s.tile_m // s.consumers_per_tile * s.tile_n // 128


# The SwiGLU + 1x128 quantization epilogue (`Gemm(glu_quant=True)`, `collectives.epilogue.glu_quant_store`): a 1x2
# cluster's CTAs compute the gate and the up tile (128 x 128) of the same rows and swap halves through shared memory;
# or ("local") one CTA computes both as a 128 x 256 tile (a gate and an up column block), nothing swapped.
GQ_TILE, GQ_THREADS = 128, 256  # the output tile (rows, and columns: one scale block) and the two consumer warpgroups
GQ_XCH_WORDS = 16  # bf16x2 words a thread sends: half of its 64 accumulator registers, paired


# what the pair swaps: half the accumulator and then row amax halves, or all of it; "local": no pair (one CTA holds
# gate and up: 128 + 128 accumulator registers a thread, so its mainloop promotes in column halves, `promote_halves`)
GLU_EXCHANGES = ("halves", "full", "local")


def glu_quant_bytes(exchange: str = "halves") -> tuple[int, int]:
    """(offset of the row-amax slots, total bytes) of the exchange region, which takes the epilogue buffers' place:
    the peer's words [word / 4][thread][word % 4], then ("halves") GQ_TILE fp32 amax halves; "full": twice the
    words, no amax slots; "local": none."""
    if exchange == "local":
        return 0, 0
    if exchange == "full":
        xch = 2 * GQ_XCH_WORDS * GQ_THREADS * 4
        return xch, xch
    xch = GQ_XCH_WORDS * GQ_THREADS * 4
    return xch, xch + GQ_TILE * 4


def glu_quant_error(s: GemmSchedule, blockwise: bool = True, grouping: str = "none", gated: bool = False,
                    promote_halves: bool = False, exchange: str = "halves") -> str | None:
    """Why schedule `s` cannot run the FP8 SwiGLU + 1x128 quantization epilogue (None when it can): the FP8 mode, no
    grouping or the contiguous one, one split; cooperative 128 x 128 tiles in 1x2 clusters (the pair: gate and up)
    with the exchange region within the epilogue buffers' bytes, or ("local") cooperative 128 x 256 tiles in 1x1
    clusters promoting in column halves."""
    if not blockwise or grouping not in ("none", "contiguous") or gated:
        return ("glu_quant is an epilogue of the FP8 block-scaled GEMM, dense or grouped contiguous, without another "
                "gated epilogue")
    if exchange not in GLU_EXCHANGES:
        return f"glu_exchange must be one of {GLU_EXCHANGES}, got {exchange!r}"
    if s.split_k > 1 or s.k_interleave or s.wg_epilogue:
        return "glu_quant needs split_k=1, no k_interleave and no wg_epilogue"
    if exchange == "local":
        if (s.kind, s.tile_m, s.tile_n, s.cluster_m, s.cluster_n) != ("cooperative", GQ_TILE, 2 * GQ_TILE, 1, 1):
            return (f"glu_exchange='local' needs cooperative {GQ_TILE}x{2 * GQ_TILE} tiles (a gate and an up column "
                    f"block a CTA) in 1x1 clusters, got {s.kind} {s.tile_m}x{s.tile_n} in {s.cluster_m}x{s.cluster_n}")
        if not promote_halves:
            return ("glu_exchange='local' needs promote_halves=True (128 accumulator registers a thread leave room "
                    "for a half-width temporary only)")
        return None
    if promote_halves:
        return "promote_halves is for glu_exchange='local' (the pair's 128 x 128 tiles promote whole K-blocks)"
    if (s.kind, s.tile_m, s.tile_n, s.cluster_m, s.cluster_n) != ("cooperative", GQ_TILE, GQ_TILE, 1, 2):
        return (f"glu_quant needs cooperative {GQ_TILE}x{GQ_TILE} tiles in 1x2 clusters (a gate and an up tile a "
                f"cluster), got {s.kind} {s.tile_m}x{s.tile_n} in {s.cluster_m}x{s.cluster_n}")
    need = glu_quant_bytes(exchange)[1]
    if s.epi_bytes(2) < need:
        return (f"glu_quant's {exchange} exchange region ({need} bytes) takes the epilogue buffers' place: "
                f"{s.epi_stages} buffers give {s.epi_bytes(2)} (epi_stages={3 if exchange == 'halves' else 4} gives "
                f"enough)")
    return None


# cooperative 128 x 256: acc 128 + one half-width temporary 64 a thread, with `promote_halves` only, its halves promoted
# one after the other (`mma_k_tiles_promoted_halves(sequential=True)`; two temporaries would need 256 registers: the
# overlapped halves spilled 216 B there)
HALVES_TILE_N = 256


def promoted_error(s: GemmSchedule) -> str | None:
    """Why schedule `s` cannot run the promoted FP8 mainloop (None when it can). The 128 x `HALVES_TILE_N` tile passes
    here and needs `promote_halves` besides (`halves_only_error`)."""
    if s.tile_k != SCALE_BLOCK:
        return f"tile_k must be {SCALE_BLOCK} (one scale block per stage), got {s.tile_k}"
    if s.tile_n == HALVES_TILE_N:
        if (s.kind, s.tile_m) != ("cooperative", 128) or s.split_k > 1 or s.k_interleave:
            return (f"tile_n {HALVES_TILE_N} is built for the cooperative 128-row tile (one warpgroup's 64 rows x "
                    f"{HALVES_TILE_N}: 128 + 64 registers with promote_halves), one split, got {s.kind} "
                    f"{s.tile_m}x{s.tile_n}")
        return None
    if s.tile_n in WIDE_TILE_N:
        if (s.kind, s.tile_m) not in (("cooperative", 128), ("pingpong", 64)):
            return (f"tile_n {s.tile_n} (a tile spanning two B-scale blocks) is built for the cooperative "
                    f"128-row tile and the ping-pong 64-row tile (one warpgroup's 64 rows either way), got "
                    f"{s.kind} {s.tile_m}x{s.tile_n}")
        if 2 * acc_per_thread(s) > MAX_WIDE_ACC:
            return f"{s.kind} {s.tile_m}x{s.tile_n}: 2 x {acc_per_thread(s)} fp32 accumulators > {MAX_WIDE_ACC}"
        return None
    if not (SCALE_BLOCK % s.tile_n == 0 or s.tile_n % SCALE_BLOCK == 0):
        return (f"tile_n must divide {SCALE_BLOCK}, be a multiple of it, or be one of {WIDE_TILE_N} "
                f"(cooperative 128-row tiles), got {s.tile_n}")
    if 2 * acc_per_thread(s) > MAX_PROMOTED_ACC:
        return (f"{s.kind} {s.tile_m}x{s.tile_n}: 2 x {acc_per_thread(s)} fp32 accumulators per thread "
                f"(sum + block temporary) > {MAX_PROMOTED_ACC}; use 128x128 cooperative or 64x128 ping-pong")
    return None


MAX_OVERLAP_ACC = 192  # fp32 registers per thread for accumulator + two temporaries (promote_overlap)


def overlap_error(s: GemmSchedule) -> str | None:
    """Why schedule `s` cannot run the overlapped promotion (`promote_overlap=True`: K-block k-1
    promoted while K-block k's WGMMAs run, two temporaries), None when it can."""
    err = promoted_error(s)
    if err:
        return err
    if s.k_interleave:
        return "promote_overlap=True: k_interleave schedules run the plain promotion (each warpgroup every other K-block)"
    if s.tile_n in WIDE_TILE_N:
        return (f"promote_overlap=True cannot be combined with tile_n={s.tile_n} ({s.kind} {s.tile_m}x{s.tile_n}): "
                f"sum + two block temporaries = 3 x {acc_per_thread(s)} fp32 registers per thread > "
                f"{MAX_OVERLAP_ACC}; use tile_n=128 with promote_overlap, or promote_overlap=False")
    if 3 * acc_per_thread(s) > MAX_OVERLAP_ACC:
        return (f"promote_overlap: {s.kind} {s.tile_m}x{s.tile_n} needs 3 x {acc_per_thread(s)} fp32 accumulators "
                f"per thread (sum + two block temporaries) > {MAX_OVERLAP_ACC}; use 64 x 128 per warpgroup or less")
    return None


SB_SMEM_MAX_K = 512 * SCALE_BLOCK  # `sb_smem`: the smem row holds 512 K-blocks (block_scales.SB_SMEM_MAX_KB)


def sb_smem_bytes(s: GemmSchedule) -> int:
    """Shared memory of the `sb_smem` B-scale row: 512 K-blocks x the tile's 1 or 2 scale blocks."""
    blocks = 2 if s.tile_n > SCALE_BLOCK or s.tile_n in WIDE_TILE_N else 1
    return blocks * (SB_SMEM_MAX_K // SCALE_BLOCK) * 4


# `sb_smem` by default from this M on (where it was measured): H200, the six issue shapes at M = 4096, 1.154x geomean
# over the same schedule without it, every shape faster (0.81-0.92x time; 4096x7168x16384 898 -> 1101 TFLOP/s). ncu
# without it (same shape): tensor pipe 65.6 % active against cuBLAS's 84 %, barrier stalls 30 %.
SB_SMEM_MIN_M = 1024


def use_sb_smem(s: GemmSchedule, m: int) -> bool:
    """Whether the op stages B scales in smem (`sb_smem`) by default for schedule `s` at M = m."""
    return m >= SB_SMEM_MIN_M and sb_smem_error(s) is None


# Small M (decode): a CTA has a single tile, so the ping-pong's second warpgroup idles and each K-block's chain (B-scale
# load, WGMMAs, wait, promotion) is the time. `promote_overlap` (K-block k-1 promoted under k's WGMMAs) with `sb_ahead`
# (B scales loaded a K-block early) measured 1.091x geomean over the 12 M = 64 / 128 issue shapes on the H200
# (64x2112x7168 92.6 -> 110.1 TFLOP/s, 128x7168x16384 570 -> 695); only K = 512 (4 K-blocks) lost (0.95x), so K >=
# SMALL_M_OVERLAP_MIN_K.
SMALL_M_OVERLAP_MAX_M = 128
SMALL_M_OVERLAP_MIN_K = 1024


def small_m_promotion(s: GemmSchedule, m: int, k: int) -> bool:
    """Whether the op runs schedule `s` at (m, k) with `promote_overlap` and `sb_ahead` by default."""
    return m <= SMALL_M_OVERLAP_MAX_M and k >= SMALL_M_OVERLAP_MIN_K and overlap_error(s) is None


def sb_smem_error(s: GemmSchedule) -> str | None:
    """Why schedule `s` cannot stage its B-scale rows in shared memory (`sb_smem=True`), or None."""
    err = promoted_error(s)
    if err:
        return err
    if s.kind != "cooperative":
        return (f"sb_smem=True needs schedule='cooperative' (the tile's two consumer warpgroups load and share "
                f"the B-scale row), got {s.kind!r}")
    need = smem_bytes(s, sb_smem=True)
    if need > SMEM_BYTES:
        return f"sb_smem=True: {s.stages} stages + the {sb_smem_bytes(s)}-byte scale row need {need} bytes > {SMEM_BYTES}"
    return None


def halves_only_error(s: GemmSchedule, promote_halves: bool) -> str | None:
    """Why the FP8 mainloop cannot run schedule `s` with `promote_halves` as given: the 128 x `HALVES_TILE_N` tile
    holds a whole-width temporary beside its accumulator only in halves."""
    if s.tile_n == HALVES_TILE_N and not promote_halves:
        return (f"tile_n {HALVES_TILE_N} needs promote_halves=True (2 x {acc_per_thread(s)} fp32 accumulators a "
                f"thread otherwise)")
    return None


def halves_error(s: GemmSchedule, promote_overlap: bool, wg_turns: bool) -> str | None:
    """Why schedule `s` cannot promote in column halves (`promote_halves=True`), or None: the halves
    are WGMMAs tile_n / 2 wide on B's rows [0, N/2) and [N/2, N) (a multiple of 8 wide, starting on a
    swizzle atom: tile_n a multiple of 16); not combined with the other promotion orders."""
    err = promoted_error(s)
    if err:
        return err
    if s.tile_n % 16:
        return f"promote_halves needs tile_n a multiple of 16, got {s.tile_n}"
    if s.split_k > 1:
        return f"promote_halves cannot be combined with split_k={s.split_k} (the split path promotes whole K-blocks)"
    if promote_overlap or wg_turns:
        return (f"promote_halves cannot be combined with promote_overlap ({promote_overlap}) or wg_turns "
                f"({wg_turns}): each orders the promotion its own way")
    return None


def turns_error(s: GemmSchedule, promote_overlap: bool) -> str | None:
    """Why schedule `s` cannot issue its K-blocks in warpgroup turns (`wg_turns=True`), or None."""
    if s.kind != "cooperative" or promote_overlap:
        return (f"wg_turns needs schedule='cooperative' without promote_overlap (got {s.kind}, "
                f"promote_overlap={promote_overlap})")
    return None


def grouped_error(s: GemmSchedule, grouping: str) -> str | None:
    """Why schedule `s` cannot run the `grouping` walk (None when it can)."""
    if grouping not in GROUPINGS:
        return f"grouping must be one of {GROUPINGS}, got {grouping!r}"
    if grouping == "contiguous":
        if s.kind != "cooperative":
            return ("contiguous grouping needs schedule='cooperative' (padding tiles are skipped; the "
                    "ping-pong turn order assumes every tile is computed)")
        if s.cluster_m != 1:
            return ("contiguous grouping needs cluster_m = 1 (the M tiles of a cluster may belong to different "
                    "experts and cannot share B by multicast); use cluster_n = 2 to share A")
        if M_ALIGN % s.tile_m:
            return f"contiguous grouping needs tile_m to divide the {M_ALIGN}-row alignment, got {s.tile_m}"
    return None


# Epilogue buffers (128x32 bf16 sub-tiles, 8 KiB each at tile_m 128) per storing group. The default
# 4 leave cooperative 128x128 at 5 stages (4 x 8 KiB + 5 x 32.5 KiB + the sb_smem row = 197.5 KiB of
# 227); 3 buffers give the 6th stage (6 x 32.5 + 24 + 2 + 1 = 222 KiB), as cuBLAS's blockwise kernel
# for this tile (nvjet ..._128x128_128x6_2x1_...) runs. Measured: pending ("ours 6 stages" column).
EPI_STAGES = (2, 3, 4)
DEEP_EPI_STAGES = 3


def scale_stage_bytes(s: GemmSchedule) -> int:
    return s.tile_m * 4


def smem_bytes(s: GemmSchedule, sb_smem: bool = False, out_bytes: int = 2, padded: bool = True) -> int:
    """Shared memory of the FP8 kernel's storage (`cute_kernels/gemm/kernels.py` `ScaledStorage` /
    `StagedScaleStorage`, in order): mbarriers padded to 1 KiB (sA is 1024-aligned), per stage A + B
    + the tile's A scales, the epilogue buffers, and with `sb_smem` the B-scale row; every piece is a
    multiple of its successor's alignment at these tiles, and the struct is padded to its 1 KiB
    alignment, so this is exact (the CPU tests read the B-scale row's offset back from SASS and
    compare the struct's size; `padded=False`: the offset of whatever follows the pieces). SMEM_BYTES
    is a multiple of 1 KiB: the padding never decides a fit."""
    need = s.stages * (s.stage_bytes(1) + scale_stage_bytes(s)) + s.epi_bytes(out_bytes) + BARRIER_BYTES
    need += sb_smem_bytes(s) if sb_smem else 0
    return -(-need // 1024) * 1024 if padded else need


def fp8_stages(s: GemmSchedule, out_bytes: int = 2) -> int:
    """A/B/A-scale stages that fit in shared memory beside the epilogue buffers (at most 8; even under
    `k_interleave`)."""
    free = SMEM_BYTES - BARRIER_BYTES - s.epi_bytes(out_bytes)
    return s.ring_stages(free // (s.stage_bytes(1) + scale_stage_bytes(s)))


def kind_defaults(kind: str) -> dict:
    """FP8 schedule fields whose default follows `kind`: ping-pong's one consumer warpgroup a tile takes 64 rows (its
    promoted accumulators and their temporaries beside them)."""
    return {"tile_m": 64} if kind == "pingpong" else {}


def fp8_schedule(kind: str = "cooperative", tile_m: int = 128, tile_n: int = 128, cluster_m: int = 2,
                 cluster_n: int = 1, stages: int = 0, raster_group: int = 8, persistent: bool = True,
                 epi_stages: int = 4, split_k: int = 1, k_interleave: bool = False, a_rows: int = 0) -> GemmSchedule:
    """A GemmSchedule for the FP8 GEMM (tile_k 128, stages counted with the scale boxes); raises
    ValueError naming the problem if the promoted mainloop cannot run it. `epi_stages` (2-4): the
    output sub-tile buffers per storing warpgroup group; fewer leave room for more stages
    (`DEEP_EPI_STAGES`: cooperative 128x128 gets 6 stages, 128x192 with 2 buffers 5). `a_rows` (decode M <= 32):
    A's and its scales' TMA boxes cut to the tile's first rows (`GemmSchedule.a_rows`, as the bf16 GEMM)."""
    if epi_stages not in EPI_STAGES:
        raise ValueError(f"epi_stages must be one of {EPI_STAGES}, got {epi_stages}")
    # split-K (small M): one launch only (`split_fixup`: the last split of a tile sums the promoted partials)
    s = GemmSchedule(kind=kind, tile_m=tile_m, tile_n=tile_n, tile_k=SCALE_BLOCK, cluster_m=cluster_m,
                     cluster_n=cluster_n, stages=stages, raster_group=raster_group, persistent=persistent,
                     epi_stages=epi_stages, split_k=split_k, split_fixup=split_k > 1, k_interleave=k_interleave,
                     a_rows=a_rows)
    err = promoted_error(s)
    if err:
        raise ValueError(err)
    if not stages:
        s = GemmSchedule(**{**s.__dict__, "stages": fp8_stages(s)})
    need = smem_bytes(s)
    if need > SMEM_BYTES:
        raise ValueError(f"{s.stages} stages need {need} bytes of shared memory > {SMEM_BYTES}")
    return s


def deep_fp8(s: GemmSchedule) -> GemmSchedule:
    """`s` with the deepest A/B/A-scale ring that fits (at most `schedules.gemm.DEEP_RING_STAGES`); `s` itself where
    that is no deeper. The bf16 GEMM's 64-row tiles on grids of one tile a CTA run such rings by default
    (`schedules.gemm.deepened`: 12 stages 1.06x at 64x4096x4096); the FP8 suite's "ours deep ring (small M)"
    column times them on the narrow FP8 tiles (64x16: 10.25 KiB a stage, 16 fit; 64x32: 14; 64x64: 10; even under
    `k_interleave`, `GemmSchedule.ring_stages`)."""
    from schedules.gemm import deepest_ring

    return deepest_ring(s, s.stages, lambda c: smem_bytes(c) <= SMEM_BYTES)


@functools.lru_cache(maxsize=4096)
def default_fp8_schedule(m: int, n: int, k: int, kind: str | None = None, num_sms: int = 132,
                         batch: int = 1, wide: bool | None = None, narrow: bool = True,
                         interleave: bool = True) -> GemmSchedule:
    """The FP8 tile with the least modelled time (`schedules.gemm.estimate`'s wave model with the
    FP8 tiles' own efficiencies), clustered 2x1 when there are at least two tile rows. The wide
    tiles (`WIDE_FP8_TILES`) join the search when `wide` is True; None: at M >= WIDE_MIN_M. `narrow`: a
    64x64 ping-pong tile on a grid of less than a wave is narrowed (`_narrowed`; dense GEMMs only), and put on
    both consumer warpgroups (`k_interleave`) unless `interleave` is False: the promotion options
    (promote_overlap, promote_halves, wg_turns, sb_smem) are not built for it."""
    if wide is None:
        wide = m >= WIDE_MIN_M
    best = None
    for knd, tm, tn in (FP8_TILES if wide else DEFAULT_FP8_TILES):
        if kind and knd != kind:
            continue
        cm = 2 if -(-m // tm) >= 2 else 1
        s = fp8_schedule(knd, tm, tn, cluster_m=cm)
        t = estimate(s, m, n, k, batch, num_sms, coop_epilogue_k=0) * _eff_correction(s)
        if best is None or t < best[0] * 0.999:
            best = (t, s)
    s = _narrowed(best[1], m, n, num_sms, batch) if narrow else best[1]
    if narrow and interleave:  # dense GEMMs on small grids: both warpgroups on each tile (`K_INTERLEAVE_DEFAULT`)
        from schedules.gemm import interleaved

        t = interleaved(s, m, n, num_sms, batch, family="fp8")
        if t is not s:
            s = fp8_schedule(t.kind, t.tile_m, t.tile_n, cluster_m=t.cluster_m, cluster_n=t.cluster_n,
                             k_interleave=True)
    if narrow:  # decode batches (M <= 32): A's and its 1x128 scales' TMA boxes cut to the M rows (`a_rows`)
        from schedules.gemm import shortened

        s = shortened(s, m, family="fp8")
    return s


def _narrowed(s: GemmSchedule, m: int, n: int, num_sms: int, batch: int) -> GemmSchedule:
    """`schedules.gemm.narrowed` for the FP8 tiles (64 -> 32 -> 16 columns; the measurements are there)."""
    from schedules.gemm import narrowed

    return narrowed(s, m, n, num_sms, batch, "fp8",
                    lambda s, tn: fp8_schedule("pingpong", 64, tn, cluster_m=s.cluster_m, cluster_n=s.cluster_n))


def _eff_correction(s: GemmSchedule) -> float:
    """`estimate` divides by the bf16 tile efficiency table; correct it to the FP8 one."""
    from schedules.gemm import _TILE_EFF

    return _TILE_EFF.get((s.kind, s.tile_m, s.tile_n), 0.5) / _FP8_EFF[(s.kind, s.tile_m, s.tile_n)]


@functools.lru_cache(maxsize=4096)
def default_grouped_schedule(grouping: str, m: int, n: int, k: int, groups: int = 1,
                             num_sms: int = 132) -> GemmSchedule:
    """Schedule of a grouped FP8 GEMM. "contiguous" (m: all rows): the dense op's cooperative tile for
    (m, n, k) (the wide 128x192 / 128x160 from WIDE_MIN_M rows), with A shared by 1x2 clusters when there
    are two tile columns (the M tiles of a cluster may belong to different experts: no B multicast).
    H200: 128x192 at 4 x 8192 tokens, N = 4096, K = 7168 1090 against 1058 TFLOP/s for 128x128 (1039 / 994 in an
    earlier run), bitwise the same output. "masked" (m: the expected valid rows per expert, `groups` experts):
    `default_fp8_schedule`'s wave model over groups x that problem."""
    if grouping == "contiguous":
        t = default_fp8_schedule(max(m, 1), n, k, "cooperative", num_sms, narrow=False)
        cn = 2 if -(-n // t.tile_n) >= 2 else 1
        return fp8_schedule("cooperative", t.tile_m, t.tile_n, cluster_m=1, cluster_n=cn)
    if grouping == "masked":
        return default_fp8_schedule(max(m, 1), n, k, None, num_sms, max(groups, 1), wide=False, narrow=False)
    raise ValueError(f"grouping must be 'contiguous' or 'masked', got {grouping!r}")
