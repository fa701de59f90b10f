"""The online-softmax state (m, l) and its associative merge (curriculum lesson 7).

For a set of logits S, the state is m = max(S) and l = sum(exp(s - m) for s in S). Two states of
disjoint sets merge into the state of their union:

    (m1, l1) + (m2, l2) = (m, l1 * exp(m1 - m) + l2 * exp(m2 - m)),   m = max(m1, m2)

which is associative and commutative, so a row can be cut anywhere (threads, warps, CTAs of a
cluster, split passes, attention KV blocks) and the pieces combined in any fixed tree. The empty set
is (-inf, 0); merging two empty states stays (-inf, 0) (the exponent is taken against a finite
reference, never -inf - -inf). log-sum-exp = m + log(l).

Exponentials are `exp2` of log2(e)-scaled arguments, one FMA each.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)
NEG_INF = float("-inf")

EMPTY = (NEG_INF, 0.0)


@cute.jit
def finite_ref(m):
    """`m`, or 0 when `m` is -inf (an empty state): a safe reference to subtract in an exponent."""
    ref = m
    if m == Float32(NEG_INF):
        ref = Float32(0.0)
    return ref


@cute.jit
def merge(a, b):
    """The state of the union of two disjoint sets."""
    m1, l1 = a
    m2, l2 = b
    m = cute.arch.fmax(m1, m2)
    ref = finite_ref(m) * Float32(LOG2E)
    s = l1 * cute.math.exp2(m1 * Float32(LOG2E) - ref, fastmath=True) + l2 * cute.math.exp2(
        m2 * Float32(LOG2E) - ref, fastmath=True)
    return (m, s)


@cute.jit
def fold(state, v):
    """The state of a set extended by the fp32 elements of the TensorSSA `v`: the streaming update
    (a kernel that does not hold the row folds each vector as it arrives). One exp per element and
    one to rescale l; the exponent's reference is `finite_ref` of the new max, as in `merge`."""
    m, s = state
    m_new = cute.arch.fmax(m, v.reduce(cute.ReductionOp.MAX, Float32(NEG_INF), 0))
    ref = finite_ref(m_new)
    s = s * cute.math.exp2(m * Float32(LOG2E) - ref * Float32(LOG2E), fastmath=True) + exp_shifted(v, ref).reduce(
        cute.ReductionOp.ADD, Float32(0.0), 0)
    return (m_new, s)


@cute.jit
def exp_shifted(v, m):
    """exp(v - m) for a TensorSSA `v` (fp32) and a scalar reference `m` (finite)."""
    return cute.math.exp2(v * Float32(LOG2E) - m * Float32(LOG2E), fastmath=True)


@cute.jit
def local_state(values):
    """A thread's state over its held fp32 vectors `values` (a list of TensorSSA; positions past the
    row's end hold -inf, so they count as empty). Returns ((m, l), exps) where
    exps[k] = exp(values[k] - m): a caller that needs the probabilities rescales them by
    exp(m - m_row) / l_row instead of exponentiating again."""
    m = Float32(NEG_INF)
    for k in cutlass.range_constexpr(len(values)):
        m = cute.arch.fmax(m, values[k].reduce(cute.ReductionOp.MAX, Float32(NEG_INF), 0))
    ref = finite_ref(m)
    exps = []
    s = Float32(0.0)
    for k in cutlass.range_constexpr(len(values)):
        e = exp_shifted(values[k], ref)
        exps.append(e)
        s = s + e.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
    return (m, s), exps


@cute.jit
def rescale(m_local, state):
    """exp(m_local - m) / l: the factor turning a thread's exps into probabilities of the row (0 for a
    thread that holds none of the row: its exps are 0 and must stay 0, not 0 * inf)."""
    m, s = state
    return cute.math.exp2(m_local * Float32(LOG2E) - m * Float32(LOG2E), fastmath=True) * cute.arch.rcp_approx(s)


@cute.jit
def log_sum_exp(state):
    m, s = state
    return m + cute.math.log(s, fastmath=True)


# --- attention: the state of each row of an S block held in registers (FlashAttention) ----------
# A consumer warpgroup holds S = Q K^T for its rows as an MMA accumulator; in its (rows, columns)
# view (`acc_rows_view`) each thread has a few rows and, for each, some columns, the rest of a row
# being spread over `row_threads` neighbouring lanes. m is kept reduced over those lanes (every
# lane of a row agrees on it); l is the thread's own partial sum, reduced once in `finalize_rows`.
# Logits are in raw units (before the softmax scale): exponents are exp2(s * scale_log2 - m * scale_log2).


