"""The device-wide ordering pieces of the voxel kernels: a stable LSD radix sort of int32 (key, value) pairs, the
column scan its passes share with the numbering scans, and the numbering of marked items in order (segment heads of
the sorted keys, first points of the voxels). Integer arithmetic only, no atomics: the same result on every run.

Items are cut into tiles of `warps` x `rounds` x 32 (one CTA each); warp w of a tile walks `rounds` rounds of 32
consecutive items in order, so (tile, warp, round, lane) is the items' order and every ranking below is stable.

Radix pass p (digit = (key >> p D) & (2^D - 1)), three kernels as `moe.layouts`' counting sort, with a parallel scan:
1. histogram: each warp counts its items per digit (`match.any` finds a round's lanes of one digit; their lowest lane
   adds the popcount into the warp's own shared row), the CTA's sums go to counts (2^D, tiles), digit-major;
2. column scan (`TileScan`, a CTA a digit): each tile's base per digit, the digit totals;
3. scatter: each digit's base (an exclusive scan of the totals), each warp's base (the tile's, plus the warps before
   it), then the warps walk their rounds in order; an item lands at its digit's running base plus its rank among the
   round's lanes of its digit.
A pass whose digit is the same for every item (its column total is n) is skipped: `state[p]` records it, and each
kernel finds its input among the two ping-pong rows of keys / vals (2, n) from the passes that ran before it
(`source_row`). After the last pass the sorted pairs are in row `source_row(state, passes)`.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from collectives import pdl
from collectives.scan import cta_exclusive_sum, cta_scan_slots
from collectives.vector_io import extent

FULL = 0xFFFFFFFF
# state[p]: radix pass p skipped (p < 4); state[6]: the out-of-range key; state[7]: the keys overflowed int32 (scatter)
STATE_SLOTS, SENTINEL_SLOT, OVERFLOW_SLOT = 8, 6, 7


@cute.jit
def source_row(state: cute.Tensor, pass_idx: Int32) -> Int32:
    """The row of the ping-pong buffers that pass `pass_idx` reads: the passes before it that ran, mod 2."""
    ran = Int32(0)
    for q in cutlass.range(pass_idx, unroll=1):
        ran = ran + (Int32(1) - state[q])
    return ran % 2


class TileScan:
    """Exclusive prefix sums along each row of a (cols, tiles) int32 count matrix, in place, one CTA a row (each
    thread sums `per_thread` consecutive tiles, `collectives.scan` scans the CTA, a carry crosses the chunks);
    totals[col] = the row's sum. With `pass_idx` >= 0 a row whose total is `n` marks radix pass `pass_idx` skipped."""

    def __init__(self, threads: int = 256, per_thread: int = 4):
        self.threads, self.per_thread = threads, per_thread

    @cute.jit
    def scan(self, counts: cute.Tensor, totals: cute.Tensor, state: cute.Tensor, pass_idx: Int32, n: Int32, stream):
        self.scan_kernel(counts, totals, state, pass_idx, n).launch(
            grid=[extent(counts, 0), 1, 1], block=[self.threads, 1, 1], stream=stream, use_pdl=pdl.LAUNCH
        )

    @cute.kernel
    def scan_kernel(self, counts: cute.Tensor, totals: cute.Tensor, state: cute.Tensor, pass_idx: Int32, n: Int32):
        pdl.enter()  # (launched as a programmatic dependent: collectives.pdl)
        tidx, _, _ = cute.arch.thread_idx()
        col, _, _ = cute.arch.block_idx()
        tiles = extent(counts, 1)
        smem = cutlass.memory.SmemAllocator()
        slots = smem.allocate_tensor(Int32, cute.make_layout(cta_scan_slots(self.threads)), byte_alignment=16)
        vals = cute.make_rmem_tensor((self.per_thread,), Int32)
        chunk = self.threads * self.per_thread
        carry = Int32(0)
        for t0 in cutlass.range(0, tiles, chunk, unroll=1):
            first = t0 + tidx * self.per_thread
            mine = Int32(0)
            for j in cutlass.range_constexpr(self.per_thread):
                x = Int32(0)
                if first + j < tiles:
                    x = counts[col, first + j]
                vals[j] = x
                mine = mine + x
            before, total = cta_exclusive_sum(mine, slots, self.threads)
            run = carry + before
            for j in cutlass.range_constexpr(self.per_thread):
                if first + j < tiles:
                    counts[col, first + j] = run
                run = run + vals[j]
            carry = carry + total
        if tidx == 0:
            totals[col] = carry
            if (pass_idx >= 0) & (carry == n):
                state[pass_idx] = Int32(1)


