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
  read it from global memory (L2) at the top of each K-block, before waiting for the stage. With
  the `sb_smem` option (cooperative tiles) the two consumer warpgroups instead copy the tile's
  B-scale rows (its 1 or 2 blocks x KB scales, up to `SB_SMEM_MAX_KB`) into shared memory once per
  tile, during the first K-block, and each K-block reads them with one LDS.

`BlockScales` is one consumer thread's view for one output tile: it knows which of the thread's
accumulator elements share a row (they share an A scale) and which 128-column block each element
is in (they share a B scale), both worked out when the kernel is traced from the MMA's partition of
an identity tensor for thread 0 (a thread's coordinates are thread 0's plus a per-thread offset, and
that offset never crosses an 8-row or 8-column group). Per K-block it loads one A scale per distinct
row (2 for a 64-row warpgroup) and one B scale per column block (1 or 2), forms their products, and
`promote` does acc[i] += temp[i] * scale[slot(i)]: one FFMA per accumulator element.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32

BLOCK = 128
SB_SMEM_MAX_KB = 512  # `sb_smem`: K-blocks of B scales a tile's smem row holds (K <= 65536)
SB_SMEM_THREADS = 256  # the cooperative tile's two consumer warpgroups load and share it


def smem_layout(tile_m: int, stages: int):
    """(tile_m, 1, stages): one fp32 A scale per tile row per stage (unswizzled, 512 B at tile_m 128)."""
    return cute.make_layout((tile_m, 1, stages), stride=(1, tile_m, tile_m))