def acc_rows_view(acc: cute.Tensor) -> cute.Tensor:
    """A Hopper WGMMA accumulator ((2, 2, V), MMA_M, MMA_N) seen as (rows, columns) of the thread:
    ((2, MMA_M), (2, V, MMA_N)). Element (r, c) is the same register as in `acc`."""
    lay = cute.make_layout(acc.layout.shape)  # compact, in the accumulator's own index order
    s, d = lay.shape, lay.stride
    rows = cute.make_layout((s[0][1], s[1]), stride=(d[0][1], d[1]))
    cols = cute.make_layout((s[0][0], s[0][2], s[2]), stride=(d[0][0], d[0][2], d[2]))
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, cute.make_layout(
        (rows.shape, cols.shape), stride=(rows.stride, cols.stride))))


@cute.jit
def softmax_rows(s_rows: cute.Tensor, m: cute.Tensor, lsum: cute.Tensor, corr: cute.Tensor, scale_log2: Float32,
                 row_threads: cutlass.Constexpr[int] = 4):
    """Fold one block of logits into the row states, leaving O alone: m = max(m, rowmax(S)); S
    becomes the unnormalized probabilities exp(scale * (S - m)); corr[r] = exp(scale * (m_old - m))
    is the factor the row's earlier O and l are to be multiplied by (l here, O by `rescale_rows`,
    possibly later: FA3's overlap rescales O once the previous P V GEMM has completed). Fully
    masked rows (all -inf so far) stay (-inf, 0) with zero probabilities: the exponent's reference
    is `finite_ref(m)`."""
    for r in cutlass.range_constexpr(cute.size(s_rows, mode=[0])):
        m_old = m[r]
        mx = m_old
        for c in cutlass.range_constexpr(cute.size(s_rows, mode=[1])):
            mx = cute.arch.fmax(mx, s_rows[r, c])
        mx = cute.arch.warp_reduction_max(mx, threads_in_group=row_threads)
        m[r] = mx
        ref = finite_ref(mx) * scale_log2
        corr[r] = cute.math.exp2(m_old * scale_log2 - ref, fastmath=True)
        total = Float32(0.0)
        for c in cutlass.range_constexpr(cute.size(s_rows, mode=[1])):
            p = cute.math.exp2(s_rows[r, c] * scale_log2 - ref, fastmath=True)
            s_rows[r, c] = p
            total = total + p
        lsum[r] = lsum[r] * corr[r] + total


@cute.jit
def rescale_rows(o_rows: cute.Tensor, corr: cute.Tensor):
    """o_rows[r, :] *= corr[r]."""
    for r in cutlass.range_constexpr(cute.size(o_rows, mode=[0])):
        for c in cutlass.range_constexpr(cute.size(o_rows, mode=[1])):
            o_rows[r, c] = o_rows[r, c] * corr[r]


@cute.jit
def update_rows(s_rows: cute.Tensor, o_rows: cute.Tensor, m: cute.Tensor, lsum: cute.Tensor, scale_log2: Float32,
                row_threads: cutlass.Constexpr[int] = 4):
    """`softmax_rows` then `rescale_rows` of O by the same factors: one block folded in, in order."""
    corr = cute.make_rmem_tensor((cute.size(s_rows, mode=[0]),), Float32)
    softmax_rows(s_rows, m, lsum, corr, scale_log2, row_threads)
    rescale_rows(o_rows, corr)


@cute.jit
def finalize_rows(o_rows: cute.Tensor, m: cute.Tensor, lsum: cute.Tensor, lse: cute.Tensor, scale: Float32,
                  row_threads: cutlass.Constexpr[int] = 4):
    """O rows /= l (lsum: each thread's partial l); lse = scale * m + log(l) (natural log). A row that
    saw no key keeps O = 0 and gets lse = +inf (FlashAttention's convention: a backward's
    exp(S - lse) is then 0 for that row, not the NaN of -inf - -inf)."""
    for r in cutlass.range_constexpr(cute.size(o_rows, mode=[0])):
        total = cute.arch.warp_reduction_sum(lsum[r], threads_in_group=row_threads)
        inv = Float32(0.0)
        out = Float32(float("inf"))
        if total > Float32(0.0):
            inv = cute.arch.rcp_approx(total)
            out = m[r] * scale + cute.math.log(total, fastmath=True)
        lse[r] = out
        for c in cutlass.range_constexpr(cute.size(o_rows, mode=[1])):
            o_rows[r, c] = o_rows[r, c] * inv
