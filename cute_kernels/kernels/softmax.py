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
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from collectives.online_softmax import EMPTY, exp_shifted, local_state, log_sum_exp, merge, rescale
from collectives.reduce import add
from collectives.rowwise import RowReducer, RowSlice, cluster_start, my_tile_count
from collectives.vector_io import extent
from cute_kernels.kernels.norms import _RowKernel

_NEG_INF = float("-inf")


def _empty():
    return (Float32(EMPTY[0]), Float32(EMPTY[1]))


class _RowLoop(_RowKernel):
    """The per-kernel prologue: indices, the reducer, the row slice, the tile count."""

    @cute.jit
    def setup(self, x: cute.Tensor, widths: cutlass.Constexpr):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, rank, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        rows, n = extent(x, 0), extent(x, 1)
        smem = cutlass.memory.SmemAllocator()
        red = RowReducer.allocate(smem, self.threads, self.tpr, self.cluster_n, widths)
        lane = tidx % self.tpr
        sl = RowSlice(self.vec, self.tpr, self.vpt, lane, rank, n)
        cluster_start(self.cluster_n)
        count, bidx, gdim = my_tile_count(rows, self.rows_per_cta, bidx, gdim, self.index64)
        return red, sl, count, bidx, gdim, rows, n, tidx // self.tpr, lane, rank


class SoftmaxFwd(_RowLoop):
    """y = softmax(x) or log_softmax(x) along the last dim of x (M, N)."""

    def __init__(self, log: bool, dtype, vec: int, index64: bool, plan):
        super().__init__(vec, index64, plan)
        self.log, self.dtype = log, dtype

    @cute.jit
    def __call__(self, x: cute.Tensor, y: cute.Tensor, max_ctas: Int32, stream):
        self.kernel(x, y).launch(**self.grid(extent(x, 0), max_ctas), stream=stream)

    @cute.kernel
    def kernel(self, x: cute.Tensor, y: cute.Tensor):
        red, sl, count, bidx, gdim, rows, n, group, lane, rank = self.setup(x, (2,))
        for i in cutlass.range(count, unroll=1):
            row = (bidx + i * gdim) * self.rows_per_cta + group
            ok = row < rows
            xs = sl.to_f32(sl.load(x[row, None], ok, _NEG_INF))
            mine, exps = local_state(xs)
            state = red.reduce(mine, merge, _empty(), 0, Int32(i % 2))
            if cutlass.const_expr(self.log):
                lse = log_sum_exp(state)
                sl.store(y[row, None], ok, [v - lse for v in xs])
            else:
                f = rescale(mine[0], state)
                sl.store(y[row, None], ok, [e * f for e in exps])
            red.end_tile()


class SoftmaxBwd(_RowLoop):
    """dx from y and dy: softmax: y * (dy - sum(y * dy)); log-softmax: dy - exp(y) * sum(dy)."""

    def __init__(self, log: bool, dtype, vec: int, index64: bool, plan):
        super().__init__(vec, index64, plan)
        self.log, self.dtype = log, dtype

    @cute.jit
    def __call__(self, y: cute.Tensor, dy: cute.Tensor, dx: cute.Tensor, max_ctas: Int32, stream):
        self.kernel(y, dy, dx).launch(**self.grid(extent(y, 0), max_ctas), stream=stream)

    @cute.kernel
    def kernel(self, y: cute.Tensor, dy: cute.Tensor, dx: cute.Tensor):
        red, sl, count, bidx, gdim, rows, n, group, lane, rank = self.setup(y, (1,))
        for i in cutlass.range(count, unroll=1):
            row = (bidx + i * gdim) * self.rows_per_cta + group
            ok = row < rows
            ys = sl.to_f32(sl.load(y[row, None], ok, 0.0))
            dys = sl.to_f32(sl.load(dy[row, None], ok, 0.0))
            if cutlass.const_expr(self.log):
                s = red.reduce(sl.sum(dys), add, Float32(0.0), 0, Int32(i % 2))
                sl.store(dx[row, None], ok, [g - cute.math.exp(v, fastmath=True) * s for v, g in zip(ys, dys)])
            else:
                s = red.reduce(sl.sum([v * g for v, g in zip(ys, dys)]), add, Float32(0.0), 0, Int32(i % 2))
                sl.store(dx[row, None], ok, [v * (g - s) for v, g in zip(ys, dys)])
            red.end_tile()


