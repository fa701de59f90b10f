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
