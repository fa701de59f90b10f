"""WGMMA mainloop: the consumer half of the TMA pipeline.

For each K-block a warpgroup waits for the stage's full barrier, issues the WGMMAs of the stage
(tile_k / 16 instructions, operands read straight from swizzled shared memory), commits them as one
group, and waits until at most `in_flight` groups are still running before releasing the *previous*
stage to the producer. With `in_flight=1` the tensor cores always have the next stage's WGMMAs
queued while the previous stage's buffer is handed back.

The accumulator is fp32 in registers. `mma_k_tiles_promoted` is the FP8 variant (two-level
accumulation, DeepGEMM's "promotion"): Hopper's FP8 WGMMA adds its products into the accumulator
with fewer mantissa bits than fp32, so a long K inside the tensor core loses precision. Each
K-block (one stage, 128 deep: one scale block) is computed into a zeroed temporary accumulator;
after the WGMMAs complete, the CUDA cores add temp * scale (the block's sa[row] * sb[col-block],
`collectives.block_scales`) into the fp32 main accumulator. Scale loads are issued before the
wait so their latency hides behind the tensor cores.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import warpgroup
from cutlass.cutlass_dsl import T

from collectives.ptx import asm_b32


def accumulate_mode(tiled_mma: cute.TiledMma) -> None:
    """Make every WGMMA add into the accumulator (which `mma_k_tiles` zeroes per tile). Call it
    outside staged loops: the field is a value the tracer cannot carry out of a loop body."""
    tiled_mma.set(warpgroup.Field.ACCUMULATE, True)


def stage_of(t: cute.Tensor, stage) -> cute.Tensor:
    """Stage `stage` of a WGMMA operand view (MMA, MMA_M/N, MMA_K, stage): (MMA, MMA_M/N, MMA_K)."""
    return t[(None, None, None, stage)]


@cute.jit
def mma_blocks(tiled_mma: cute.TiledMma, acc: cute.Tensor, tA: cute.Tensor, tB: cute.Tensor,
               zero_first: cutlass.Constexpr[bool] = False, b_stage=None):
    """acc += tA @ tB over the K blocks of one stage (one WGMMA per block, issued, not committed).
    tA/tB are (MMA, MMA_M/N, MMA_K) views with the stage already sliced (`stage_of`): slicing the
    dynamic stage index once, not per K block, lets ptxas step each descriptor with one 64-bit uniform
    add (UIADD3.64) instead of rebuilding both 32-bit halves before every WGMMA (the attention
    forward's SASS, D = 128: 135 -> 75 UMOV, 2424 -> 2360 instructions; FA4's loop body has 9 UMOV per
    K/V block to our 42). With `b_stage`, tB is still staged and is sliced per block (the attention's
    QK^T at D = 192, where the precomputed descriptors of its 12 blocks made ptxas serialize the WGMMAs
    of the band-mask variant; D = 256 steps its descriptors, at the same speed).
    `zero_first`: the first block overwrites acc (ACCUMULATE off), the rest add."""
    for kb in cutlass.range_constexpr(cute.size(tA, mode=[2])):
        if cutlass.const_expr(zero_first):
            tiled_mma.set(warpgroup.Field.ACCUMULATE, kb != 0)
        b = tB[(None, None, kb)] if cutlass.const_expr(b_stage is None) else tB[(None, None, kb, b_stage)]
        cute.gemm(tiled_mma, acc, tA[(None, None, kb)], b, acc)


@cute.jit
def mma_k_tiles(
    tiled_mma: cute.TiledMma,
    acc: cute.Tensor,
    tCrA: cute.Tensor,
    tCrB: cute.Tensor,
    pipe,
    read_state,
    release_state,
    k_tiles,
    in_flight: cutlass.Constexpr[int] = 1,
    k_step: cutlass.Constexpr[int] = 1,
):
    """acc = A_tile @ B_tile over `k_tiles` K-blocks (acc is zeroed first; k_tiles >= 1). The caller
    sets the MMA's ACCUMULATE field once, before its tile loop (`accumulate_mode(tiled_mma)`).

    tCrA/tCrB are the WGMMA operand views (MMA, MMA_M/N, MMA_K, stage). Returns the advanced
    (read_state, release_state); every stage read is released before returning.
    `k_step` (the ping-pong `k_interleave`: two warpgroups on one tile, each every other K-block): the
    states step over that many stages after each K-block (the other warpgroup's stages in between are
    neither waited for nor released here).
    """
    acc.fill(0.0)
    warpgroup.fence()
    prologue = cutlass.min(in_flight, k_tiles)
    for _ in cutlass.range(prologue, unroll=1):
        pipe.consumer_wait(read_state)
        mma_blocks(tiled_mma, acc, stage_of(tCrA, read_state.index), stage_of(tCrB, read_state.index))
        warpgroup.commit_group()
        read_state.advance(k_step)
    for _ in cutlass.range(prologue, k_tiles, unroll=1):
        pipe.consumer_wait(read_state)
        mma_blocks(tiled_mma, acc, stage_of(tCrA, read_state.index), stage_of(tCrB, read_state.index))
        warpgroup.commit_group()
        warpgroup.wait_group(in_flight)
        pipe.consumer_release(release_state)
        release_state.advance(k_step)
        read_state.advance(k_step)
    warpgroup.wait_group(0)
    for _ in cutlass.range(prologue, unroll=1):
        pipe.consumer_release(release_state)
        release_state.advance(k_step)
    return read_state, release_state


@cute.jit
def mma_k_tiles_promoted(
    tiled_mma: cute.TiledMma,
    acc: cute.Tensor,
    temp: cute.Tensor,
    tCrA: cute.Tensor,
    tCrB: cute.Tensor,
    pipe,
    read_state,
    release_state,
    k_tiles,
    scales,
    turns=None,
    sb_ahead: cutlass.Constexpr = False,
    k_step: cutlass.Constexpr[int] = 1,
):
    """acc = sum over the `k_tiles` K-blocks of scale_k * (A_k @ B_k), each block's product
    accumulated by WGMMA in `temp` (same shape as acc) and promoted into acc on the CUDA cores.
    `scales` is a `collectives.block_scales.BlockScales` (prefetch / fetch / promote). Same
    arguments, ACCUMULATE setting and returned states as `mma_k_tiles`.

    `turns` (the FP8 GEMM's `wg_turns`: this warpgroup's and the other's named barrier): the two
    consumer warpgroups of a cooperative tile issue their K-block WGMMAs in turn (wait for mine,
    issue and commit, arrive on theirs), so each sub-partition's tensor core has one warpgroup's
    K-block queued ahead of the other's: the first finishes early and promotes on the CUDA cores
    while the second's WGMMAs run, and its next K-block queues behind them. Without it the two
    warpgroups' WGMMAs interleave, finish together, and both promote while the tensor cores idle.
    The caller pre-arrives warpgroup 0's barrier once before its first tile; the sums are bitwise
    the same (the same FFMAs in the same order).

    Per K-block: B scales (global) -> wait stage -> zero temp, WGMMAs, commit -> A scales (smem of
    that stage) -> wait for the WGMMAs -> release the stage -> acc += temp * sa * sb. The tensor
    cores idle during this warpgroup's promotion unless the other consumer warpgroup has WGMMAs
    queued (both schedules run two consumer warpgroups, so they mostly do).

    With staged B scales (`scales.staged`, the `sb_smem` option) K-block 0 also copies the tile's
    B-scale rows into shared memory (global loads before its wait, stores + the two warpgroups'
    barrier after its WGMMAs are issued); later K-blocks read sb with an LDS before the stage wait
    and sa right after it, and multiply them after the WGMMAs complete (in PTX; ptxas moves the
    FMULs up, but their inputs are shared loads issued before the K-block's first WGMMA).

    `k_step` (as in `mma_k_tiles`): the K-blocks are every `k_step`-th of the tile from `scales.k0` (their
    B scales too); not with staged B scales (their rows are copied at the tile's K-block 0).
    """
    acc.fill(0.0)
    if cutlass.const_expr(scales.staged and k_step != 1):
        raise ValueError("k_step > 1 (k_interleave) does not combine with staged B scales (sb_smem)")
    if cutlass.const_expr(scales.staged):
        # sb_smem: K-block 0 also stages the tile's B-scale rows (global loads before the wait,
        # shared stores + barrier once its WGMMAs are issued); the loop then starts at 1.
        if k_tiles > 0:
            row = scales.load_row()
            pipe.consumer_wait(read_state)
            _take_turn(turns)
            _issue_block(tiled_mma, temp, tCrA, tCrB, read_state.index)
            _pass_turn(turns)
            scales.store_row(row)
            s = scales.fetch(scales.prefetch(0), read_state.index)  # after store_row's barrier
            read_state, release_state = _release_and_promote(pipe, release_state, read_state, scales, acc, temp,
                                                             s, 0)
        for k in cutlass.range(1, k_tiles, unroll=1):
            sb = scales.prefetch(k)
            pipe.consumer_wait(read_state)
            raw = scales.load(sb, read_state.index)
            _take_turn(turns)
            _issue_block(tiled_mma, temp, tCrA, tCrB, read_state.index)
            _pass_turn(turns)
            warpgroup.wait_group(0)
            s = scales.combine(raw)
            pipe.consumer_release(release_state)
            release_state.advance()
            read_state.advance()
            scales.promote(acc, temp, s)
    elif cutlass.const_expr(sb_ahead):
        # B scales one K-block ahead: K-block k+1's global loads are issued before K-block k's wait and
        # consumed a whole K-block later. Two K-blocks an iteration, each scale in its own variable
        # (a one-K-block loop would carry the value through a register move that ptxas places right
        # after the loads, waiting for them in the same K-block); an odd last K-block after the loop.
        sb_a = scales.prefetch(0)
        last = k_tiles - 1
        for kk in cutlass.range(k_tiles // 2, unroll=1):
            sb_b = scales.prefetch((kk * 2 + 1) * k_step)
            read_state, release_state = _promoted_block(tiled_mma, acc, temp, tCrA, tCrB, pipe, read_state,
                                                        release_state, scales, sb_a, turns, k_step)
            sb_a = scales.prefetch(cutlass.min(kk * 2 + 2, last) * k_step)
            read_state, release_state = _promoted_block(tiled_mma, acc, temp, tCrA, tCrB, pipe, read_state,
                                                        release_state, scales, sb_b, turns, k_step)
        if k_tiles % 2 == 1:
            read_state, release_state = _promoted_block(tiled_mma, acc, temp, tCrA, tCrB, pipe, read_state,
                                                        release_state, scales, sb_a, turns, k_step)
    else:
        for k in cutlass.range(k_tiles, unroll=1):
            read_state, release_state = _promoted_block(tiled_mma, acc, temp, tCrA, tCrB, pipe, read_state,
                                                        release_state, scales, scales.prefetch(k * k_step), turns,
                                                        k_step)
    return read_state, release_state


def _promoted_block(tiled_mma, acc, temp, tCrA, tCrB, pipe, read_state, release_state, scales, sb, turns, step=1):
    """One K-block of `mma_k_tiles_promoted` with its B scales `sb` already loaded (this K-block's, or
    one K-block ahead with `sb_ahead`): wait stage -> zero temp, WGMMAs, commit -> A scales -> wait for
    the WGMMAs -> release -> promote. `step`: the stages the states step over (`k_step`)."""
    pipe.consumer_wait(read_state)
    _take_turn(turns)
    temp.fill(0.0)
    warpgroup.fence()
    mma_blocks(tiled_mma, temp, stage_of(tCrA, read_state.index), stage_of(tCrB, read_state.index))
    warpgroup.commit_group()
    _pass_turn(turns)
    s = scales.fetch(sb, read_state.index)
    return _release_and_promote(pipe, release_state, read_state, scales, acc, temp, s, 0, step)


def _release_and_promote(pipe, release_state, read_state, scales, acc, temp, s, pending: int, step: int = 1):
    """The end of a promoted K-block: wait until at most `pending` WGMMA groups are in flight (this
    K-block's are done), release its stage, step the states by `step` stages (`read_state` too unless None:
    nothing left to read) and promote `temp` with the scales `s` into acc. Returns the states (callers rebind
    them: the tracer threads only locals rebound in the staged loop or branch body)."""
    warpgroup.wait_group(pending)
    pipe.consumer_release(release_state)
    release_state.advance(step)
    if read_state is not None:
        read_state.advance(step)
    scales.promote(acc, temp, s)
    return read_state, release_state


def _overlap_step(tiled_mma, acc, t_new, t_old, tCrA, tCrB, pipe, read_state, release_state, scales, sb):
    """A step of `mma_k_tiles_promoted_overlap`: the next K-block's WGMMAs into `t_new`, then the
    previous K-block (`t_old`, its B scales `sb`, its stage the one `release_state` points at) waited
    for, released and promoted while they run."""
    pipe.consumer_wait(read_state)
    _issue_block(tiled_mma, t_new, tCrA, tCrB, read_state.index)
    s = scales.fetch(sb, release_state.index)
    return _release_and_promote(pipe, release_state, read_state, scales, acc, t_old, s, 1)


def _take_turn(turns):
    """Wait for this warpgroup's turn to issue (`mma_k_tiles_promoted`'s `turns`; nothing without)."""
    if turns is not None:
        turns[0].arrive_and_wait()


def _pass_turn(turns):
    """Hand the turn to the other consumer warpgroup once this K-block's WGMMAs are issued."""
    if turns is not None:
        turns[1].arrive()


@cute.jit
def _issue_block(tiled_mma: cute.TiledMma, temp: cute.Tensor, tCrA: cute.Tensor, tCrB: cute.Tensor, stage):
    """temp = A_stage @ B_stage (zeroed first: ptxas folds the zeroing into the first WGMMA's
    scale-d = 0), issued and committed as one WGMMA group; returns without waiting."""
    temp.fill(0.0)
    warpgroup.fence()
    mma_blocks(tiled_mma, temp, stage_of(tCrA, stage), stage_of(tCrB, stage))
    warpgroup.commit_group()


@cute.jit
def _issue_fresh(mma_set: cute.TiledMma, mma_add: cute.TiledMma, temp: cute.Tensor, tCrA: cute.Tensor,
                 tCrB: cute.Tensor, stage):
    """temp = A_stage @ B_stage with no zeroing: the first WGMMA overwrites temp (`mma_set`, its
    ACCUMULATE field off), the rest add (`mma_add`); committed as one group. Two MMA objects whose
    fields are set once outside the loops: setting a field per block inside the K loop leaves the
    object holding a value of the loop's region. Zeroing with moves instead: with another group in
    flight LLVM sank them past the fence, and ptxas serialized every WGMMA."""
    warpgroup.fence()
    tA, tB = stage_of(tCrA, stage), stage_of(tCrB, stage)
    for kb in cutlass.range_constexpr(cute.size(tA, mode=[2])):
        cute.gemm(mma_set if kb == 0 else mma_add, temp, tA[(None, None, kb)], tB[(None, None, kb)], temp)
    warpgroup.commit_group()


@cute.jit
def mma_k_tiles_promoted_overlap(
    tiled_mma: cute.TiledMma,
    acc: cute.Tensor,
    t0: cute.Tensor,
    t1: cute.Tensor,
    tCrA: cute.Tensor,
    tCrB: cute.Tensor,
    pipe,
    read_state,
    release_state,
    k_tiles,
    scales,
    sb_ahead: cutlass.Constexpr = False,
):
    """`mma_k_tiles_promoted` with the promotion of K-block k-1 overlapping the WGMMAs of K-block k
    (the `promote_overlap` option of the FP8 GEMM). Two temporaries t0 / t1 alternate: K-block k is
    issued into t[k % 2], then `wait_group(1)` waits only for K-block k-1 (the tensor cores keep
    K-block k queued), its stage is released and t[(k-1) % 2] is promoted on the CUDA cores while
    the tensor cores work. Costs one more accumulator-sized temporary per thread (3 x 64 fp32 at
    64 x 128 per warpgroup) and holds each stage one K-block longer (its A scales are read before
    it is released). The parity of a temporary must be known when the kernel is traced, so the
    K loop runs in pairs after K-block 0, with a tail for an even K-block count. Same arguments
    (plus the second temporary), ACCUMULATE setting and returned states as `mma_k_tiles_promoted`;
    the sum is bitwise the same (same FFMAs in the same K order).

    `sb_ahead` (B scales from global): K-block j's scales are loaded in the step that issues j, a step
    before its promotion (without it, in the step that promotes it): `sb_a` holds the even K-blocks'
    scales and is reloaded right after its use, `sb_b` the odd ones', so no register move carries a
    load across the loop."""
    acc.fill(0.0)
    if k_tiles > 0:
        row = scales.load_row()  # sb_smem: stage the tile's B-scale rows (None / no-op without it)
        pipe.consumer_wait(read_state)
        sb_a = scales.prefetch(0) if cutlass.const_expr(sb_ahead) else None
        _issue_block(tiled_mma, t0, tCrA, tCrB, read_state.index)
        scales.store_row(row)
        read_state.advance()
        for p in cutlass.range((k_tiles - 1) // 2, unroll=1):
            k = 2 * p + 1
            # K-block k -> t1 while K-block k-1 (t0) is promoted.
            if cutlass.const_expr(sb_ahead):
                sb_b = scales.prefetch(k)
                sb = sb_a
            else:
                sb = scales.prefetch(k - 1)
            read_state, release_state = _overlap_step(tiled_mma, acc, t1, t0, tCrA, tCrB, pipe, read_state,
                                                      release_state, scales, sb)
            # K-block k+1 -> t0 while K-block k (t1) is promoted.
            if cutlass.const_expr(sb_ahead):
                sb_a = scales.prefetch(k + 1)
                sb = sb_b
            else:
                sb = scales.prefetch(k)
            read_state, release_state = _overlap_step(tiled_mma, acc, t0, t1, tCrA, tCrB, pipe, read_state,
                                                      release_state, scales, sb)
        if (k_tiles - 1) % 2 == 1:  # even K-block count: the last one goes to t1
            if cutlass.const_expr(sb_ahead):
                sb_b = scales.prefetch(k_tiles - 1)
                sb = sb_a
            else:
                sb = scales.prefetch(k_tiles - 2)
            read_state, release_state = _overlap_step(tiled_mma, acc, t1, t0, tCrA, tCrB, pipe, read_state,
                                                      release_state, scales, sb)
            sb = sb_b if cutlass.const_expr(sb_ahead) else scales.prefetch(k_tiles - 1)
            _, release_state = _release_and_promote(pipe, release_state, None, scales, acc, t1,
                                                    scales.fetch(sb, release_state.index), 0)
        else:  # odd: the last one is in t0
            sb = sb_a if cutlass.const_expr(sb_ahead) else scales.prefetch(k_tiles - 1)
            _, release_state = _release_and_promote(pipe, release_state, None, scales, acc, t0,
                                                    scales.fetch(sb, release_state.index), 0)
    return read_state, release_state


@cute.jit
def mma_k_tiles_promoted_halves(
    half_mma: cute.TiledMma,
    half_set: cute.TiledMma,
    acc: cute.Tensor,
    halves,
    tCrA: cute.Tensor,
    tCrB: tuple,
    pipe,
    read_state,
    release_state,
    k_tiles,
    scales,
    to_acc: tuple,
    sequential: cutlass.Constexpr[bool] = False,
):
    """`mma_k_tiles_promoted` with each K-block's WGMMAs cut into two column halves, committed as two
    groups, so the tensor cores always hold one half while the CUDA cores promote the other (the
    `promote_halves` option of the FP8 GEMM). Per K-block k (half 0 already issued): issue half 1;
    wait for half 0 (one group left in flight), promote it; wait for stage k+1, issue its half 0;
    wait for half 1 of k, release k's stage, promote it. The temporaries are half the accumulator each
    (`halves`: views of one register array shaped as `half_mma`'s C partition), so registers stay at the
    plain promotion's acc + one temporary: the wide tiles (128x160 / 128x192), which `promote_overlap`'s
    three sets cannot hold, get the overlap (SASS at 128x192: up to R215 of 232, no spills; the kernel
    needs `.minnctapersm 1`, `Gemm._reg_bound`, or ptxas ignores setmaxnreg). The price: each half's
    WGMMAs read the warpgroup's A slice again from shared memory (A 8 KiB + B/2 per half-group).

    half_mma / half_set: the half-width MMA with ACCUMULATE on / off (`_issue_fresh`: no zeroing).
    tCrA: `half_mma`'s A fragment (MMA, 1, MMA_K, stage); tCrB: one B fragment per half (the tile's
    columns [0, N/2) and [N/2, N)). `to_acc[h]`: for each element of half h, its index in `acc`
    (trace-time table, `half_index_map`). The FFMAs are the plain promotion's, in the same K order:
    bitwise the same sums. Same ACCUMULATE setting and returned states as `mma_k_tiles_promoted`.

    `sequential` (the 128 x 256 tile: acc's 128 registers leave room for one half-width temporary, `halves` two views
    of it): per K-block, half 0 issued, waited for and promoted, then half 1 the same; the other consumer
    warpgroup's WGMMAs are what the tensor cores run during a promotion. Staged B scales are stored before the first
    K-block."""
    acc.fill(0.0)
    t0, t1 = halves
    if cutlass.const_expr(sequential):
        scales.store_row(scales.load_row())
        for k in cutlass.range(k_tiles, unroll=1):
            sb = scales.prefetch(k)
            pipe.consumer_wait(read_state)
            _issue_fresh(half_set, half_mma, t0, tCrA, tCrB[0], read_state.index)
            s = scales.fetch(sb, read_state.index)
            warpgroup.wait_group(0)
            scales.promote_part(acc, t0, s, to_acc[0])
            _issue_fresh(half_set, half_mma, t0, tCrA, tCrB[1], read_state.index)
            s = scales.fetch(sb, read_state.index)  # (the products do not live across the issue)
            warpgroup.wait_group(0)
            pipe.consumer_release(release_state)
            release_state.advance()
            read_state.advance()
            scales.promote_part(acc, t0, s, to_acc[1])
    elif k_tiles > 0:
        row = scales.load_row()  # sb_smem: stage the tile's B-scale rows (None / no-op without it)
        pipe.consumer_wait(read_state)
        _issue_fresh(half_set, half_mma, t0, tCrA, tCrB[0], read_state.index)
        scales.store_row(row)
        read_state.advance()  # release_state: K-block k's stage, read_state: k+1's
        for k in cutlass.range(k_tiles - 1, unroll=1):
            sb = scales.prefetch(k)  # B scales of K-block k (global loads without sb_smem: issued first)
            _issue_fresh(half_set, half_mma, t1, tCrA, tCrB[1], release_state.index)
            s = scales.fetch(sb, release_state.index)
            warpgroup.wait_group(1)  # half 0 of K-block k
            scales.promote_part(acc, t0, s, to_acc[0])
            pipe.consumer_wait(read_state)  # K-block k+1
            _issue_fresh(half_set, half_mma, t0, tCrA, tCrB[0], read_state.index)
            read_state.advance()
            s = scales.fetch(sb, release_state.index)  # again: the products do not live across the issue
            warpgroup.wait_group(1)  # half 1 of K-block k
            pipe.consumer_release(release_state)
            release_state.advance()
            scales.promote_part(acc, t1, s, to_acc[1])
        # The last K-block's half 1, issued from two branches on purpose: with one straight-line tail
        # ptxas (CUDA 13.0) reports C7514 and serializes every WGMMA of the kernel.
        if k_tiles % 2 == 1:
            _halves_tail(half_mma, half_set, acc, t0, t1, tCrA, tCrB, pipe, release_state, k_tiles, scales, to_acc)
        else:
            _halves_tail(half_mma, half_set, acc, t0, t1, tCrA, tCrB, pipe, release_state, k_tiles, scales, to_acc)
        release_state.advance()
    return read_state, release_state


@cute.jit
def _halves_tail(half_mma, half_set, acc, t0, t1, tCrA, tCrB, pipe, release_state, k_tiles, scales, to_acc):
    """`mma_k_tiles_promoted_halves`'s last K-block (its half 0 already issued): issue half 1, promote
    half 0, wait for half 1, release the stage (the caller advances the state), promote half 1."""
    _issue_fresh(half_set, half_mma, t1, tCrA, tCrB[1], release_state.index)
    s = scales.fetch(scales.prefetch(k_tiles - 1), release_state.index)
    warpgroup.wait_group(1)
    scales.promote_part(acc, t0, s, to_acc[0])
    warpgroup.wait_group(0)
    pipe.consumer_release(release_state)
    scales.promote_part(acc, t1, s, to_acc[1])


def half_index_map(tiled_mma: cute.TiledMma, half_mma: cute.TiledMma, tile_m: int, tile_n: int) -> tuple:
    """For each column half h of the tile: the index in the full accumulator (`tiled_mma`'s C
    partition of tile_m x tile_n) of every element of `half_mma`'s C partition of tile_m x tile_n/2,
    shifted by h * tile_n / 2 columns. Trace-time; raises if a half element has no full twin."""
    hn = tile_n // 2
    full = tiled_mma.get_slice(0).partition_C(cute.make_identity_tensor((tile_m, tile_n)))
    half = half_mma.get_slice(0).partition_C(cute.make_identity_tensor((tile_m, hn)))
    where = {}
    for j in range(cute.size(full)):
        m, n = full[j]
        where[(int(m), int(n))] = j
    out = []
    for h in range(2):
        idx = []
        for i in range(cute.size(half)):
            m, n = half[i]
            idx.append(where[(int(m), int(n) + h * hn)])
        out.append(tuple(idx))
    assert sorted(out[0] + out[1]) == list(range(cute.size(full))), "the halves do not cover the accumulator"
    return tuple(out)


def acc_a_view(acc: cute.Tensor) -> cute.Tensor:
    """A WGMMA accumulator ((2, 2, V), MMA_M, MMA_N) regrouped as the register A operand of a
    following WGMMA, ((2, 2, 2), MMA_M, (V/2, MMA_N)): same registers, A's index order.

    For 16-bit operands the two layouts put the same (row, column) in the same thread: a 64 x 16
    K-block of A is two adjacent 8-column blocks of C (tests/attention/test_forward_compile.py checks it
    element by element). V must be even (the C tile's N a multiple of 16)."""
    lay = cute.logical_divide(acc.layout, ((None, None, 2), None, None))  # ((2, 2, (2, V/2)), M, N)
    s, d = lay.shape, lay.stride
    view = cute.make_layout(((s[0][0], s[0][1], s[0][2][0]), s[1], (s[0][2][1], s[2])),
                            stride=((d[0][0], d[0][1], d[0][2][0]), d[1], (d[0][2][1], d[2])))
    return cute.make_tensor(acc.iterator, view)


def _pack2(lo, hi, dtype) -> cutlass.Int32:
    """Two fp32 values rounded to one packed 16-bit pair (`lo` in the low half), as an opaque PTX
    `cvt.rn.{bf16x2,f16x2}.f32`. Opaque on purpose: LLVM folds a phi of two identical conversions
    (the P converted before the walk and the one converted in its loop) into one conversion of a phi,
    which sinks the conversion into the next step; the loop then carries P as 64 fp32 values instead
    of 32 packed words (D = 64 at 192 rows: the 30 registers that spilled S and O every step)."""
    ty = "bf16x2" if dtype is cutlass.BFloat16 else "f16x2"
    return cutlass.Int32(llvm.inline_asm(T.i32(), [cutlass.Float32(lo).ir_value(), cutlass.Float32(hi).ir_value()],
                                         f"cvt.rn.{ty}.f32 $0, $2, $1;", "=r,f,f",
                                         has_side_effects=False, is_align_stack=False))


def acc_as_a_operand(acc: cute.Tensor, dtype, out: cute.Tensor | None = None, pinned: bool = True) -> cute.Tensor:
    """The fp32 accumulator converted to `dtype` as the register A operand of the next WGMMA
    (`OperandSource.RMEM`): FlashAttention's P = softmax(S) feeding O += P V without a trip
    through shared memory. Into `out` when given (registers that must outlive the accumulator's
    next use: FA3's overlap keeps P_j while S_{j+1} is computed into the same accumulator).
    `pinned`: 16-bit types convert pairwise through `_pack2` (round to nearest even, as `.to(dtype)`),
    here; else by `.to(dtype)`, which LLVM may sink to P's use in the next loop step (32 more
    registers live across the loop, the conversion issued after the next S GEMM)."""
    view = acc_a_view(acc)
    if out is None:
        out = cute.make_rmem_tensor(view.shape, dtype)
    if pinned and dtype in (cutlass.BFloat16, cutlass.Float16):
        # element pairs (2i, 2i + 1) in A's order: the first mode's first pair, adjacent in `out`
        words = cute.recast_tensor(out, cutlass.Int32)
        for i in range(cute.size(words)):  # a plain function: the loop unrolls as it traces
            words[i] = _pack2(view[2 * i], view[2 * i + 1], dtype)
    else:
        out.store(view.load().to(dtype))
    return out


# --- register A operands built from shared memory (swapped-operand decode: K and V^T as A) --------------------
def e4m3x2_to_f16x2(word, high: bool) -> cutlass.Int32:
    """The two e4m3 values of `word`'s low (or high) 16 bits as one packed f16x2 word, the first in the low half
    (exact: every e4m3 value is an fp16 value)."""
    half = "h" if high else "l"
    return asm_b32(f"{{.reg .b16 l, h; mov.b32 {{l, h}}, $1; cvt.rn.f16x2.e4m3x2 $0, {half};}}", "=r,r", word)


def permute_bytes(a, b, selector: int) -> cutlass.Int32:
    """`prmt.b32`: byte k of the result is byte (selector >> 4 k) & 7 of the pair (a = bytes 0-3, b = 4-7)."""
    return asm_b32(f"prmt.b32 $0, $1, $2, {selector};", "=r,r,r", a, b)


def fence_operand(t: cute.Tensor) -> None:
    """Pins each 32-bit register of the rmem tensor `t` at this point (an empty volatile asm reading and rewriting
    it): every instruction defining it is ordered before, so none sinks past the next `warpgroup.fence()` into the
    WGMMA's pipeline stage, where ptxas would serialize the WGMMAs that read it (C7513)."""
    words = cute.recast_tensor(t, cutlass.Int32)
    for i in range(cute.size(words)):  # a plain function: the loop unrolls as it traces
        words[i] = cutlass.Int32(llvm.inline_asm(T.i32(), [words[i].ir_value()], "", "=r,0",
                                                 has_side_effects=True, is_align_stack=False))
