"""The attention-state merge: N partial attentions of one query row over disjoint key sets combined into the
attention over their union (flash decoding's second step, and `merge_attention_states[_many]`).

A state is (O, LSE) with O = sum_j p_j v_j / sum_j p_j and LSE = log sum_j exp(s_j) over its keys. Over the
union, with m = max_i LSE_i and w_i = exp(LSE_i - m):

    LSE = m + log sum_i w_i,        O = sum_i w_i O_i / sum_i w_i

(each O_i times its own normalizer exp(LSE_i) is the unnormalized sum over its keys; the common factor exp(m)
cancels). It is `online_softmax.merge` lifted to whole rows, associative and commutative like it. A state
whose LSE is +inf or -inf is empty (our forward and FA write +inf for a row that saw no key; a split with no
keys writes -inf): it gets weight 0 and its O is not read (it may be garbage). A row whose states are all
empty gets O = 0 and LSE = +inf, the forward's keyless-row convention.

Memory-bound: N (D + 1) values read and D + 1 written per row. A row's D elements are split over D / 4
threads of 4 contiguous elements (one 16-byte fp32 vector), `rows_per_cta` rows per 128-thread CTA; every
thread reads its row's N LSEs (the same addresses across the row's threads: one transaction), finds m over
the finite ones, then adds its O vectors with their weights.

Tensors as the kernel sees them, each in its caller's layout with a unit-stride D: O (N, B, S, H, D), LSE
(N, B, H, S), out O (B, S, H, D), out LSE (B, H, S). Rows are walked h fastest, then s, then b (the order of
a (B, S, H, D) tensor: consecutive rows are adjacent in memory).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from collectives.online_softmax import exp_diff

VEC = 4  # elements per thread: one 16-byte fp32 vector
UNROLL = 4  # states whose loads are in flight together
THREADS = 128


class MergeStates:
    def __init__(self, out_dtype, head_dim: int):
        if head_dim % VEC or head_dim // VEC > THREADS:
            raise ValueError(f"merge: head_dim must be a multiple of {VEC} and at most {VEC * THREADS}, got {head_dim}")
        self.out_dtype, self.d = out_dtype, head_dim
        self.tpr = head_dim // VEC
        self.rows_per_cta = THREADS // self.tpr

    @cute.jit
    def __call__(self, o: cute.Tensor, lse: cute.Tensor, o_out: cute.Tensor, lse_out: cute.Tensor, stream):
        """O (N, B, S, H, D), LSE (N, B, H, S) fp32 -> out O (B, S, H, D), out LSE (B, H, S) fp32."""
        rows = cute.size(o_out, mode=[0]) * cute.size(o_out, mode=[1]) * cute.size(o_out, mode=[2])
        grid = [cutlass.max((rows + self.rows_per_cta - 1) // self.rows_per_cta, 1), 1, 1]
        self.kernel(o, lse, o_out, lse_out, rows).launch(grid=grid, block=[self.rows_per_cta * self.tpr, 1, 1],
                                                         stream=stream, use_pdl=True)

    @cute.kernel
    def kernel(self, mO: cute.Tensor, mLSE: cute.Tensor, mOut: cute.Tensor, mLSEOut: cute.Tensor, rows: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        # launched as a programmatic dependent (flash decoding's partials): nothing is read before the previous grid
        # has completed and flushed its writes; launched plainly this returns at once
        cute.arch.griddepcontrol_wait()
        row = bidx * self.rows_per_cta + tidx // self.tpr
        lane = tidx % self.tpr
        if row < rows:
            heads = cute.size(mOut, mode=[2])
            seq = cute.size(mOut, mode=[1])
            h = row % heads
            s = (row // heads) % seq
            b = row // (heads * seq)
            self.merge_row(mO, mLSE, mOut, mLSEOut, b, s, h, lane)

    @cute.jit
    def merge_row(self, mO: cute.Tensor, mLSE: cute.Tensor, mOut: cute.Tensor, mLSEOut: cute.Tensor, b: Int32,
                  s: Int32, h: Int32, lane: Int32):
        """One row (b, s, h): this thread's VEC elements of O and, from lane 0, the LSE. Two passes over the states:
        the max of the finite LSEs, then the weighted sum. An empty state gets weight 0 and its O (possibly NaN) is
        never used. From UNROLL states on, each pass is a branch-free loop unrolled by UNROLL (selects for the
        empty states), so the unrolled iterations' loads are issued together: the split merge reads 16 partials
        from L2, one round trip after another with a branch per state. Fewer states take the branching loop. (Both
        measure 78 % of copy at 2 states, T = 32k, H = 32, D = 128; the first version, branching at every count,
        measured 87 % there: not explained yet.)"""
        n_states = cute.size(mO, mode=[0])
        inf = Float32(float("inf"))
        neg = Float32(float("-inf"))
        m = neg
        acc = cute.make_rmem_tensor((VEC,), Float32)
        acc.fill(0.0)
        total = Float32(0.0)
        if n_states >= UNROLL:
            for n in cutlass.range(n_states, unroll=UNROLL):
                x = mLSE[n, b, h, s]
                m = cute.arch.fmax(m, Float32(cutlass.select_(x < inf, x, neg)))  # +inf: empty; -inf loses any max
            ref = Float32(cutlass.select_(m > neg, m, Float32(0.0)))
            for n in cutlass.range(n_states, unroll=UNROLL):
                x = mLSE[n, b, h, s]
                v = self.vectors(mO[n, b, s, h, None])[None, lane].load().to(Float32)
                live = (x < inf) & (x > neg)
                w = Float32(cutlass.select_(live, exp_diff(x, ref), Float32(0.0)))
                total = total + w
                for e in cutlass.range_constexpr(VEC):
                    acc[e] = cute.math.fma(w, Float32(cutlass.select_(live, v[e], Float32(0.0))), acc[e])
        else:
            for n in cutlass.range(n_states, unroll=4):
                x = mLSE[n, b, h, s]
                if x < inf:
                    m = cute.arch.fmax(m, x)
            if m > neg:
                for n in cutlass.range(n_states, unroll=4):
                    x = mLSE[n, b, h, s]
                    if x > neg and x < inf:
                        w = exp_diff(x, m)
                        total = total + w
                        v = self.vectors(mO[n, b, s, h, None])[None, lane].load().to(Float32)
                        for e in cutlass.range_constexpr(VEC):
                            acc[e] = cute.math.fma(w, v[e], acc[e])
        inv = Float32(0.0)
        out_lse = inf
        if total > Float32(0.0):
            inv = cute.arch.rcp_approx(total)
            out_lse = m + cute.math.log(total, fastmath=True)
        res = cute.make_rmem_tensor((VEC,), Float32)
        for e in cutlass.range_constexpr(VEC):
            res[e] = acc[e] * inv
        self.vectors(mOut[b, s, h, None])[None, lane].store(res.load().to(self.out_dtype))
        if lane == 0:
            mLSEOut[b, h, s] = out_lse

    def vectors(self, row: cute.Tensor) -> cute.Tensor:
        """A row's D elements as (VEC, D / VEC) columns, column `lane` a thread's vector."""
        return cute.make_tensor(row.iterator, cute.make_layout((VEC, self.tpr), stride=(1, VEC)))
