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

from collectives.ptx import asm_f32, f32_literal
from collectives.vector_io import widen_f32

# 2^f on [-0.5, 0.5], degree 3 (least squares on the relative error at Chebyshev nodes): relative error 7.7e-5
EXP2_POLY = (0.999928891658783, 0.6932762861251831, 0.24260465800762177, 0.05508876591920853)


def exp2_fma(x) -> Float32:
    """2^x on the FMA and integer pipes instead of the MUFU (FA4's trick for when the exponentials outrun the tensor
    cores): j = round(x) by the 1.5 * 2^23 trick, f = x - j in [-0.5, 0.5], 2^f by a degree-3 polynomial
    (`EXP2_POLY`, relative error 7.7e-5), j added to the exponent field. Arguments below -126 (masked logits, -inf)
    give exactly 0, as the MUFU's exp2 does for -inf. 9 instructions, none on the XU pipe."""
    c0, c1, c2, c3 = (f32_literal(c) for c in EXP2_POLY)
    text = ("{ .reg .f32 xc, t, r, f, p; .reg .b32 tb, pb; .reg .pred lo;\n"
            "max.f32 xc, $1, 0fC2FC0000;\n"            # -126
            "add.rn.f32 t, xc, 0f4B400000;\n"          # + 1.5 * 2^23: round(x) in the low mantissa bits
            "sub.rn.f32 r, t, 0f4B400000;\n"
            "sub.rn.f32 f, xc, r;\n"
            f"fma.rn.f32 p, f, {c3}, {c2};\n"
            f"fma.rn.f32 p, p, f, {c1};\n"
            f"fma.rn.f32 p, p, f, {c0};\n"
            "mov.b32 tb, t;\n shl.b32 tb, tb, 23;\n mov.b32 pb, p;\n add.s32 pb, pb, tb;\n"
            "setp.lt.f32 lo, $1, 0fC2FC0000;\n"
            "selp.b32 $0, 0, pb, lo; }")
    return asm_f32(text, x)


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
    ref = finite_ref(m)
    # one explicit fma: written as l1 * e1 + l2 * e2, ptxas contracted either product into FFMA
    # depending on the code around it, so the held softmax forward and the same plan with its
    # refill (`prefetch`) differed in the last bit of l (GPU test_softmax_prefetch_equals_held_bitwise)
    # (l1 * e1 first, then the fma with e2: the order LLVM had contracted it to, whose PTX ptxas fits in 70 registers
    # at the 4k softmax forward; the other order took 74, one CTA fewer an SM: 5 % slower in the suite)
    s1 = l1 * exp_diff(m1, ref)
    s = cute.math.fma(l2, exp_diff(m2, ref), s1)
    return (m, s)


@cute.jit
def fold(state, v):
    """The state of a set extended by the elements of the TensorSSA `v` (any float type), or of
    each TensorSSA of the list `v`: the streaming update (a kernel that does not hold the row folds vectors as they
    arrive). One exp per element and one to rescale l per call: a list (a pass's vectors, loaded
    together) shares the max and the rescale, and no exp can start before every vector of it has
    arrived. The exponent's reference is `finite_ref` of the new max, as in `merge`."""
    vs = v if isinstance(v, (list, tuple)) else [v]
    m, s = state
    m_new = m
    for k in cutlass.range_constexpr(len(vs)):
        # in the vectors' own type (a max is exact in any float type): 16-bit logits are not
        # widened to fp32 twice or held widened across the max
        part = vs[k].dtype(vs[k].reduce(cute.ReductionOp.MAX, vs[k].dtype(NEG_INF), 0)).to(Float32)
        m_new = cute.arch.fmax(m_new, part)
    ref = finite_ref(m_new)
    r = exp_diff(m, ref)
    for k in cutlass.range_constexpr(len(vs)):
        els = widen_f32(vs[k], vs[k].dtype)  # bf16: one integer op per element
        part = exp_diff(els[0], ref)
        for e in cutlass.range_constexpr(1, len(els)):
            part = part + exp_diff(els[e], ref)
        # the rescale of l fused with the first part explicitly (as in `merge`: never left to ptxas)
        s = cute.math.fma(s, r, part) if k == 0 else s + part
    return (m_new, s)


