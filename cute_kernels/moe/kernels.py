"""The MoE kernels: routing (`MoeRoute`, a warp a token), the grouped-GEMM layouts (`MoeLayouts`, a counting sort
keeping copy order), and dispatch / combine (`TokenRows`, below).

Dispatch and combine: one kernel, the two directions of one map between token rows and layout rows.

A CTA per token t (grid-stride over tokens past the grid's cap), its threads over the row's 16-byte vectors. The
token's k slots name their layout rows (`rows[t, s]`: the contiguous layout's row, or e max_m + i of the masked
one; -1 for a slot with no row: dropped, or served by another rank).
- dispatch: x[t] is read once, vector by vector, and stored into each slot's row (rows never named are left
  unwritten: the grouped GEMM skips or ignores them and combine never reads them); `weighted`: w[t, s] x[t] in fp32,
  rounded once (combine's gradient with respect to y);
- the quantizing dispatch: x[t] in e4m3 with 1x128 scales (quantize_1x128's arithmetic), quantized once and
  stored into every slot's row (the grouped FP8 GEMM reads it directly);
- combine: out[t] = sum over slots in order of w[t, s] * y[rows[t, s]] in fp32, rounded once (bit-identical run to
  run: no atomics), the slots' loads issued before the sum.

Roofline: dispatch reads H once a token and writes it k times; combine reads it k times and writes it once; both at
16-bit H: bandwidth-bound, the floor is their bytes over copy bandwidth.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from collectives import pdl
from collectives.arg_reduce import key_index, max_key, pack_key, scan_update, select
from collectives.quantize import BLOCK, E4M3, fmax, inverse, scale_of, vector_amax
from collectives.reduce import warp_reduce
from collectives.scan import cta_exclusive_sum, cta_scan_slots
from collectives.vector_io import as_vectors, extent

DIRECTIONS = ("dispatch", "combine")
SCAN_LOADS = 8  # the layouts' scan: chunk counts loaded at once (one memory round trip a batch of chunks)
QUANT_VEC, QUANT_LOADS = 16, 2  # the quantizing dispatch: elements a thread quantizes at once (one 16-byte e4m3
# store a copy), such vectors loaded together


class TokenRows:
    def __init__(self, direction: str, dtype, top_k: int, weighted: bool = False, quantize: bool = False,
                 threads: int = 128):
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
        if not 1 <= top_k <= 16:
            raise ValueError(f"top_k must be in [1, 16], got {top_k}")
        self.direction, self.dtype, self.k, self.threads = direction, dtype, top_k, threads
        self.weighted = weighted  # dispatch: each slot's row gets w[t, s] * x[t] (combine's backward to y)
        # dispatch: the rows in e4m3 with 1x128 scales (`collectives.quantize`: quantize_1x128's bits); a block's 8
        # vectors of QUANT_VEC elements are 8 consecutive lanes
        self.vec = 128 // dtype.width
        self.quantize = quantize
        if quantize and (direction != "dispatch" or weighted or threads % (BLOCK // QUANT_VEC)):
            raise ValueError("quantize is the unweighted dispatch's option, with threads a multiple of 8")

    @cute.jit
    def __call__(self, src: cute.Tensor, dst: cute.Tensor, rows: cute.Tensor, weights: cute.Tensor,
                 scales: cute.Tensor, max_ctas: Int32, stream):
        """dispatch: src = x (T, H), dst = the layout (R, H); combine: src = y (R, H), dst = out (T, H). rows (T, k)
        int32, weights (T, k) fp32 (read by combine and the weighted dispatch); scales (R, H / 128) fp32, any
        strides (written by the quantizing dispatch, whose dst is e4m3 and H a multiple of 128)."""
        tokens = extent(rows, 0)
        ctas = cutlass.max(cutlass.min(tokens, max_ctas), 1)
        self.kernel(src, dst, rows, weights, scales).launch(grid=[ctas, 1, 1], block=[self.threads, 1, 1], stream=stream,
                                                    use_pdl=pdl.LAUNCH)

    @cute.kernel
    def kernel(self, mSrc: cute.Tensor, mDst: cute.Tensor, mRows: cute.Tensor, mW: cute.Tensor, mS: cute.Tensor):
        pdl.enter()  # (launched as a programmatic dependent: collectives.pdl)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        tokens = extent(mRows, 0)
        h = extent(mSrc, 1)
        nvec = h // self.vec
        for t in cutlass.range(bidx, tokens, gdim, unroll=1):
            row = [mRows[t, s] for s in range(self.k)]
            if cutlass.const_expr(self.quantize):
                # token t's row quantized once (1x128 blocks: amax over the block's 8 lanes, scale, e4m3) and stored
                # into each slot's row with its scales; every lane runs every step (the shuffles need the whole warp):
                # a vector past the row reads vector 0 and stores nothing
                # A thread takes QUANT_VEC elements (two 16-byte loads) so that each of the k copies is one 16-byte
                # store: the stores, not the bytes, bound this kernel (8-byte stores ran it no faster than the bf16
                # dispatch, which writes twice the bytes); the row's loads are issued QUANT_LOADS vectors at a time
                # before any is quantized (the copies' stores may alias them for all the compiler knows).
                qvec = QUANT_VEC
                nq = h // qvec
                per_block = BLOCK // qvec
                src = as_vectors(mSrc[t, None], h, qvec)
                span = self.threads * QUANT_LOADS
                for i in cutlass.range((nq + span - 1) // span, unroll=1):
                    vs = [src[None, cutlass.min(i * span + u * self.threads + tidx, nq - 1)].load()
                          for u in range(QUANT_LOADS)]
                    for u in cutlass.range_constexpr(QUANT_LOADS):
                        j = i * span + u * self.threads + tidx
                        v = vs[u].to(Float32)
                        scale = scale_of(warp_reduce(vector_amax(v), fmax, per_block), False)
                        q = cute.make_rmem_tensor((qvec,), E4M3)  # (held in registers: the stores below sit in
                        q.store((v * inverse(scale)).to(E4M3))  # branches the converted value may not cross)
                        if j < nq:
                            for s in cutlass.range_constexpr(self.k):
                                if row[s] >= 0:
                                    as_vectors(mDst[row[s], None], h, qvec)[None, j].store(q.load())
                                    if j % per_block == 0:
                                        mS[row[s], j // per_block] = scale
            elif cutlass.const_expr(self.direction == "dispatch"):
                src = as_vectors(mSrc[t, None], h, self.vec)
                w = [mW[t, s] for s in range(self.k)] if self.weighted else None
                for j in cutlass.range(tidx, nvec, self.threads, unroll=1):
                    v = src[None, j].load()
                    for s in cutlass.range_constexpr(self.k):
                        if row[s] >= 0:
                            out = as_vectors(mDst[row[s], None], h, self.vec)[None, j]
                            if cutlass.const_expr(self.weighted):
                                out.store((w[s] * v.to(Float32)).to(self.dtype))
                            else:
                                out.store(v)
            else:
                w = [mW[t, s] for s in range(self.k)]
                dst = as_vectors(mDst[t, None], h, self.vec)
                for j in cutlass.range(tidx, nvec, self.threads, unroll=1):
                    # every slot's vector loaded first (a clamped row for an empty slot, never summed)
                    vals = [as_vectors(mSrc[cutlass.max(row[s], 0), None], h, self.vec)[None, j].load()
                            for s in range(self.k)]
                    acc = cute.make_rmem_tensor((self.vec,), Float32)
                    acc.fill(0.0)
                    for s in cutlass.range_constexpr(self.k):
                        if row[s] >= 0:
                            acc.store(acc.load() + w[s] * vals[s].to(Float32))
                    dst[None, j].store(acc.load().to(self.dtype))


class MoeRoute:
    """Routing, a warp a token: lane l holds experts l, l + 32, ... (ceil(E / 32) slots). Scores (softmax over the
    warp: max and sum by butterflies; or sigmoid) in fp32; the selection adds the bias; with groups, each group's
    score (its two best selections with a bias, its best without) merged across lanes by a top-2 butterfly, the
    `topk_groups` best groups kept (ties to the lower group) and the rest masked; then k rounds of the warp's arg-max
    (`collectives.arg_reduce`'s keys: the larger value, ties to the lower expert), the winner's unbiased score
    broadcast from its lane. Lane r keeps round r's expert and weight; the weights are renormalized (sum + 1e-20) and
    scaled. The layouts (counts, ranks, rows) are built after it (`MoeLayouts`, or the reference's torch ops)."""

    def __init__(self, experts: int, top_k: int, scoring: str, groups: int, topk_groups: int, bias: bool,
                 renormalize: bool, threads: int = 128):
        if not 1 <= experts <= 256 or not 1 <= top_k <= min(16, experts):
            raise ValueError(f"experts must be 1-256 and top_k 1-min(16, experts), got {experts}, {top_k}")
        if groups and (experts % groups or not 1 <= topk_groups <= groups or groups > 32):
            raise ValueError(f"groups ({groups}) must divide experts ({experts}), be <= 32, and topk_groups "
                             f"({topk_groups}) lie in [1, groups]")
        self.e, self.k, self.scoring, self.groups, self.topk_groups = experts, top_k, scoring, groups, topk_groups
        self.bias, self.renormalize, self.threads = bias, renormalize, threads
        self.slots = -(-experts // 32)

    @cute.jit
    def __call__(self, logits: cute.Tensor, bias: cute.Tensor, ids: cute.Tensor, weights: cute.Tensor,
                 scale: Float32, max_ctas: Int32, stream):
        warps = self.threads // 32
        ctas = cutlass.max(cutlass.min((extent(logits, 0) + warps - 1) // warps, max_ctas), 1)
        self.kernel(logits, bias, ids, weights, scale).launch(grid=[ctas, 1, 1], block=[self.threads, 1, 1],
                                                              stream=stream, use_pdl=pdl.LAUNCH)

    @cute.kernel
    def kernel(self, mL: cute.Tensor, mB: cute.Tensor, mIds: cute.Tensor, mW: cute.Tensor, scale: Float32):
        pdl.enter()  # (launched as a programmatic dependent: collectives.pdl)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        warps = self.threads // 32
        lane = tidx % 32
        tokens = extent(mL, 0)
        ninf = Float32(-math.inf)
        for t0 in cutlass.range(bidx * warps, tokens, gdim * warps, unroll=1):
            t = t0 + tidx // 32
            live = t < tokens  # (a warp past the last token runs along with a clamped token and writes nothing)
            tc = cutlass.min(t, tokens - 1)
            ex = [i * 32 + lane for i in range(self.slots)]
            x = [mL[tc, cutlass.min(ex[i], self.e - 1)].to(Float32) for i in range(self.slots)]
            x = [select(ex[i] < self.e, x[i], ninf) for i in range(self.slots)]
            if cutlass.const_expr(self.scoring == "softmax"):
                m = x[0]
                for i in cutlass.range_constexpr(1, self.slots):
                    m = cute.arch.fmax(m, x[i])
                m = warp_reduce(m, fmax)
                p = [cute.math.exp(x[i] - m) for i in range(self.slots)]
                total = p[0]
                for i in cutlass.range_constexpr(1, self.slots):
                    total = total + p[i]
                total = warp_reduce(total, lambda a, b: a + b)
                score = [p[i] / total for i in range(self.slots)]
            else:
                score = [Float32(1.0) / (Float32(1.0) + cute.math.exp(-x[i])) for i in range(self.slots)]
            sel = [score[i] + mB[cutlass.min(ex[i], self.e - 1)].to(Float32) if self.bias else score[i]
                   for i in range(self.slots)]
            sel = [select(ex[i] < self.e, sel[i], ninf) for i in range(self.slots)]
            if cutlass.const_expr(self.groups > 0):
                sel = self.keep_groups(sel, ex, ninf)
            my_id = Int32(0)
            my_w = Float32(0.0)
            total_w = Float32(0.0)
            for r in cutlass.range_constexpr(self.k):
                best, idx = ninf, Int32(0)
                for i in cutlass.range_constexpr(self.slots):
                    best, idx = scan_update(best, idx, sel[i], ex[i])
                key = warp_reduce(pack_key(best, idx, best > ninf), max_key)
                win = Int32(key_index(key))
                mine = score[0]
                for i in cutlass.range_constexpr(1, self.slots):
                    mine = select(win // 32 == i, score[i], mine)
                w = cute.arch.shuffle_sync(mine, win % 32)
                sel = [select(ex[i] == win, ninf, sel[i]) for i in range(self.slots)]
                total_w = total_w + w
                my_id = select(lane == r, win, my_id)
                my_w = select(lane == r, w, my_w)
            if cutlass.const_expr(self.renormalize):
                my_w = my_w / (total_w + Float32(1e-20))
            if live & (lane < self.k):
                mIds[t, lane] = my_id
                mW[t, lane] = my_w * scale

    @cute.jit
    def keep_groups(self, sel, ex, ninf):
        """sel with the experts outside the `topk_groups` best groups masked to -inf."""
        per = self.e // self.groups
        gs = []
        for g in cutlass.range_constexpr(self.groups):
            a1, a2 = ninf, ninf  # this lane's two best of group g
            for i in cutlass.range_constexpr(self.slots):
                inside = ex[i] // per == g
                v = select(inside, sel[i], ninf)
                a2 = cute.arch.fmax(a2, cute.arch.fmin(a1, v))
                a1 = cute.arch.fmax(a1, v)
            for j in cutlass.range_constexpr(5):  # merge (a1, a2) pairs across the warp
                off = 16 >> j
                b1 = cute.arch.shuffle_sync_bfly(a1, offset=off)
                b2 = cute.arch.shuffle_sync_bfly(a2, offset=off)
                a2 = cute.arch.fmax(cute.arch.fmin(a1, b1), cute.arch.fmax(a2, b2))
                a1 = cute.arch.fmax(a1, b1)
            gs.append(a1 + a2 if self.bias and per > 1 else a1)  # (one expert a group: its own score)
        keep = []
        for g in cutlass.range_constexpr(self.groups):
            rank = Int32(0)
            for h in cutlass.range_constexpr(self.groups):
                # a group above g: a larger score, or an equal one at a lower index
                if cutlass.const_expr(h < g):
                    rank = rank + select(gs[h] >= gs[g], Int32(1), Int32(0))
                if cutlass.const_expr(h > g):
                    rank = rank + select(gs[h] > gs[g], Int32(1), Int32(0))
            keep.append(rank < self.topk_groups)
        out = []
        for i in cutlass.range_constexpr(self.slots):
            kept = keep[0] & (ex[i] // per == 0)
            for g in cutlass.range_constexpr(1, self.groups):
                kept = kept | (keep[g] & (ex[i] // per == g))
            out.append(select(kept, sel[i], ninf))
        return out


class MoeLayouts:
    """Both grouped-GEMM layouts of a (T, k) expert assignment, on the device and deterministic (the semantics of
    `cute_kernels.moe.reference._layouts`): a counting sort by expert that keeps copy order. Copies c = t k + s are cut
    into chunks of `warps` x `rounds` x 32 (one CTA each, a warp a run of `rounds` x 32 consecutive copies):

    1. count: each warp loads its rounds' experts at once (staged in shared memory), then counts its copies per
       expert (`match.any` finds a round's lanes of one expert; their lowest lane adds the popcount into the warp's
       own shared row: no atomics); the CTA's sums go to chunk_counts (C, E);
    2. scan (one CTA, a thread an expert): each chunk's base per expert (a running sum over the chunks in order, the
       counts loaded `SCAN_LOADS` chunks at a time), the counts, masked_m, and by two CTA scans the offsets and the
       128-aligned starts of the contiguous layout (rows_used their total);
    3. place: the counts again (the experts staged again), each warp's base (the warps before it), then the warps
       walk their rounds in order: a copy's rank is chunk base + warp base + the warp's running count + its lanes of
       the same expert below it; it lands in row start[e] + rank, and in masked slot e max_m + rank while rank < max_m
       (else dropped, counted).
    Rows and slots no copy takes keep the -1 that step 1's CTAs fill every row and slot with first (grid-stride,
    beside their counting; `dropped` zeroed too): step 3 starts after step 2, which starts after step 1 has ended
    (each waits for its predecessor's end), so no fill lands after a placement, and the layouts need no memsets."""

    def __init__(self, experts: int, warps: int = 4, rounds: int = 8):
        if not 1 <= experts <= 1024:
            raise ValueError(f"experts must be 1-1024, got {experts}")
        self.e, self.warps, self.rounds = experts, warps, rounds
        self.chunk = warps * rounds * 32
        self.scan_threads = max(32, -(-experts // 32) * 32)

    @cute.jit
    def __call__(self, ids: cute.Tensor, chunk_counts: cute.Tensor, counts: cute.Tensor, offsets: cute.Tensor,
                 starts: cute.Tensor, masked_m: cute.Tensor, token_rows: cute.Tensor, m_indices: cute.Tensor,
                 row_source: cute.Tensor, masked_source: cute.Tensor, token_slots: cute.Tensor, dropped: cute.Tensor,
                 max_m: Int32, stream):
        """ids, token_rows, token_slots: (T k,) int32 (flat); chunk_counts (C, E); counts, masked_m (E,); offsets,
        starts (E + 1,) (starts[E]: rows_used); m_indices, row_source (R,), masked_source (E max_m,) and dropped (1,)
        as they come (the count kernel fills them with -1 and 0). All int32."""
        chunks = cutlass.max((extent(ids, 0) + self.chunk - 1) // self.chunk, 1)
        self.count_kernel(ids, chunk_counts, m_indices, row_source, masked_source, dropped).launch(
            grid=[chunks, 1, 1], block=[32 * self.warps, 1, 1], stream=stream, use_pdl=pdl.LAUNCH)
        self.scan_kernel(chunk_counts, counts, offsets, starts, masked_m, max_m).launch(
            grid=[1, 1, 1], block=[self.scan_threads, 1, 1], stream=stream, use_pdl=pdl.LAUNCH)
        self.place_kernel(ids, chunk_counts, starts, token_rows, m_indices, row_source, masked_source, token_slots,
                          dropped, max_m).launch(grid=[chunks, 1, 1], block=[32 * self.warps, 1, 1], stream=stream,
                                                 use_pdl=pdl.LAUNCH)

    @cute.jit
    def stage_rounds(self, ids: cute.Tensor, own: cute.Tensor, first: Int32, lane: Int32, n: Int32):
        """The experts of a warp's `rounds` x 32 copies from `first` (lane's copy first + 32 r + lane in round r; -1
        past the copies) into the warp's shared row `own`: the loads issued together (one memory round trip, not one
        a round), then stored (n >= 1: the clamped index stays inside)."""
        xs = []
        for r in cutlass.range_constexpr(self.rounds):
            c = first + r * 32 + lane
            v = ids[cutlass.min(c, n - 1)]
            xs.append(cutlass.select_(c < n, v, Int32(-1)))
        for r in cutlass.range_constexpr(self.rounds):
            own[r * 32 + lane] = xs[r]
        cute.arch.sync_warp()

    @cute.jit
    def peers_of(self, x: Int32):
        """(the lanes of x's expert, those below this lane) in a round."""
        peers = cute.arch.match_sync(0xFFFFFFFF, x)
        return peers, peers & cute.arch.lanemask_lt()

    def rounds_smem(self, smem):
        """Each warp's staged experts (`stage_rounds`): (warps, rounds x 32) Int32 in shared memory."""
        width = self.rounds * 32
        return smem.allocate_tensor(Int32, cute.make_layout((self.warps, width), stride=(width, 1)),
                                    byte_alignment=16)

    @cute.jit
    def warp_counts(self, ids: cute.Tensor, cnt: cute.Tensor, own: cute.Tensor, chunk: Int32, warp: Int32,
                    lane: Int32):
        """This warp's copies counted per expert into its row of `cnt` (warps, E) in shared memory; its copies'
        experts staged in `own` (its row of `rounds_smem`) on the way."""
        n = extent(ids, 0)
        self.stage_rounds(ids, own, chunk * self.chunk + warp * self.rounds * 32, lane, n)
        for e in cutlass.range(lane, self.e, 32, unroll=1):
            cnt[warp, e] = Int32(0)
        cute.arch.sync_warp()
        for r in cutlass.range(self.rounds, unroll=1):
            x = own[r * 32 + lane]
            peers, lower = self.peers_of(x)
            if (x >= 0) & (lower == 0):  # the lowest lane of its expert's lanes
                cnt[warp, x] = cnt[warp, x] + Int32(cute.arch.popc(peers))
            cute.arch.sync_warp()

    @cute.kernel
    def count_kernel(self, ids: cute.Tensor, chunk_counts: cute.Tensor, m_indices: cute.Tensor,
                     row_source: cute.Tensor, masked_source: cute.Tensor, dropped: cute.Tensor):
        pdl.enter()  # (launched as a programmatic dependent: collectives.pdl)
        tidx, _, _ = cute.arch.thread_idx()
        chunk, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        warp, lane = tidx // 32, tidx % 32
        # the fills the placement leaves where no copy lands (-1 rows and slots, no drops), grid-stride
        step = gdim * 32 * self.warps
        for i in cutlass.range(chunk * 32 * self.warps + tidx, extent(m_indices, 0), step, unroll=1):
            m_indices[i] = Int32(-1)
            row_source[i] = Int32(-1)
        for i in cutlass.range(chunk * 32 * self.warps + tidx, extent(masked_source, 0), step, unroll=1):
            masked_source[i] = Int32(-1)
        if (chunk == 0) & (tidx == 0):
            dropped[0] = Int32(0)
        smem = cutlass.memory.SmemAllocator()
        cnt = smem.allocate_tensor(Int32, cute.make_layout((self.warps, self.e), stride=(self.e, 1)),
                                   byte_alignment=16)
        staged = self.rounds_smem(smem)
        self.warp_counts(ids, cnt, staged[warp, None], chunk, warp, lane)
        cute.arch.sync_threads()
        for e in cutlass.range(tidx, self.e, 32 * self.warps, unroll=1):
            total = Int32(0)
            for w in cutlass.range_constexpr(self.warps):
                total = total + cnt[w, e]
            chunk_counts[chunk, e] = total

    @cute.kernel
    def scan_kernel(self, chunk_counts: cute.Tensor, counts: cute.Tensor, offsets: cute.Tensor, starts: cute.Tensor,
                    masked_m: cute.Tensor, max_m: Int32):
        pdl.enter()  # (launched as a programmatic dependent: collectives.pdl)
        tidx, _, _ = cute.arch.thread_idx()
        chunks = extent(chunk_counts, 0)
        smem = cutlass.memory.SmemAllocator()
        tot = smem.allocate_tensor(Int32, cute.make_layout(cta_scan_slots(self.scan_threads)), byte_alignment=16)
        running = Int32(0)
        if tidx < self.e:
            # each chunk's base: the copies of the chunks before it; SCAN_LOADS chunks' counts loaded before any base
            # is stored (one memory round trip a batch, not a chunk)
            for c0 in cutlass.range(0, chunks, SCAN_LOADS, unroll=1):
                here = [chunk_counts[cutlass.min(c0 + u, chunks - 1), tidx] for u in range(SCAN_LOADS)]
                for u in cutlass.range_constexpr(SCAN_LOADS):
                    if c0 + u < chunks:
                        chunk_counts[c0 + u, tidx] = running
                        running = running + here[u]
            counts[tidx] = running
            masked_m[tidx] = cutlass.min(running, max_m)
        # the experts' offsets and 128-aligned starts, in expert order (a CTA scan: a thread an expert)
        off, total = cta_exclusive_sum(running, tot, self.scan_threads)
        start, start_total = cta_exclusive_sum((running + 127) // 128 * 128, tot, self.scan_threads)
        if tidx < self.e:
            offsets[tidx] = off
            starts[tidx] = start
        if tidx == 0:
            offsets[self.e] = total
            starts[self.e] = start_total

    @cute.kernel
    def place_kernel(self, ids: cute.Tensor, chunk_base: cute.Tensor, starts: cute.Tensor, token_rows: cute.Tensor,
                     m_indices: cute.Tensor, row_source: cute.Tensor, masked_source: cute.Tensor,
                     token_slots: cute.Tensor, dropped: cute.Tensor, max_m: Int32):
        pdl.enter()  # (launched as a programmatic dependent: collectives.pdl)
        tidx, _, _ = cute.arch.thread_idx()
        chunk, _, _ = cute.arch.block_idx()
        warp, lane = tidx // 32, tidx % 32
        n = extent(ids, 0)
        smem = cutlass.memory.SmemAllocator()
        cnt = smem.allocate_tensor(Int32, cute.make_layout((self.warps, self.e), stride=(self.e, 1)),
                                   byte_alignment=16)
        base = smem.allocate_tensor(Int32, cute.make_layout((self.warps, self.e), stride=(self.e, 1)),
                                    byte_alignment=16)
        staged = self.rounds_smem(smem)
        own = staged[warp, None]
        self.warp_counts(ids, cnt, own, chunk, warp, lane)
        cute.arch.sync_threads()
        for e in cutlass.range(tidx, self.e, 32 * self.warps, unroll=1):
            run = chunk_base[chunk, e] + starts[e]  # the expert's first row of this chunk's copies
            for w in cutlass.range_constexpr(self.warps):
                base[w, e] = run
                run = run + cnt[w, e]
        cute.arch.sync_threads()
        drops = Int32(0)
        first = chunk * self.chunk + warp * self.rounds * 32
        for r in cutlass.range(self.rounds, unroll=1):
            x = own[r * 32 + lane]
            c = first + r * 32 + lane
            peers, lower = self.peers_of(x)
            xs_ = cutlass.max(x, 0)
            row = base[warp, xs_] + Int32(cute.arch.popc(lower))
            cute.arch.sync_warp()
            if (x >= 0) & (lower == 0):
                base[warp, xs_] = base[warp, xs_] + Int32(cute.arch.popc(peers))
            cute.arch.sync_warp()
            if c < n:
                slot = Int32(-1)
                if x >= 0:
                    rank = row - starts[x]
                    m_indices[row] = x
                    row_source[row] = c
                    if rank < max_m:
                        slot = x * max_m + rank
                        masked_source[slot] = c
                    else:
                        drops = drops + Int32(1)
                else:
                    row = Int32(-1)
                token_rows[c] = row
                token_slots[c] = slot
        if drops > 0:
            cute.arch.atomic_add(dropped.iterator, drops)
