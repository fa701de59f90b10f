"""Warp, CTA and cluster reductions (curriculum lessons 2 and 4-7), shared by every row-wise kernel.

Threads are grouped into rows of `group` consecutive threads (a power of two). Within a warp the
butterfly `shfl.sync.bfly` leaves the group's result in every lane; groups wider than a warp add a
second stage through shared memory (one slot per warp), after which every thread of the group holds
the result. A row split over the CTAs of a cluster adds a third stage through distributed shared
memory (`cluster_reduce`). The combination order is fixed, so results are bit-for-bit reproducible.

A value is one scalar or a tuple of scalars reduced together through one set of shuffles and one
barrier (e.g. the (max, sum-of-exp) state of softmax or the two sums of a LayerNorm backward); `op`
then takes and returns tuples.
"""

from __future__ import annotations

import operator
from typing import Callable

import cutlass
import cutlass.cute as cute

from collectives.ptx import mbarrier_wait

WARP = 32


def _parts(val) -> tuple:
    return val if isinstance(val, tuple) else (val,)


def _whole(parts: tuple, like):
    return tuple(parts) if isinstance(like, tuple) else parts[0]


def width_of(val) -> int:
    """Scalars a value carries (1 for a scalar, len for a tuple)."""
    return len(_parts(val))


def shuffle_bfly(val, offset: int):
    """`shfl.sync.bfly` of a scalar or of each scalar of a tuple."""
    return _whole(tuple(cute.arch.shuffle_sync_bfly(v, offset=offset) for v in _parts(val)), val)


@cute.jit
def warp_reduce(val, op: Callable, group: cutlass.Constexpr[int] = WARP):
    """Butterfly reduction over aligned groups of `group` (<= 32) lanes; every lane gets its group's result."""
    offset = group // 2
    while cutlass.const_expr(offset > 0):
        val = op(val, shuffle_bfly(val, offset))
        offset = offset // 2
    return val


