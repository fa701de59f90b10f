"""ArgMax over the last dim (curriculum lesson 12: pair reductions and determinism).

Roofline: reads each input byte once and writes one int64 per row. Floor: input bytes / read
bandwidth (H200 ~4.2 TB/s: a 1 GiB bf16 tensor, ~0.26 ms). At 8 bf16 per 128-bit vector a
compare-and-select per element is ~55 SASS instructions per vector, more than the SM issues at
that bandwidth; the two-level scan below is ~14 (3 packed max.NaN, 2 compares, 6 selects).
Schedule: the row tiling of the row sum (`schedules.row_tiling`): a row's threads stride over its
128-bit vectors in index order, comparing each vector's NaN-propagating max with the running best
once and keeping the best vector's words; the position inside that vector is found after the scan
(`collectives.arg_reduce`: vector_max / improves / locate). The (best value, index) pairs are
packed into ordered Int64 keys and combined by `group_reduce` with max.
Long rows are split over CTAs whose keys a second launch of this kernel reduces (keys in, index
out): no atomics, the same bits every run. Ties resolve to the lowest index; a NaN wins (the first
one), as in `torch.argmax`.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from collectives.arg_reduce import (
    EMPTY,
    improves,
    key_index,
    locate,
    max_key,
    neg_inf_word,
    pack_key,
    scan_update,
    select,
    vector_max,
    vector_words,
)
from collectives.reduce import group_reduce, group_smem
from collectives.vector_io import as_vectors, extent
from schedules.row_tiling import RowTiling
from schedules.walks import SplitRowWalk, row_tile_grid, strided_fold


class ArgMax:
    """out[m, s] for x (M, N) with unit stride along N and a row stride divisible by `vec`.

    `keys_in`: x holds Int64 keys (the partials of a split first pass) instead of values.
    `keys_out`: out[m, s] is the key of split `s` of row m (a partial); else out has one column and
    holds the index. CTAs walk row tiles grid-stride, at most `max_ctas` per split.
    """

    def __init__(self, in_dtype, vec: int, index64: bool, tiling: RowTiling, keys_in: bool, keys_out: bool,
                 row_head: bool = False):
        self.in_dtype, self.vec, self.index64, self.tiling = in_dtype, vec, index64, tiling
        self.keys_in, self.keys_out = keys_in, keys_out
        if keys_in and vec != 1:
            raise ValueError("the key pass reads one key at a time (vec=1)")
        if row_head and (keys_in or vec == 1):
            raise ValueError("row_head reads values in vectors (vec > 1)")
        # Rows not 16-byte aligned (an odd row length, e.g. a 50257-word vocabulary): each row's h < vec
        # first elements up to its first 16-byte boundary are scalars, then nv vectors, then the rest.
        # nv = (n - vec + 1) // vec is the same for every row (the head varies), so the walk's split of
        # the vectors over threads and CTAs is too; the up to 2 vec - 2 scalars go to the last split.
        self.row_head = row_head

    @cute.jit
    def __call__(self, x: cute.Tensor, out: cute.Tensor, max_ctas: Int32, stream):
        ctas = row_tile_grid(extent(x, 0), max_ctas, self.tiling)
        self.kernel(x, out).launch(
            grid=[ctas, extent(out, 1), 1], block=[self.tiling.threads, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(self, x: cute.Tensor, out: cute.Tensor):
        vec = self.vec
        tpr = self.tiling.threads_per_row
        rows, n = extent(x, 0), extent(x, 1)
        splits = extent(out, 1)

        buf = group_smem(cutlass.memory.SmemAllocator(), Int64, self.tiling.threads, tpr)

        n_vec = cutlass.max(n - (vec - 1), 0) if cutlass.const_expr(self.row_head) else n
        w = SplitRowWalk.create(self.tiling, rows, n_vec, vec, splits, self.index64)
        lane, nv, v_begin, v_count, tail = w.lane, w.nv, w.v_begin, w.v_count, w.tail
        if cutlass.const_expr(self.row_head):
            tail = n - nv * vec  # the head and the end, up to 2 vec - 2 scalars
        _, split, _ = cute.arch.block_idx()
        if cutlass.const_expr(self.index64):
            v_begin = Int64(v_begin)
        # What this thread scans: its vectors (if lane < v_count), then tail elements of the last split.
        last = split == splits - 1
        has = (lane < v_count) | (last & (lane < tail))
        first = v_begin * vec + lane * vec
        if lane >= v_count:
            first = nv * vec + lane  # (row_head: shifted per row below)

        for i in cutlass.range(w.count, unroll=1):
            row = w.row(i)
            key = Int64(EMPTY)
            if row < rows:
                if cutlass.const_expr(self.keys_in):
                    xr = x[row, None]

                    def load_key(j):
                        return xr[v_begin + j]

                    def step_key(acc, j, k):
                        return max_key(acc, k)

                    key = strided_fold(v_count, lane, tpr, tpr * self.tiling.unroll, self.tiling.unroll,
                                       load_key, step_key, key, tail_together=False)
                else:
                    head = 0
                    if cutlass.const_expr(self.row_head):
                        # vectors from the row's first 16-byte boundary; element positions shift by head
                        p0 = x[row, None].iterator
                        pa = p0.align(16)
                        head = Int32((pa.toint() - p0.toint()) // (self.in_dtype.width // 8))
                        xv = as_vectors(cute.make_tensor(pa, cute.make_layout(nv * vec)), nv * vec, vec)
                    else:
                        xv = as_vectors(x[row, None], n, vec)
                    start = first
                    if cutlass.const_expr(self.row_head):
                        if lane < v_count:  # a vector lane: its first vector starts `head` later
                            start = first + head
                    # the row's head scalars (row_head): their own in-order scan, its key max'ed in after;
                    # scanned after the vectors into the same state they would lose ties they must win
                    hbest = Float32(-float("inf"))
                    hidx = type(start)(lane)  # the lane's first head slot (used only if lane < head)

                    def load(j):
                        return xv[None, v_begin + j].load()

                    if cutlass.const_expr(vec > 1):
                        # Two levels: each vector's NaN-propagating max against the best once; the
                        # best vector's words are kept and the position inside it found after the scan.
                        def step(acc, j, v):
                            best, pos, saved = acc[0], acc[1], acc[2:]
                            words = vector_words(v)
                            vm = vector_max(words, self.in_dtype)
                            take = improves(vm, best)
                            saved = [select(take, w, s) for w, s in zip(words, saved)]
                            return (select(take, vm, best), select(take, head + (v_begin + j) * vec, pos), *saved)

                        # Before any vector improves, the saved words are -inf, so `locate` gives 0.
                        state = (Float32(-float("inf")), start, *[neg_inf_word(self.in_dtype)] * (
                            vec * self.in_dtype.width // 32))
                        state = strided_fold(v_count, lane, tpr, tpr * self.tiling.unroll, self.tiling.unroll,
                                             load, step, state, tail_together=False)
                        best = state[0]
                        idx = state[1] + locate(list(state[2:]), self.in_dtype, best)
                        if last:
                            for k in cutlass.range_constexpr(-(-(2 * vec if self.row_head else vec) // tpr)):
                                if lane + k * tpr < tail:
                                    e = nv * vec + lane + k * tpr
                                    if cutlass.const_expr(self.row_head):
                                        if lane + k * tpr < head:  # a head scalar: the head scan
                                            he = type(e)(lane + k * tpr)
                                            hbest, hidx = scan_update(hbest, hidx, x[row, he].to(Float32), he)
                                        else:
                                            best, idx = scan_update(best, idx, x[row, e].to(Float32), e)
                                    else:
                                        best, idx = scan_update(best, idx, x[row, e].to(Float32), e)
                    else:

                        def step1(acc, j, v):
                            best, idx = acc
                            return scan_update(best, idx, v[0].to(Float32), v_begin + j)

                        state = (Float32(-float("inf")), first)
                        best, idx = strided_fold(v_count, lane, tpr, tpr * self.tiling.unroll, self.tiling.unroll,
                                                 load, step1, state, tail_together=False)
                    key = pack_key(best, idx, has)
                    if cutlass.const_expr(self.row_head):
                        key = max_key(key, pack_key(hbest, hidx, last & (lane < head)))
            key = group_reduce(key, max_key, tpr, buf, Int64(EMPTY))
            if row < rows and lane == 0:
                if cutlass.const_expr(self.keys_out):
                    out[row, split] = key
                else:
                    out[row, split] = key_index(key)
            if cutlass.const_expr(buf is not None):
                cute.arch.barrier()  # the shared slots are rewritten by the next tile