class RadixSort:
    """A stable LSD radix sort of the pairs (keys[row, i], vals[row, i]) by the key's low `passes` x `digit_bits`
    bits (keys >= 0), ping-ponging between the two rows of keys / vals (2, n) (module doc). The caller fills row 0
    and, for `counted_first`, pass 0's tile histogram too (the kernel that makes the keys counts them as it goes)."""

    def __init__(self, digit_bits: int = 8, warps: int = 8, rounds: int = 8):
        if not 1 <= digit_bits <= 9:
            raise ValueError(f"digit_bits must be in [1, 9], got {digit_bits}")
        self.digit_bits, self.radix, self.mask = digit_bits, 1 << digit_bits, (1 << digit_bits) - 1
        self.warps, self.rounds = warps, rounds
        self.threads = 32 * warps
        self.tile = self.threads * rounds
        self.scanner = TileScan()

    def tiles(self, n):
        return (n + self.tile - 1) // self.tile

    @cute.jit
    def run(
        self,
        keys: cute.Tensor,
        vals: cute.Tensor,
        counts: cute.Tensor,
        totals: cute.Tensor,
        state: cute.Tensor,
        passes: cutlass.Constexpr[int],
        counted_first: cutlass.Constexpr[bool],
        stream,
    ):
        """counts (2^D, tiles), totals (2^D,), state (STATE_SLOTS,) zeroed (passes' skip marks)."""
        n = extent(keys, 1)
        tiles = cutlass.max(self.tiles(n), 1)
        for p in cutlass.range_constexpr(passes):
            shift = Int32(p * self.digit_bits)
            if cutlass.const_expr(p > 0 or not counted_first):
                self.hist_kernel(keys, counts, state, shift, Int32(p)).launch(
                    grid=[tiles, 1, 1], block=[self.threads, 1, 1], stream=stream, use_pdl=pdl.LAUNCH
                )
            self.scanner.scan(counts, totals, state, Int32(p), n, stream)
            self.scatter_kernel(keys, vals, counts, totals, state, shift, Int32(p)).launch(
                grid=[tiles, 1, 1], block=[self.threads, 1, 1], stream=stream, use_pdl=pdl.LAUNCH
            )

    # --- shared by the kernels that count digits (also the key kernels' pass-0 histogram) ----------------------
    def counter_smem(self, smem):
        """The per-warp digit counters (warps, 2^D) in shared memory."""
        return smem.allocate_tensor(
            Int32, cute.make_layout((self.warps, self.radix), stride=(self.radix, 1)), byte_alignment=16
        )

    @cute.jit
    def zero_row(self, cnt: cute.Tensor, warp: Int32, lane: Int32):
        for d in cutlass.range(lane, self.radix, 32, unroll=1):
            cnt[warp, d] = Int32(0)
        cute.arch.sync_warp()

    @cute.jit
    def count_digit(self, x: Int32, cnt: cute.Tensor, warp: Int32):
        """One round: the lanes' digits (-1: no item) added into the warp's row, by the lowest lane of each digit."""
        peers = cute.arch.match_sync(FULL, x)
        lower = peers & cute.arch.lanemask_lt()
        if (x >= 0) & (lower == 0):
            cnt[warp, x] = cnt[warp, x] + Int32(cute.arch.popc(peers))
        cute.arch.sync_warp()

    @cute.jit
    def store_counts(self, cnt: cute.Tensor, counts: cute.Tensor, tile: Int32, tidx: Int32):
        """The tile's count per digit (its warps' rows summed) into column `tile` of counts (after a CTA barrier)."""
        for d in cutlass.range(tidx, self.radix, self.threads, unroll=1):
            total = Int32(0)
            for w in cutlass.range_constexpr(self.warps):
                total = total + cnt[w, d]
            counts[d, tile] = total

    def first_item(self, tile, warp):
        return tile * self.tile + warp * (self.rounds * 32)

    # --- the kernels --------------------------------------------------------------------------------------------
    @cute.kernel
    def hist_kernel(self, keys: cute.Tensor, counts: cute.Tensor, state: cute.Tensor, shift: Int32, pass_idx: Int32):
        pdl.enter()  # (launched as a programmatic dependent: collectives.pdl)
        tidx, _, _ = cute.arch.thread_idx()
        tile, _, _ = cute.arch.block_idx()
        warp, lane = tidx // 32, tidx % 32
        n = extent(keys, 1)
        src = source_row(state, pass_idx)
        smem = cutlass.memory.SmemAllocator()
        cnt = self.counter_smem(smem)
        first = self.first_item(tile, warp)
        ks = cute.make_rmem_tensor((self.rounds,), Int32)
        for r in cutlass.range_constexpr(self.rounds):  # every round's load in flight first
            k = Int32(-1)
            c = first + r * 32 + lane
            if c < n:
                k = (keys[src, c] >> shift) & self.mask
            ks[r] = k
        self.zero_row(cnt, warp, lane)
        for r in cutlass.range_constexpr(self.rounds):
            self.count_digit(ks[r], cnt, warp)
        cute.arch.sync_threads()
        self.store_counts(cnt, counts, tile, tidx)

    @cute.kernel
    def scatter_kernel(
        self,
        keys: cute.Tensor,
        vals: cute.Tensor,
        counts: cute.Tensor,
        totals: cute.Tensor,
        state: cute.Tensor,
        shift: Int32,
        pass_idx: Int32,
    ):
        pdl.enter()  # (launched as a programmatic dependent: collectives.pdl)
        tidx, _, _ = cute.arch.thread_idx()
        tile, _, _ = cute.arch.block_idx()
        warp, lane = tidx // 32, tidx % 32
        n = extent(keys, 1)
        smem = cutlass.memory.SmemAllocator()
        cnt = self.counter_smem(smem)
        base = self.counter_smem(smem)
        dbase = smem.allocate_tensor(Int32, cute.make_layout(self.radix), byte_alignment=16)
        slots = smem.allocate_tensor(Int32, cute.make_layout(cta_scan_slots(self.threads)), byte_alignment=16)
        if state[pass_idx] == 0:  # (a skipped pass leaves its input where it is; uniform over the CTA)
            src = source_row(state, pass_idx)
            dst = 1 - src
            first = self.first_item(tile, warp)
            ks = cute.make_rmem_tensor((self.rounds,), Int32)
            vs = cute.make_rmem_tensor((self.rounds,), Int32)
            for r in cutlass.range_constexpr(self.rounds):
                k = Int32(0)
                v = Int32(0)
                c = first + r * 32 + lane
                if c < n:
                    k = keys[src, c]
                    v = vals[src, c]
                ks[r] = k
                vs[r] = v
            # each digit's first output position: the digits below it
            carry = Int32(0)
            for d0 in cutlass.range_constexpr(0, self.radix, self.threads):
                d = d0 + tidx
                t = Int32(0)
                if d < self.radix:
                    t = totals[d]
                before, total = cta_exclusive_sum(t, slots, self.threads)
                if d < self.radix:
                    dbase[d] = carry + before
                carry = carry + total
            self.zero_row(cnt, warp, lane)
            for r in cutlass.range_constexpr(self.rounds):
                c = first + r * 32 + lane
                self.count_digit(cutlass.select_(c < n, (ks[r] >> shift) & self.mask, Int32(-1)), cnt, warp)
            cute.arch.sync_threads()
            for d in cutlass.range(tidx, self.radix, self.threads, unroll=1):
                run = dbase[d] + counts[d, tile]
                for w in cutlass.range_constexpr(self.warps):
                    base[w, d] = run
                    run = run + cnt[w, d]
            cute.arch.sync_threads()
            for r in cutlass.range_constexpr(self.rounds):
                c = first + r * 32 + lane
                x = cutlass.select_(c < n, (ks[r] >> shift) & self.mask, Int32(-1))
                peers = cute.arch.match_sync(FULL, x)
                lower = peers & cute.arch.lanemask_lt()
                xs = cutlass.max(x, Int32(0))
                rank = base[warp, xs] + Int32(cute.arch.popc(lower))
                cute.arch.sync_warp()
                if (x >= 0) & (lower == 0):
                    base[warp, xs] = base[warp, xs] + Int32(cute.arch.popc(peers))
                cute.arch.sync_warp()
                if c < n:
                    keys[dst, rank] = ks[r]
                    vals[dst, rank] = vs[r]


