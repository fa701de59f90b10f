"""The attention-state merge: N partial attentions of one query row over disjoint key sets combined into the
attention over their union (flash decoding's second step, and `merge_attention_states[_many]`).

A state is (O, LSE) with O = sum_j p_j v_j / sum_j p_j and LSE = log sum_j exp(s_j) over its keys. Over the
union, with m = max_i LSE_i and w_i = exp(LSE_i - m):

    LSE = m + log sum_i w_i,        O = sum_i w_i O_i / sum_i w_i

(each O_i times its own normalizer exp(LSE_i) is the unnormalized sum over its keys; the common factor exp(m)
cancels). It is `online_softmax.merge` lifted to whole rows, associative and commutative like it: so a thread may
fold its states in chunks (a running (m, sum w, sum w O), rescaled when m grows) and threads may combine their
running states in any order. A state whose LSE is +inf or -inf is empty (our forward and FA write +inf for a row
that saw no key; a split with no keys writes -inf): it gets weight 0 and its O is not used (it may be garbage). A
row whose states are all empty gets O = 0 and LSE = +inf, the forward's keyless-row convention.

Memory-bound: N (D + 1) values read and D + 1 written per row; what costs is the round trips. A row's D elements
are split over D / 4 vector columns (one 16-byte fp32 vector each), and each column over `lanes` threads of one
warp (`schedules.decode.MergeSchedule`): lane p takes states p, p + lanes, ..., and issues the LSE and O loads of
`chunk` of them before using any (state indices past N re-read the last state and get weight 0: no branch between
the loads). The lanes' running states combine by butterfly shuffles; lane 0 writes.

Tensors as the kernel sees them, each in its caller's layout with a unit-stride D: O (N, B, S, H, D), LSE
(N, B, H, S), out O (B, S, H, D), out LSE (B, H, S). Rows are walked h fastest, then s, then b (the order of
a (B, S, H, D) tensor: consecutive rows are adjacent in memory).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from collectives import pdl
from collectives.online_softmax import exp_diff
from schedules.decode import MERGE_VEC as VEC
from schedules.decode import MergeSchedule


class MergeStates:
    def __init__(self, out_dtype, head_dim: int, schedule: MergeSchedule = MergeSchedule()):
        if not schedule.fits(head_dim):
            raise ValueError(f"merge: head_dim must be a multiple of {VEC} with {schedule.lanes} lanes x head_dim / "
                             f"{VEC} <= 1024 threads a row, got {head_dim}")
        self.out_dtype, self.d, self.s = out_dtype, head_dim, schedule
        self.tpr = head_dim // VEC
        self.threads = schedule.threads(head_dim)
        self.rows_per_cta = self.threads // schedule.row_threads(head_dim)

    @cute.jit
    def __call__(self, o: cute.Tensor, lse: cute.Tensor, o_out: cute.Tensor, lse_out: cute.Tensor, stream):
        """O (N, B, S, H, D), LSE (N, B, H, S) fp32 -> out O (B, S, H, D), out LSE (B, H, S) fp32."""
        rows = cute.size(o_out, mode=[0]) * cute.size(o_out, mode=[1]) * cute.size(o_out, mode=[2])
        grid = [cutlass.max((rows + self.rows_per_cta - 1) // self.rows_per_cta, 1), 1, 1]
        self.kernel(o, lse, o_out, lse_out, rows).launch(grid=grid, block=[self.threads, 1, 1], stream=stream,
                                                         use_pdl=pdl.LAUNCH)

    @cute.kernel
    def kernel(self, mO: cute.Tensor, mLSE: cute.Tensor, mOut: cute.Tensor, mLSEOut: cute.Tensor, rows: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        # launched as a programmatic dependent (flash decoding's partials; collectives.pdl): nothing is read before
        # the previous grid has completed and flushed its writes; launched plainly this returns at once. The
        # release lets the output projection behind it launch in turn.
        pdl.enter()
        lanes = self.s.lanes
        p = tidx % lanes
        col = (tidx // lanes) % self.tpr
        row = bidx * self.rows_per_cta + tidx // (lanes * self.tpr)
        # a row past the end is merged as the last row and not written: every lane of a warp takes part in the
        # shuffles
        r = cutlass.min(row, rows - 1)
        heads = cute.size(mOut, mode=[2])
        seq = cute.size(mOut, mode=[1])
        self.merge_row(mO, mLSE, mOut, mLSEOut, r // (heads * seq), (r // heads) % seq, r % heads, col, p,
                       row < rows)

    @cute.jit
    def merge_row(self, mO: cute.Tensor, mLSE: cute.Tensor, mOut: cute.Tensor, mLSEOut: cute.Tensor, b: Int32,
                  s: Int32, h: Int32, col: Int32, p: Int32, write):
        """Row (b, s, h), vector column `col`, states p, p + lanes, ... (lane p of `lanes`); lane 0 writes when
        `write`. Each chunk's loads are issued together, then folded into the running (m, total, acc)."""
        lanes, chunk = self.s.lanes, self.s.chunk
        n_states = cute.size(mO, mode=[0])
        inf = Float32(float("inf"))
        neg = Float32(float("-inf"))
        m = neg
        total = Float32(0.0)
        acc = cute.make_rmem_tensor((VEC,), Float32)
        acc.fill(0.0)
        xs = cute.make_rmem_tensor((chunk,), Float32)
        vs = cute.make_rmem_tensor((chunk, VEC), Float32)
        step = lanes * chunk
        for c in cutlass.range((n_states + step - 1) // step, unroll=1):
            for u in cutlass.range_constexpr(chunk):
                n = (c * chunk + u) * lanes + p
                nn = cutlass.min(n, n_states - 1)
                x = mLSE[nn, b, h, s]
                live = (n < n_states) & (x < inf) & (x > neg)
                xs[u] = Float32(cutlass.select_(live, x, neg))
                v = self.vectors(mO[nn, b, s, h, None])[None, col].load().to(Float32)
                for e in cutlass.range_constexpr(VEC):
                    vs[u, e] = v[e]
            mc = xs[0]
            for u in cutlass.range_constexpr(1, chunk):
                mc = cute.arch.fmax(mc, xs[u])
            m, total = self.fold(m, total, acc, mc)
            ref = Float32(cutlass.select_(m > neg, m, Float32(0.0)))
            for u in cutlass.range_constexpr(chunk):
                live = xs[u] > neg
                w = Float32(cutlass.select_(live, exp_diff(xs[u], ref), Float32(0.0)))
                total = total + w
                for e in cutlass.range_constexpr(VEC):
                    acc[e] = cute.math.fma(w, Float32(cutlass.select_(live, vs[u, e], Float32(0.0))), acc[e])
        if cutlass.const_expr(lanes > 1):
            k = 1
            while k < lanes:  # (a Python loop: log2(lanes) butterfly steps, unrolled at trace time)
                m_o = cute.arch.shuffle_sync_bfly(m, offset=k)
                t_o = cute.arch.shuffle_sync_bfly(total, offset=k)
                a_o = cute.make_rmem_tensor((VEC,), Float32)
                for e in cutlass.range_constexpr(VEC):
                    a_o[e] = cute.arch.shuffle_sync_bfly(acc[e], offset=k)
                mm = cute.arch.fmax(m, m_o)
                ref = Float32(cutlass.select_(mm > neg, mm, Float32(0.0)))
                w_a = exp_diff(m, ref)
                w_b = exp_diff(m_o, ref)
                total = total * w_a + t_o * w_b
                for e in cutlass.range_constexpr(VEC):
                    acc[e] = acc[e] * w_a + a_o[e] * w_b
                m = mm
                k *= 2
        inv = Float32(0.0)
        out_lse = inf
        if total > Float32(0.0):
            inv = cute.arch.rcp_approx(total)
            out_lse = m + cute.math.log(total, fastmath=True)
        if write & (p == 0):
            res = cute.make_rmem_tensor((VEC,), Float32)
            for e in cutlass.range_constexpr(VEC):
                res[e] = acc[e] * inv
            self.vectors(mOut[b, s, h, None])[None, col].store(res.load().to(self.out_dtype))
            if col == 0:
                mLSEOut[b, h, s] = out_lse

    @cute.jit
    def fold(self, m: Float32, total: Float32, acc: cute.Tensor, m_chunk: Float32):
        """The running state rescaled to max(m, m_chunk): returns (the new m, the rescaled total); acc in place."""
        neg = Float32(float("-inf"))
        mm = cute.arch.fmax(m, m_chunk)
        w = exp_diff(m, Float32(cutlass.select_(mm > neg, mm, Float32(0.0))))
        for e in cutlass.range_constexpr(VEC):
            acc[e] = acc[e] * w
        return mm, total * w

    def vectors(self, row: cute.Tensor) -> cute.Tensor:
        """A row's D elements as (VEC, D / VEC) columns, column `col` a thread's vector."""
        return cute.make_tensor(row.iterator, cute.make_layout((VEC, self.tpr), stride=(1, VEC)))
