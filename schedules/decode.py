"""Decode-attention schedules: how many CTAs share one (batch, KV head)'s keys (split-KV), and each CTA's tiles.

With one query (or a few: speculative decoding) per sequence there is no parallelism along the queries. The
q_len x (H_q / H_kv) query rows that read one KV head are packed into the MMA's M dimension (GQA packing: 64
rows a tile, `m_tiles` tiles when there are more), so a CTA covers a (batch, KV head, row tile); that gives
B x H_kv x m_tiles CTAs, far fewer than the SMs at small batch. Split-KV (flash decoding) cuts each sequence's
key blocks into `splits` contiguous ranges, one CTA each, every CTA writing a partial (O, LSE) in fp32; the
attention-state merge combines them (`cute_kernels.attention.merge`).

The kernel is memory-bound (K and V are read once: 2 * L * D * 2 bytes per KV head at bf16, against 4 L D g
FLOPs, g query rows), so the schedule is about keeping bytes in flight: one producer warp streams K and V
tiles by TMA through `stages` smem buffers, one consumer warpgroup computes. A CTA holds 64 KiB a stage at
tile_n 128, D 128 (bf16 K + V), three stages: one CTA an SM, 192 KiB in flight.

`choose_splits` is the split model, from the static shapes only (B, H_kv, the cache's key capacity, q_len) and
the SM count, so a CUDA graph and `torch.compile` see one launch per shape: enough CTAs to fill every SM
once (`waves`), but no split shorter than `min_tiles` key tiles (each split pays a pipeline fill and writes D + 1
fp32 per row, and the merge reads them back).
"""

from __future__ import annotations

from dataclasses import dataclass

from schedules.hardware import num_sms as _num_sms

DECODE_HEAD_DIMS = (64, 128, 256)
MAX_SPLITS = 128
MAX_Q_LEN = 16
MAX_GROUP = 16
ROWS_PER_TILE = 64  # the WGMMA's M: packed query rows per CTA
SWAP_ROWS = (0, 8, 16)  # DecodeSchedule.swap_rows: off, or the WGMMA's N
PAGE_SIZES = tuple(16 * k for k in range(1, 17))  # 16 .. 256, multiples of 16


