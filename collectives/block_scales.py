"""Block scales of an FP8 GEMM (DeepGEMM's recipe): D = sum over K-blocks kb of
sa[m, kb] * sb[n // 128, kb] * (A[m, kb-block] @ B[n, kb-block]^T).

Scale layouts, as the kernel reads them:

* sa: one fp32 per (row, 128-wide K-block), stored (M, KB, L) with unit stride along M and the
  K-block stride padded to a multiple of 4 elements (16 bytes, TMA's rule) -- DeepGEMM's
  "MN-major, TMA-aligned" layout. A tile's `tile_m` scales of one K-block are then one contiguous
  TMA box, loaded by the producer into the same pipeline stage (and on the same full barrier) as
  the A and B boxes of that K-block: `smem_layout` + `collectives.tma_pipeline.operand_tma`.
* sb: one fp32 per (128-row N-block, K-block), (NB, KB, L), any strides. It is tiny (a 7168 x 7168
  weight has 56 x 56 scales) and each warp needs the same one or two values, so consumer threads
  read it from global memory (L2) at the top of each K-block, before waiting for the stage.

`BlockScales` is one consumer thread's view for one output tile: it knows which of the thread's
accumulator elements share a row (they share an A scale) and which 128-column block each element
is in (they share a B scale), both worked out when the kernel is traced from the MMA's partition of
an identity tensor for thread 0 (a thread's coordinates are thread 0's plus a per-thread offset, and
that offset never crosses an 8-row or 8-column group). Per K-block it loads one A scale per distinct
row (2 for a 64-row warpgroup) and one B scale per column block (1 or 2), forms their products, and
`promote` does acc[i] += temp[i] * scale[slot(i)]: one FFMA per accumulator element.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute

BLOCK = 128


def smem_layout(tile_m: int, stages: int):
    """(tile_m, 1, stages): one fp32 A scale per tile row per stage (unswizzled, 512 B at tile_m 128)."""
    return cute.make_layout((tile_m, 1, stages), stride=(1, tile_m, tile_m))


def element_slots(tiled_mma: cute.TiledMma, tile_m: int, tile_n: int):
    """Trace-time tables for the accumulator elements of one thread: (rep, row_slot, col_slot) where
    rep[j] is an element of row slot j, row_slot[i] / col_slot[i] the A-scale row slot and the
    128-column block (within the tile) of element i."""
    c0 = tiled_mma.get_slice(0).partition_C(cute.make_identity_tensor((tile_m, tile_n)))
    rows, row_slot, col_slot, rep = [], [], [], []
    for i in range(cute.size(c0)):
        m, n = c0[i]
        m, n = int(m), int(n)
        if m not in rows:
            rows.append(m)
            rep.append(i)
        row_slot.append(rows.index(m))
        col_slot.append(n // BLOCK)
    return tuple(rep), tuple(row_slot), tuple(col_slot)


@dataclass(frozen=True)
class BlockScales:
    """A consumer thread's scales for one output tile (see the module docstring). Frozen: the
    mainloop's dynamic K loop then treats it as read-only (no loop-carried state)."""

    rows: tuple  # this thread's tile rows, one per A-scale slot
    nbs: tuple  # the tile's B-scale blocks (N / 128 indices), one per column slot
    row_slot: tuple  # static: element -> row slot
    col_slot: tuple  # static: element -> column slot
    sSA: cute.Tensor
    mSB: cute.Tensor
    batch: object  # the tile's batch index

    @staticmethod
    def create(tCcC: cute.Tensor, slots, sSA: cute.Tensor, mSB: cute.Tensor, n0, batch) -> BlockScales:
        """slots: `element_slots(...)`; n0: the tile's first column; batch: its batch index."""
        rep, row_slot, col_slot = slots
        last = cute.size(mSB, mode=[0]) - 1
        nb0 = n0 // BLOCK
        # Column blocks past N (the tile's clipped part) read the last block's scale, unused.
        nbs = tuple(cutlass.min(nb0 + j, last) for j in range(max(col_slot) + 1))
        return BlockScales(tuple(tCcC[i][0] for i in rep), nbs, row_slot, col_slot, sSA, mSB, batch)

    @property
    def n_blocks(self) -> int:
        return len(self.nbs)

    def prefetch(self, k):
        """The B scales of K-block k (global loads; issue them before waiting for the stage)."""
        return [self.mSB[nb, k, self.batch] for nb in self.nbs]

    def fetch(self, sb, stage):
        """Products sa[row] * sb[block] for every (row slot, column block) of K-block in `stage`."""
        out = []
        for r in self.rows:
            a = self.sSA[r, 0, stage]
            for j in range(self.n_blocks):
                out.append(a * sb[j])
        return out

    def promote(self, acc: cute.Tensor, temp: cute.Tensor, scales):
        """acc += temp * scale, element by element, on the CUDA cores."""
        for i in range(cute.size(acc)):
            s = scales[self.row_slot[i] * self.n_blocks + self.col_slot[i]]
            acc[i] = acc[i] + temp[i] * s