def exp_diff(a, b):
    """exp(a - b) as exp2((a - b) log2 e), for fp32 scalars or TensorSSAs (b finite, a may be -inf).
    The difference first: exactly 0 when a == b (so a one-element row has probability 1 and
    loss 0, not 1 ulp off), exact near the max (Sterbenz), and a subtract then a multiply gives
    ptxas nothing to contract. Written as a * log2e - b * log2e, ptxas fused some pairs into FFMA
    and not others depending on the code around them: the shared-memory staged softmax, which
    computes the same exps twice, differed from the register path in the last bit, and a
    1-column cross-entropy returned 2.4e-7 instead of 0 (GPU tests)."""
    return cute.math.exp2((a - b) * Float32(LOG2E), fastmath=True)


@cute.jit
def exp_shifted(v, m):
    """exp(v - m) for a TensorSSA `v` (fp32) and a scalar reference `m` (finite): `exp_diff`."""
    return exp_diff(v, m)


@cute.jit
def local_state(values):
    """A thread's state over its held vectors `values` (a list of TensorSSA, any float type;
    positions past the row's end hold -inf, so they count as empty). Returns ((m, l), exps) where
    exps[k] = exp(values[k] - m) in fp32: a caller that needs the probabilities rescales them by
    exp(m - m_row) / l_row instead of exponentiating again. 16-bit values: the max is taken in
    their own type (exact) and each vector is widened only for its exps, so a held 16-bit row
    takes half the registers until then (same bits as widening first)."""
    m = Float32(NEG_INF)
    for k in cutlass.range_constexpr(len(values)):
        t = values[k].dtype
        m = cute.arch.fmax(m, t(values[k].reduce(cute.ReductionOp.MAX, t(NEG_INF), 0)).to(Float32))
    ref = finite_ref(m)
    exps = []
    s = Float32(0.0)
    for k in cutlass.range_constexpr(len(values)):
        e = exp_shifted(values[k].to(Float32), ref)
        exps.append(e)
        s = s + e.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
    return (m, s), exps


@cute.jit
def rescale(m_local, state):
    """exp(m_local - m) / l: the factor turning a thread's exps into probabilities of the row (0 for a
    thread that holds none of the row: its exps are 0 and must stay 0, not 0 * inf)."""
    m, s = state
    return exp_diff(m_local, m) * cute.arch.rcp_approx(s)


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


def acc_cols_view(acc: cute.Tensor) -> cute.Tensor:
    """The transpose of `acc_rows_view`: a WGMMA accumulator ((2, 2[, V]), MMA_M, MMA_N) seen as (columns, rows) of
    the thread, ((2[, V], MMA_N), (2, MMA_M)). With swapped operands (keys in M, query rows in N) a softmax row is an
    accumulator column: element (c, r) is column c's entry in the thread's row r, the same register as in `acc`. A
    column is spread over the lanes of one lane % 4 and the warpgroup's four warps
    (`collectives.reduce.warpgroup_column_reduce`)."""
    lay = cute.make_layout(acc.layout.shape)
    s, d = lay.shape, lay.stride
    rows = cute.make_layout((s[0][1], s[1]), stride=(d[0][1], d[1]))
    if cutlass.const_expr(len(s[0]) == 3):
        cols = cute.make_layout((s[0][0], s[0][2], s[2]), stride=(d[0][0], d[0][2], d[2]))
    else:  # N = 8: one column pair a thread
        cols = cute.make_layout((s[0][0], s[2]), stride=(d[0][0], d[2]))
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, cute.make_layout(
        (cols.shape, rows.shape), stride=(cols.stride, rows.stride))))


# Independent partial maxima per row in `softmax_rows`: the row max of a thread's tile_n / 4 columns
# is a dependency chain of that many FMNMX when folded one by one (32 at tile_n 128, the first thing
# a block's softmax waits on); four interleaved partials and a 2-level tree make it 8 + 2 deep, with
# the same instruction count. A max is exact in any order, so the result is bit for bit the same.
ROW_MAX_PARTIALS = 4
# `lazy_threshold`: FA4's conditional rescale (its Blackwell correction warpgroup's rule), here
# warp-uniform. log2 units of the exponents: the probabilities stay <= 2^8.
LAZY_RESCALE_LOG2 = 8.0


