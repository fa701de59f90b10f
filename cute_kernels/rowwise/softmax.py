"""Softmax, log-softmax and cross-entropy over the last dim, forward and backward (lessons 6-7).

Roofline: softmax / log-softmax forward read x and write y (2 passes), backward reads y and dy and
writes dx (3 passes); cross-entropy forward reads x only and writes 8 bytes per row (loss, lse:
1 pass), its backward reads x and writes dx (2 passes) -- the probabilities are recomputed from x
and the saved log-sum-exp, never stored. One exp per element (MUFU ex2 at 16/clk/SM is ~1.5x the
rate that bf16 at 4.8 TB/s asks for: two exps per element would make the kernel SFU-bound).

Schedule: the row is held in registers (`collectives.rowwise`, `schedules.row_tiling.plan_held_rows`),
one CTA per group of short rows or a cluster of up to 8 CTAs per long row. Each thread computes its
online-softmax state (m, l) and its exps against its own max in one sweep; one reduction with the
associative merge (`collectives.online_softmax.merge`) over warp, CTA and cluster gives the row's
(m, l); the exps are then rescaled by exp(m_thread - m) / l instead of exponentiating again.
Cross-entropy forward writes no row, so it does not hold one: it streams the row like the row sum
(`CrossEntropyFwd`), any length, long rows split over CTAs and merged by a second pass.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from collectives.online_softmax import EMPTY, exp_shifted, finite_ref, fold, local_state, log_sum_exp, merge, rescale
from collectives.reduce import add, group_reduce, group_smem
from collectives.rowwise import HeldRowKernel, RowReducer, RowSlice, cluster_join, cluster_start, my_tile_count
from collectives.vector_io import as_vectors, extent, widen_again, widen_f32
from schedules.row_tiling import RowTiling
from schedules.walks import SplitRowWalk, row_tile_grid, strided_fold

_NEG_INF = float("-inf")


def _empty():
    return (Float32(EMPTY[0]), Float32(EMPTY[1]))


class _RowLoop(HeldRowKernel):
    """The per-kernel prologue: indices, the reducer, the row slice, the tile count."""

    @cute.jit
    def setup(self, x: cute.Tensor, widths: cutlass.Constexpr, staged: cutlass.Constexpr = 0):
        """... and this row group's staging buffers for `staged` row tensors of x's dtype."""
        tidx, _, _ = cute.arch.thread_idx()
        bidx, rank, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        rows, n = extent(x, 0), extent(x, 1)
        smem = cutlass.memory.SmemAllocator()
        red = RowReducer.allocate(smem, self.threads, self.tpr, self.cluster_n, widths, self.plan.cluster_sync,
                                  self.plan.cluster_fold)
        lane = tidx % self.tpr
        sl = RowSlice(self.vec, self.tpr, self.vpt, lane, rank, n, self.staged)
        bufs = self.holders(sl, smem, (x.element_type,) * staged, tidx // self.tpr)
        cluster_start(self.cluster_n)
        count, bidx, gdim = self.tile_count(rows, bidx, gdim)
        return red, sl, count, bidx, gdim, rows, n, tidx // self.tpr, lane, rank, bufs


class SoftmaxFwd(_RowLoop):
    """y = softmax(x) or log_softmax(x) along the last dim of x (M, N). With `plan.hold` a staged
    tile is read from shared memory once and then computed from registers (one exp per element)."""

    holds = True
    # `HeldRowPlan.prefetch` with `hold` (as `NormFwd`): the next tile's row lands in this tile's buffer once the
    # held row's (m, l) state and exps are taken from it
    pipelined = prefetch_needs_hold = True

    def __init__(self, log: bool, dtype, vec: int, index64: bool, plan):
        super().__init__(vec, index64, plan)
        self.log, self.dtype = log, dtype
        self.staged_rows = (dtype,)
        self.staged_min_regs = 88  # (m, l) pass + exps' addresses: 64 elements spill at 64 (and, since exp_diff, at 80)
        self.held_min_regs = self.held_regs(plan.tiling.unroll * vec)
        if log and dtype == cutlass.Float16 and plan.hold and plan.tiling.unroll * vec == 64:
            # fp16 log-softmax holding 64 elements: 16 B spilled at 80 (64k / 128k, 256 threads in clusters of 4 / 8;
            # bf16 and the softmax fit; CPU compile): 96 fit (2 CTAs an SM for this dtype, not 3)
            self.held_min_regs = 96

    @staticmethod
    def held_regs(elems: int) -> int:
        """Registers a thread holding `elems` elements of a staged row asks for (`HeldRowPlan.hold`; sets the CTAs
        per SM): 80 to 64 elements; 168 past that (128 elements: the fp32 exps alone take 128; CPU compile:
        167 registers, no spills, 3 CTAs of 128 threads an SM; capped at 80 it spilled 608 B)."""
        return 80 if elems <= 64 else 168

    @cute.jit
    def __call__(self, x: cute.Tensor, y: cute.Tensor, max_ctas: Int32, stream):
        self.kernel(x, y).launch(**self.grid(extent(x, 0), max_ctas), stream=stream)

    @cute.kernel
    def kernel(self, x: cute.Tensor, y: cute.Tensor):
        red, sl, count, bidx, gdim, rows, n, group, lane, rank, bufs = self.setup(x, (2,), 1)
        # The cluster wait after the first tile's loads are issued, as in the norms (at the kernel's start each CTA of a
        # 16-CTA cluster waited for the whole cluster before its first load: at 256k, ~20 waves of CTAs of ~8 us each,
        # 0.86x QuACK, which waits only at its reduction). It once sat at the start because strided 32x65536 rows gave
        # staged and register plans different bits with the wait here; a likely cause, ptxas contracting the state
        # merge's l1 * e1 + l2 * e2 differently in the two kernels, is gone since the merge writes its fma
        # (`collectives.online_softmax.merge`).
        if cutlass.const_expr(self.prefetch):  # the first tile's row
            row0 = bidx * self.rows_per_cta + group
            sl.fetch(x[row0, None], row0 < rows, _NEG_INF, bufs[0])
            RowSlice.commit(True)
            cluster_join(self.cluster_n, True)
        for i in cutlass.range(count, unroll=1):
            row = (bidx + i * gdim) * self.rows_per_cta + group
            ok = row < rows
            hx = bufs[0]
            if cutlass.const_expr(not self.prefetch):
                hx = sl.fetch(x[row, None], ok, _NEG_INF, bufs[0])
                cluster_join(self.cluster_n, i == 0)
            sl.arrive(self.staged)
            if cutlass.const_expr(self.hold):
                # the landed row read once and held from here on, in its own dtype (half the
                # registers of fp32; local_state widens each vector for its exps)
                hx = sl.read(hx, ok, _NEG_INF)
                xs = hx
            else:
                xs = sl.to_f32(sl.read(hx, ok, _NEG_INF))
            mine, exps = local_state(sl.lazy(hx, xs, ok, _NEG_INF))
            if cutlass.const_expr(self.prefetch):  # the held row's state and exps are taken: refill its buffer
                nrow = row + gdim * self.rows_per_cta  # >= rows past this CTA's last tile
                sl.fetch(x[nrow, None], nrow < rows, _NEG_INF, bufs[0])
                RowSlice.commit(True)
            state = red.reduce(mine, merge, _empty(), 0, Int32(i))
            if cutlass.const_expr(self.log):
                lse = log_sum_exp(state)
                if cutlass.const_expr(self.hold):  # x again from its 16-bit copy (`widen_again`: not merged)
                    xs = [widen_again(v) for v in hx]
                sl.store(y[row, None], ok, [v - lse for v in sl.to_f32(sl.again(hx, xs, ok, _NEG_INF))])
            else:
                f = rescale(mine[0], state)
                if cutlass.const_expr(self.staged and not self.hold):  # the thread's exps again (local_state's)
                    ref = finite_ref(mine[0])
                    exps = [exp_shifted(v, ref) for v in sl.again(hx, xs, ok, _NEG_INF)]
                sl.store(y[row, None], ok, [e * f for e in exps])
            red.end_tile()


class SoftmaxBwd(_RowLoop):
    """dx from y and dy: softmax: y * (dy - sum(y * dy)); log-softmax: dy - exp(y) * sum(dy).
    With `plan.prefetch` the next tile's y and dy are fetched while this one is computed."""

    pipelined = True

    def __init__(self, log: bool, dtype, vec: int, index64: bool, plan):
        super().__init__(vec, index64, plan)
        self.log, self.dtype = log, dtype
        self.staged_rows = (dtype, dtype)
        if dtype == cutlass.Float16 and plan.staging == "smem" and plan.tiling.unroll * vec >= 64:
            # fp16's conversions beside 64 staged elements a thread: 24 B spilled at the 80 registers 6 CTAs of 128
            # threads get (the 12289-16384 plan; bf16 fits; CPU compile): 96 fit
            self.staged_min_regs = 96

    @cute.jit
    def __call__(self, y: cute.Tensor, dy: cute.Tensor, dx: cute.Tensor, max_ctas: Int32, stream):
        self.kernel(y, dy, dx).launch(**self.grid(extent(y, 0), max_ctas), stream=stream)

    @cute.kernel
    def kernel(self, y: cute.Tensor, dy: cute.Tensor, dx: cute.Tensor):
        red, sl, count, bidx, gdim, rows, n, group, lane, rank, hold = self.setup(y, (1,), 2)
        if cutlass.const_expr(self.prefetch):  # the first tile (`HeldRowKernel.fetch_rows`)
            row0 = bidx * self.rows_per_cta + group
            self.fetch_rows(sl, hold, [y[row0, None], dy[row0, None]], row0 < rows, 0.0, 0)
            sl.commit(self.staged)
        # the backward kernels walk several tiles per CTA (capped grids): one wait, after the first
        # prefetch's loads are issued (without prefetch, at the start; in the loop it cost a spill)
        cluster_join(self.cluster_n, True)
        for i in cutlass.range(count, unroll=1):
            row = (bidx + i * gdim) * self.rows_per_cta + group
            ok = row < rows
            if cutlass.const_expr(self.prefetch):
                hy, hdy = self.held_rows(sl, hold, Int32(i % 2))
                nrow = row + gdim * self.rows_per_cta  # >= rows past this CTA's last tile
                self.fetch_rows(sl, hold, [y[nrow, None], dy[nrow, None]], nrow < rows, 0.0, 1 - Int32(i % 2))
                sl.arrive(self.staged, 1)
            else:
                hy = sl.fetch(y[row, None], ok, 0.0, hold[0])
                hdy = sl.fetch(dy[row, None], ok, 0.0, hold[1])
                sl.arrive(self.staged)
            ys = sl.to_f32(sl.read(hy, ok, 0.0))
            dys = sl.to_f32(sl.read(hdy, ok, 0.0))
            if cutlass.const_expr(self.log):
                s = red.reduce(sl.sum(dys), add, Float32(0.0), 0, Int32(i))
                ys, dys = sl.again(hy, ys, ok, 0.0), sl.again(hdy, dys, ok, 0.0)
                sl.store(dx[row, None], ok, [cute.math.fma(cute.math.exp(v, fastmath=True), cute.full_like(v, -s), g)
                                              for v, g in zip(ys, dys)])  # explicit fma: see RowSlice.dot
            else:
                s = red.reduce(sl.dot(ys, dys), add, Float32(0.0), 0, Int32(i))
                ys, dys = sl.again(hy, ys, ok, 0.0), sl.again(hdy, dys, ok, 0.0)
                sl.store(dx[row, None], ok, [v * (g - s) for v, g in zip(ys, dys)])
            red.end_tile()


