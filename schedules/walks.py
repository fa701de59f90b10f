"""The device side of the schedules: how a CTA walks the work its schedule assigns (`@cute.jit` index
arithmetic and the per-CTA walk objects the kernels carry through their loops). The host side, the schedule
dataclasses and their choice, lives beside it in `schedules/` and imports no DSL.

- GEMM (`schedules.gemm`): `TileWalk`, the cluster tiles a persistent cluster visits; the masked grouped walk.
- attention (`schedules.attention`): `take_tile`, the dynamic hand-out of a persistent walk.
- grid-stride (`schedules.grid_stride`): `strided_fold`, the fold over a thread's items.
- row tiling (`schedules.row_tiling`): `SplitRowWalk` and `row_tile_grid`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from schedules.gemm import GemmSchedule, cluster_tile, split_range
from schedules.row_tiling import RowTiling


# --- GEMM ------------------------------------------------------------------------------------------
@dataclass
class TileWalk:
    """The device side of the scheduler: the cluster tiles one cluster visits. Cluster `z` of
    `Z` visits tiles z, z + Z, z + 2Z, ... (a static persistent schedule; with a grid of all tiles
    it visits exactly one).

    Split-K (`splits` > 1): the walk hands out work units, (cluster tile, split) pairs, split
    slowest (unit u is tile u % tiles of split u // tiles), so the units running at one time cover
    whole raster groups of one split; `k_range` gives a unit's K-blocks."""

    clusters_m: Int32
    clusters_n: Int32
    total: Int32
    first: Int32
    stride: Int32
    group: int
    tiles: Int32 = None  # cluster tiles per split (split-K only)

    @staticmethod
    def create(tiles_m, tiles_n, batch, s: GemmSchedule) -> TileWalk:
        _, _, z = cute.arch.block_idx()
        gz = cute.arch.grid_dim()[2]
        cm = (tiles_m + s.cluster_m - 1) // s.cluster_m
        cn = (tiles_n + s.cluster_n - 1) // s.cluster_n
        if cutlass.const_expr(s.split_k > 1):
            tiles = cm * cn * batch
            return TileWalk(cm, cn, tiles * s.split_k, Int32(z), Int32(gz), s.raster_group, tiles)
        return TileWalk(cm, cn, cm * cn * batch, Int32(z), Int32(gz), s.raster_group)

    def count(self):
        """Tiles (split-K: work units) this cluster visits."""
        return (cutlass.max(self.total - self.first, 0) + self.stride - 1) // self.stride

    def _unit(self, i, s: GemmSchedule):
        """(cluster tile index, split) of this cluster's `i`-th unit."""
        u = self.first + i * self.stride
        if cutlass.const_expr(s.split_k > 1):
            sp = u // self.tiles
            return u - sp * self.tiles, sp
        return u, 0

    def coords(self, i, cta_m, cta_n, s: GemmSchedule):
        """CTA tile coordinates (m, n, l) of this cluster's `i`-th tile, for the CTA at (cta_m, cta_n)
        of its cluster."""
        t, _ = self._unit(i, s)
        cm, cn, l = cluster_tile(t, self.clusters_m, self.clusters_n, self.group)
        return cm * s.cluster_m + cta_m, cn * s.cluster_n + cta_n, l

    def split(self, i, s: GemmSchedule):
        """The split of this cluster's `i`-th unit (0 without split-K)."""
        return self._unit(i, s)[1]

    def k_range(self, i, k_tiles, s: GemmSchedule):
        """(first K-block, K-blocks) of this cluster's `i`-th unit: `split_range` of its split, or
        (0, k_tiles) without split-K."""
        if cutlass.const_expr(s.split_k > 1):
            return split_range(self.split(i, s), s.split_k, k_tiles)
        return 0, k_tiles

    def tile(self, i, cta_m, cta_n, s: GemmSchedule, grouping: str = "none", groups=None, experts=None):
        """(m, n, l, expert, valid) of this cluster's `i`-th tile: l indexes A, D and the A scales,
        expert indexes B and the B scales, valid says whether the tile is computed at all. Without
        grouping expert is l and valid the constant True (the dense kernel is unchanged).

        groups: "contiguous": expert of each row of A (M,) int32, -1 for padding (read at the
        tile's first row; `cluster_m` must be 1: two M tiles may need different B; an expert
        outside [0, experts) counts as padding, so a bad index never reads past B);
        "masked": valid rows per expert (E,) int32 (`create_grouped` counted the tiles with it)."""
        if grouping == "masked":
            cm, cn, e = masked_cluster_tile(self.first + i * self.stride, groups, self.clusters_m, s.tile_m,
                                            s.cluster_m, self.clusters_n, self.group)
            return cm * s.cluster_m + cta_m, cn * s.cluster_n + cta_n, e, e, True
        m, n, batch = self.coords(i, cta_m, cta_n, s)
        if grouping == "contiguous":
            e = groups[m * s.tile_m]
            return m, n, batch, e, (e >= 0) & (e < experts)
        return m, n, batch, batch, True

    @staticmethod
    def create_grouped(tiles_m, tiles_n, batch, s: GemmSchedule, grouping: str, groups) -> TileWalk:
        """`create`, for a grouped walk: "masked" walks only the cluster tiles of valid rows."""
        walk = TileWalk.create(tiles_m, tiles_n, batch, s)
        if grouping == "masked":
            walk.total = masked_clusters(groups, walk.clusters_m, s.tile_m, s.cluster_m, walk.clusters_n)
        return walk


# --- grouped (MoE) walks ----------------------------------------------------------------------
def masked_cluster_rows(valid_rows, clusters_m, tile_m, cluster_m):
    """Cluster rows covering an expert's `valid_rows` (clamped to [0, the buffer's rows])."""
    tiles = (cutlass.max(valid_rows, 0) + tile_m - 1) // tile_m
    return cutlass.min((tiles + cluster_m - 1) // cluster_m, clusters_m)


@cute.jit
def masked_clusters(masked_m: cute.Tensor, clusters_m, tile_m: cutlass.Constexpr, cluster_m: cutlass.Constexpr,
                    clusters_n):
    """Cluster tiles of a masked grouped GEMM: sum over experts of their cluster rows x columns."""
    total = Int32(0)
    for e in cutlass.range(cute.size(masked_m), unroll=1):
        total += masked_cluster_rows(masked_m[e], clusters_m, tile_m, cluster_m) * clusters_n
    return total


@cute.jit
def masked_cluster_tile(t, masked_m: cute.Tensor, clusters_m, tile_m: cutlass.Constexpr,
                        cluster_m: cutlass.Constexpr, clusters_n, group: cutlass.Constexpr):
    """Cluster coordinates (cm, cn, expert) of the `t`-th valid cluster tile (t < the total of
    `masked_clusters`): skip whole experts, then `cluster_tile`'s raster inside the expert."""
    e = Int32(0)
    base = Int32(0)
    rows = masked_cluster_rows(masked_m[0], clusters_m, tile_m, cluster_m)
    while t >= base + rows * clusters_n:
        base += rows * clusters_n
        e += 1
        rows = masked_cluster_rows(masked_m[e], clusters_m, tile_m, cluster_m)
    cm, cn, _ = cluster_tile(t - base, rows, clusters_n, group)
    return cm, cn, e


# --- attention -------------------------------------------------------------------------------------
@cute.jit
def take_tile(counter: cute.Tensor, total, ctas):
    """The linear index of a `dynamic` walk's next tile, for one warp: lane 0 adds 1 to the counter (int32, in global
    memory), and every lane gets ctas + the old value (CTA x's first tile is x; an index >= total: no tile left).
    Every CTA fetches until it is refused, so a launch makes exactly `total` fetches and the one that returns
    total - 1 is its last: that lane stores 0 for the next launch (stream order)."""
    old = Int32(0)
    if cute.arch.lane_idx() == 0:
        old = cute.arch.atomic_add(counter.iterator.llvm_ptr, Int32(1), sem="relaxed", scope="gpu")
        if old == total - 1:
            counter[0] = Int32(0)
    return ctas + cute.arch.shuffle_sync(old, 0)


# --- grid-stride -----------------------------------------------------------------------------------
@cute.jit
def strided_fold(
    n_items,
    first,
    stride,
    pass_stride,
    unroll: cutlass.Constexpr[int],
    load: Callable,
    step: Callable,
    acc,
    tail_branch: cutlass.Constexpr[bool] = True,
    full_passes=None,
    pass_step: Callable | None = None,
    tail_together: bool = True,
):
    """Fold `step(acc, j, load(j))` over j = first + p * pass_stride + u * stride < n_items, for
    passes p = 0, 1, ... and u < unroll.

    The caller guarantees that pass p of every participating thread lies in
    [p * pass_stride, (p + 1) * pass_stride), so passes below `n_items // pass_stride` need no bounds
    checks. Each pass issues its `unroll` loads before the first `step`, so their latencies
    overlap. `load` and `step` are trace-time callables; `acc` is any DSL value (a dummy for pure
    maps) and is returned. The visiting order is fixed, which keeps folds deterministic.
    `full_passes` (= n_items // pass_stride, the same for every thread) may come from the launch's
    host code: the integer division then leaves the path to the first load (~40 dependent
    instructions in a kernel whose whole run is a few microseconds at 1 MiB).
    `tail_together` (with `tail_branch`): the partial pass's loads issued together, items past `n_items` loading the
    last item (never folded); False: one load per step, as each bounds check passes.
    `pass_step(acc, vals)`, when given, folds a full pass's `unroll` loaded values at once
    (vals[u] is item base + u * stride), e.g. one max and one rescale per pass in an online
    softmax instead of one per item; the partial last pass still goes through `step`.
    """
    if cutlass.const_expr(full_passes is None):
        full_passes = n_items // pass_stride
    for p in cutlass.range(full_passes, unroll=1):
        base = p * pass_stride + first
        vals = []
        for u in cutlass.range_constexpr(unroll):
            vals.append(load(base + u * stride))
        if cutlass.const_expr(pass_step is not None):
            acc = pass_step(acc, vals)
        else:
            for u in cutlass.range_constexpr(unroll):
                acc = step(acc, base + u * stride, vals[u])
    base = full_passes * pass_stride + first
    # `tail_branch`: one branch over the whole partial pass, so its predicated-off code does not
    # issue when it is empty (~70 instructions per row at N = 4096 for ArgMax; cross-entropy's
    # 64-bit variant spills without it). The row sum passes False: with the branch the compiler
    # spilled reduction.row_sum fp32 t512 r4 u8 to an 8-byte stack frame.
    if cutlass.const_expr(tail_branch and not tail_together):  # (ArgMax: its fp32 512-thread tile spilled 8 B with
        # the partial pass's values live together)
        if base < n_items:
            for u in cutlass.range_constexpr(unroll):
                j = base + u * stride
                if j < n_items:
                    acc = step(acc, j, load(j))
    elif cutlass.const_expr(tail_branch):
        if base < n_items:
            # the partial pass's loads issued together, as a full pass's: the items past n_items load the last item
            # instead (a cached vector, never folded), so no load waits behind a bounds check and the fold before it
            # (cross-entropy fwd at N = 6144 folded its one partial pass a vector at a time: 60 % of copy bandwidth
            # against 89 % at 8192). The same steps in the same order: the same result.
            vals = [load(base)]
            for u in cutlass.range_constexpr(1, unroll):
                vals.append(load(cutlass.min(base + u * stride, n_items - 1)))
            for u in cutlass.range_constexpr(unroll):
                j = base + u * stride
                if j < n_items:
                    acc = step(acc, j, vals[u])
    else:
        for u in cutlass.range_constexpr(unroll):
            j = base + u * stride
            if j < n_items:
                acc = step(acc, j, load(j))
    return acc


# --- row tiling ------------------------------------------------------------------------------------
@dataclass
class SplitRowWalk:
    """What one thread of a row-tiling kernel (launched on `row_tile_grid`) visits: CTA `bidx` of
    `gdim` takes row tiles bidx, bidx + gdim, ... (`count` of them); on each, the thread is `lane` of
    its row's threads and folds vectors [v_begin, v_begin + v_count) of split `split` of the row; the
    `tail` = n % vec elements past the last vector belong to the last split. With 64-bit indexing the
    tile arithmetic is widened (the loop still steps by one: DSL 4.8.1 cannot trace a loop whose
    dynamic step is 64-bit). The tiling enters as two ints, not as a RowTiling: the tracer rebuilds
    the dataclasses a staged loop uses, and would re-validate a RowTiling built from staged values.
    `row_block` > 1 (GEMV's register tile): each thread's row group owns `row_block` consecutive rows,
    so a tile is `rows_per_cta * row_block` rows and `row(i)` is the first of the group's rows."""

    rows_per_cta: int
    threads_per_row: int
    lane: object
    nv: object
    v_begin: object
    v_count: object
    tail: object
    bidx: object
    gdim: object
    count: object
    row_block: int = 1

    @staticmethod
    def create(tiling: RowTiling, rows, n, vec: int, splits, index64: bool, row_block: int = 1) -> SplitRowWalk:
        tidx, _, _ = cute.arch.thread_idx()
        bidx, split, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        nv = n // vec
        chunk = cute.ceil_div(nv, splits)
        v_begin = split * chunk
        v_count = cutlass.max(cutlass.min(nv - v_begin, chunk), 0)
        tiles = cute.ceil_div(rows, tiling.rows_per_cta * row_block)
        if index64:
            bidx, gdim, tiles = Int64(bidx), Int64(gdim), Int64(tiles)
        count = (cutlass.max(tiles - bidx, 0) + gdim - 1) // gdim
        return SplitRowWalk(tiling.rows_per_cta, tiling.threads_per_row, tidx % tiling.threads_per_row, nv,
                            v_begin, v_count, n - nv * vec, bidx, gdim, count, row_block)

    def row(self, i):
        """The row this thread works on in its CTA's `i`-th tile (may be >= rows: predicate it)."""
        tidx, _, _ = cute.arch.thread_idx()
        group = (self.bidx + i * self.gdim) * self.rows_per_cta + tidx // self.threads_per_row
        return group * self.row_block


def interleaved_split(split, splits, lane, threads_per_row: int, unroll: int):
    """(first, pass_stride) of `strided_fold` over a whole row's vectors (stride `threads_per_row`) for `lane` of split
    `split` of `splits` when the splits take the row's CTA passes (`threads_per_row * unroll` vectors) in turn instead
    of a column chunk each (`SplitRowWalk.v_begin`): the grid then reads the row from its start up, as one CTA would.
    Host ints or DSL integers."""
    cta_pass = threads_per_row * unroll
    return split * cta_pass + lane, splits * cta_pass


def row_tile_grid(rows, max_ctas, tiling: RowTiling, row_block: int = 1):
    """CTAs along x for a row-tiling kernel: one per row tile (`rows_per_cta * row_block` rows), at
    most `max_ctas`, at least one."""
    return cutlass.max(cutlass.min(cute.ceil_div(rows, tiling.rows_per_cta * row_block), max_ctas), 1)