def row_max(s_rows: cute.Tensor, r: int, init: Float32):
    """max(init, s_rows[r, :]) over the thread's columns, as ROW_MAX_PARTIALS interleaved chains
    combined by a tree (the order of a max does not change its value). A plain Python helper called
    while tracing (its loops unroll; no AST rewriting of the while loop)."""
    cols = cute.size(s_rows, mode=[1])
    k = min(ROW_MAX_PARTIALS, cols)
    part = [s_rows[r, c] for c in range(k)]
    part[0] = cute.arch.fmax(part[0], init)
    for c in range(k, cols):
        part[c % k] = cute.arch.fmax(part[c % k], s_rows[r, c])
    width = k
    while width > 1:
        half = (width + 1) // 2
        for i in range(width - half):
            part[i] = cute.arch.fmax(part[i], part[i + half])
        width = half
    return part[0]


@cute.jit
def softmax_rows(s_rows: cute.Tensor, m: cute.Tensor, lsum: cute.Tensor, corr: cute.Tensor, scale_log2: Float32,
                 row_threads: cutlass.Constexpr[int] = 4, lazy_threshold: cutlass.Constexpr[float] = 0.0,
                 o_rows=None, sum_from_corr: cutlass.Constexpr[bool] = False,
                 exact_one: cutlass.Constexpr[bool] = False, reduce_max=None, block_scale=None,
                 poly_every: cutlass.Constexpr[int] = 0, p_log2_bias=None, sum_scale=None):
    """Fold one block of logits into the row states, leaving O alone: m = max(m, rowmax(S)); S
    becomes the unnormalized probabilities exp(scale * (S - m)); corr[r] = exp(scale * (m_old - m))
    is the factor the row's earlier O and l are to be multiplied by (l here, O by `rescale_rows`,
    possibly later: FA3's overlap rescales O once the previous P V GEMM has completed). Fully
    masked rows (all -inf so far) stay (-inf, 0) with zero probabilities: the exponent's reference
    is `finite_ref(m)`.

    Returns `keep` (a Boolean, uniform over the warp): with `lazy_threshold` > 0, True when no row
    of the warp has a new max more than `lazy_threshold` (log2 units, after the scale) above its
    reference m: then every row of the warp keeps its old m as the exponent's reference (m is a
    reference, not the max: the probabilities may reach 2^lazy_threshold, and l and O stay
    consistent with it, so O / l and lse = scale m + log l are unchanged in exact arithmetic), corr
    is exactly 1 and the caller skips the O rescale (`rescale_rows(..., keep)`). A row whose
    reference is still -inf never keeps it (-inf - -inf is NaN, not <= the threshold). Without
    `lazy_threshold`, keep is the constant False. With `o_rows`, O is rescaled here (`update_rows`).

    The row sum: l = l * corr + (the block's sum, from 0) by default; with `sum_from_corr` the block's
    probabilities are added to l * corr one by one (FA4's order). The second needs corr before the
    first addition, so its exponential comes early instead of last; l rounds differently (the same
    additions, another starting value), so the two agree to rounding, not bit for bit.

    `exact_one`: a row whose max did not move gets corr exactly 1 (the contracted m_old * s - m * s of the
    exponent can leave a rounding residual, so exp2 of it may be 1 +- a few ulp), which lets
    `rescale_rows(..., skip_ones=True)` skip O's rescale on the warps where no row's max moved. Equal to the
    default up to those ulps of corr (a more exact factor, not a stale reference like `lazy_threshold`).
    `reduce_max`: a row held by threads other than `row_threads` neighbouring lanes (swapped operands: a column of
    the accumulator, `acc_cols_view`); called with the thread's partial maxima (rows,), it leaves each row's
    maximum over all its threads in place (`collectives.reduce.warpgroup_column_reduce`).
    `block_scale` (a positive Float32, this block's): the logits are block_scale * S (FP8 attention's per-block key
    descale) without a multiply per element: m stays in scaled units, the block's raw maximum is scaled once a row,
    and the exponent's per-element factor becomes scale_log2 * block_scale.
    `poly_every` = k > 0: every k-th column's exponential by `exp2_fma` (FMA pipe) instead of the MUFU.
    `p_log2_bias` (a Float32 b, the same for every row): the probabilities left in s_rows are 2^b times the
    softmax's, p' = exp2(scale (S - m) + b) (FP8 attention folds the block's v scale into P this way, in O's units),
    while l still sums the unbiased ones: the block's sum of p' is multiplied by `sum_scale` (= 2^-b) before it is
    added. The row maxima and corr ignore b."""
    if cutlass.const_expr(sum_from_corr and sum_scale is not None):
        raise ValueError("softmax_rows: sum_scale needs the default sum order (not sum_from_corr)")
    rows = cute.size(s_rows, mode=[0])
    m_new = cute.make_rmem_tensor((rows,), Float32)
    for r in cutlass.range_constexpr(rows):
        if cutlass.const_expr(block_scale is not None):
            raw = row_max(s_rows, r, Float32(-math.inf))
            if cutlass.const_expr(reduce_max is None):
                raw = cute.arch.warp_reduction_max(raw, threads_in_group=row_threads)
            m_new[r] = cute.arch.fmax(m[r], raw * block_scale)
        elif cutlass.const_expr(reduce_max is None):
            m_new[r] = cute.arch.warp_reduction_max(row_max(s_rows, r, m[r]), threads_in_group=row_threads)
        else:
            m_new[r] = row_max(s_rows, r, m[r])
    if cutlass.const_expr(reduce_max is not None):
        reduce_max(m_new)
    keep = False
    if cutlass.const_expr(lazy_threshold > 0.0):
        small = cutlass.Boolean(True)
        for r in cutlass.range_constexpr(rows):
            small = small & ((m_new[r] - m[r]) * scale_log2 <= Float32(lazy_threshold))
        keep = cute.arch.vote_all_sync(small)
    for r in cutlass.range_constexpr(rows):
        m_old = m[r]
        mx = m_new[r]
        if cutlass.const_expr(lazy_threshold > 0.0):
            mx = Float32(cutlass.select_(keep, m_old, mx))  # selects, not branches: one branch per block
        c = cute.math.exp2(m_old * scale_log2 - finite_ref(mx) * scale_log2, fastmath=True)
        if cutlass.const_expr(lazy_threshold > 0.0):
            c = Float32(cutlass.select_(keep, Float32(1.0), c))  # exactly 1 (the exp2 of ~0 may not be)
        if cutlass.const_expr(exact_one):
            c = Float32(cutlass.select_(mx == m_old, Float32(1.0), c))
        m[r] = mx
        corr[r] = c
    if cutlass.const_expr(o_rows is not None):
        # O rescaled here, before the exponentials: no fp32 probability is live across the
        # rescale's branch (LLVM recomputes ~half of them after it when one is: 100 ex2 for 66)
        rescale_rows(o_rows, corr, keep if cutlass.const_expr(lazy_threshold > 0.0) else None)
    elem_scale = scale_log2 if cutlass.const_expr(block_scale is None) else scale_log2 * block_scale
    for r in cutlass.range_constexpr(rows):
        c = corr[r]
        ref = finite_ref(m[r]) * scale_log2
        if cutlass.const_expr(p_log2_bias is not None):
            ref = ref - p_log2_bias
        total = Float32(0.0)
        if cutlass.const_expr(sum_from_corr):
            total = lsum[r] * c
        for col in cutlass.range_constexpr(cute.size(s_rows, mode=[1])):
            if cutlass.const_expr(poly_every > 0 and col % poly_every == poly_every - 1):
                p = exp2_fma(s_rows[r, col] * elem_scale - ref)
            else:
                p = cute.math.exp2(s_rows[r, col] * elem_scale - ref, fastmath=True)
            s_rows[r, col] = p
            total = total + p
        if cutlass.const_expr(sum_from_corr):
            lsum[r] = total
        elif cutlass.const_expr(sum_scale is not None):
            lsum[r] = lsum[r] * c + total * sum_scale
        else:
            lsum[r] = lsum[r] * c + total
    return keep


