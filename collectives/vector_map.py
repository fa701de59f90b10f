"""The elementwise map over flat tensors: `outs[k][i] = f(ins[0][i], ...)[k]`, grid-stride over 128-bit vectors
(`schedules.grid_stride`), the `n % vec` tail by scalar accesses of the last CTA. The body of the elementwise
kernels, SiLU / SwiGLU and the split-K GEMM's summing pass."""

from __future__ import annotations

from typing import Callable

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from collectives import pdl
from collectives.vector_io import as_vectors, extent
from schedules.walks import strided_fold


def map_grid(n_vectors, schedule, max_ctas, index64: bool):
    """(CTAs, the grid's complete passes over the vectors) of a `map_vectors` launch, in the launch's
    host code: one pass until the grid reaches `max_ctas`, past that CTAs loop (`GridStride.grid`).
    The pass count is divided here once instead of by every thread (it is 0, unused, for the 64-bit
    variant, which divides on the device)."""
    ctas = cutlass.max(cutlass.min(cute.ceil_div(n_vectors, schedule.items_per_cta_pass()), max_ctas), 1)
    passes = Int32(0)
    if cutlass.const_expr(not index64):
        _, _, pass_stride = schedule.thread_walk(0, ctas, 0)
        passes = n_vectors // pass_stride
    return ctas, passes


def thread_walk(schedule, n, index64: bool):
    """This thread's grid-stride walk over `n` items of `schedule`: (first, stride, pass_stride, (tidx, bidx, gdim)),
    in 64-bit indices for the 64-bit variants (whose size `n` must then be an Int64). A plain helper called while a
    kernel traces."""
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    gdim, _, _ = cute.arch.grid_dim()
    if index64:
        assert n.dtype is Int64, "64-bit variant traced with a 32-bit size"
        walk = schedule.thread_walk(Int64(bidx), Int64(gdim), Int64(tidx))
    else:
        walk = schedule.thread_walk(bidx, gdim, tidx)
    return (*walk, (tidx, bidx, gdim))


@cute.jit
def map_vectors(ins: tuple, outs: tuple, f: Callable, vec: cutlass.Constexpr[int], schedule: cutlass.Constexpr,
                index64: cutlass.Constexpr[bool], with_index: cutlass.Constexpr[bool] = False, full_passes=None):
    """The body of every elementwise kernel: `outs[k][i] = f(ins[0][i], ins[1][i], ...)[k]` for all i.

    All tensors are flat, of one length (that of `outs[0]`), 16-byte aligned when `vec` > 1; an input may
    instead be a (rows, cols) matrix with unit column stride and any row stride, read in row-major order
    (`as_vectors`; cols % vec == 0, so such a map has no tail). `f`
    takes and returns TensorSSA vectors (`vec` elements; one element for the scalar tail) and returns
    a tuple with one vector per output, already in that output's dtype. The grid walks 128-bit
    vectors under `schedule` (a `GridStride`); the `n % vec` tail is done by the last CTA.
    With `with_index`, f's first argument is the flat index of the vector's first element (for
    operands broadcast along a mode, e.g. the split-K GEMM's bias). `full_passes`: the grid's
    complete passes over the vectors when the launch computed them (`map_grid`; ignored by the
    64-bit variant).
    """
    pdl.enter()  # the kernels built on this map are launched as programmatic dependents (collectives.pdl)
    n = extent(outs[0], 0)
    first, stride, pass_stride, (tidx, bidx, gdim) = thread_walk(schedule, n, index64)

    like = None  # the first matrix input: its extents serve every matrix input (one division per vector)
    for t in ins:
        if cutlass.const_expr(like is None and cute.rank(t) == 2):
            like = t
    in_v = [as_vectors(t, n, vec, like) for t in ins]
    out_v = [as_vectors(t, n, vec) for t in outs]

    def load(j):
        return tuple(v[None, j].load() for v in in_v)

    def step(acc, j, vals):
        res = f(j * vec, *vals) if cutlass.const_expr(with_index) else f(*vals)
        for k in cutlass.range_constexpr(len(out_v)):
            out_v[k][None, j].store(res[k])
        return acc

    strided_fold(n // vec, first, stride, pass_stride, schedule.unroll, load, step, Int32(0),
                 full_passes=None if cutlass.const_expr(index64) else full_passes)

    if cutlass.const_expr(vec > 1 and all(cute.rank(t) == 1 for t in ins)):
        # Scalar tail: the last n % vec elements, one per thread of the last CTA.
        tail_start = (n // vec) * vec
        if bidx == gdim - 1:
            t = tail_start + tidx
            if t < n:
                one = cute.make_layout(1)
                vals = [cute.make_tensor(x.iterator + t, one).load() for x in ins]
                res = f(t, *vals) if cutlass.const_expr(with_index) else f(*vals)
                for k in cutlass.range_constexpr(len(outs)):
                    cute.make_tensor(outs[k].iterator + t, one).store(res[k])