class CrossEntropyFwd(_RowLoop):
    """loss[m] = lse(x[m]) - x[m, target[m]] (0 where target == ignore_index) and lse[m], fp32.
    A target outside [0, N) other than ignore_index gives NaN."""

    def __init__(self, dtype, vec: int, index64: bool, plan):
        super().__init__(vec, index64, plan)
        self.dtype = dtype

    @cute.jit
    def __call__(self, x: cute.Tensor, target: cute.Tensor, loss: cute.Tensor, lse: cute.Tensor,
                 ignore_index: Int32, max_ctas: Int32, stream):
        self.kernel(x, target, loss, lse, ignore_index).launch(**self.grid(extent(x, 0), max_ctas), stream=stream)

    @cute.kernel
    def kernel(self, x: cute.Tensor, target: cute.Tensor, loss: cute.Tensor, lse: cute.Tensor, ignore_index: Int32):
        red, sl, count, bidx, gdim, rows, n, group, lane, rank = self.setup(x, (2,))
        for i in cutlass.range(count, unroll=1):
            row = (bidx + i * gdim) * self.rows_per_cta + group
            ok = row < rows
            xs = sl.to_f32(sl.load(x[row, None], ok, _NEG_INF))
            mine, _ = local_state(xs)
            state = red.reduce(mine, merge, _empty(), 0, Int32(i % 2))
            if ok and lane == 0 and rank == 0:
                v = log_sum_exp(state)
                t = target[row]
                out = Float32(0.0)
                if t != ignore_index.to(t.dtype):
                    out = Float32(float("nan"))
                    if t >= 0 and t < n:
                        out = v - x[row, t].to(Float32)
                loss[row] = out
                lse[row] = v
            red.end_tile()


class CrossEntropyBwd(_RowLoop):
    """dx[m, j] = (exp(x[m, j] - lse[m]) - [j == target[m]]) * dloss[m]; 0 where target == ignore_index."""

    def __init__(self, dtype, vec: int, index64: bool, plan):
        super().__init__(vec, index64, plan)
        self.dtype = dtype

    @cute.jit
    def __call__(self, x: cute.Tensor, target: cute.Tensor, dloss: cute.Tensor, lse: cute.Tensor, dx: cute.Tensor,
                 ignore_index: Int32, max_ctas: Int32, stream):
        self.kernel(x, target, dloss, lse, dx, ignore_index).launch(
            **self.grid(extent(x, 0), max_ctas), stream=stream)

    @cute.kernel
    def kernel(self, x: cute.Tensor, target: cute.Tensor, dloss: cute.Tensor, lse: cute.Tensor, dx: cute.Tensor,
               ignore_index: Int32):
        vec = self.vec
        red, sl, count, bidx, gdim, rows, n, group, lane, rank = self.setup(x, ())
        for i in cutlass.range(count, unroll=1):
            row = (bidx + i * gdim) * self.rows_per_cta + group
            ok = row < rows
            g = Float32(0.0)
            v = Float32(0.0)
            t = Int32(-1).to(target.element_type)
            if ok:
                t = target[row]
                v = lse[row]
                if t != ignore_index.to(t.dtype):
                    g = dloss[row]
            xs = sl.to_f32(sl.load(x[row, None], ok, 0.0))
            out = []
            for k in cutlass.range_constexpr(self.vpt):
                frag = cute.make_rmem_tensor(cute.make_layout(vec), Float32)
                frag.store(exp_shifted(xs[k], v) * g)
                first = sl.index(k) * vec
                for e in cutlass.range_constexpr(vec):
                    if first + e == t:
                        frag[e] = frag[e] - g
                out.append(frag.load())
            sl.store(dx[row, None], ok, out)