def element_slots(tiled_mma: cute.TiledMma, tile_m: int, tile_n: int):
    """Trace-time tables for the accumulator elements of one thread: (rep, row_slot, col_slot,
    thresholds) where rep[j] is an element of row slot j and row_slot[i] the A-scale row slot of
    element i.

    tile_n dividing 128 or a multiple of it (every tile starts on a scale-block boundary):
    thresholds is None and col_slot[i] is the 128-column block (within the tile) of element i.
    Otherwise (`wide_tile`: 160, 192, ...) the tile starts at a runtime offset o = n0 % 128 inside
    its first scale block and spans two blocks; an 8-column group starting at tile column c is in
    the second block iff o >= 128 - c. col_slot[i] is then a column class and thresholds[c] the
    smallest o at which class c's columns are in the second block (0: always; BLOCK: never). o is
    a multiple of g = gcd(tile_n, 128), so thresholds are rounded up to multiples of g: 192 gives
    3 classes (cols 0-63 always block 0, 64-127 block 0 iff o = 0, 128-191 always block 1)."""
    c0 = tiled_mma.get_slice(0).partition_C(cute.make_identity_tensor((tile_m, tile_n)))
    rows, row_slot, cols, rep = [], [], [], []
    for i in range(cute.size(c0)):
        m, n = c0[i]
        m, n = int(m), int(n)
        if m not in rows:
            rows.append(m)
            rep.append(i)
        row_slot.append(rows.index(m))
        cols.append(n)
    if not wide_tile(tile_n):
        return tuple(rep), tuple(row_slot), tuple(n // BLOCK for n in cols), None
    thr = [second_block_threshold(n, tile_n) for n in cols]
    classes = sorted(set(thr))
    return tuple(rep), tuple(row_slot), tuple(classes.index(t) for t in thr), tuple(classes)


def second_block_threshold(col: int, tile_n: int) -> int:
    """Smallest tile offset o (= n0 % 128, a multiple of gcd(tile_n, 128)) at which tile column
    `col` lies in the tile's second scale block: 0 = always, BLOCK = never. A thread's columns are
    thread 0's plus < 8 inside the same 8-column group and o is a multiple of 16, so the group's
    first column decides for every thread."""
    g = math.gcd(tile_n, BLOCK)
    return min(BLOCK, max(0, -(-(BLOCK - (col - col % 8)) // g) * g))


def wide_tile(tile_n: int) -> bool:
    """tile_n neither divides 128 nor is a multiple of it: tiles start inside a scale block."""
    return BLOCK % tile_n != 0 and tile_n % BLOCK != 0


def spans_two_blocks(tile_n: int) -> bool:
    """Every tile of width tile_n (a multiple of 16) covers at most two 128-column scale blocks,
    whatever its start: the largest offset (128 - gcd) plus tile_n stays within 256 columns."""
    return tile_n % 16 == 0 and BLOCK - math.gcd(tile_n, BLOCK) + tile_n <= 2 * BLOCK


def sb_smem_layout(n_blocks: int):
    """(n_blocks, SB_SMEM_MAX_KB): the tile's B-scale rows in shared memory (`sb_smem`), the
    n_blocks scales of one K-block adjacent (one 32- or 64-bit LDS per K-block)."""
    return cute.make_layout((n_blocks, SB_SMEM_MAX_KB), stride=(1, n_blocks))


@dataclass(frozen=True)
class BlockScales:
    """A consumer thread's scales for one output tile (see the module docstring). Frozen: the
    mainloop's dynamic K loop then treats it as read-only (no loop-carried state).

    With `sSB` (the `sb_smem` option, cooperative tiles) the tile's B-scale rows live in shared
    memory: `load_row` (global loads, issued before the first K-block's wait) and `store_row`
    (after the first K-block's WGMMAs are issued: shared stores + the two warpgroups' barrier)
    stage them once per tile, and each K-block reads its scales with one LDS instead of an LDG."""

    rows: tuple  # this thread's tile rows, one per A-scale slot
    nbs: tuple  # the tile's B-scale blocks (N / 128 indices), one per column slot
    row_slot: tuple  # static: element -> row slot
    col_slot: tuple  # static: element -> column slot (block, or column class for wide tiles)
    sSA: cute.Tensor
    mSB: cute.Tensor
    batch: object  # the tile's batch index
    second: tuple = None  # wide tiles: per column class, Boolean "in the tile's second block"
    sSB: cute.Tensor = None  # sb_smem: (n_blocks, SB_SMEM_MAX_KB) shared buffer
    tid: object = None  # sb_smem: thread index among the SB_SMEM_THREADS loaders
    bar: object = None  # sb_smem: named barrier of the loaders
    k0: object = 0  # split-K: the first K-block of this unit (the mainloop counts its K-blocks from 0)
    # `k_interleave` with `sb_ahead`: the last K-block; a prefetch past it (a warpgroup whose next K-block does not
    # exist: the read-ahead of the last one, or warpgroup 1 of a one-K-block tile) reads that one instead
    k_last: object = None

    @staticmethod
    def create(tCcC: cute.Tensor, slots, sSA: cute.Tensor, mSB: cute.Tensor, n0, batch, sSB: cute.Tensor = None,
               tid=None, bar=None, k0=0) -> BlockScales:
        """slots: `element_slots(...)`; n0: the tile's first column; batch: its batch index;
        sSB / tid / bar: the sb_smem buffer (`sb_smem_layout`), this thread's index in [0, 256)
        and the named barrier of those 256 threads (None: sb read from global per K-block)."""
        rep, row_slot, col_slot, thresholds = slots
        last = cute.size(mSB, mode=[0]) - 1
        nb0 = n0 // BLOCK
        second = None
        if thresholds is None:
            # Column blocks past N (the tile's clipped part) read the last block's scale, unused.
            nbs = tuple(cutlass.min(nb0 + j, last) for j in range(max(col_slot) + 1))
        else:
            nbs = (nb0, cutlass.min(nb0 + 1, last))
            o = n0 - nb0 * BLOCK
            second = tuple(True if t == 0 else False if t >= BLOCK else o >= t for t in thresholds)
        return BlockScales(tuple(tCcC[i][0] for i in rep), nbs, row_slot, col_slot, sSA, mSB, batch, second,
                           sSB, tid, bar, k0)

    @property
    def n_blocks(self) -> int:
        return len(self.nbs)

    @property
    def n_cols(self) -> int:
        """Column slots per row slot: blocks, or column classes for wide tiles."""
        return self.n_blocks if self.second is None else len(self.second)

    @property
    def staged(self) -> bool:
        return self.sSB is not None

    def prefetch(self, k):
        """The B scales of K-block k: global loads (issue them before waiting for the stage), or,
        with sb_smem, just k (`fetch` reads the staged row)."""
        k = k + self.k0
        if cutlass.const_expr(self.k_last is not None):
            k = cutlass.min(k, self.k_last)
        if cutlass.const_expr(self.staged):
            v = cute.make_tensor(self.sSB.iterator + k * self.n_blocks, cute.make_layout(self.n_blocks)).load()
            return [v[j] for j in range(self.n_blocks)]
        return [self.mSB[nb, k, self.batch] for nb in self.nbs]

    def load_row(self):
        """sb_smem: this thread's share of the tile's B-scale rows (slots past KB hold K-block KB-1), as
        registers; None without sb_smem. Flat index f = tid + 256 u over (block, K-block) pairs."""
        if cutlass.const_expr(not self.staged):
            return None
        kb = cute.size(self.mSB, mode=[1])
        nblk = self.n_blocks
        vals = []
        for u in range(nblk * SB_SMEM_MAX_KB // SB_SMEM_THREADS):
            f = self.tid + SB_SMEM_THREADS * u
            j, k = f % nblk, f // nblk
            nb = self.nbs[0] if nblk == 1 else cutlass.min(self.nbs[0] + j, self.nbs[-1])
            # K-blocks past KB load K-block KB-1 (in bounds, same lines; never read back). No select:
            # ptxas would place it right after the load, waiting for it before the first K-block.
            vals.append(self.mSB[nb, cutlass.min(k, kb - 1), self.batch])
        return vals

    def store_row(self, vals):
        """sb_smem: write `load_row`'s values and wait for the 256 loaders (the K loop reads them
        after this). The previous tile's reads are done: the epilogue's barriers separate them."""
        if cutlass.const_expr(self.staged):
            flat = cute.make_tensor(self.sSB.iterator, cute.make_layout(cute.cosize(self.sSB.layout)))
            for u, v in enumerate(vals):
                flat[self.tid + SB_SMEM_THREADS * u] = v
            self.bar.arrive_and_wait()

    def load(self, sb, stage):
        """The raw scales of the K-block in `stage`: (A scales of the thread's rows, B scales of the
        tile's blocks), shared loads only (sb: `prefetch`'s result). `combine` multiplies them."""
        return [self.sSA[r, 0, stage] for r in self.rows], list(sb)

    def fetch(self, sb, stage):
        """Products sa[row] * sb[block] for every (row slot, column slot) of K-block in `stage`;
        for wide tiles the column class picks its block's product (one select per class and row
        whose block depends on the tile's offset)."""
        if cutlass.const_expr(self.second is None):  # load, multiply, per row (the PTX order since lesson 13)
            out = []
            for r in self.rows:
                a = self.sSA[r, 0, stage]
                out.extend(a * sb[j] for j in range(self.n_blocks))
            return out
        return self.combine(self.load(sb, stage))

    def combine(self, raw):
        """`load`'s raw scales -> the products `promote` takes (see `fetch`)."""
        sas, sb = raw
        out = []
        for a in sas:
            prod = [a * sb[j] for j in range(self.n_blocks)]
            if cutlass.const_expr(self.second is None):
                out.extend(prod)
            else:
                for sec in self.second:
                    if isinstance(sec, bool):
                        out.append(prod[1] if sec else prod[0])
                    else:
                        out.append(Float32(cutlass.select_(sec, prod[1], prod[0])))
        return out

    def promote(self, acc: cute.Tensor, temp: cute.Tensor, scales):
        """acc += temp * scale, element by element, on the CUDA cores."""
        for i in range(cute.size(acc)):
            s = scales[self.row_slot[i] * self.n_cols + self.col_slot[i]]
            acc[i] = acc[i] + temp[i] * s

    def promote_part(self, acc: cute.Tensor, temp: cute.Tensor, scales, to_acc: tuple):
        """`promote` for a part of the tile: acc[to_acc[i]] += temp[i] * its scale (`promote_halves`)."""
        for i in range(cute.size(temp)):
            j = to_acc[i]
            s = scales[self.row_slot[j] * self.n_cols + self.col_slot[j]]
            acc[j] = acc[j] + temp[i] * s