HEADS, FIRSTS = "heads", "firsts"


class Numbering:
    """Numbers the marked items of a sequence in order (a tile count by ballots, `TileScan` over one row, a placement
    that walks the rounds in order as the radix scatter does):

    - "heads": the segment heads of the sorted keys (row `source_row(state, passes)` of keys / vals): position c is a
      head when its key is valid (below `sentinel`, the out-of-range key, which sorts last) and differs from the key
      before it. Segment s is voxel s in ascending key order: seg_start[s] = its first position, seg_start[V] = the
      end of the valid keys. Hard mode (`scatter` off): flags[vals[c]] = s + 1 at each head, marking the voxel's first
      point (the sort is stable). Scatter: point_map[vals[c]] = s at every valid position, out_coords[s] =
      coords[vals[c]] at each head, runseg[c / run] = s where c is a multiple of `run` (the segmented reduction's
      runs).
    - "firsts": the nonzero flags over the points (flag - 1: the voxel's segment); the i-th flagged point in point
      order numbers its voxel i: seg_of_vid[i] = flag - 1 while i < seg_of_vid's extent (max_voxels).
    Tensors a kind does not use are not read (pass any of the right type)."""

    def __init__(self, kind: str, scatter: bool = False, run: int = 128, warps: int = 8, rounds: int = 8):
        if kind not in (HEADS, FIRSTS):
            raise ValueError(f"kind must be {HEADS!r} or {FIRSTS!r}, got {kind!r}")
        self.kind, self.scatter, self.run_len = kind, scatter, run
        self.warps, self.rounds = warps, rounds
        self.threads = 32 * warps
        self.tile = self.threads * rounds
        self.scanner = TileScan()

    def items(self, keys, flags):
        return extent(keys, 1) if self.kind == HEADS else extent(flags, 0)

    @cute.jit
    def run(
        self,
        keys: cute.Tensor,
        vals: cute.Tensor,
        flags: cute.Tensor,
        state: cute.Tensor,
        passes: Int32,
        counts1: cute.Tensor,
        totals1: cute.Tensor,
        seg_start: cute.Tensor,
        point_map: cute.Tensor,
        coords: cute.Tensor,
        out_coords: cute.Tensor,
        runseg: cute.Tensor,
        seg_of_vid: cute.Tensor,
        stream,
    ):
        """counts1 (1, tiles), totals1 (1,): the marks' count; state[SENTINEL_SLOT]: the out-of-range key (written by
        the kernel that made the keys); the rest as the class doc."""
        n = self.items(keys, flags)
        tiles = cutlass.max((n + self.tile - 1) // self.tile, 1)
        self.count_kernel(keys, flags, state, passes, counts1).launch(
            grid=[tiles, 1, 1], block=[self.threads, 1, 1], stream=stream, use_pdl=pdl.LAUNCH
        )
        self.scanner.scan(counts1, totals1, state, Int32(-1), n, stream)
        self.place_kernel(
            keys, vals, flags, state, passes, counts1, seg_start, point_map, coords, out_coords, runseg, seg_of_vid
        ).launch(grid=[tiles, 1, 1], block=[self.threads, 1, 1], stream=stream, use_pdl=pdl.LAUNCH)

    @cute.jit
    def load_round(self, keys: cute.Tensor, flags: cute.Tensor, fin: Int32, c: Int32, n: Int32, sentinel: Int32):
        """(key at c, key before c) for heads (sentinel past n), (flag, 0) for firsts (0 past n)."""
        a = Int32(0)
        b = Int32(0)
        if cutlass.const_expr(self.kind == HEADS):
            a = sentinel
            b = sentinel
            if c < n:
                a = keys[fin, c]
                if c > 0:
                    b = keys[fin, c - 1]
        else:
            if c < n:
                a = flags[c]
        return a, b

    @cute.jit
    def marks(self, a: Int32, b: Int32, c: Int32, sentinel: Int32):
        """(marked, valid) of an item from `load_round`'s pair."""
        if cutlass.const_expr(self.kind == HEADS):
            valid = a != sentinel
            return valid & ((c == 0) | (b != a)), valid
        return a != 0, a != 0

    @cute.jit
    def warp_base(self, ka, kb, first: Int32, sentinel: Int32, wsum: cute.Tensor, warp: Int32, lane: Int32):
        """The marked items of this warp's rounds, stored into wsum[warp] (a CTA barrier after)."""
        total = Int32(0)
        for r in cutlass.range_constexpr(self.rounds):
            m, _ = self.marks(ka[r], kb[r], first + r * 32 + lane, sentinel)
            total = total + Int32(cute.arch.popc(cute.arch.vote_ballot_sync(m)))
        if lane == 0:
            wsum[warp] = total
        cute.arch.sync_threads()

    @cute.kernel
    def count_kernel(
        self, keys: cute.Tensor, flags: cute.Tensor, state: cute.Tensor, passes: Int32, counts1: cute.Tensor
    ):
        pdl.enter()  # (launched as a programmatic dependent: collectives.pdl)
        sentinel = state[SENTINEL_SLOT]
        tidx, _, _ = cute.arch.thread_idx()
        tile, _, _ = cute.arch.block_idx()
        warp, lane = tidx // 32, tidx % 32
        n = self.items(keys, flags)
        fin = source_row(state, passes)
        smem = cutlass.memory.SmemAllocator()
        wsum = smem.allocate_tensor(Int32, cute.make_layout(self.warps), byte_alignment=16)
        first = tile * self.tile + warp * (self.rounds * 32)
        ka = cute.make_rmem_tensor((self.rounds,), Int32)
        kb = cute.make_rmem_tensor((self.rounds,), Int32)
        for r in cutlass.range_constexpr(self.rounds):
            a, b = self.load_round(keys, flags, fin, first + r * 32 + lane, n, sentinel)
            ka[r] = a
            kb[r] = b
        self.warp_base(ka, kb, first, sentinel, wsum, warp, lane)
        if tidx == 0:
            total = Int32(0)
            for w in cutlass.range_constexpr(self.warps):
                total = total + wsum[w]
            counts1[0, tile] = total

    @cute.kernel
    def place_kernel(
        self,
        keys: cute.Tensor,
        vals: cute.Tensor,
        flags: cute.Tensor,
        state: cute.Tensor,
        passes: Int32,
        counts1: cute.Tensor,
        seg_start: cute.Tensor,
        point_map: cute.Tensor,
        coords: cute.Tensor,
        out_coords: cute.Tensor,
        runseg: cute.Tensor,
        seg_of_vid: cute.Tensor,
    ):
        pdl.enter()  # (launched as a programmatic dependent: collectives.pdl)
        sentinel = state[SENTINEL_SLOT]
        tidx, _, _ = cute.arch.thread_idx()
        tile, _, _ = cute.arch.block_idx()
        warp, lane = tidx // 32, tidx % 32
        n = self.items(keys, flags)
        fin = source_row(state, passes)
        smem = cutlass.memory.SmemAllocator()
        wsum = smem.allocate_tensor(Int32, cute.make_layout(self.warps), byte_alignment=16)
        first = tile * self.tile + warp * (self.rounds * 32)
        ka = cute.make_rmem_tensor((self.rounds,), Int32)
        kb = cute.make_rmem_tensor((self.rounds,), Int32)
        vs = cute.make_rmem_tensor((self.rounds,), Int32)
        for r in cutlass.range_constexpr(self.rounds):
            c = first + r * 32 + lane
            a, b = self.load_round(keys, flags, fin, c, n, sentinel)
            ka[r] = a
            kb[r] = b
            v = Int32(0)
            if cutlass.const_expr(self.kind == HEADS):
                if c < n:
                    v = vals[fin, c]
            vs[r] = v
        self.warp_base(ka, kb, first, sentinel, wsum, warp, lane)
        run = counts1[0, tile]
        for w in cutlass.range(warp, unroll=1):
            run = run + wsum[w]
        max_voxels = extent(seg_of_vid, 0)
        for r in cutlass.range_constexpr(self.rounds):
            c = first + r * 32 + lane
            m, valid = self.marks(ka[r], kb[r], c, sentinel)
            ballot = cute.arch.vote_ballot_sync(m)
            if cutlass.const_expr(self.kind == HEADS):
                # the segment of position c: the heads up to c, less one
                seg = run + Int32(cute.arch.popc(ballot & Int32(cute.arch.lanemask_le()))) - 1
                v = vs[r]
                if m:
                    seg_start[seg] = c
                    if cutlass.const_expr(self.scatter):
                        for j in cutlass.range_constexpr(3):
                            out_coords[seg, j] = coords[v, j]
                    else:
                        flags[v] = seg + 1
                if cutlass.const_expr(self.scatter):
                    if valid:
                        point_map[v] = seg
                        if c % self.run_len == 0:
                            runseg[c // self.run_len] = seg
                # the end of the valid keys: the first out-of-range key, or n
                if (c < n) & (ka[r] == sentinel) & ((c == 0) | (kb[r] != sentinel)):
                    seg_start[seg + 1] = c
                if valid & (c == n - 1):
                    seg_start[seg + 1] = n
            else:
                vid = run + Int32(cute.arch.popc(ballot & Int32(cute.arch.lanemask_lt())))
                if m & (vid < max_voxels):
                    seg_of_vid[vid] = ka[r] - 1
            run = run + Int32(cute.arch.popc(ballot))