@dataclass(frozen=True)
class DecodeSchedule:
    """tile_n: keys per K/V tile (one WGMMA N); stages: K/V smem buffers (0: as many as fit);
    min_tiles: the shortest split `choose_splits` makes, in tiles (2: at B1 L4k 16 splits of 2 tiles measured
    14.8 us, 8 of 4 15.5); waves: CTAs per SM it aims for;
    fused_merge: with splits, the last split to finish of each (row tile, KV head, batch) merges the partials (a
    counter per (batch, KV head, row tile)) instead of the merge kernel (`merge.MergeStates`, launched as a
    programmatic dependent). Measured slower (B1 L32k 42.7 against 40.7 us): the last CTA's release fence, counter
    add and acquire sit on the path, where the dependent merge's CTAs are resident and waiting.
    swap_rows: 0, or 8 / 16: swapped operands for at most that many packed query rows (q_len x g). The keys go in
    the WGMMA's M and the rows in N (S^T = K Q^T, O^T = V^T P^T): K and V are the A operand, loaded from the stage
    ring into registers (an FP8 cache widened there, no fp16 tile in smem), and P^T goes through a small smem tile.
    A tile of 128 keys then costs 2 x (128 x rows x D) MMA work instead of 2 x (64 x 128 x D) with 60 of the 64
    rows padding, and the softmax's row max crosses the warpgroup's four warps (`warpgroup_column_reduce`)."""

    tile_n: int = 128
    stages: int = 0
    min_tiles: int = 2
    waves: int = 1
    fused_merge: bool = False
    swap_rows: int = 0

    def __post_init__(self):
        if self.tile_n not in (64, 128):
            raise ValueError(f"DecodeSchedule.tile_n must be 64 or 128, got {self.tile_n}")
        if self.stages < 0 or self.stages > 8:
            raise ValueError(f"DecodeSchedule.stages must be 0 (as many as fit) to 8, got {self.stages}")
        if self.min_tiles < 1 or self.waves < 1:
            raise ValueError("DecodeSchedule.min_tiles and waves must be >= 1")
        if self.swap_rows not in SWAP_ROWS:
            raise ValueError(f"DecodeSchedule.swap_rows must be one of {SWAP_ROWS}, got {self.swap_rows}")

    @property
    def rows_per_tile(self) -> int:
        """Packed query rows a CTA covers: the WGMMA's N with swapped operands, else its M (64)."""
        return self.swap_rows or ROWS_PER_TILE

    threads = 160  # warps 0-3: the consumer warpgroup; warp 4: the producer (one CTA an SM: no register budgets)

    def stage_bytes(self, head_dim: int, elem_bytes: int) -> int:
        return 2 * self.tile_n * head_dim * elem_bytes

    def fixed_bytes(self, head_dim: int, elem_bytes: int) -> int:
        """Beside the stage ring: Q's (64, D) fp16 / bf16 tile, and with an FP8 cache (1-byte elements) the fp16 K
        and V tiles the consumer widens each stage into. Swapped operands: Q^T's (swap_rows, D) tile, P^T's
        (swap_rows, tile_n) and the column reduction's slots."""
        if self.swap_rows:
            return self.swap_rows * (head_dim + self.tile_n) * 2 + 16 * self.swap_rows * 4
        widened = 2 * self.tile_n * head_dim * 2 if elem_bytes == 1 else 0
        return ROWS_PER_TILE * head_dim * 2 + widened

    def num_stages(self, head_dim: int, elem_bytes: int, smem_limit: int = 227 * 1024) -> int:
        """The stages given, or as many as fit next to the fixed tiles (at most 8)."""
        if self.stages:
            return self.stages
        free = smem_limit - self.fixed_bytes(head_dim, elem_bytes) - 2048
        return max(1, min(8, free // self.stage_bytes(head_dim, elem_bytes)))

    def smem_bytes(self, head_dim: int, elem_bytes: int) -> int:
        return self.fixed_bytes(head_dim, elem_bytes) + self.num_stages(head_dim, elem_bytes) * self.stage_bytes(
            head_dim, elem_bytes) + 1024

    def fits(self, head_dim: int, elem_bytes: int = 2) -> bool:
        return self.smem_bytes(head_dim, elem_bytes) <= 227 * 1024


def m_tiles(q_len: int, group: int, rows_per_tile: int = ROWS_PER_TILE) -> int:
    """Row tiles of `rows_per_tile` packed query rows (q_len x group of them)."""
    return max(1, -(-q_len * group // rows_per_tile))


def swap_rows_for(q_len: int, group: int) -> int:
    """The swapped-operand width for q_len x group packed rows: 8 or 16, or 0 (rows in M) past 16."""
    packed = q_len * group
    return 8 if packed <= 8 else 16 if packed <= 16 else 0


def choose_splits(batch: int, kv_heads: int, max_keys: int, q_len: int, group: int,
                  schedule: DecodeSchedule = DecodeSchedule(), sms: int | None = None) -> int:
    """Splits per (batch, KV head) from static shapes: the CTAs without splits are B x H_kv x m_tiles; split
    while they fit in `waves` x the SMs (one CTA an SM: its smem), never below `min_tiles` key tiles a split (of
    the cache's capacity `max_keys`: L_max, or the block table's pages x page size), at most MAX_SPLITS."""
    sms = sms if sms is not None else _num_sms()
    base = max(1, batch * kv_heads * m_tiles(q_len, group))
    tiles = max(1, -(-max_keys // schedule.tile_n))
    if 4 * base >= 3 * schedule.waves * sms:  # three quarters of the SMs busy already: a split only adds the merge
        return 1
    want = schedule.waves * sms // base  # whole waves: a CTA past the last SM would wait for a whole CTA's time
    return int(max(1, min(want, tiles // schedule.min_tiles, MAX_SPLITS)))


def default_decode_schedule(head_dim: int, fp8: bool = False, q_len: int = 1, group: int = 1) -> DecodeSchedule:
    """128-key tiles up to D = 128, 64 above; an FP8 cache with at most 16 packed rows and D >= 128 takes swapped
    operands (its K and V widened in registers: no fp16 tiles through smem, 1/8 the MMA work)."""
    swap = swap_rows_for(q_len, group) if fp8 and head_dim >= 128 else 0
    return DecodeSchedule(tile_n=128 if head_dim <= 128 else 64, swap_rows=swap)


def split_table(shapes, schedule: DecodeSchedule = DecodeSchedule(), sms: int = 132) -> list[dict]:
    """The split model's choice for each (B, L, H_kv, q_len, group) of `shapes`: the table `cute-kernels schedules
    decode` prints and the docs show."""
    rows = []
    for b, length, hk, q_len, group in shapes:
        s = choose_splits(b, hk, length, q_len, group, schedule, sms)
        tiles = -(-length // schedule.tile_n)
        rows.append(dict(batch=b, keys=length, kv_heads=hk, q_len=q_len, group=group,
                         ctas=b * hk * m_tiles(q_len, group) * s, splits=s, tiles_per_split=-(-tiles // s)))
    return rows


def decode_candidates(head_dim: int) -> list[DecodeSchedule]:
    """The schedules a search tries: both tile widths, two to four stages (or as many as fit), a few split
    granularities."""
    out = []
    for tile_n in (64, 128):
        for stages in (0, 2, 3, 4):
            for min_tiles in (2, 4, 8):
                s = DecodeSchedule(tile_n=tile_n, stages=stages, min_tiles=min_tiles)
                if s.fits(head_dim):
                    out.append(s)
    out.append(DecodeSchedule(tile_n=128 if head_dim <= 128 else 64, fused_merge=True))
    return out


# --- the attention-state merge ---------------------------------------------------------------------------------
MERGE_VEC = 4  # O elements per thread and state: one 16-byte fp32 vector
MERGE_MAX_CHUNK = 8
MERGE_MAX_LANES = 32  # a row's state lanes share a warp (their partial states combine by shuffles)


@dataclass(frozen=True)
class MergeSchedule:
    """How `merge.MergeStates` spreads a row's N states over threads. Each of a row's D / 4 vector columns is
    held by `lanes` threads (1-32, a power of two, in one warp); lane p takes states p, p + lanes, ... and issues
    the loads of `chunk` of them (1-8, a power of two) together, so a thread waits for ceil(N / (lanes chunk))
    round trips; the lanes' partial states combine by butterfly shuffles. Many rows (merge_many over a long
    sequence): one lane, the chunk covering N. Few rows with many states (a split decode's partials: B1 L32k merges
    16 states of 32 rows): several lanes, so one round trip reads every state and more SMs take part."""

    lanes: int = 1
    chunk: int = 4

    def __post_init__(self):
        if self.lanes not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"MergeSchedule.lanes must be a power of two from 1 to 32, got {self.lanes}")
        if self.chunk not in (1, 2, 4, 8):
            raise ValueError(f"MergeSchedule.chunk must be 1, 2, 4 or 8, got {self.chunk}")

    def row_threads(self, head_dim: int) -> int:
        return self.lanes * (head_dim // MERGE_VEC)

    def threads(self, head_dim: int) -> int:
        """A CTA: at least 128 threads, whole rows."""
        return max(128, self.row_threads(head_dim))

    def fits(self, head_dim: int) -> bool:
        return head_dim % MERGE_VEC == 0 and self.row_threads(head_dim) <= 1024


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def choose_merge(states: int, rows: int, head_dim: int, sms: int | None = None) -> MergeSchedule:
    """The merge's schedule from static shapes: the chunk covers the states (at most 8), and while the rows alone
    give fewer than 512 threads an SM, more lanes share each row (up to one round trip for all states)."""
    sms = sms if sms is not None else _num_sms()
    chunk = min(MERGE_MAX_CHUNK, _pow2_at_least(max(states, 1)))
    tpr = max(1, head_dim // MERGE_VEC)
    lanes = 1
    while (lanes < MERGE_MAX_LANES and lanes * chunk < states and rows * tpr * lanes < 512 * sms
           and 2 * lanes * tpr <= 1024):
        lanes *= 2
    return MergeSchedule(lanes=lanes, chunk=chunk)
