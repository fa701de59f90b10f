"""Bulk-chunk schedule: one CTA per contiguous chunk of a flat buffer, moved by the TMA unit.

The buffer's 16-byte-aligned part is cut into chunks of `chunk_bytes` (the last one shorter); CTA b
owns chunk b: one thread issues `pieces` bulk loads (`cp.async.bulk` global -> shared memory, each
piece completing on its own mbarrier) and, as each piece lands, its bulk store (shared -> global).
There is no loop: a grid of ceil(aligned bytes / chunk_bytes) CTAs, spread by the hardware block
scheduler. Each CTA holds `chunk_bytes` of shared memory, which bounds the CTAs resident per SM.

The point is latency, not bandwidth: at 1 MiB a grid-stride copy is one DRAM round trip per thread
and its dependent address arithmetic (`docs/kernels/elementwise.md`, "Gaps still open"); here each CTA
makes one request of `chunk_bytes / pieces` bytes per piece.
"""

from __future__ import annotations

from dataclasses import dataclass

CHUNKS = (2048, 4096, 8192, 16384, 32768)
PIECES = (1, 2, 4)


@dataclass(frozen=True)
class BulkChunks:
    chunk_bytes: int = 8192
    pieces: int = 1

    def __post_init__(self):
        if self.chunk_bytes not in CHUNKS:
            raise ValueError(f"chunk_bytes must be one of {CHUNKS}, got {self.chunk_bytes}")
        if self.pieces not in PIECES:
            raise ValueError(f"pieces must be one of {PIECES}, got {self.pieces}")

    def __str__(self) -> str:
        return f"bulk{self.chunk_bytes // 1024}k" + (f"p{self.pieces}" if self.pieces > 1 else "")

    def grid(self, nbytes: int) -> int:
        """CTAs for a buffer of `nbytes` (the 16-byte-aligned part in chunks; one CTA at least,
        which then does only the scalar tail)."""
        return max(1, -(-(nbytes // 16 * 16) // self.chunk_bytes))


# Size classes (bytes per tensor, upper bound exclusive) in which an op takes the bulk schedule
# instead of `schedules.grid_stride.pick`'s. Empty until measured on the H200: `python3 -m perf.small
# --ops copy` times the bulk schedules beside the grid-stride ones, the elementwise bench suite has
# an "ours bulk" column.
SIZE_CLASSES: dict[str, tuple[tuple[int, int, BulkChunks], ...]] = {}


def pick(op: str, tensor_bytes: int) -> BulkChunks | None:
    """The bulk schedule for `op` on tensors of `tensor_bytes` bytes each, or None (grid-stride)."""
    for lo, hi, cls in SIZE_CLASSES.get(op, ()):
        if lo <= tensor_bytes < hi:
            return cls
    return None