@cute.jit
def rescale_rows(o_rows: cute.Tensor, corr: cute.Tensor, keep=None, skip_ones: cutlass.Constexpr[bool] = False):
    """o_rows[r, :] *= corr[r]; skipped when `keep` (from `softmax_rows` with a lazy threshold) is
    True, corr being exactly 1 then. `skip_ones`: skipped when every corr of the warp is exactly 1 (a vote at the
    rescale itself, so the decision needs nothing carried from the softmax: `softmax_rows(..., exact_one=True)`
    makes a row whose max did not move exactly 1)."""
    if cutlass.const_expr(skip_ones):
        ones = cutlass.Boolean(True)
        for r in cutlass.range_constexpr(cute.size(o_rows, mode=[0])):
            ones = ones & (corr[r] == Float32(1.0))
        keep = cute.arch.vote_all_sync(ones)
    if cutlass.const_expr(keep is None):
        for r in cutlass.range_constexpr(cute.size(o_rows, mode=[0])):
            for c in cutlass.range_constexpr(cute.size(o_rows, mode=[1])):
                o_rows[r, c] = o_rows[r, c] * corr[r]
    else:
        if not keep:
            for r in cutlass.range_constexpr(cute.size(o_rows, mode=[0])):
                for c in cutlass.range_constexpr(cute.size(o_rows, mode=[1])):
                    o_rows[r, c] = o_rows[r, c] * corr[r]


