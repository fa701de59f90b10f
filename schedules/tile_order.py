"""Tile order of a one-tile-per-CTA kernel (transposes): which tile the `t`-th CTA takes.

The hardware hands out CTAs in launch order (x fastest), so the tiles of CTAs with nearby indices
run at the same time; the order decides which memory the ~1,500-2,000 resident CTAs of an H200
touch together. For a transpose, tile (tm, tn) reads rows tm*T.. of x and writes rows tn*T.. of
out, one 128-byte segment per row on each side. Orders (`TileOrder.order`):

- "row": row-major over the tile grid (tn fastest), the plain 2-D grid. The resident CTAs cover a
  few whole tile-rows: their reads are one contiguous block, but their writes are a narrow column
  band (a few 128-byte segments) of every output row. For a power-of-two row stride (8192 bf16:
  16 KB) that spreads the writes thinly over the whole output.
- "grouped": groups of `group` tile-rows, tm fastest inside a group, then tn, then the next group
  (the GEMM's raster, `schedules.gemm.cluster_tile`). The resident CTAs cover `group` tile-rows x
  (resident / group) tile-columns: each output row they write gets a `group` x 128-byte segment
  (group 32: 4 KB, every dtype) and each input row a (resident / group) x 128-byte one. `group` 1
  is "row"; `group` >= the tile-rows is column-major.
- "diagonal": the classic partition-camping cure (CTA of row-major index (bx, by) takes tile
  ((bx + by) mod tiles_n, by), here in the rectangular form: tm = t mod tiles_m, tn = (t div
  tiles_m + tm) mod tiles_n). Consecutive CTAs walk a wrapped diagonal, one tile per tile-row and
  per tile-column: the resident CTAs touch every row band of both x and out, a few segments each.

Batch entries follow one another (the order restarts in each). `tile` works on Python ints (tests,
pictures) and on DSL Int32 values (kernels) alike; `tile_list` is the host mirror.
"""

from __future__ import annotations

from dataclasses import dataclass

from schedules.gemm import cluster_tile

ORDERS = ("row", "grouped", "diagonal")


@dataclass(frozen=True)
class TileOrder:
    order: str = "grouped"
    group: int = 32  # tile-rows per group ("grouped" only)

    def __post_init__(self):
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {self.order!r}")
        if self.group < 1:
            raise ValueError(f"group must be >= 1, got {self.group}")

    def __str__(self) -> str:
        return f"g{self.group}" if self.order == "grouped" else self.order[0]

    def tile(self, t, tiles_m, tiles_n):
        """(tm, tn, batch entry) of the `t`-th CTA (0 <= t < tiles_m * tiles_n * batch)."""
        if self.order == "grouped":
            return cluster_tile(t, tiles_m, tiles_n, self.group)
        per_batch = tiles_m * tiles_n
        b = t // per_batch
        r = t - b * per_batch
        if self.order == "row":  # = grouped with group 1, without its divisions by a runtime 1
            return r // tiles_n, r % tiles_n, b
        tm = r % tiles_m
        return tm, (r // tiles_m + tm) % tiles_n, b


def tile_list(tiles_m: int, tiles_n: int, batch: int, order: TileOrder) -> list[tuple[int, int, int]]:
    """Every tile in launch order (a permutation of the (tm, tn, batch) grid)."""
    return [order.tile(t, tiles_m, tiles_n) for t in range(tiles_m * tiles_n * batch)]


def picture(tiles_m: int, tiles_n: int, order: TileOrder, width: int = 3) -> str:
    """The launch index of every tile of one batch entry, laid out as the tile grid (for docs)."""
    idx = {}
    for t, (tm, tn, _) in enumerate(tile_list(tiles_m, tiles_n, 1, order)):
        idx[tm, tn] = t
    return "\n".join(" ".join(f"{idx[m, n]:>{width}}" for n in range(tiles_n)) for m in range(tiles_m))


# A CTA per 2 x 2 block of tiles (`sub=2`: 256-byte row runs on both sides, a quarter of the CTAs) for the
# TMA transpose of large matrices. Measured on the H200 (% of copy):
# fp32 16384^2 86.2 -> 90.3, 8192^2 89.8 -> 93.1, 4096x16384 89.9 -> 94.1; bf16 16384^2 86.6 -> 91.2,
# 4096x16384 93.1 -> 96.5, 8192^2 91.0 -> 93.1; below ~100 MiB a matrix it lost (bf16 4096^2 80.9 -> 76.5,
# fp32 4096^2 93.7 -> 91.6) or tied (batches of small matrices). The non-TMA variants ran slower with it.
SUB2_MIN_BYTES = 96 << 20


def transpose_sub(variant: str, rows: int, cols: int, elem_bytes: int) -> int:
    """Tiles per side of a CTA's block for one (rows, cols) matrix of the transpose: 2 for the TMA variant
    on a matrix of at least SUB2_MIN_BYTES, else 1."""
    return 2 if variant == "tma" and rows * cols * elem_bytes >= SUB2_MIN_BYTES else 1


def persistent_ctas_per_sm(sub: int, tile_bytes: int = 4096, smem_bytes: int = 227 << 10) -> int:
    """Resident CTAs per SM of the persistent TMA transpose: its shared memory is two load stages and two
    store buffers of sub x sub tiles (4 x sub^2 x 4 KiB), at most 8 CTAs (a quarter of the SM's threads)."""
    return max(1, min(8, smem_bytes // (4 * sub * sub * tile_bytes + 1024)))

