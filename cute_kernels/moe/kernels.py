"""MoE dispatch and combine: one kernel, the two directions of one map between token rows and layout rows.

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

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from collectives import pdl
from collectives.quantize import BLOCK, E4M3, fmax, inverse, scale_of, vector_amax
from collectives.reduce import warp_reduce
from collectives.vector_io import as_vectors, extent

DIRECTIONS = ("dispatch", "combine")


class TokenRows:
    def __init__(self, direction: str, dtype, top_k: int, weighted: bool = False, quantize: bool = False,
                 threads: int = 128):
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
        if not 1 <= top_k <= 16:
            raise ValueError(f"top_k must be in [1, 16], got {top_k}")
        self.direction, self.dtype, self.k, self.threads = direction, dtype, top_k, threads
        self.weighted = weighted  # dispatch: each slot's row gets w[t, s] * x[t] (combine's backward to y)
        # dispatch: the rows in e4m3 with 1x128 scales (`collectives.quantize`: quantize_1x128's bits); a block's 16
        # vectors are 16 consecutive lanes
        self.vec = 128 // dtype.width
        self.quantize = quantize
        if quantize and (direction != "dispatch" or weighted or threads % (BLOCK // self.vec)):
            raise ValueError("quantize is the unweighted dispatch's option, with threads a multiple of 16")

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
                # token t's row quantized once (1x128 blocks: amax over the block's 16 lanes, scale, e4m3) and stored
                # into each slot's row with its scales; every lane runs every step (the shuffles need the whole warp):
                # a vector past the row reads vector 0 and stores nothing
                per_block = BLOCK // self.vec
                src = as_vectors(mSrc[t, None], h, self.vec)
                for i in cutlass.range((nvec + self.threads - 1) // self.threads, unroll=1):
                    j = i * self.threads + tidx
                    v = src[None, cutlass.min(j, nvec - 1)].load().to(Float32)
                    scale = scale_of(warp_reduce(vector_amax(v), fmax, per_block), False)
                    q = cute.make_rmem_tensor((self.vec,), E4M3)  # (held in registers: the stores below sit in
                    q.store((v * inverse(scale)).to(E4M3))  # branches the converted value may not cross)
                    if j < nvec:
                        for s in cutlass.range_constexpr(self.k):
                            if row[s] >= 0:
                                as_vectors(mDst[row[s], None], h, self.vec)[None, j].store(q.load())
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