@cute.jit
def update_rows(s_rows: cute.Tensor, o_rows: cute.Tensor, m: cute.Tensor, lsum: cute.Tensor, scale_log2: Float32,
                row_threads: cutlass.Constexpr[int] = 4, lazy_threshold: cutlass.Constexpr[float] = 0.0,
                sum_from_corr: cutlass.Constexpr[bool] = False):
    """`softmax_rows` then `rescale_rows` of O by the same factors: one block folded in, in order."""
    corr = cute.make_rmem_tensor((cute.size(s_rows, mode=[0]),), Float32)
    softmax_rows(s_rows, m, lsum, corr, scale_log2, row_threads, lazy_threshold, o_rows, sum_from_corr)


def empty_rows(rows: int):
    """(m, l) for a thread's `rows` accumulator rows, each the empty state (-inf, 0): where a tile's walk over K/V
    blocks starts (its O accumulator is zeroed beside it)."""
    m = cute.make_rmem_tensor((rows,), Float32)
    lsum = cute.make_rmem_tensor((rows,), Float32)
    m.fill(NEG_INF)
    lsum.fill(0.0)
    return m, lsum


@cute.jit
def finalize_rows(o_rows: cute.Tensor, m: cute.Tensor, lsum: cute.Tensor, lse: cute.Tensor, scale: Float32,
                  row_threads: cutlass.Constexpr[int] = 4, reduce_sum=None):
    """O rows /= l (lsum: each thread's partial l); lse = scale * m + log(l) (natural log). A row that
    saw no key keeps O = 0 and gets lse = +inf (FlashAttention's convention: a backward's
    exp(S - lse) is then 0 for that row, not the NaN of -inf - -inf). `reduce_sum`: as `softmax_rows`'
    reduce_max, for the partial sums (lsum is left reduced)."""
    if cutlass.const_expr(reduce_sum is not None):
        reduce_sum(lsum)
    for r in cutlass.range_constexpr(cute.size(o_rows, mode=[0])):
        total = lsum[r]
        if cutlass.const_expr(reduce_sum is None):
            total = cute.arch.warp_reduction_sum(lsum[r], threads_in_group=row_threads)
        inv = Float32(0.0)
        out = Float32(float("inf"))
        if total > Float32(0.0):
            inv = cute.arch.rcp_approx(total)
            out = m[r] * scale + cute.math.log(total, fastmath=True)
        lse[r] = out
        for c in cutlass.range_constexpr(cute.size(o_rows, mode=[1])):
            o_rows[r, c] = o_rows[r, c] * inv
