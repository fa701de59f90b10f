"""WGMMA mainloop: the consumer half of the TMA pipeline.

For each K-block a warpgroup waits for the stage's full barrier, issues the WGMMAs of the stage
(tile_k / 16 instructions, operands read straight from swizzled shared memory), commits them as one
group, and waits until at most `in_flight` groups are still running before releasing the *previous*
stage to the producer. With `in_flight=1` the tensor cores always have the next stage's WGMMAs
queued while the previous stage's buffer is handed back.

The accumulator is fp32 in registers. FP8 promotion (a second fp32 accumulator flushed every few
K-blocks) builds on `mma_k_tiles` by splitting the K range.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warpgroup


def accumulate_mode(tiled_mma: cute.TiledMma) -> None:
    """Make every WGMMA add into the accumulator (which `mma_k_tiles` zeroes per tile). Call it
    outside staged loops: the field is a value the tracer cannot carry out of a loop body."""
    tiled_mma.set(warpgroup.Field.ACCUMULATE, True)


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
):
    """acc = A_tile @ B_tile over `k_tiles` K-blocks (acc is zeroed first; k_tiles >= 1). The caller
    sets the MMA's ACCUMULATE field once, before its tile loop (`accumulate_mode(tiled_mma)`).

    tCrA/tCrB are the WGMMA operand views (MMA, MMA_M/N, MMA_K, stage). Returns the advanced
    (read_state, release_state); every stage read is released before returning.
    """
    k_blocks = cute.size(tCrA, mode=[2])
    acc.fill(0.0)
    warpgroup.fence()
    prologue = cutlass.min(in_flight, k_tiles)
    for _ in cutlass.range(prologue, unroll=1):
        pipe.consumer_wait(read_state)
        for kb in cutlass.range_constexpr(k_blocks):
            cute.gemm(tiled_mma, acc, tCrA[(None, None, kb, read_state.index)],
                      tCrB[(None, None, kb, read_state.index)], acc)
        warpgroup.commit_group()
        read_state.advance()
    for _ in cutlass.range(prologue, k_tiles, unroll=1):
        pipe.consumer_wait(read_state)
        for kb in cutlass.range_constexpr(k_blocks):
            cute.gemm(tiled_mma, acc, tCrA[(None, None, kb, read_state.index)],
                      tCrB[(None, None, kb, read_state.index)], acc)
        warpgroup.commit_group()
        warpgroup.wait_group(in_flight)
        pipe.consumer_release(release_state)
        release_state.advance()
        read_state.advance()
    warpgroup.wait_group(0)
    for _ in cutlass.range(prologue, unroll=1):
        pipe.consumer_release(release_state)
        release_state.advance()
    return read_state, release_state
