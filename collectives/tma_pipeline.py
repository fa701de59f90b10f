"""TMA load pipeline: A and B tiles stream from global memory into a ring of swizzled shared-memory
stages, one mbarrier pair per stage (full: the TMA bytes landed; empty: every consumer released it).

Host side (inside the `@cute.jit` launcher): `operand_smem_layout` picks the widest WGMMA swizzle
atom for the operand's major mode (128-byte swizzle for a 64-element bf16 K tile) and tiles it over
(rows, tile_k, stages); `operand_tma` builds the TMA atom for one stage's box, multicast across the
cluster when more than one CTA shares the tile.

Device side: `produce_k_tiles` is the producer warp's loop for one output tile (acquire a stage,
issue both TMA loads on its full barrier); the consumers' half is `collectives.wgmma_mainloop`.
The same pipeline feeds the FP8 GEMM (plus a scale box per stage) and attention.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warpgroup


def operand_smem_layout(major, dtype, rows: int, tile_k: int, stages: int, atom_extent: int | None = None):
    """(rows, tile_k, stages) swizzled layout for an operand whose `major` (a LayoutEnum) is K or
    M/N, built from the WGMMA smem layout atoms: the widest swizzle that divides the contiguous extent, or
    `atom_extent` (a tile also read in parts of that width, e.g. as the MN-major operand of a GEMM per part)."""
    k_major = major.sm90_mma_major_mode() == cute.nvgpu.OperandMajorMode.K
    extent = atom_extent or (tile_k if k_major else rows)
    atom = warpgroup.make_smem_layout_atom(sm90_utils.get_smem_layout_atom(major, dtype, extent), dtype)
    return cute.tile_to_shape(atom, (rows, tile_k, stages), order=(0, 1, 2) if k_major else (1, 0, 2))


def operand_tma(tensor: cute.Tensor, smem_staged, rows: int, tile_k: int, multicast: int):
    """TMA atom + coordinate tensor loading one (rows, tile_k) box of `tensor` (rows, K, L) per stage;
    with `multicast` > 1 each CTA of the cluster loads a slice and multicasts it to the others."""
    op = cpasync.CopyBulkTensorTileG2SMulticastOp() if multicast > 1 else cpasync.CopyBulkTensorTileG2SOp()
    return cpasync.make_tiled_tma_atom(op, tensor, cute.slice_(smem_staged, (None, None, 0)), (rows, tile_k),
                                       num_multicast=multicast)


def make_pipeline(storage_ptr, stages: int, tx_bytes: int, cluster_mn, consumer_warps: int):
    """The stage ring's mbarriers. Each consumer warp releases a stage to every CTA whose TMA wrote
    into it (its cluster row and column), hence the arrive count."""
    mcast = cluster_mn[0] + cluster_mn[1] - 1
    return pipeline.PipelineTmaAsync.create(
        barrier_storage=storage_ptr,
        num_stages=stages,
        producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
        consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, mcast * consumer_warps),
        tx_count=tx_bytes,
        cta_layout_vmnk=cute.make_layout((1, *cluster_mn, 1)),
        defer_sync=True,
    )


@cute.jit
def produce_k_tiles(
    pipe,
    state,
    k_tiles,
    tma_a: cute.CopyAtom,
    tAgA: cute.Tensor,
    tAsA: cute.Tensor,
    mask_a,
    tma_b: cute.CopyAtom,
    tBgB: cute.Tensor,
    tBsB: cute.Tensor,
    mask_b,
    tma_s: cute.CopyAtom = None,
    tSgS: cute.Tensor = None,
    tSsS: cute.Tensor = None,
    k_first=None,
    a_step: cutlass.Constexpr = 1,
):
    """Load the `k_tiles` K-blocks of one output tile: tAgA/tBgB are this tile's (TMA, k) global
    views, tAsA/tBsB the (TMA, stage) shared ring. With `tma_s` (FP8 block scales) a third box,
    the tile's A scales of the K-block, lands in the same stage on the same full barrier (the
    pipeline's tx count includes its bytes; not multicast). With `k_first` (split-K) the K-blocks
    are k_first .. k_first + k_tiles - 1 of the views, else 0 .. k_tiles - 1. `a_step` > 1: A's box is the
    first rows of a stage, tAsA a ring of a_step times the stages (`GemmSchedule.a_rows`), stage i at a_step * i;
    so is the A scales' box (tSsS).
    Returns the advanced producer state."""
    for i in cutlass.range(k_tiles, unroll=1):
        k = i
        if cutlass.const_expr(k_first is not None):
            k = k_first + i
        pipe.producer_acquire(state)
        bar = pipe.producer_get_barrier(state)
        cute.copy(tma_a, tAgA[(None, k)], tAsA[(None, state.index * a_step)], tma_bar_ptr=bar, mcast_mask=mask_a)
        cute.copy(tma_b, tBgB[(None, k)], tBsB[(None, state.index)], tma_bar_ptr=bar, mcast_mask=mask_b)
        if cutlass.const_expr(tma_s is not None):
            cute.copy(tma_s, tSgS[(None, k)], tSsS[(None, state.index * a_step)], tma_bar_ptr=bar)
        pipe.producer_commit(state)
        state.advance()
    return state
