"""Attention schedules (issue 6): who computes which Q tile of which head, with which warps, when.

An `AttentionSchedule` fixes the *when and where* of a FlashAttention forward on Hopper, none of
the *how* (that is `collectives/`: the TMA pipeline, WGMMA, the masks, the online softmax):

* `kind="fa3"` (warp-specialized, FlashAttention-3): warpgroup 0 is the producer (one warp issues
  the TMA loads: the Q tile once, then K and V blocks through two rings of `stages` swizzled smem
  buffers; it gives its registers away with `setmaxnreg.dec` to `producer_regs`); warpgroups
  1..`consumer_wgs` are consumers, each owning 64 rows of the `tile_m`-row Q tile
  (`setmaxnreg.inc` to `consumer_regs`). Per K/V block a consumer computes S = Q K^T (WGMMA, both
  operands in smem), masks and folds S into its online-softmax state (m, l) in registers, and adds
  P V into its O accumulator (WGMMA with P from registers). Named barriers take the consumers'
  GEMMs in turn (`pingpong`), so one warpgroup's softmax runs under the other's tensor-core work.
* `kind="fa2"` (sliced Q, no warp specialization): planned; the same tile walk.
* the tile walk: one CTA per (q tile, head, batch), grid (q_tiles, H_q, B). With a causal mask the
  q tiles are visited last-first (`reverse_m`): the CTAs of the longest rows (the most K/V blocks)
  start first, a cheap longest-processing-time order. A persistent LPT scheduler comes later.

Registers: 24 + 2 x 240 = 504 <= 512 per thread-slot of the 64K file for 384 threads (FA3's
budget); three consumer warpgroups would be 32 + 3 x 160.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

SMEM_BYTES = 232448  # usable dynamic shared memory per CTA on sm_90 (227 KiB)
BARRIER_BYTES = 1024  # mbarriers and alignment slack
KINDS = ("fa3",)  # "fa2" planned
HEAD_DIMS = (64, 96, 128, 192, 256)


@dataclass(frozen=True)
class AttentionSchedule:
    kind: str = "fa3"
    tile_m: int = 128  # Q rows per CTA (64 per consumer warpgroup)
    tile_n: int = 128  # K/V rows per pipeline stage
    stages: int = 0  # K/V stages; 0 = as many as fit (at most 4)
    consumer_wgs: int = 2
    pingpong: bool = True  # named barriers alternate the consumers' GEMMs
    producer_regs: int = 24
    consumer_regs: int = 240

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.consumer_wgs != 2:
            raise ValueError(f"consumer_wgs must be 2 (3 is planned), got {self.consumer_wgs}")
        if self.tile_m != 64 * self.consumer_wgs:
            raise ValueError(f"tile_m must be 64 x consumer_wgs = {64 * self.consumer_wgs}, got {self.tile_m}")
        if self.tile_n % 16 or not 16 <= self.tile_n <= 256:
            raise ValueError(f"tile_n must be a multiple of 16 in [16, 256], got {self.tile_n}")
        if self.producer_regs + self.consumer_wgs * self.consumer_regs > 512 or self.producer_regs % 8 \
                or self.consumer_regs % 8 or self.producer_regs < 24 or self.consumer_regs > 256:
            raise ValueError("register budget: producer + consumers x consumer_regs <= 512 per thread, "
                             "multiples of 8 in [24, 256]")

    # --- warp roles ---------------------------------------------------------------------------
    @property
    def threads(self) -> int:
        return 128 * (1 + self.consumer_wgs)

    # --- registers (fp32 values per consumer thread) ------------------------------------------
    def accumulators(self, head_dim: int) -> int:
        """S (64 x tile_n) and O (64 x head_dim) fp32 accumulators + P (bf16 pairs) per thread."""
        return self.tile_n // 2 + head_dim // 2 + self.tile_n // 4

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
        free = SMEM_BYTES - BARRIER_BYTES - self.q_bytes(head_dim, elem)
        return max(2, min(4, free // self.kv_stage_bytes(head_dim, elem)))

    def smem_bytes(self, head_dim: int, elem: int = 2) -> int:
        return (self.q_bytes(head_dim, elem) + self.num_stages(head_dim, elem) * self.kv_stage_bytes(head_dim, elem)
                + BARRIER_BYTES)

    def fits(self, head_dim: int, elem: int = 2) -> bool:
        return self.smem_bytes(head_dim, elem) <= SMEM_BYTES and self.accumulators(head_dim) <= 192

    def __str__(self) -> str:
        pp = "pp" if self.pingpong else "nopp"
        return f"{self.kind}_{self.tile_m}x{self.tile_n}_s{self.stages}_wg{self.consumer_wgs}_{pp}"


# Tile sizes per head dim (FA3's choices where the registers allow: O and S both live in registers,
# so the K/V block shrinks as the head dim grows).
_TILE_N = {64: 128, 96: 128, 128: 128, 192: 96, 256: 80}


@functools.lru_cache(maxsize=64)
def default_schedule(head_dim: int, causal: bool = False) -> AttentionSchedule:
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {head_dim}")
    return AttentionSchedule(tile_n=_TILE_N[head_dim])


def candidates(head_dim: int) -> list[AttentionSchedule]:
    """Schedules worth timing for one head dim (`cute-kernels schedules attention`, planned)."""
    out = []
    for tn in (64, 80, 96, 112, 128, 160, 176, 192):
        for pp in (True, False):
            s = AttentionSchedule(tile_n=tn, pingpong=pp)
            if s.fits(head_dim):
                out.append(s)
    d = default_schedule(head_dim)
    out.sort(key=lambda s: (s != d, -s.tile_n))
    return out


# --- the tile walk ----------------------------------------------------------------------------
def grid(seqlen_q: int, heads: int, batch: int, s: AttentionSchedule) -> tuple[int, int, int]:
    return (max(1, -(-seqlen_q // s.tile_m)), heads, batch)


def tile_coords(bx, by, bz, q_tiles, reverse_m: bool):
    """(q tile, head, batch) of the CTA at block index (bx, by, bz). Works on Python and DSL ints."""
    m = q_tiles - 1 - bx if reverse_m else bx
    return m, by, bz
