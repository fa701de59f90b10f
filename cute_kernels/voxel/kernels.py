"""The voxel kernels: dynamic voxelization (`DynamicCoords`), hard voxelization (`HardVoxelize`) and the voxel scatter
(`ScatterVoxels`), each one compiled function that launches its kernels in stream order (programmatic dependent
launches, no host synchronization: the counts stay on the device).

Hard voxelization, on N points:
1. keys: each point's linear voxel index (z gy + y) gx + x, or the grid's size (the "out of range" key, sorting
   last), written beside its index; pass 0's digit histogram on the way (`sort.RadixSort.count_digit`);
2. a stable radix sort of (key, point) by the key's bits (`sort.RadixSort`): each voxel's points become a segment of
   consecutive positions in input order;
3. segment heads numbered in key order (`sort.Numbering` "heads"): each segment's start, and its first point (the
   head's point, by stability) flagged with its segment;
4. the flagged first points numbered in point order (`sort.Numbering` "firsts"): voxel i is the i-th first point's
   segment, for i < max_voxels;
5. the writer: every row of voxels (max_voxels, max_points, C) once, a thread a 16-byte vector (or an element): row r
   of voxel v is point r of v's segment while r < its count, else zeros; coords from the key, num_points.

Voxel scatter, on N coordinates and features: the coordinates' bounding box (integer atomics on 6 words), keys =
the linear index inside the box (the invalid rows' key the box's size), the same sort and heads numbering (segment s
is voxel s in ascending key order: torch.unique's order), then the segmented reduction (`SegmentReduce`): runs of
`run` consecutive sorted positions, a group of lanes a run and feature slice walking its positions in order; a
segment inside a run is reduced and written there, one crossing runs leaves partials that a second kernel combines in
run order. Every order is fixed by the data, never by timing: the same bits on every run.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from collectives import pdl
from collectives.arg_reduce import select
from collectives.reduce import warp_reduce
from collectives.vector_io import as_vectors, extent
from cute_kernels.voxel.sort import (
    FIRSTS,
    HEADS,
    OVERFLOW_SLOT,
    SENTINEL_SLOT,
    STATE_SLOTS,
    Numbering,
    RadixSort,
    source_row,
)

INT_MIN = -(2**31)
FIXUP_RUNS, FIXUP_REGS = 16, 64  # the segmented reduction's fix-up: runs' partials loaded at once (`fixup_batch`)
KEY_LIMIT = 2**31 - 1
REDUCES = ("sum", "mean", "max")


@cute.jit
def voxel_of(x: Float32, y: Float32, z: Float32, lo, hi, size, grid):
    """(in range, cx, cy, cz) of a point by the rules (reference.py): min <= p < max, q = (p - min) / size in fp32,
    floor(q) < grid (q < grid exactly: the grid is below 2^24 an axis); coordinates 0 when out of range."""
    p = (x, y, z)
    ok = x == x
    c = []
    for a in cutlass.range_constexpr(3):
        q = (p[a] - lo[a]) / size[a]
        ok = ok & (p[a] >= lo[a]) & (p[a] < hi[a]) & (q < grid[a].to(Float32))
        c.append(q)
    out = [select(ok, c[a], Float32(0.0)).to(Int32) for a in range(3)]  # q >= 0 in range: truncation is floor
    return ok, out[0], out[1], out[2]


@cute.jit
def load_xyz(points: cute.Tensor, i: Int32, vec: cutlass.Constexpr[int]):
    """x, y, z of point i: one 16-byte vector (rows of whole vectors) or three loads."""
    if cutlass.const_expr(vec == 4):
        v = as_vectors(points[i, None], 4, 4)[None, 0].load()
        return v[0], v[1], v[2]
    return points[i, 0], points[i, 1], points[i, 2]


class DynamicCoords:
    """Dynamic voxelization: each point's (z, y, x) or (-1, -1, -1), a thread a point."""

    def __init__(self, vec: int = 1, threads: int = 256):
        self.vec, self.threads = vec, threads

    @cute.jit
    def __call__(
        self,
        points: cute.Tensor,
        coords: cute.Tensor,
        x0: Float32,
        y0: Float32,
        z0: Float32,
        x1: Float32,
        y1: Float32,
        z1: Float32,
        sx: Float32,
        sy: Float32,
        sz: Float32,
        gx: Int32,
        gy: Int32,
        gz: Int32,
        stream,
    ):
        ctas = cutlass.max((extent(points, 0) + self.threads - 1) // self.threads, 1)
        self.kernel(points, coords, x0, y0, z0, x1, y1, z1, sx, sy, sz, gx, gy, gz).launch(
            grid=[ctas, 1, 1], block=[self.threads, 1, 1], stream=stream, use_pdl=pdl.LAUNCH
        )

    @cute.kernel
    def kernel(
        self,
        points: cute.Tensor,
        coords: cute.Tensor,
        x0: Float32,
        y0: Float32,
        z0: Float32,
        x1: Float32,
        y1: Float32,
        z1: Float32,
        sx: Float32,
        sy: Float32,
        sz: Float32,
        gx: Int32,
        gy: Int32,
        gz: Int32,
    ):
        pdl.enter()  # (launched as a programmatic dependent: collectives.pdl)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        i = bidx * self.threads + tidx
        if i < extent(points, 0):
            x, y, z = load_xyz(points, i, self.vec)
            ok, cx, cy, cz = voxel_of(x, y, z, (x0, y0, z0), (x1, y1, z1), (sx, sy, sz), (gx, gy, gz))
            coords[i, 0] = select(ok, cz, Int32(-1))
            coords[i, 1] = select(ok, cy, Int32(-1))
            coords[i, 2] = select(ok, cx, Int32(-1))


class HardVoxelize:
    """Hard voxelization (module doc), `passes` radix passes of `digit_bits` covering the grid size's bits; `vec` 4:
    point rows of whole 16-byte vectors (C % 4 == 0, aligned), else elements."""

    def __init__(
        self, passes: int, digit_bits: int = 8, vec: int = 1, warps: int = 8, rounds: int = 8, threads: int = 256
    ):
        self.passes, self.vec, self.threads = passes, vec, threads
        self.sorter = RadixSort(digit_bits, warps, rounds)
        self.heads = Numbering(HEADS, scatter=False, warps=warps, rounds=rounds)
        self.firsts = Numbering(FIRSTS, warps=warps, rounds=rounds)

    @cute.jit
    def __call__(
        self,
        points: cute.Tensor,
        keys: cute.Tensor,
        vals: cute.Tensor,
        counts: cute.Tensor,
        totals: cute.Tensor,
        counts1: cute.Tensor,
        totals1: cute.Tensor,
        state: cute.Tensor,
        seg_start: cute.Tensor,
        flags: cute.Tensor,
        seg_of_vid: cute.Tensor,
        voxels: cute.Tensor,
        coords_out: cute.Tensor,
        num_points: cute.Tensor,
        voxel_num: cute.Tensor,
        x0: Float32,
        y0: Float32,
        z0: Float32,
        x1: Float32,
        y1: Float32,
        z1: Float32,
        sx: Float32,
        sy: Float32,
        sz: Float32,
        gx: Int32,
        gy: Int32,
        gz: Int32,
        max_points: Int32,
        max_ctas: Int32,
        stream,
    ):
        """points (N, C) fp32; keys, vals (2, N); counts (2^D, tiles), totals (2^D,); counts1 (1, tiles), totals1 (1,);
        state (8,); seg_start (N + 1,); flags (N,); seg_of_vid (max_voxels,); voxels (max_voxels x max_points, C);
        coords_out (max_voxels, 3); num_points (max_voxels,); voxel_num (1,). All int32 but points and voxels. N >= 1."""
        n = extent(points, 0)
        tiles = cutlass.max(self.sorter.tiles(n), 1)
        self.keys_kernel(
            points, keys, vals, counts, flags, state, x0, y0, z0, x1, y1, z1, sx, sy, sz, gx, gy, gz
        ).launch(grid=[tiles, 1, 1], block=[self.sorter.threads, 1, 1], stream=stream, use_pdl=pdl.LAUNCH)
        self.sorter.run(keys, vals, counts, totals, state, self.passes, True, stream)
        p = Int32(self.passes)
        self.heads.run(
            keys,
            vals,
            flags,
            state,
            p,
            counts1,
            totals1,
            seg_start,
            flags,
            coords_out,
            coords_out,
            flags,
            seg_of_vid,
            stream,
        )
        self.firsts.run(
            keys,
            vals,
            flags,
            state,
            p,
            counts1,
            totals1,
            seg_start,
            flags,
            coords_out,
            coords_out,
            flags,
            seg_of_vid,
            stream,
        )
        units = extent(voxels, 0) * (extent(voxels, 1) // self.vec)
        ctas = cutlass.max(cutlass.min((units + self.threads - 1) // self.threads, max_ctas), 1)
        self.writer_kernel(
            points,
            keys,
            vals,
            state,
            seg_start,
            seg_of_vid,
            totals1,
            voxels,
            coords_out,
            num_points,
            voxel_num,
            max_points,
            gx,
            gy,
        ).launch(grid=[ctas, 1, 1], block=[self.threads, 1, 1], stream=stream, use_pdl=pdl.LAUNCH)

    @cute.kernel
    def keys_kernel(
        self,
        points: cute.Tensor,
        keys: cute.Tensor,
        vals: cute.Tensor,
        counts: cute.Tensor,
        flags: cute.Tensor,
        state: cute.Tensor,
        x0: Float32,
        y0: Float32,
        z0: Float32,
        x1: Float32,
        y1: Float32,
        z1: Float32,
        sx: Float32,
        sy: Float32,
        sz: Float32,
        gx: Int32,
        gy: Int32,
        gz: Int32,
    ):
        pdl.enter()  # (launched as a programmatic dependent: collectives.pdl)
        s = self.sorter
        tidx, _, _ = cute.arch.thread_idx()
        tile, _, _ = cute.arch.block_idx()
        warp, lane = tidx // 32, tidx % 32
        n = extent(points, 0)
        sentinel = gx * gy * gz  # the grid's size: above every voxel's key (the host checked it fits int32)
        if (tile == 0) & (tidx < STATE_SLOTS):
            state[tidx] = select(tidx == SENTINEL_SLOT, sentinel, Int32(0))
        smem = cutlass.memory.SmemAllocator()
        cnt = s.counter_smem(smem)
        first = s.first_item(tile, warp)
        xs = cute.make_rmem_tensor((s.rounds * 3,), Float32)
        for r in cutlass.range_constexpr(s.rounds):  # every round's loads in flight first
            c = cutlass.min(first + r * 32 + lane, n - 1)
            x, y, z = load_xyz(points, c, self.vec)
            xs[3 * r] = x
            xs[3 * r + 1] = y
            xs[3 * r + 2] = z
        s.zero_row(cnt, warp, lane)
        for r in cutlass.range_constexpr(s.rounds):
            c = first + r * 32 + lane
            ok, cx, cy, cz = voxel_of(
                xs[3 * r], xs[3 * r + 1], xs[3 * r + 2], (x0, y0, z0), (x1, y1, z1), (sx, sy, sz), (gx, gy, gz)
            )
            key = select(ok, (cz * gy + cy) * gx + cx, sentinel)
            if c < n:
                keys[0, c] = key
                vals[0, c] = c
                flags[c] = Int32(0)
            s.count_digit(select(c < n, key & s.mask, Int32(-1)), cnt, warp)
        cute.arch.sync_threads()
        s.store_counts(cnt, counts, tile, tidx)

    @cute.kernel
    def writer_kernel(
        self,
        points: cute.Tensor,
        keys: cute.Tensor,
        vals: cute.Tensor,
        state: cute.Tensor,
        seg_start: cute.Tensor,
        seg_of_vid: cute.Tensor,
        totals1: cute.Tensor,
        voxels: cute.Tensor,
        coords_out: cute.Tensor,
        num_points: cute.Tensor,
        voxel_num: cute.Tensor,
        max_points: Int32,
        gx: Int32,
        gy: Int32,
    ):
        pdl.enter()  # (launched as a programmatic dependent: collectives.pdl)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        fin = source_row(state, Int32(self.passes))
        max_voxels = extent(seg_of_vid, 0)
        c_all = extent(voxels, 1)
        per_row = c_all // self.vec
        units = extent(voxels, 0) * per_row
        kept = cutlass.min(totals1[0], max_voxels)
        gtid = bidx * self.threads + tidx
        if gtid == 0:
            voxel_num[0] = kept
        buf = cute.make_rmem_tensor((self.vec,), Float32)
        for u in cutlass.range(gtid, units, gdim * self.threads, unroll=1):
            row = u // per_row
            j = u - row * per_row
            v = row // max_points
            r = row - v * max_points
            buf.fill(0.0)
            npts = Int32(0)
            start = Int32(0)
            if v < kept:
                seg = seg_of_vid[v]
                start = seg_start[seg]
                npts = cutlass.min(seg_start[seg + 1] - start, max_points)
                if r < npts:
                    src = vals[fin, start + r]
                    if cutlass.const_expr(self.vec == 1):
                        buf[0] = points[src, j]
                    else:
                        buf.store(as_vectors(points[src, None], c_all, self.vec)[None, j].load())
            if cutlass.const_expr(self.vec == 1):
                voxels[row, j] = buf[0]
            else:
                as_vectors(voxels[row, None], c_all, self.vec)[None, j].store(buf.load())
            if (r == 0) & (j == 0):
                num_points[v] = npts
                cz = Int32(0)
                cy = Int32(0)
                cx = Int32(0)
                if v < kept:
                    key = keys[fin, start]
                    t = key // gx
                    cx = key - t * gx
                    cz = t // gy
                    cy = t - cz * gy
                coords_out[v, 0] = cz
                coords_out[v, 1] = cy
                coords_out[v, 2] = cx


@cute.jit
def _max6(a, b):
    return tuple(cutlass.max(x, y) for x, y in zip(a, b))


class ScatterVoxels:
    """The voxel scatter (module doc): features (N, F) of `dtype`, reduce "sum" / "mean" / "max"; `vec` features a
    lane (16-byte vectors when F is a whole number of them, else 1), `group` lanes a run (group x vec features a
    slice), `run` sorted positions a run."""

    def __init__(
        self,
        reduce: str,
        dtype,
        vec: int = 1,
        group: int = 32,
        run: int = 128,
        digit_bits: int = 8,
        warps: int = 8,
        rounds: int = 8,
        threads: int = 256,
    ):
        self.passes = -(-31 // digit_bits)  # the keys' bits are known on the device only: all 31
        self.threads = threads
        self.sorter = RadixSort(digit_bits, warps, rounds)
        self.heads = Numbering(HEADS, scatter=True, run=run, warps=warps, rounds=rounds)
        self.reducer = SegmentReduce(reduce, dtype, vec, group, run, threads)

    @cute.jit
    def __call__(
        self,
        feats: cute.Tensor,
        coords: cute.Tensor,
        keys: cute.Tensor,
        vals: cute.Tensor,
        counts: cute.Tensor,
        totals: cute.Tensor,
        counts1: cute.Tensor,
        totals1: cute.Tensor,
        state: cute.Tensor,
        box: cute.Tensor,
        seg_start: cute.Tensor,
        runseg: cute.Tensor,
        out: cute.Tensor,
        argout: cute.Tensor,
        coords_out: cute.Tensor,
        point_map: cute.Tensor,
        part_first: cute.Tensor,
        part_last: cute.Tensor,
        arg_first: cute.Tensor,
        arg_last: cute.Tensor,
        max_ctas: Int32,
        stream,
    ):
        """feats (N, F); coords (N, 3) int32 (z, y, x); keys, vals (2, N); counts (2^D, tiles), totals (2^D,);
        counts1 (1, tiles), totals1 (1,): the voxel count; state (8,); box (6,) filled with INT_MIN; seg_start
        (N + 1,); runseg (runs,); out (N, F); argout (N, F) int32 (max); coords_out (N, 3); point_map (N,);
        part_first, part_last (runs, F) fp32, arg_first, arg_last (runs, F) int32 (max). N >= 1."""
        n = extent(coords, 0)
        tiles = cutlass.max(self.sorter.tiles(n), 1)
        ctas = cutlass.max(cutlass.min((n + self.threads - 1) // self.threads, max_ctas), 1)
        self.box_kernel(coords, box).launch(
            grid=[ctas, 1, 1], block=[self.threads, 1, 1], stream=stream, use_pdl=pdl.LAUNCH
        )
        self.keys_kernel(coords, box, keys, vals, counts, point_map, state).launch(
            grid=[tiles, 1, 1], block=[self.sorter.threads, 1, 1], stream=stream, use_pdl=pdl.LAUNCH
        )
        self.sorter.run(keys, vals, counts, totals, state, self.passes, True, stream)
        p = Int32(self.passes)
        self.heads.run(
            keys,
            vals,
            point_map,
            state,
            p,
            counts1,
            totals1,
            seg_start,
            point_map,
            coords,
            coords_out,
            runseg,
            runseg,
            stream,
        )
        self.reducer.run(
            feats,
            keys,
            vals,
            state,
            p,
            seg_start,
            totals1,
            runseg,
            out,
            argout,
            part_first,
            part_last,
            arg_first,
            arg_last,
            max_ctas,
            stream,
        )

    @cute.kernel
    def box_kernel(self, coords: cute.Tensor, box: cute.Tensor):
        """box = (max -z, max -y, max -x, max z, max y, max x) over the valid rows (every entry >= 0): one max over
        six words (atomicMax), INT_MIN where no row is valid."""
        pdl.enter()  # (launched as a programmatic dependent: collectives.pdl)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        warp, lane = tidx // 32, tidx % 32
        n = extent(coords, 0)
        lo = Int32(INT_MIN)
        b0, b1, b2, b3, b4, b5 = lo, lo, lo, lo, lo, lo
        for i in cutlass.range(bidx * self.threads + tidx, n, gdim * self.threads, unroll=1):
            z, y, x = coords[i, 0], coords[i, 1], coords[i, 2]
            ok = (z >= 0) & (y >= 0) & (x >= 0)
            b0 = select(ok, cutlass.max(b0, -z), b0)
            b1 = select(ok, cutlass.max(b1, -y), b1)
            b2 = select(ok, cutlass.max(b2, -x), b2)
            b3 = select(ok, cutlass.max(b3, z), b3)
            b4 = select(ok, cutlass.max(b4, y), b4)
            b5 = select(ok, cutlass.max(b5, x), b5)
        m = warp_reduce((b0, b1, b2, b3, b4, b5), _max6)
        smem = cutlass.memory.SmemAllocator()
        part = smem.allocate_tensor(Int32, cute.make_layout((self.threads // 32, 6), stride=(6, 1)), byte_alignment=16)
        if lane == 0:
            for k in cutlass.range_constexpr(6):
                part[warp, k] = m[k]
        cute.arch.sync_threads()
        if tidx < 6:
            best = part[0, tidx]
            for w in cutlass.range_constexpr(1, self.threads // 32):
                best = cutlass.max(best, part[w, tidx])
            if best > lo:
                cute.arch.atomic_max((box.iterator + tidx).llvm_ptr, best)

    @cute.kernel
    def keys_kernel(
        self,
        coords: cute.Tensor,
        box: cute.Tensor,
        keys: cute.Tensor,
        vals: cute.Tensor,
        counts: cute.Tensor,
        point_map: cute.Tensor,
        state: cute.Tensor,
    ):
        pdl.enter()  # (launched as a programmatic dependent: collectives.pdl)
        s = self.sorter
        tidx, _, _ = cute.arch.thread_idx()
        tile, _, _ = cute.arch.block_idx()
        warp, lane = tidx // 32, tidx % 32
        n = extent(coords, 0)
        z0, y0, x0 = -box[0], -box[1], -box[2]
        # the box's extents (0 with no valid row) and its size in 64 bits: the key of the invalid rows, when it fits
        any_valid = box[3] >= 0
        sz = select(any_valid, Int64(box[3]) - Int64(z0) + 1, Int64(0))
        sy = select(any_valid, Int64(box[4]) - Int64(y0) + 1, Int64(0))
        sx = select(any_valid, Int64(box[5]) - Int64(x0) + 1, Int64(0))
        yx = cutlass.min(sy * sx, Int64(KEY_LIMIT) + 1)
        size = yx * sz
        overflow = size > Int64(KEY_LIMIT)
        sentinel = Int32(cutlass.min(size, Int64(KEY_LIMIT)))
        if (tile == 0) & (tidx < STATE_SLOTS):
            v = Int32(0)
            if tidx == SENTINEL_SLOT:
                v = sentinel
            if tidx == OVERFLOW_SLOT:
                v = select(overflow, Int32(1), Int32(0))
            state[tidx] = v
        smem = cutlass.memory.SmemAllocator()
        cnt = s.counter_smem(smem)
        first = s.first_item(tile, warp)
        cs = cute.make_rmem_tensor((s.rounds * 3,), Int32)
        for r in cutlass.range_constexpr(s.rounds):
            c = cutlass.min(first + r * 32 + lane, n - 1)
            for a in cutlass.range_constexpr(3):
                cs[3 * r + a] = coords[c, a]
        s.zero_row(cnt, warp, lane)
        for r in cutlass.range_constexpr(s.rounds):
            c = first + r * 32 + lane
            z, y, x = cs[3 * r], cs[3 * r + 1], cs[3 * r + 2]
            ok = (z >= 0) & (y >= 0) & (x >= 0)
            lin = (Int64(z - z0) * sy + Int64(y - y0)) * sx + Int64(x - x0)
            key = select(ok, Int32(cutlass.min(lin, Int64(KEY_LIMIT - 1))), sentinel)
            if c < n:
                keys[0, c] = key
                vals[0, c] = c
                point_map[c] = Int32(-1)
            s.count_digit(select(c < n, key & s.mask, Int32(-1)), cnt, warp)
        cute.arch.sync_threads()
        s.store_counts(cnt, counts, tile, tidx)


class SegmentReduce:
    """The segmented reduction of the sorted features (module doc). Work unit (run r, feature slice k): a group of
    `group` lanes, each `vec` consecutive features, walks positions [r run, (r + 1) run) of the valid ones in order,
    `batch` positions' indices, sorted keys and feature vectors loaded ahead (a segment ends where the key changes). A
    segment that starts and ends inside the run is written to out[segment]; the run's first segment, when it began
    before the run, leaves part_first[r]; its last, when it goes on past the run, part_last[r]. The fix-up kernel, for
    each run that holds the start of a segment going on past it, combines part_last[r] with part_first of the runs the
    segment covers, in order. max keeps (value, point) with ties to the earlier point (the positions of a segment are
    in point order) and the first NaN."""

    def __init__(
        self, reduce: str, dtype, vec: int = 1, group: int = 32, run: int = 128, threads: int = 256, batch: int = 4
    ):
        if reduce not in REDUCES:
            raise ValueError(f"reduce must be one of {REDUCES}, got {reduce!r}")
        if group not in (1, 2, 4, 8, 16, 32) or vec not in (1, 2, 4, 8):
            raise ValueError(f"group must be a power of two <= 32 and vec one of 1, 2, 4, 8; got {group}, {vec}")
        self.reduce, self.dtype, self.vec, self.group, self.run_len = reduce, dtype, vec, group, run
        self.threads, self.batch = threads, batch
        self.is_max = reduce == "max"
        # the fix-up's runs loaded at once: up to FIXUP_RUNS, FIXUP_REGS registers of partials (max: half as many
        # runs, their points' registers beside)
        self.fixup_batch = max(1, min(FIXUP_RUNS, FIXUP_REGS // vec) // (2 if self.is_max else 1))

    @cute.jit
    def run(
        self,
        feats: cute.Tensor,
        keys: cute.Tensor,
        vals: cute.Tensor,
        state: cute.Tensor,
        passes: Int32,
        seg_start: cute.Tensor,
        totals1: cute.Tensor,
        runseg: cute.Tensor,
        out: cute.Tensor,
        argout: cute.Tensor,
        part_first: cute.Tensor,
        part_last: cute.Tensor,
        arg_first: cute.Tensor,
        arg_last: cute.Tensor,
        max_ctas: Int32,
        stream,
    ):
        width = self.group * self.vec
        units = extent(runseg, 0) * ((extent(feats, 1) + width - 1) // width)
        per_cta = self.threads // self.group
        ctas = cutlass.max(cutlass.min((units + per_cta - 1) // per_cta, max_ctas), 1)
        self.runs_kernel(
            feats,
            keys,
            vals,
            state,
            passes,
            seg_start,
            totals1,
            runseg,
            out,
            argout,
            part_first,
            part_last,
            arg_first,
            arg_last,
        ).launch(grid=[ctas, 1, 1], block=[self.threads, 1, 1], stream=stream, use_pdl=pdl.LAUNCH)
        self.fixup_kernel(
            seg_start, totals1, runseg, out, argout, part_first, part_last, arg_first, arg_last, extent(feats, 1)
        ).launch(grid=[ctas, 1, 1], block=[self.threads, 1, 1], stream=stream, use_pdl=pdl.LAUNCH)

    # --- the reduction's pieces ------------------------------------------------------------------------------
    @cute.jit
    def reset(self, acc: cute.Tensor, arg: cute.Tensor):
        acc.fill(-math.inf if self.is_max else 0.0)
        arg.fill(-1)

    @cute.jit
    def take(self, acc: cute.Tensor, arg: cute.Tensor, e: int, x: Float32, i: Int32):
        """Fold (x, point i) into element e: the sum, or the max (a later point wins only when strictly greater, or
        when it is the first NaN)."""
        if cutlass.const_expr(self.is_max):
            best = acc[e]
            wins = (arg[e] < 0) | (x > best) | ((x != x) & (best == best))
            wins = wins & (i >= 0)
            acc[e] = select(wins, x, best)
            arg[e] = select(wins, i, arg[e])
        else:
            acc[e] = acc[e] + x

    @cute.jit
    def store_final(
        self,
        out: cute.Tensor,
        argout: cute.Tensor,
        acc: cute.Tensor,
        arg: cute.Tensor,
        seg: Int32,
        f0: Int32,
        count: Int32,
        n_features: Int32,
    ):
        res = cute.make_rmem_tensor((self.vec,), self.dtype)
        for e in cutlass.range_constexpr(self.vec):
            v = acc[e]
            if cutlass.const_expr(self.reduce == "mean"):
                v = v / count.to(Float32)
            res[e] = v.to(self.dtype)
        if cutlass.const_expr(self.vec == 1):
            out[seg, f0] = res[0]
        else:
            as_vectors(out[seg, None], n_features, self.vec)[None, f0 // self.vec].store(res.load())
        if cutlass.const_expr(self.is_max):
            for e in cutlass.range_constexpr(self.vec):
                argout[seg, f0 + e] = arg[e]

    @cute.jit
    def store_partial(
        self, part: cute.Tensor, part_arg: cute.Tensor, acc: cute.Tensor, arg: cute.Tensor, r: Int32, f0: Int32
    ):
        for e in cutlass.range_constexpr(self.vec):
            part[r, f0 + e] = acc[e]
            if cutlass.const_expr(self.is_max):
                part_arg[r, f0 + e] = arg[e]

    @cute.jit
    def flush(
        self,
        out,
        argout,
        part_first,
        part_last,
        arg_first,
        arg_last,
        acc,
        arg,
        seg: Int32,
        count: Int32,
        started: Int32,
        ended,
        r: Int32,
        f0: Int32,
        active,
        n_features: Int32,
    ):
        """A finished stretch of one segment: the whole segment (out), its head part (part_last) or a part past its
        head (part_first)."""
        if active:
            if (started != 0) & ended:
                self.store_final(out, argout, acc, arg, seg, f0, count, n_features)
            elif started != 0:
                self.store_partial(part_last, arg_last, acc, arg, r, f0)
            else:
                self.store_partial(part_first, arg_first, acc, arg, r, f0)

    def unit_geometry(self, u, chunks, n_features):
        """(run, first feature of this lane, whether it has features) of work unit u."""
        r = u // chunks
        k = u - r * chunks
        tidx, _, _ = cute.arch.thread_idx()
        f0 = k * (self.group * self.vec) + (tidx % self.group) * self.vec
        return r, f0, f0 < n_features

    # --- the kernels -------------------------------------------------------------------------------------------
    @cute.kernel
    def runs_kernel(
        self,
        feats: cute.Tensor,
        keys: cute.Tensor,
        vals: cute.Tensor,
        state: cute.Tensor,
        passes: Int32,
        seg_start: cute.Tensor,
        totals1: cute.Tensor,
        runseg: cute.Tensor,
        out: cute.Tensor,
        argout: cute.Tensor,
        part_first: cute.Tensor,
        part_last: cute.Tensor,
        arg_first: cute.Tensor,
        arg_last: cute.Tensor,
    ):
        pdl.enter()  # (launched as a programmatic dependent: collectives.pdl)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        fin = source_row(state, passes)
        n_valid = seg_start[totals1[0]]
        nf = extent(feats, 1)
        chunks = (nf + self.group * self.vec - 1) // (self.group * self.vec)
        runs = (n_valid + self.run_len - 1) // self.run_len
        per_cta = self.threads // self.group
        acc = cute.make_rmem_tensor((self.vec,), Float32)
        arg = cute.make_rmem_tensor((self.vec,), Int32)
        rows = cute.make_rmem_tensor((self.batch,), Int32)
        ks = cute.make_rmem_tensor((self.batch,), Int32)
        xs = cute.make_rmem_tensor((self.batch * self.vec,), Float32)
        for u in cutlass.range(bidx * per_cta + tidx // self.group, runs * chunks, gdim * per_cta, unroll=1):
            r, f0, active = self.unit_geometry(u, chunks, nf)
            fc = cutlass.min(f0, nf - self.vec)
            a = r * self.run_len
            b = cutlass.min(a + self.run_len, n_valid)
            # Segment boundaries from the sorted keys (a new segment where the key changes), loaded with the batch, so
            # no load inside the walk waits on another (seg_start read at each boundary did; the kernel's time did not
            # move: 451 us at 2M points, H100). The run's first segment started here unless the key before the run
            # is the same; the last one ends here unless the key after it is.
            seg = runseg[r]
            cur = keys[fin, a]
            before = keys[fin, cutlass.max(a - 1, 0)]
            after = keys[fin, cutlass.min(b, n_valid - 1)]
            started = select((a == 0) | (before != cur), Int32(1), Int32(0))
            head = a
            self.reset(acc, arg)
            for p0 in cutlass.range(a, b, self.batch, unroll=1):
                for j in cutlass.range_constexpr(self.batch):  # the batch's loads in flight first
                    rows[j] = vals[fin, cutlass.min(p0 + j, b - 1)]
                    ks[j] = keys[fin, cutlass.min(p0 + j, b - 1)]
                for j in cutlass.range_constexpr(self.batch):
                    if cutlass.const_expr(self.vec == 1):
                        xs[j] = feats[rows[j], fc].to(Float32)
                    else:
                        x = as_vectors(feats[rows[j], None], nf, self.vec)[None, fc // self.vec].load().to(Float32)
                        for e in cutlass.range_constexpr(self.vec):
                            xs[j * self.vec + e] = x[e]
                for j in cutlass.range_constexpr(self.batch):
                    p = p0 + j
                    if p < b:
                        if ks[j] != cur:  # a new segment: the one before it ended at p
                            self.flush(
                                out,
                                argout,
                                part_first,
                                part_last,
                                arg_first,
                                arg_last,
                                acc,
                                arg,
                                seg,
                                p - head,
                                started,
                                True,
                                r,
                                f0,
                                active,
                                nf,
                            )
                            seg = seg + 1
                            head = p
                            cur = ks[j]
                            started = Int32(1)
                            self.reset(acc, arg)
                        for e in cutlass.range_constexpr(self.vec):
                            self.take(acc, arg, e, xs[j * self.vec + e], rows[j])
            self.flush(
                out,
                argout,
                part_first,
                part_last,
                arg_first,
                arg_last,
                acc,
                arg,
                seg,
                b - head,
                started,
                (b == n_valid) | (after != cur),
                r,
                f0,
                active,
                nf,
            )

    @cute.kernel
    def fixup_kernel(
        self,
        seg_start: cute.Tensor,
        totals1: cute.Tensor,
        runseg: cute.Tensor,
        out: cute.Tensor,
        argout: cute.Tensor,
        part_first: cute.Tensor,
        part_last: cute.Tensor,
        arg_first: cute.Tensor,
        arg_last: cute.Tensor,
        nf: Int32,
    ):
        pdl.enter()  # (launched as a programmatic dependent: collectives.pdl)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        n_valid = seg_start[totals1[0]]
        chunks = (nf + self.group * self.vec - 1) // (self.group * self.vec)
        runs = (n_valid + self.run_len - 1) // self.run_len
        per_cta = self.threads // self.group
        acc = cute.make_rmem_tensor((self.vec,), Float32)
        arg = cute.make_rmem_tensor((self.vec,), Int32)
        pv = cute.make_rmem_tensor((self.fixup_batch * self.vec,), Float32)
        pa = cute.make_rmem_tensor((self.fixup_batch * self.vec,), Int32)
        for u in cutlass.range(bidx * per_cta + tidx // self.group, runs * chunks, gdim * per_cta, unroll=1):
            r, f0, active = self.unit_geometry(u, chunks, nf)
            nxt = (r + 1) * self.run_len
            if active & (nxt < n_valid):
                seg = runseg[r + 1]  # the segment at the next run's first position
                head = seg_start[seg]
                if (head < nxt) & (head >= r * self.run_len):  # it started in this run and goes on past it
                    end = seg_start[seg + 1]
                    self.reset(acc, arg)
                    for e in cutlass.range_constexpr(self.vec):
                        self.take(acc, arg, e, part_last[r, f0 + e], arg_last[r, f0 + e] if self.is_max else Int32(0))
                    # the runs a long segment covers (a dense voxel: thousands of points, hundreds of runs) in
                    # order, `fixup_batch` runs' partials loaded into registers before any is folded (a plain loop, even
                    # unrolled, left ptxas interleaving each load with its add: the fix-up took 190 us of a 2M-point
                    # scatter's 870, batched 140, H100)
                    q_end = (end - 1) // self.run_len + 1
                    nb = self.fixup_batch
                    for qb in cutlass.range(r + 1, q_end, nb, unroll=1):
                        for j in cutlass.range_constexpr(nb):
                            q = cutlass.min(qb + j, q_end - 1)
                            for e in cutlass.range_constexpr(self.vec):
                                pv[j * self.vec + e] = part_first[q, f0 + e]
                                if cutlass.const_expr(self.is_max):
                                    pa[j * self.vec + e] = arg_first[q, f0 + e]
                        for j in cutlass.range_constexpr(nb):
                            if qb + j < q_end:
                                for e in cutlass.range_constexpr(self.vec):
                                    if cutlass.const_expr(self.is_max):
                                        self.take(acc, arg, e, pv[j * self.vec + e], pa[j * self.vec + e])
                                    else:
                                        self.take(acc, arg, e, pv[j * self.vec + e], Int32(0))
                    self.store_final(out, argout, acc, arg, seg, f0, end - head, nf)