class CrossEntropyFwd:
    """loss[m] = lse(x[m]) - x[m, target[m]] (0 where target == ignore_index) and lse[m], fp32.
    A target outside [0, N) other than ignore_index gives NaN.

    Not a held row: the forward only reduces, so it streams like the row sum (`cute_kernels.reduction.kernels`):
    the row tiling of `schedules.row_tiling.plan_rows` (`schedules.row_tiling.ce_plan`), each thread
    folding its vectors into an online-softmax state through `schedules.walks.strided_fold`: a pass's `unroll`
    vectors are loaded together and folded at once (`online_softmax.fold` of the list: one max in
    the logits' type, then the exps, one rescale per pass), so no exp is scheduled before the
    pass's last load (a per-vector fold let ptxas sink half the loads behind the exps); the row's
    threads combine states with `merge` through `group_reduce`. The thread that writes the row's
    result loads target[m] before the scan (predicated, never waited for there) and x[m, target[m]]
    after it: the gather's latency hides behind the row's reduction. `mode`:
      "rows":    x (M, N) in, loss and lse out (`part` unused);
      "partial": split `s` of each row (grid y) writes its state to part[m, 2s : 2s + 2];
      "merge":   part (M, 2 * splits) in, merged in split order (64-bit loads of (m, l) pairs),
                 loss and lse out (x read only at the target).
    CTAs walk row tiles grid-stride, at most `max_ctas` per split. Deterministic: fixed order.
    """

    MODES = ("rows", "partial", "merge")

    def __init__(self, dtype, vec: int, index64: bool, tiling: RowTiling, mode: str):
        if mode not in self.MODES:
            raise ValueError(f"mode must be one of {self.MODES}, got {mode!r}")
        if mode == "merge" and vec != 2:
            raise ValueError("the merge pass reads (m, l) pairs (vec=2)")
        self.dtype, self.vec, self.index64, self.tiling, self.mode = dtype, vec, index64, tiling, mode

    @cute.jit
    def __call__(self, x: cute.Tensor, target: cute.Tensor, part: cute.Tensor, loss: cute.Tensor, lse: cute.Tensor,
                 ignore_index: Int32, max_ctas: Int32, stream):
        splits = 1
        if cutlass.const_expr(self.mode == "partial"):
            splits = extent(part, 1) // 2
        ctas = row_tile_grid(extent(x, 0), max_ctas, self.tiling)
        self.kernel(x, target, part, loss, lse, ignore_index).launch(
            grid=[ctas, splits, 1], block=[self.tiling.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, x: cute.Tensor, target: cute.Tensor, part: cute.Tensor, loss: cute.Tensor, lse: cute.Tensor,
               ignore_index: Int32):
        vec, tpr, unroll = self.vec, self.tiling.threads_per_row, self.tiling.unroll
        merging = self.mode == "merge"
        src = part if merging else x
        rows, n, classes = extent(src, 0), extent(src, 1), extent(x, 1)
        splits = 1
        if cutlass.const_expr(self.mode == "partial"):
            splits = extent(part, 1) // 2

        buf = group_smem(cutlass.memory.SmemAllocator(), Float32, self.tiling.threads, tpr, 2)

        w = SplitRowWalk.create(self.tiling, rows, n, vec, splits, self.index64)
        lane, nv, v_begin, v_count, tail = w.lane, w.nv, w.v_begin, w.v_count, w.tail
        _, split, _ = cute.arch.block_idx()
        for i in cutlass.range(w.count, unroll=1):
            row = w.row(i)
            state = _empty()
            t = Int32(-1).to(target.element_type)
            xt = Float32(0.0)
            if row < rows:
                if cutlass.const_expr(self.mode != "partial"):
                    if lane == 0:  # target[m] issued before the scan, waited for after it
                        t = target[row]
                sv = as_vectors(src[row, None], n, vec)

                def load(j):
                    return sv[None, v_begin + j].load()

                pass_step = None
                if cutlass.const_expr(merging):

                    def step(acc, j, v):
                        return merge(acc, (v[0], v[1]))
                else:

                    def step(acc, j, v):
                        return fold(acc, v)

                    def pass_step(acc, vals):  # one max, one rescale per pass of `unroll` vectors
                        return fold(acc, vals)

                state = strided_fold(v_count, lane, tpr, tpr * unroll, unroll, load, step, state,
                                     pass_step=pass_step)
                if cutlass.const_expr(vec > 1 and not merging):
                    if split == splits - 1:  # the n % vec elements past the last vector
                        for k in cutlass.range_constexpr(-(-vec // tpr)):
                            if lane + k * tpr < tail:
                                state = merge(state, (x[row, nv * vec + lane + k * tpr].to(Float32), Float32(1.0)))
                if cutlass.const_expr(self.mode != "partial"):
                    # The gather after the scan: no branch on target[m] holds up the scan's loads
                    # (it was a wait of one DRAM latency per row tile before them), x[m, t] is
                    # mostly in L1/L2 by now, and its latency hides behind the row's reduction.
                    if lane == 0:
                        if t != ignore_index.to(t.dtype) and t >= 0 and t < classes:
                            xt = x[row, t].to(Float32)
            state = group_reduce(state, merge, tpr, buf)
            if row < rows and lane == 0:
                if cutlass.const_expr(self.mode == "partial"):
                    part[row, 2 * split] = state[0]
                    part[row, 2 * split + 1] = state[1]
                else:
                    v = log_sum_exp(state)
                    out = Float32(0.0)
                    if t != ignore_index.to(t.dtype):
                        out = Float32(float("nan"))
                        if t >= 0 and t < classes:
                            out = v - xt
                    loss[row] = out
                    lse[row] = v
            if cutlass.const_expr(buf is not None):
                cute.arch.barrier()  # the shared slots are rewritten by the next tile


class CrossEntropyBwd(_RowLoop):
    """dx[m, j] = (exp(x[m, j] - lse[m]) - [j == target[m]]) * dloss[m]; 0 where target == ignore_index.
    A target outside [0, N) other than ignore_index subtracts nothing (dx = softmax * dloss).

    No reduction: with the forward's lse every element's gradient is its own, so this is a copy
    that reads x and writes dx (2 bytes each way per bf16 element), and only bytes in flight bound
    it. The plan (`HELD_TUNED["ce_bwd"]`) only cuts rows: each thread loads its `vpt` vectors of a
    row together (128-bit, 8 per thread: 128 B in flight) and computes each vector as it lands;
    the `cluster_n` CTAs of a long row are independent CTAs along grid y, launched without a
    cluster (no cluster barrier at their start, no co-scheduling: there is nothing to exchange).
    The row's three scalars (target, lse, dloss) are loaded together with the row, none waits on
    another (dloss was loaded only once target had arrived and was compared with ignore_index:
    two DRAM latencies per row tile); ignore_index then zeroes the loaded dloss. The one-hot is
    one 32-bit compare per element against a constant: the target's offset from the thread's
    first element is taken once per row (-1 - first when outside [0, N), which never matches).
    """

    def __init__(self, dtype, vec: int, index64: bool, plan):
        super().__init__(vec, index64, plan)
        self.dtype = dtype

    @cute.jit
    def __call__(self, x: cute.Tensor, target: cute.Tensor, dloss: cute.Tensor, lse: cute.Tensor, dx: cute.Tensor,
                 ignore_index: Int32, max_ctas: Int32, stream):
        self.kernel(x, target, dloss, lse, dx, ignore_index).launch(
            **self.grid(extent(x, 0), max_ctas), stream=stream)

    def grid(self, rows, max_ctas):
        """`HeldRowKernel.grid` without the cluster: a long row's CTAs (grid y) share nothing."""
        launch = super().grid(rows, max_ctas)
        launch["cluster"] = None
        return launch

    @cute.kernel
    def kernel(self, x: cute.Tensor, target: cute.Tensor, dloss: cute.Tensor, lse: cute.Tensor, dx: cute.Tensor,
               ignore_index: Int32):
        vec, tpr = self.vec, self.tpr
        tidx, _, _ = cute.arch.thread_idx()
        bidx, rank, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        rows, n = extent(x, 0), extent(x, 1)
        group, lane = tidx // tpr, tidx % tpr
        sl = RowSlice(vec, tpr, self.vpt, lane, rank, n, compact=True)  # one base, constant offsets
        count, bidx, gdim = my_tile_count(rows, self.rows_per_cta, bidx, gdim, self.index64)
        first = sl.index(0) * vec  # this thread's first element; vector k starts k * tpr * vec later
        for i in cutlass.range(count, unroll=1):
            row = (bidx + i * gdim) * self.rows_per_cta + group
            ok = row < rows
            t = Int32(-1).to(target.element_type)
            v = Float32(0.0)
            g = Float32(0.0)
            if ok:  # issued together: no load waits on another
                t = target[row]
                v = lse[row]
                g = dloss[row]
            hx = sl.load(x[row, None], ok, 0.0)
            if t == ignore_index.to(t.dtype):
                g = Float32(0.0)
            d = Int32(-1) - first  # the target's offset from `first`; negative: no match
            if t >= 0 and t < n:
                d = t.to(Int32) - first
            out = []
            for k in cutlass.range_constexpr(self.vpt):
                els = widen_f32(hx[k], x.element_type)
                frag = cute.make_rmem_tensor(cute.make_layout(vec), Float32)
                for e in cutlass.range_constexpr(vec):
                    p = exp_shifted(els[e], v) * g
                    if d == k * tpr * vec + e:
                        p = p - g
                    frag[e] = p
                out.append(frag.load())
            sl.store(dx[row, None], ok, out)
