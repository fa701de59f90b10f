"""Attention schedules: who computes which Q tile of which head, with which warps, when.

An `AttentionSchedule` fixes the *when and where* of a FlashAttention forward on Hopper, none of
the *how* (that is `collectives/`: the TMA pipeline, WGMMA, the masks, the online softmax). Both
kinds run in the same kernel (`cute_kernels/attention/forward.py`), chosen at trace time:

* `kind="fa3"` (warp-specialized, FlashAttention-3): warpgroup 0 is the producer (one warp issues
  the TMA loads: the Q tile once, then K and V blocks through two rings of `stages` swizzled smem
  buffers; it gives its registers away with `setmaxnreg.dec` to `producer_regs`); warpgroups
  1..`consumer_wgs` are consumers, each owning 64 rows of the `tile_m`-row Q tile
  (`setmaxnreg.inc` to `consumer_regs`). Per K/V block a consumer computes S = Q K^T (WGMMA, both
  operands in smem), masks and folds S into its online-softmax state (m, l) in registers, and adds
  P V into its O accumulator (WGMMA with P from registers). Named barriers take the consumers'
  GEMMs in turn (`pingpong`), so one warpgroup's softmax runs under the other's tensor-core work.
  `overlap` (FA3 section 3.2, intra-warpgroup pipelining): a consumer issues S_{j+1} = Q K_{j+1}^T
  and then O += P_j V_j before it waits, and runs the softmax of S_{j+1} while P_j V_j is still on
  the tensor cores; O is rescaled after that GEMM completes. It costs no second fp32 S buffer:
  P_j lives in its own bf16 registers (it is converted before S_{j+1} is issued).
  `double_p` (with `overlap`): P in two register buffers (32 more registers at tile_n 128). With
  one buffer, P_{j+1} may not overwrite P_j before P_j V_j is done, and ptxas hoists that wait to the
  top of the softmax: the exponentials run after P_j V_j, not under it. With two, a consumer waits
  for P_{j-1} V_{j-1} only before its next turn (long done), rescales O, issues S_{j+1} and P_j V_j,
  waits for S_{j+1} alone and runs the whole softmax under P_j V_j. Same results bit for bit.
  `lazy_rescale` (without `overlap`; FA4's conditional rescale on Blackwell, warp-uniform here): a
  row keeps its exponent reference m while the block max exceeds it by at most 2^8 (after the
  scale), so the warp skips the 64 FMULs of the O rescale on most blocks (one vote.all per block);
  the probabilities may reach 256 before the final O / l. Same result up to rounding.
  `split_mask` (with `overlap`, one P buffer): the walk in three loops, the blocks that cross the key
  end or the band's right edge (walked first), the interior, the blocks of the left edge
  (`attention_mask.mask_split`; at D > 128 the left edge stays in the interior loop's branch, and
  D = 256 does not fit: ptxas serialized the WGMMAs of those), so the interior loop has no mask code; with its branch gone ptxas no
  longer puts the wait for P_j V_j before the exponentials. Same operations, same order: bit for bit.
  `sum_from_corr`: the row sum starts from l * corr and adds the block's probabilities to it (FA4's
  order; corr's exponential comes first), instead of l * corr + (the block's sum) at the end, which
  left corr and the O rescale last in the block. Same result up to the rounding of l.
* `kind="fa2"` (FlashAttention-2's arrangement, no warp specialization): every warpgroup computes,
  each owning 64 rows of the Q tile (sliced Q); there is no producer warpgroup and no `setmaxnreg`
  (the 128 or 256 threads get up to 255 registers each). Warp 0, itself a compute warp, issues the
  TMA loads in line: Q once, then, while the S = Q K^T of block j runs, K/V block j + stages - 1
  into the stage every warp released after block j - 1 (stages 1: load, wait, compute; the default
  2: double buffering as in FA2). Same collectives, same tile walk, no ping-pong, no overlap.
* the tile walk: one CTA per (q tile, head, batch), grid (q_tiles, H_q, B). With a causal mask the
  q tiles are visited last-first (`reverse_m`): the CTAs of the longest rows (the most K/V blocks)
  start first, a cheap longest-processing-time order, within each (head, batch): the grid launches
  x fastest, so head 0's shortest tiles start before head 1's longest. `heads_first`
  launches the grid as (H_q, B, q_tiles) instead: every head's and batch's tile of one q index before
  the next index, so with the reversal the whole grid runs longest first. Scheduling only: the same
  tiles, the same bits. Measured at 0.971x / 0.967x the default (d128 / d64 causal):
  with every head's longest tile in flight at once, the K/V of all heads compete for L2.
* `l2_groups`: FA3's LPT order without its dynamic hand-out. The grid is
  1-D, each block index a place in `grouped_coords`' order: the (batch, head) pairs cut into groups
  whose K and V fit L2_KV_BYTES (`l2_group_heads`), group by group, in a group q index slowest (causal:
  longest first) and head fastest. The tiles in flight at once have about the same length, and only one
  group's K/V is being read. The same tiles, the same bits.
* `persistent` (fa3, batched): a grid of one CTA per SM, each walking the tiles t = x,
  x + X, x + 2X, ... of the launch order above (`PersistentWalk`). The producer warp carries its K/V
  ring position from tile to tile: it loads the next tile's first `stages` K/V blocks while the
  consumers still finish the current one and store its O, then the next Q once the consumers release
  the Q buffer (O is staged through it), then the rest. The consumers carry their ring position too.
  The same bits as the one-CTA-a-tile grid; measured at 0.93-1.04x the default, and 0.61x at D = 64
  causal, where the static stride hands each CTA the same q index on every pass
  (docs/kernels/attention.md).
* `dynamic` (with `persistent`): the same walk with the tiles handed out at run time, FA3's
  dynamic scheduler. CTA x starts on tile x; each later tile is X + the value an atomic add on a counter in
  global memory returns, taken by the producer warp when it has issued its tile's last load. The producer
  writes the tile's index into one of two shared-memory slots before Q's full barrier (whose arrive
  releases it, whose wait acquires it), so the consumers learn each tile with its Q; an index past the
  last tile, sent with a bare arrive, ends their loop. An SM that finishes early takes the next tile in
  the order (`linear_coords`: the launch order, or the L2 groups' longest-first order), so no static
  stride can pile the long tiles on a few SMs. The fetch that returns the last value resets the counter
  to 0 for the next launch (`schedules.walks.take_tile`). The same tiles, the same bits. Measured: 1.026x /
  1.034x (causal) at D = 64, the batched default there; 0.96-0.99x at D = 128 / 256.
* `skip_rescale` (the overlap; the D = 256 default, 1.017x causal and not): a row whose max did not move gets
  corr exactly 1 (`softmax_rows(exact_one=True)`), and O's rescale is skipped on a warp whose corrs are all
  1 (`rescale_rows(skip_ones=True)`, a vote at the rescale). At D = 256 that is 128 FMUL per thread and
  block, the largest single item of the steady loop. Equal to the default up to a few ulps of corr.
* `late_v_release` (the one-buffer overlap): V_j's stage is released in the next step, after S_{j+2}'s
  wait, not right after P_j V_j's. ptxas schedules an mbarrier arrive early, and the P V wait before it moved
  with it to the top of the softmax (PC sampling: 4.5 % of the samples, FA4's 0.1 %). Without the arrive the
  wait lands after 38 of the 66 exponentials at d128. It costs one stage of V look-ahead: 1.028x at D = 96,
  1.008x at D = 128 causal (the defaults there), 0.97-0.98x at D = 64, 0.62x with two stages (D = 192). The same
  bits.

Registers (fa3): 24 + 2 x 240 = 504 <= 512 per thread-slot of the 64K file for 384 threads (FA3's
budget); three consumer warpgroups would be 32 + 3 x 160.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from schedules.index_math import floor_pow2, imax, imin

SMEM_BYTES = 232448  # usable dynamic shared memory per CTA on sm_90 (227 KiB)
BARRIER_BYTES = 1024  # mbarriers and alignment slack
KINDS = ("fa3", "fa2")
HEAD_DIMS = (64, 96, 128, 192, 256)
TILE_NS = (64, 80, 96, 112, 128, 160, 176, 192)


@dataclass(frozen=True)
class AttentionSchedule:
    kind: str = "fa3"
    tile_m: int = 128  # Q rows per CTA (64 per computing warpgroup): 64, 128 or 192 (fa3, three consumers)
    tile_n: int = 128  # K/V rows per pipeline stage
    stages: int = 0  # K/V stages; 0 = fa3: as many as fit (at most 4), fa2: 2
    consumer_wgs: int = 0  # computing warpgroups; 0 = tile_m // 64
    pingpong: bool | None = None  # named barriers alternate the consumers' GEMMs; None = on where possible
    overlap: bool = False  # fa3: the next S = Q K^T is issued before this block's softmax
    lazy_rescale: bool = False  # keep a row's exponent reference while the max grows by <= 2^8 (no O rescale)
    double_p: bool = False  # overlap with P in two register buffers: no P V wait inside the softmax
    split_mask: bool = False  # overlap: the walk as masked / unmasked / masked loops (no mask code in the middle)
    sum_from_corr: bool = False  # the row sum starts from l * corr (FA4's order), not l * corr + sum at the end
    producer_regs: int = 0  # 0: 24 (one or two consumer warpgroups), 32 (three)
    consumer_regs: int = 0  # 0: 240 (one or two), 160 (three): FA3's / FA4's budgets
    heads_first: bool = False  # the grid (H_q, B, q_tiles): each q index over every head and batch before the next
    persistent: bool = False  # fa3: one CTA per SM walks the tiles in launch order (`PersistentWalk`)
    l2_groups: bool = False  # a 1-D grid in FA3's order: heads in groups whose K/V fit L2, q slowest in a group
    dynamic: bool = False  # persistent, the tiles handed out by an atomic counter in the walk's order
    skip_rescale: bool = False  # overlap: O's rescale skipped on warps where no row's max moved (corr exactly 1)
    late_v_release: bool = False  # one-buffer overlap: V_j's stage released one step later, after S_{j+2}'s wait
    # (grid z holds the q tiles then: at most 65535, S_q <= 4M rows at tile_m 64)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.tile_m not in (64, 128, 192):
            raise ValueError(f"tile_m must be 64, 128 or 192 (64 rows per computing warpgroup), got {self.tile_m}")
        if self.tile_m == 192 and self.kind != "fa3":
            raise ValueError("tile_m 192 (three consumer warpgroups, 512 threads) is built for kind='fa3'")
        wgs = self.consumer_wgs or self.tile_m // 64
        if self.tile_m != 64 * wgs:
            raise ValueError(f"tile_m must be 64 x consumer_wgs = {64 * wgs}, got {self.tile_m}")
        object.__setattr__(self, "consumer_wgs", wgs)
        if self.pingpong is None:
            object.__setattr__(self, "pingpong", self.kind == "fa3" and wgs >= 2)
        if self.pingpong and (self.kind != "fa3" or wgs < 2):
            raise ValueError(f"pingpong needs kind='fa3' with two or three consumer warpgroups (tile_m 128 or 192; "
                             f"three take turns round robin), got {self.kind} with tile_m {self.tile_m}")
        if not self.producer_regs:
            object.__setattr__(self, "producer_regs", 32 if wgs == 3 else 24)
        if not self.consumer_regs:
            object.__setattr__(self, "consumer_regs", 160 if wgs == 3 else 240)
        if self.l2_groups and self.heads_first:
            raise ValueError("l2_groups and heads_first are two tile orders: choose one")
        if self.persistent and self.kind != "fa3":
            raise ValueError("persistent is built for kind='fa3' (its producer warp carries the K/V ring across tiles)")
        if self.skip_rescale and not self.overlap:
            raise ValueError("skip_rescale is built for the overlap (whose O rescale comes after the P V wait); the "
                             "schedules without it have lazy_rescale")
        if self.late_v_release and not (self.overlap and not self.double_p):
            raise ValueError("late_v_release is built for the one-buffer overlap (overlap=True, double_p=False): it moves "
                             "the V release off the P V wait that ptxas would otherwise hoist into the softmax")
        if self.dynamic and not self.persistent:
            raise ValueError("dynamic (tiles handed out by an atomic counter) is a persistent walk: it needs "
                             "persistent=True")
        if self.overlap and self.kind != "fa3":
            raise ValueError("overlap (the next S = Q K^T issued before the softmax) is an fa3 option; fa2 is the "
                             "synchronous schedule")
        if self.lazy_rescale and self.overlap:
            raise ValueError("lazy_rescale is built for the schedules without overlap (there the O rescale and "
                             "its skip branch come before the exponentials; under the overlap they come after)")
        if self.double_p and not self.overlap:
            raise ValueError("double_p (a second P register buffer) is a variant of the overlap: it needs overlap=True")
        if self.split_mask and (not self.overlap or self.double_p):
            raise ValueError("split_mask (the walk split into masked and unmasked loops) is built for the one-buffer "
                             "overlap: it needs overlap=True and double_p=False")
        if self.tile_n % 16 or not 16 <= self.tile_n <= 256:
            raise ValueError(f"tile_n must be a multiple of 16 in [16, 256], got {self.tile_n}")
        if not 0 <= self.stages <= 4:
            raise ValueError(f"stages must be in [1, 4], or 0 for the default, got {self.stages}")
        if self.producer_regs + self.consumer_wgs * self.consumer_regs > 512 or self.producer_regs % 8 \
                or self.consumer_regs % 8 or self.producer_regs < 24 or self.consumer_regs > 256:
            raise ValueError("register budget: producer + consumers x consumer_regs <= 512 per thread, "
                             "multiples of 8 in [24, 256]")

    # --- warp roles ---------------------------------------------------------------------------
    @property
    def warp_specialized(self) -> bool:
        """A producer warpgroup (fa3) or every warpgroup computing and warp 0 loading in line (fa2)."""
        return self.kind == "fa3"

    @property
    def threads(self) -> int:
        return 128 * (self.consumer_wgs + (1 if self.warp_specialized else 0))

    @property
    def prefetch(self) -> int:
        """fa2: how many K/V blocks ahead warp 0 loads (the ring minus the stage being computed)."""
        return 0 if self.warp_specialized else (self.stages or 2) - 1

    @property
    def pinned_p(self) -> bool:
        """P converted to 16 bits where the code puts it (`acc_as_a_operand(pinned=True)`), not where
        LLVM sinks it (into the next step, after that step's S GEMM is issued: 32 more live
        registers). Pinned where registers are short: three consumers at 160 registers (the 192-row
        overlap spilled 256-336 B unpinned) and two P buffers (D = 256 at 80-key blocks, B2 S8k H8:
        726.5-733.5 TFLOP/s pinned against 706 unpinned). The one-buffer
        overlap at 240 registers keeps the sunk conversion, which issues the next S GEMM first: D = 128
        measured 643.7 pinned against 660.2 (B2 S8k H16, two suite runs). Pinned on a persistent grid: inside
        the tile walk, the sunk conversion made ptxas serialize every WGMMA of the one-buffer overlap (C7512,
        "insufficient register resources"; 48 ARRIVE for 48 HGMMA at D = 128); pinned, 6 for 48, top register
        193 (`tests/attention/test_wgmma_waits_sass.py`)."""
        return self.consumer_wgs == 3 or self.double_p or self.persistent

    # --- registers (fp32 values per consumer thread) ------------------------------------------
    def accumulators(self, head_dim: int) -> int:
        """S (64 x tile_n) and O (64 x head_dim) fp32 accumulators + P (bf16 pairs; two buffers with
        `double_p`) per thread."""
        return self.tile_n // 2 + head_dim // 2 + self.tile_n // 4 * (2 if self.double_p else 1)

    # --- shared memory ------------------------------------------------------------------------
    def q_bytes(self, head_dim: int, elem: int = 2) -> int:
        return self.tile_m * head_dim * elem

    def kv_stage_bytes(self, head_dim: int, elem: int = 2) -> int:
        return 2 * self.tile_n * head_dim * elem  # one K and one V block

    def num_stages(self, head_dim: int, elem: int = 2) -> int:
        """K/V stages. The output tile is staged through the Q buffer (each consumer warpgroup
        writes O into its own Q rows once its last S = Q K^T is done), so Q and K/V share smem."""
        if self.stages:
            return self.stages
        if not self.warp_specialized:
            return 2
        free = SMEM_BYTES - BARRIER_BYTES - self.q_bytes(head_dim, elem)
        return max(2, min(4, free // self.kv_stage_bytes(head_dim, elem)))

    def smem_bytes(self, head_dim: int, elem: int = 2) -> int:
        return (self.q_bytes(head_dim, elem) + self.num_stages(head_dim, elem) * self.kv_stage_bytes(head_dim, elem)
                + BARRIER_BYTES)

    def fits(self, head_dim: int, elem: int = 2) -> bool:
        # 192 accumulator registers leave 48 of the 240 for addresses, row states and the softmax; the
        # second P buffer was checked in the SASS at every default tile (D = 256: 208, highest register
        # 225, no spills; tests/attention/test_wgmma_waits_sass.py)
        limit = 208 if self.double_p else 192
        if self.split_mask:
            # three copies of the loop body: at D = 256 (188 accumulator registers) ptxas serializes
            # every WGMMA (one ARRIVE per HGMMA, tests/attention/test_split_mask_compile.py); D <= 192 is clean
            limit = 176
        if self.consumer_regs < 240:
            # three consumers at 160 registers: D = 64, tile_n 128 (128 accumulators), the synchronous
            # walk and the overlap (split or not, causal or not) compile without local memory and with
            # grouped WGMMAs (the overlap's interior loop: 12 HGMMA, 2 ARRIVE). The overlap spilled
            # 256-336 bytes here until P's conversion became opaque to LLVM (`acc_as_a_operand`: a
            # folded phi had carried P as 64 fp32 values through the loop)
            limit = self.consumer_regs - 32
        return self.smem_bytes(head_dim, elem) <= SMEM_BYTES and self.accumulators(head_dim) <= limit

    def __str__(self) -> str:
        pp = "pp" if self.pingpong else "nopp"
        return (f"{self.kind}_{self.tile_m}x{self.tile_n}_s{self.stages}_wg{self.consumer_wgs}_{pp}"
                + ("_ov" if self.overlap else "") + ("_lz" if self.lazy_rescale else "") + ("_dp" if self.double_p else "")
                + ("_sm" if self.split_mask else "") + ("_sc" if self.sum_from_corr else "")
                + ("_hf" if self.heads_first else "") + ("_l2" if self.l2_groups else "")
                + ("_ps" if self.persistent else "") + ("_dyn" if self.dynamic else "")
                + ("_sk" if self.skip_rescale else "") + ("_lv" if self.late_v_release else ""))


# Tile sizes per head dim (FA3's choices where the registers allow: O and S both live in registers,
# so the K/V block shrinks as the head dim grows).
_TILE_N = {64: 128, 96: 128, 128: 128, 192: 96, 256: 80}


@functools.lru_cache(maxsize=64)
def default_schedule(head_dim: int, causal: bool = False, seqlen_k: int | None = None,
                     varlen: bool = False) -> AttentionSchedule:
    """The measured default for `head_dim` (causal: any mask with a right bound; `seqlen_k`: the keys per
    sequence, or the varlen maximum, where known; `varlen`: packed sequences, one CTA a tile)."""
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {head_dim}")
    # overlap on (FA3's intra-warpgroup pipelining): H200, d 128, B16 S1k and B2 S8k, causal and not,
    # 3.3-4.4 % faster than without in the same interleaved run; it compiles without spills at every head dim
    # (168 launch registers, setmaxnreg 240).
    # split_mask where it fits (D <= 192): H200, d 128, the same four shapes, 1.018-1.045x (geomean
    # 1.033x) in one interleaved run; bitwise the same.
    # D = 64: three consumer warpgroups on 192-row tiles (FA4's d <= 64 tile). The synchronous walk: H200, B2 S8k
    # H32, 502.8 vs 455.9 TFLOP/s for the 128-row overlap + split (1.10x). The 192-row overlap + split, once P's
    # pinned conversion stopped it spilling (`AttentionSchedule.pinned_p`): 536.2 vs 517.5 for the synchronous walk
    # (1.036x), causal 485.4 vs 479.2 (1.013x).
    # ... except causal D = 64 below 4096 keys, where the 192-row diagonal tiles waste more: 0.92x / 0.89x
    # the 128-row default at S 512 / 1k, equal at 2k-4k, 1.06-1.07x at 8k-16k (H200 attention suite;
    # measured with the synchronous 192-row walk)
    # D = 256: the overlap with two P buffers (`double_p`): B2 S8k H8, 685.5 vs 653.7 (1.049x)
    # D = 64 (batched): the persistent grid with the tiles handed out at run time (`dynamic`; causal in the L2
    # groups' order) against the same schedule one CTA a tile: 1.026x at B2 S8k H32 (581.1 vs 566.6), 1.034x
    # causal at B4 S4k H32 (448.3 vs 433.6); and the 192-row tile from 2048 causal keys (B8 S2k H32: 356.2 against
    # 335.6 for the 128-row overlap). At D = 128 / 256 it measured 0.96-0.99x (P's pinned conversion at D = 128;
    # D = 256 not profiled), so they keep one CTA a tile.
    # Causal (batched): the tiles in the L2 groups' order (`l2_groups`, heads in power-of-two groups) against the
    # same schedule in the plain order, H200, one interleaved search each: d256 B2 S8k / B4 S4k / B8 S2k
    # H8 749.2 / 689.6 / 583.0 against 690.8 / 632.1 / 543.4 (1.085 / 1.091 / 1.073x), d128 H16 672.3 / 616.8 /
    # 520.9 against 651.4 / 598.9 / 508.8 (1.032 / 1.030 / 1.024x), d96 B2 S8k H16 576.3 against 559.7 (1.030x),
    # d192 B2 S8k H10 713.5 against 676.9 (1.054x). The list-scheduling model of the causal tail predicted it
    # (docs/kernels/attention.md, "How it got here" -> "The causal tail and the L2 groups"). Not below 2048 keys
    # (1024 at D = 256): the suite with the groups everywhere lost 2-5 % at S 512 / 1k (d64, d128) and at S 512
    # (d256), and gained 3 % at d256 S 1k.
    # D = 256 skips O's rescale where no row's max moved (`skip_rescale`): B2 S8k H8 763.4 against 750.1 causal
    # (1.018x), 793.0 against 780.0 without a mask (1.017x); at D = 192 it lost (681.6 against 713.5).
    # D = 192 causal walks the dynamic persistent grid: 757.5 against 713.5 one CTA a tile (1.062x) at B2 S8k H10;
    # without a mask too (bitwise GPU-tested): 782.6 against 737.4 (1.061x), 754.0 against 704.0 in a second run.
    grouped = causal and not varlen and (seqlen_k is None or seqlen_k >= _L2_MIN_KEYS.get(head_dim, 2048))
    settings = dataclasses.asdict(_base_schedule(head_dim))
    if head_dim in _DEFAULT_OVERRIDE:
        override, causal_min_keys = _DEFAULT_OVERRIDE[head_dim]
        if not (causal and seqlen_k is not None and seqlen_k < causal_min_keys):
            settings = override
    if not varlen and (head_dim in _DYNAMIC_HEAD_DIMS and settings.get("tile_m") == 192
                       or head_dim in _DYNAMIC_CAUSAL_HEAD_DIMS and (grouped or not causal)):
        settings = dict(settings, persistent=True, dynamic=True)
    if head_dim in _LATE_V_HEAD_DIMS and (causal or head_dim == 96) and settings.get("overlap") \
            and not settings.get("double_p"):
        # `late_v_release`, one interleaved search each: d96 B4 S4k H16 602.5 against 585.9 (1.028x); d128 causal B2 S8k
        # / B8 S2k 703.5 / 527.6 against 697.7 / 523.5 (1.008x); d128 without a mask 728.5 against 731.0 (0.997x: not
        # taken); at D = 192 (two stages) V's loads then wait (493 against 790); at D = 64 0.966-0.982x
        # (`perf.ab_attention`)
        settings = dict(settings, late_v_release=True)
    return AttentionSchedule(**dict(settings, l2_groups=grouped))


# Head dims whose measured default is not the 128-row overlap (see `default_schedule`): the schedule's
# settings, and the fewest keys per sequence at which a causal mask still takes them
_DEFAULT_OVERRIDE = {64: (dict(tile_m=192, tile_n=128, overlap=True, split_mask=True), 2048),
                     256: (dict(tile_n=80, overlap=True, double_p=True, skip_rescale=True), 0)}
# The fewest keys per sequence at which a causal mask walks the L2 groups' order (2048 where not named)
_L2_MIN_KEYS = {256: 1024}
# ... and those whose batched default walks a `dynamic` persistent grid (at D = 64 the 192-row tile's), or does
# so without a mask and under a causal mask in the L2 groups' order
_DYNAMIC_HEAD_DIMS = (64,)
_DYNAMIC_CAUSAL_HEAD_DIMS = (192,)
# ... and those whose default releases V's stage a step late (`late_v_release`; D = 96 under every mask, D = 128
# under a causal one): three or more K/V stages, so that the producer still runs a stage ahead
_LATE_V_HEAD_DIMS = (96, 128)


def _base_schedule(head_dim: int) -> AttentionSchedule:
    """The 128-row overlap (+ split where it fits): the default at most head dims, and the base the
    candidate list varies around."""
    return _split_where_fits(AttentionSchedule(tile_n=_TILE_N[head_dim], overlap=True), head_dim)


def _split_where_fits(s: AttentionSchedule, head_dim: int) -> AttentionSchedule:
    """`s` with `split_mask` when it is a one-buffer overlap that still fits `head_dim` with it."""
    if s.kind == "fa3" and s.overlap and not s.double_p and not s.split_mask:
        t = dataclasses.replace(s, split_mask=True)
        if t.fits(head_dim):
            return t
    return s


def candidates(head_dim: int, causal: bool = False, limit: int = 24) -> list[AttentionSchedule]:
    """Schedules worth timing for one head dim (`cute-kernels schedules attention`), default first.

    fa3 with tile_m 128: the default K/V block and its fitting neighbours (one smaller, one larger)
    x ping-pong on/off x overlap on/off, the overlap with two P buffers (`double_p`), plus two stages
    instead of as-many-as-fit; fa3 with one
    consumer warpgroup (tile_m 64); fa2 with tile_m 128 and 64, the default block and the next
    smaller one, two stages and one (fully synchronous). Right after the default, its twins in other tile orders:
    L2 groups, the dynamic persistent walk (causal: in the L2 groups' order), not causal the static one, and from
    D = 128 the default with `skip_rescale` flipped; from D = 96 the default with `late_v_release` flipped (second in
    the list) and with a two-stage K/V ring where more fit. At most `limit` (~20 at every head dim)."""
    default = default_schedule(head_dim, causal)
    d = _base_schedule(head_dim)
    plain = dataclasses.asdict(dataclasses.replace(default, persistent=False, dynamic=False, l2_groups=False))
    fitting = [tn for tn in TILE_NS if AttentionSchedule(tile_n=tn).fits(head_dim)]
    i = fitting.index(d.tile_n)
    near = [d.tile_n] + fitting[max(0, i - 1):i] + fitting[i + 1:i + 2]
    # right after the default, its twins in other tile orders: L2 groups, the persistent grid with the tiles handed
    # out at run time (causal: in the L2 groups' longest-first order), and the static persistent walk (non-causal
    # only: its fixed stride unbalanced every causal case measured, 0.86-0.90x the default). heads_first
    # measured slower (0.971x / 0.967x)
    # (the default's tile and loop, one CTA a tile first where the default walks a grid of its own)
    specs = [dataclasses.asdict(default)]
    if default.overlap and not default.double_p and head_dim >= 96:
        # the default with V's stage released a step later (the P V wait off the softmax's top; not at
        # D = 64, whose list is full)
        specs.append(dict(dataclasses.asdict(default), late_v_release=not default.late_v_release))
    specs += [plain, dict(plain, l2_groups=True),
             dict(plain, persistent=True, dynamic=True, l2_groups=causal)]
    if not causal:
        specs.append(dict(plain, persistent=True))
    if default.overlap and head_dim >= 128:
        # O's rescale skipped where no row's max moved (the D = 256 default) or not:
        # D / 2 FMUL a block and thread, so from D = 128 (at D = 64 the 32 of them are not worth a slot of the list)
        specs.append(dict(dataclasses.asdict(default), skip_rescale=not default.skip_rescale))
    if default.warp_specialized and head_dim >= 96 and default.num_stages(head_dim) > 2:
        # the default's K/V ring at FA4's two stages (the L2 bytes: docs/kernels/attention.md, "Gaps still open")
        specs.append(dict(dataclasses.asdict(default), stages=2))
    twins = len(specs)
    if head_dim <= 64:
        # three consumer warpgroups (FA4's d <= 64 tile is 192 x 128), next after the default so that a
        # short --limit keeps them: the synchronous walk, the overlap, the overlap at 64-key blocks
        specs += [dict(tile_m=192, tile_n=d.tile_n), dict(tile_m=192, tile_n=d.tile_n, overlap=True),
                  dict(tile_m=192, tile_n=64, overlap=True)]
    for tn in near:
        for pp in (True, False):
            for ov in (d.overlap, not d.overlap):
                specs.append(dict(tile_n=tn, pingpong=pp, overlap=ov))
    specs.append(dict(tile_n=d.tile_n, overlap=True, double_p=True))
    if d.num_stages(head_dim) > 2:
        specs.append(dict(tile_n=d.tile_n, stages=2))
    specs += [dict(tile_m=64, tile_n=d.tile_n), dict(tile_m=64, tile_n=d.tile_n, overlap=True)]
    if head_dim <= 64:
        specs.append(dict(tile_m=192, tile_n=d.tile_n, lazy_rescale=True))
    for tm in (128, 64):
        for tn in near[:2]:
            specs.append(dict(kind="fa2", tile_m=tm, tile_n=tn))
    specs.append(dict(kind="fa2", tile_n=d.tile_n, stages=1))
    if not d.split_mask:
        # the default cannot split (D = 256 at tile_n 80: serialized WGMMAs); smaller K/V blocks that can,
        # with and without ping-pong (FA4 runs d > 128 without its scheduler barrier)
        for tn in reversed(fitting):  # the largest smaller block that splits
            if tn < d.tile_n and AttentionSchedule(tile_n=tn, overlap=True, split_mask=True).fits(head_dim):
                specs[twins:twins] = [dict(tile_n=tn, overlap=True, split_mask=True, pingpong=pp) for pp in (True, False)]
                break
    out = []
    for kw in specs:
        s = AttentionSchedule(**kw)
        s = _split_where_fits(s, head_dim) if d.split_mask else s  # the default's interior loop
        if s.fits(head_dim) and s not in out:
            out.append(s)
    out = out[:limit - 1] if d.split_mask else out[:limit]
    return out + ([dataclasses.replace(d, split_mask=False)] if d.split_mask else [])  # the default without it


# --- the tile walk ----------------------------------------------------------------------------
def grid(seqlen_q: int, heads: int, batch: int, s: AttentionSchedule) -> tuple[int, int, int]:
    """The launch grid: (q_tiles, H_q, B), (H_q, B, q_tiles) with `heads_first`, (q_tiles x H_q x B, 1, 1) with
    `l2_groups` (block x is the tile's place in `grouped_coords`' order)."""
    q_tiles = max(1, -(-seqlen_q // s.tile_m))
    if s.l2_groups:
        return (q_tiles * heads * batch, 1, 1)
    return (heads, batch, q_tiles) if s.heads_first else (q_tiles, heads, batch)


# K and V bytes a group of heads may keep in L2 together (`l2_groups`): under half of the H200's L2 (FA3's LPT
# scheduler swizzles heads in L2-sized groups for the same reason); a first value, to be measured
L2_KV_BYTES = 24 * 1024 * 1024


def l2_group_heads(seqlen_k, head_dim: int, q_per_kv, elem: int = 2):
    """Query heads per L2 group (`l2_groups`): as many K/V heads as fit L2_KV_BYTES with their K and V of
    `seqlen_k` rows (at least one), rounded down to a power of two, times the query heads sharing each (GQA).
    The rounding is for the tail: B x H is usually a power of two, so the groups divide it evenly. A small last
    group starts its longest tiles when the other SMs are nearly done (D = 256 causal, B2 S8k H8: groups of 3,
    3, 3, 3, 3 and 1 measured 0.964x the plain order, and a list-scheduling model over 132 SMs gives 0.865 of
    the ideal against 0.996 for groups of 2; tests/attention/test_schedules_and_masks_cpu.py). Works on Python and DSL ints (no
    product of the sequence length that could overflow 32 bits)."""
    return floor_pow2(imax((L2_KV_BYTES // (2 * head_dim * elem)) // imax(seqlen_k, 1), 1)) * q_per_kv


def grouped_coords(t, q_tiles, heads, batch, group):
    """(q-tile index, head, batch) of tile `t` in the L2-grouped order (`l2_groups`, FA3's LPT scheduler without
    its dynamic hand-out). The (batch, head) pairs, head fastest, are cut into groups of `group`; the tiles go
    group by group, in a group q index slowest and head fastest. With `tile_coords`' causal reversal that is
    longest first within a group: the tiles in flight at once have about the same length (the block scheduler
    or a persistent walk balances them), and only one group's K/V is being read. Works on Python and DSL ints."""
    per_group = group * q_tiles
    g = t // per_group
    r = t - g * per_group
    size = imin(group, heads * batch - g * group)  # the last group may be smaller
    mi = r // size
    hb = g * group + (r - mi * size)
    return mi, hb % heads, hb // heads


def block_coords(bx, by, bz, heads_first: bool):
    """(q-tile index, head, batch) of the CTA at block index (bx, by, bz) of `grid`. Works on Python and DSL ints."""
    return (bz, bx, by) if heads_first else (bx, by, bz)


@dataclass
class PersistentWalk:
    """The tiles one CTA of a persistent grid visits: linear indices t = first, first + stride, ... below
    q_tiles x heads x batch, each decoded as the one-CTA-a-tile launch would (`grid`: the block index x fastest,
    or `grouped_coords`' place with `l2_groups`), so the walk keeps that launch's order. Works on Python and DSL
    ints (a dataclass of them: the DSL carries it through run-time loops like `schedules.walks.TileWalk`)."""

    q_tiles: object
    heads: object
    batch: object
    first: object  # this CTA's first tile (its block index) and the grid's CTA count
    stride: object

    def count(self):
        """Tiles this CTA visits (the grid has at most one CTA a tile: first < total)."""
        return (self.q_tiles * self.heads * self.batch - self.first + self.stride - 1) // self.stride

    def coords(self, i, heads_first: bool, group=None):
        """(q-tile index, head, batch) of this CTA's `i`-th tile: `grouped_coords` with `group` (`l2_groups`), else
        `block_coords` of its block index in `grid` (`heads_first`: a Python bool; a field would become a run-time
        value in the DSL's loops)."""
        return linear_coords(self.first + i * self.stride, self.q_tiles, self.heads, self.batch, heads_first, group)


def linear_coords(t, q_tiles, heads, batch, heads_first: bool, group=None):
    """(q-tile index, head, batch) of the t-th tile of the one-CTA-a-tile launch order (`grid`): `grouped_coords`
    with `group` (`l2_groups`), else `block_coords` of the t-th block index, x fastest. The tile of linear index t
    of a persistent walk, static (`PersistentWalk`) or dynamic (`next_tile`). Works on Python and DSL ints."""
    if group is not None:
        return grouped_coords(t, q_tiles, heads, batch, group)
    dx, dy = (heads, batch) if heads_first else (q_tiles, heads)
    return block_coords(t % dx, (t // dx) % dy, t // (dx * dy), heads_first)


def persistent_ctas(q_tiles, heads, batch, num_sms: int):
    """CTAs of a persistent grid (the kernel's launch): one per SM (227 KiB of smem a CTA), no more than there are
    tiles, counting at least one q tile as the one-CTA-a-tile grid does. Works on Python and DSL ints."""
    return imin(imax(q_tiles, 1) * heads * batch, num_sms)


def tile_coords(mi, h, b, q_tiles, reverse_m: bool):
    """(q tile, head, batch) of the CTA with q-tile index `mi` (`block_coords`): the index reversed with `reverse_m`
    (the causal longest-first order). Works on Python and DSL ints."""
    m = q_tiles - 1 - mi if reverse_m else mi
    return m, h, b


# --- the FP8 forward (`cute_kernels.attention.fp8_forward`): its config fields and their candidates ----------------
FP8_TILE_M = 128  # two consumer warpgroups of 64 rows: one 128-row scale block of Q per tile
FP8_SCALE_BLOCK = 128  # rows / keys per block scale
FP8_HEAD_DIMS = (64, 128, 256)
FP8_EXP2_POLY = (0, 2, 4, 8)  # every k-th column's exponential on the FMA pipe (0: none)


def fp8_quant_cta(d: int) -> dict:
    """The FP8 attention quantizer's CTA shape by head dim (`fp8_attn_quant` config: threads, cluster). At D = 256 one
    512-thread CTA a 128-row block holds 64 fp32 values a thread, one CTA an SM, its load / reduce / store phases in
    series: four 256-thread CTAs a block (32 rows each, the amax folded over the cluster) measured 72.3 % of copy
    against 60.5 % (H100, `perf/lab/fp8_quant_ab.py`, block + Hadamard, 2x8192x8x256). At D = 64 / 128 the
    clusters did not pay (D 64: 82.8 % one CTA, 56.8-77.3 % clustered; D 128: 79.3 % against 74.4-80.1 %)."""
    return {"threads": 256, "cluster": 4} if d == 256 else {"threads": 512, "cluster": 1}


def fp8_default_lazy(d: int) -> int:
    """The FP8 forward's `lazy_rescale` threshold by head dim: 7 at D = 256, where O's rescale is 128 multiplies a
    64-key block (H100, D 256 S 8k: 874 -> 954 TFLOP/s), 0 below (D 128: 842 -> 797, the vote and the folded unit
    cost more than the 64 multiplies they skip)."""
    return 7 if d == 256 else 0


def fp8_default_tile_n(d: int) -> int:
    """Keys per K/V block: 128 (one scale block), 64 at D = 256 (O's 128 fp32 registers a thread)."""
    return 64 if d == 256 else 128


def fp8_smem_bytes(d: int, tile_n: int, stages: int) -> int:
    """Q (128 x D) + per stage K, V and V^T (tile_n x D each), e4m3, plus the barriers."""
    return FP8_TILE_M * d + stages * 3 * tile_n * d + BARRIER_BYTES


def fp8_max_stages(d: int, tile_n: int) -> int:
    """Stages that fit (at most 4)."""
    s = 4
    while s > 1 and fp8_smem_bytes(d, tile_n, s) > SMEM_BYTES:
        s -= 1
    return s


def fp8_candidates(d: int, limit: int = 24) -> list[dict]:
    """The FP8 forward's configs worth timing at head dim d, the default first, then the default with the other
    `lazy_rescale` (7 where the default is 0 and back), then K/V block (dividing the 128-key scale block, at most 64
    at D = 256 for O's registers), stages (2 up to what fits), `exp2_poly`. Dicts of the catalogue entry's config
    fields (tile_n, stages, exp2_poly[, lazy_rescale])."""
    if d not in FP8_HEAD_DIMS:
        raise ValueError(f"FP8 attention head_dim must be one of {FP8_HEAD_DIMS}, got {d}")
    default = {"tile_n": fp8_default_tile_n(d), "stages": fp8_max_stages(d, fp8_default_tile_n(d)), "exp2_poly": 0}
    out = [default, {**default, "lazy_rescale": 0 if fp8_default_lazy(d) else 7}]
    for tile_n in ((64,) if d == 256 else (128, 64)):
        for stages in range(fp8_max_stages(d, tile_n), 1, -1):
            for poly in FP8_EXP2_POLY:
                c = {"tile_n": tile_n, "stages": stages, "exp2_poly": poly}
                if c not in out:
                    out.append(c)
    return out[:limit]