def group_smem_slots(threads: int, group: int, width: int = 1) -> int:
    """Shared-memory slots `group_reduce` needs for a CTA of `threads` (0 when groups fit in a warp)."""
    return width * (threads // WARP) if group > WARP else 0


def group_smem(smem, dtype, threads: int, group: int, width: int = 1):
    """Allocate from `smem` (the kernel's `SmemAllocator`) the `group_smem_slots` elements of `dtype`
    that `group_reduce` needs; None when the groups fit in a warp. Trace-time Python."""
    slots = group_smem_slots(threads, group, width)
    return smem.allocate_tensor(dtype, cute.make_layout(slots), byte_alignment=16) if slots else None


@cute.jit
def group_reduce(val, op: Callable, group: cutlass.Constexpr[int], smem: cute.Tensor, init=None):
    """Reduce `val` over groups of `group` consecutive threads (power of two, <= CTA size).

    `smem` holds `group_smem_slots(threads, group, width_of(val))` elements of val's type (unused
    when the group fits in a warp). Every thread of a group returns the group's result (the same
    bits in every thread when `op` commutes exactly, as add and max do). Every thread of the CTA
    must call it (a CTA barrier when `group > WARP`). Ends with the slots free for reuse only after
    the caller's next barrier. `init` (op's identity) is ignored; kept for existing callers.

    Groups wider than a warp: lane 0 of each warp stores its warp's result; after the barrier lane
    `l` of every warp loads the partial of warp `l % warps_per_group` of its group (one broadcast
    per slot), and a butterfly over `warps_per_group` lanes leaves the group's result in all 32
    lanes. (Loading only in lanes < warps_per_group, the others padded with `init`, would leave the
    result in those lanes only: a butterfly over aligned groups of `warps_per_group` lanes never
    mixes them with the rest. Row-wise kernels need it in every lane.)
    """
    val = warp_reduce(val, op, min(group, WARP))
    if cutlass.const_expr(group > WARP):
        width = width_of(val)
        warps_per_group = group // WARP
        lane = cute.arch.lane_idx()
        warp = cute.arch.warp_idx()
        if lane == 0:
            for i in cutlass.range_constexpr(width):
                smem[warp * width + i] = _parts(val)[i]
        cute.arch.barrier()
        src = (warp // warps_per_group) * warps_per_group + lane % warps_per_group
        partial = _whole(tuple(smem[src * width + i] for i in range(width)), val)
        val = warp_reduce(partial, op, warps_per_group)
    return val


def _spread_stages(width: int, group: int) -> list[tuple[int, int, int]]:
    """(lane offset, values held, values split off) of each butterfly stage of `group_reduce_spread`."""
    stages, m, offset = [], width, min(group, WARP) // 2
    while offset > 0:
        stages.append((offset, m, m // 2))
        m = m // 2 + m % 2
        offset //= 2
    return stages


@cute.jit
def group_reduce_spread(vals: tuple, group: cutlass.Constexpr[int], smem: cute.Tensor):
    """Sum each of the fp32 scalars `vals` (a tuple of `width` of them) over groups of `group`
    consecutive threads, leaving each sum in ONE thread: about one shuffle per value, not one per
    value and lane bit as `group_reduce` (which leaves every result in every lane) needs.

    Returns a tuple of (sum, index, owner) triples, the same count in every thread: `sum` is the
    total of value `index` (Int32, < width) when `owner` (Int32, 1 or 0) is 1; each index is owned
    by exactly one thread of the group. Warp stage: at the stage of lane bit `o` a thread holding
    `m` partial sums keeps half of them (the lower half when its bit is 0, the upper when 1), sends
    the other half to lane `l ^ o` and adds what it receives; an odd one out is summed by both lanes
    (a plain butterfly) and owned by the one whose bit is 0. Groups wider than a warp (`width` <=
    `group` required) add one shared stage: owners store into `smem`
    (`group_smem_slots(threads, group, width)` fp32 elements), a CTA barrier, and thread `i` of the
    group adds value `i` of its warps in warp order. Every thread of the CTA must call it; the slots
    are free again after the caller's next barrier. The combination order is fixed: deterministic.
    """
    width = len(vals)
    lane = cute.arch.lane_idx()
    vals, idx, own = list(vals), [cutlass.Int32(i) for i in range(width)], [cutlass.Int32(1)] * width
    stages = _spread_stages(width, group)
    for st in cutlass.range_constexpr(len(stages)):
        offset, m, h = stages[st]
        bit = (lane & offset) // offset  # 0 or 1
        hi = bit != 0
        nv, ni, no = [], [], []
        for i in cutlass.range_constexpr(h):
            send = cutlass.Float32(cutlass.select_(hi, vals[i], vals[i + h]))
            keep = cutlass.Float32(cutlass.select_(hi, vals[i + h], vals[i]))
            nv.append(keep + cute.arch.shuffle_sync_bfly(send, offset=offset))
            ni.append(cutlass.Int32(cutlass.select_(hi, idx[i + h], idx[i])))
            no.append(cutlass.Int32(cutlass.select_(hi, own[i + h], own[i])))
        if cutlass.const_expr(m % 2 == 1):
            last = vals[m - 1]
            nv.append(last + cute.arch.shuffle_sync_bfly(last, offset=offset))
            ni.append(idx[m - 1])
            no.append(own[m - 1] * (cutlass.Int32(1) - bit))
        vals, idx, own = nv, ni, no
    out = tuple((vals[i], idx[i], own[i]) for i in range(len(vals)))
    if cutlass.const_expr(group > WARP):
        assert width <= group, "the shared stage gives one value per thread of the group"
        warps_per_group = group // WARP
        warp = cute.arch.warp_idx()
        for i in cutlass.range_constexpr(len(vals)):
            if own[i] != 0:
                smem[warp * width + idx[i]] = vals[i]
        cute.arch.barrier()
        tidx, _, _ = cute.arch.thread_idx()
        mine = tidx % group
        first = (warp // warps_per_group) * warps_per_group
        j = cutlass.min(mine, width - 1)
        total = smem[first * width + j]
        for w in cutlass.range_constexpr(1, warps_per_group):
            total = total + smem[(first + w) * width + j]
        out = ((total, j, cutlass.Int32(cutlass.select_(mine < width, 1, 0))),)
    return out


def cluster_smem_slots(rows_per_cta: int, cluster_n: int, width: int = 1) -> int:
    """Shared-memory slots one `cluster_reduce` call site needs (0 without a cluster)."""
    return rows_per_cta * cluster_n * width if cluster_n > 1 else 0


@cute.jit
def cluster_reduce(val, op: Callable, cluster_n: cutlass.Constexpr[int], smem: cute.Tensor,
                   row_in_cta, lane_in_row, rank, mbar=None, phase=None, rows_per_cta: cutlass.Constexpr[int] = 1,
                   tree: cutlass.Constexpr[bool] = False, row_threads: cutlass.Constexpr[int] = WARP):
    """Combine per-CTA row results over the `cluster_n` CTAs of a cluster (distributed shared memory).

    Every thread of a row holds the CTA's result `val` for that row (after `group_reduce`). Lane `r`
    (r < cluster_n) of the row writes it into slot [row_in_cta, rank] of CTA `r`'s `smem`
    (`cluster_smem_slots` elements); after a cluster barrier (arrive.release / wait.acquire) each
    thread folds the `cluster_n` slots of its row in rank order, so every CTA gets the same bits.

    Reuse: a call site's slots may be rewritten only after the next cluster barrier of every peer;
    callers give each call site of a tile its own slots and alternate two sets between tiles (a
    peer that reaches tile i+2 has passed tile i+1's barrier, which every reader of tile i's slots
    had to arrive at after reading them).

    With `mbar` (this slot set's mbarrier in the CTA's shared memory, initialized with one arrival;
    `phase` the parity of its use, `rows_per_cta` the CTA's row groups) there is no cluster barrier:
    the lanes store with `st.async`, each store completing its byte count on the receiving CTA's
    mbarrier; thread 0 of every CTA arms its own barrier with the bytes all peers send it (the
    count may go negative first: stores can land before the arming, the arrival keeps the phase
    open) and every thread waits on it. No fence, so the previous tile's global stores need not
    drain first. Reuse holds as with the barrier: a peer writes tile i+2 into a slot set only after
    it has this CTA's tile i+1 values, which are sent after the CTA's tile barrier (`end_tile`)
    that follows every thread's reads of tile i.

    `tree` (`HeldRowPlan.cluster_fold` "tree"; the row's `row_threads` >= cluster_n): the fold is a butterfly
    instead, as `group_reduce` combines its warps: lane l of the row loads slot l % cluster_n and log2(cluster_n)
    shuffle stages leave the result in every lane. One shared-memory load and log2(cluster_n) ops on the critical
    path instead of cluster_n of each (a 16-CTA softmax row: 4 merges of two exps each, not 15 in a chain). The
    order is fixed (deterministic), the same in every CTA; the bits may differ from the rank-order fold's, and, for
    an `op` that does not commute exactly (the softmax state's merge), by an ulp between lanes, as `warp_reduce`'s.
    """
    width = width_of(val)
    if cutlass.const_expr(mbar is not None):
        tidx, _, _ = cute.arch.thread_idx()
        if tidx == 0:
            cute.arch.mbarrier_arrive_and_expect_tx(mbar, rows_per_cta * cluster_n * width * 4)
    if lane_in_row < cluster_n:
        base = (row_in_cta * cluster_n + rank) * width
        if cutlass.const_expr(mbar is not None):
            remote_bar = cutlass.Int32(cute.arch.map_dsmem_ptr(mbar, lane_in_row).toint())
        for i in cutlass.range_constexpr(width):
            remote = cutlass.Int32(cute.arch.map_dsmem_ptr(smem.iterator + (base + i), lane_in_row).toint())
            if cutlass.const_expr(mbar is None):
                cute.arch.inline_ptx("st.shared::cluster.f32 [{$r0}], {$r1};", read_only_args=[remote, _parts(val)[i]])
            else:
                cute.arch.inline_ptx("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [{$r0}], {$r1}, [{$r2}];",
                                     read_only_args=[remote, _parts(val)[i], remote_bar])
    if cutlass.const_expr(mbar is None):
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()
    else:
        mbarrier_wait(mbar, phase)
    first = row_in_cta * cluster_n * width
    if cutlass.const_expr(tree):
        assert row_threads >= cluster_n, "the butterfly spans cluster_n lanes of a row"
        src = first + (lane_in_row % cluster_n) * width
        acc = warp_reduce(_whole(tuple(smem[src + i] for i in range(width)), val), op, min(cluster_n, WARP))
    else:
        acc = _whole(tuple(smem[first + i] for i in range(width)), val)
        for r in cutlass.range_constexpr(1, cluster_n):
            acc = op(acc, _whole(tuple(smem[first + r * width + i] for i in range(width)), val))
    return acc


add = operator.add


def add_pairs(a, b):
    """Element-wise sum of two tuples (several sums reduced at once)."""
    return tuple(x + y for x, y in zip(a, b))


def welford_merge(a, b):
    """Chan's pairwise merge of two (count, mean, M2) partials of a row (M2: the sum of squared deviations
    from the mean): n = na + nb, mean = (na ma + nb mb) / n, M2 = M2a + M2b + (mb - ma)^2 na nb / n. Written
    so that swapping a and b gives the same expression up to the order of the operands of + and * (both
    commute in IEEE arithmetic; ptxas's FFMA contraction may still differ by an ulp between the two
    lanes of a butterfly). Empty partials (n = 0) merge to the other one."""
    na, ma, qa = a
    nb, mb, qb = b
    n = na + nb
    inv = cute.arch.rcp_approx(cutlass.max(n, cutlass.Float32(1.0)))
    d = mb - ma
    return n, (na * ma + nb * mb) * inv, qa + qb + d * d * (na * nb) * inv


@cute.jit
def fmax(a, b):
    return cute.arch.fmax(a, b)


def column_smem_slots(columns: int) -> int:
    """Shared-memory slots (fp32) `warpgroup_column_reduce` needs for a thread's `columns` accumulator columns."""
    return 4 * 4 * columns


@cute.jit
def warpgroup_column_reduce(vals: cute.Tensor, op: Callable, smem: cute.Tensor, barrier_id: cutlass.Constexpr[int]):
    """Each column of a warpgroup's WGMMA accumulator reduced over the 64 rows it spans: `vals` (columns,) holds
    a thread's partials for its columns (lane % 4 picks which; every lane of one lane % 4 holds the same columns
    over other rows). A butterfly over lanes 4, 8, 16 apart reduces a warp's rows; lanes 0-3 of each warp
    store their warp's results into `smem` (`column_smem_slots` fp32 slots) and, after a named barrier of the
    warpgroup's 128 threads, every thread combines the four warps' in warp order (the same bits in every thread).
    The slots are free again only after the caller's next barrier of the warpgroup."""
    cols = cute.size(vals)
    for c in cutlass.range_constexpr(cols):
        v = vals[c]
        for off in (4, 8, 16):
            v = op(v, cute.arch.shuffle_sync_bfly(v, offset=off))
        vals[c] = v
    lane = cute.arch.lane_idx()
    warp = cute.arch.warp_idx() % 4
    if lane < 4:
        for c in cutlass.range_constexpr(cols):
            smem[(warp * 4 + lane) * cols + c] = vals[c]
    cute.arch.barrier(barrier_id=barrier_id, number_of_threads=128)
    for c in cutlass.range_constexpr(cols):
        v = smem[(lane % 4) * cols + c]
        for w in cutlass.range_constexpr(1, 4):
            v = op(v, smem[(w * 4 + lane % 4) * cols + c])
        vals[c] = v
