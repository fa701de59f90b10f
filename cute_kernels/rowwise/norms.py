"""RMSNorm and LayerNorm, forward and backward (curriculum lessons 4-5).

Roofline: forward reads x (and the residual) once and writes y (and the residual sum): 2 tensor
passes (4 with a residual) plus O(N) for weight/bias and O(M) for the saved statistics; the floor is
those bytes / copy bandwidth (H200: 256 MiB in + 256 MiB out of bf16 in ~0.12 ms). Backward reads
x and dy and writes dx (3 passes; 4 with a residual gradient) plus fp32 weight-gradient partials of
(CTAs x N). ~5-10 flops per element: far below the arithmetic limit.

Schedule: the row is held in registers (`collectives.rowwise`, planned by
`schedules.row_tiling.plan_held_rows`): one CTA holds `rows_per_cta` rows, or a cluster of up to 8
CTAs one long row; x is loaded once as 128-bit vectors, the statistics reduced by warp butterfly,
shared memory and (cluster) distributed shared memory, and y computed from the registers.
LayerNorm is two-pass in registers: mean first, then the sum of squared deviations (no
cancellation, unlike sum(x^2) - mean^2). Backward CTAs walk row tiles grid-stride and accumulate
dweight/dbias for their columns in fp32 registers; the CTA's row groups combine them in shared
memory in a fixed order and write one fp32 partial row per CTA, summed over CTAs by the op.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from collectives import pdl
from collectives import quantize as fp8
from collectives.reduce import add, add_pairs, welford_merge
from collectives.rowwise import HeldRowKernel, RowReducer, RowSlice, cluster_join, cluster_start, my_tile_count
from collectives.vector_io import extent, widen_again
from schedules.row_tiling import (
    NORM_BWD_ACC_REG_ELEMS,
    HeldRowPlan,
    bwd_acc_in_regs,
    bwd_direct_partial,
    bwd_smem_accumulators,
)


class NormFwd(HeldRowKernel):
    """y = (x - mean) * rstd * w + b (LayerNorm) or x * rstd * w (RMSNorm) for x (M, N).

    Optional: `w`, `b` (N,); `res` (M, N): x + res is normalized and written to `res_out`
    (rounded to its dtype first, so the backward sees exactly the stored sum). Writes rstd (and
    mean for LayerNorm) per row in fp32 for the backward.

    `fp8_out`: "none" writes y in x's dtype; "per_token" / "block128" write y as e4m3
    into `out` with fp32 `scales` (M, 1) / (M, ceil(N / 128)) (any strides): y is rounded to x's
    dtype first (the y of the plain kernel), then quantized by `collectives.quantize`, so the
    result is bitwise the unfused norm followed by the quantizer. The row's amax is one more
    `RowReducer` site (per_token); a 128-column block's amax a butterfly over the lanes that hold
    it (`collectives.quantize.row_block_amaxes`, shared memory when a block spans warps).
    """

    holds = True  # `HeldRowPlan.hold`: the landed x (and residual) read once, held in their 16-bit type
    held_min_regs = 64
    # `HeldRowPlan.prefetch` with `hold`: once a tile's row is read out of its staging buffer (and widened), the
    # next tile's copies go into that buffer, in flight under this tile's reductions, exchange and stores
    pipelined = prefetch_needs_hold = True

    def __init__(self, kind: str, dtype, w_dtype, out_dtype, vec: int, index64: bool, plan: HeldRowPlan,
                 has_weight: bool, has_bias: bool, has_residual: bool, fp8_out: str = "none"):
        super().__init__(vec, index64, plan)
        assert kind in ("rms", "layer") and fp8_out in ("none", "per_token", "block128")
        self.kind, self.dtype, self.w_dtype, self.out_dtype = kind, dtype, w_dtype, out_dtype
        self.has_weight, self.has_bias, self.has_residual = has_weight, has_bias, has_residual
        self.fp8_out = fp8_out
        if fp8_out != "none":
            # the quantizing epilogue keeps the re-reading staged path: `hold` unmeasured there (the same
            # bits either way; only the plan's cache key differs), and so without the refill
            self.hold = False
            self.prefetch = False
            # the quantizing epilogue (amaxes, scales, e4m3 packing) spilled 232 B at the 80 registers
            # a staged 256-thread plan gets with the default floor (RMSNorm 128k, cluster 8)
            self.staged_min_regs = self.held_min_regs = 128
        elems = plan.tiling.unroll * vec
        if fp8_out != "none" and has_residual and elems >= 64:
            # the quantizing epilogue next to the residual's row: 24-120 B of spills at 128 registers (RMSNorm 128k,
            # both modes, CPU compile); 168 fits them (3 CTAs of 128 threads, or 1 of 256)
            self.staged_min_regs = self.held_min_regs = 168
        if plan.staging == "smem" and elems >= 64 and int(has_weight) + int(has_bias) < (2 if kind == "layer" else 1):
            # fewer (N,) operands staged than the measured signature (LayerNorm's weight and bias, RMSNorm's weight):
            # shared memory then admits more CTAs than the row's registers allow (CPU compile: LayerNorm holding 64
            # elements spilled 104 B at 64 registers, RMSNorm re-reading 128 elements 176 B at 80, LayerNorm with a bias
            # or a weight only 8-40 B at 80); with both, shared memory already held them to what was measured
            self.staged_min_regs = max(self.staged_min_regs, 128 if elems >= 128 else 96)
            self.held_min_regs = max(self.held_min_regs, 96)
        if kind == "rms" and has_residual and plan.hold:
            # RMSNorm's held row beside the residual's at the 64-register floor (CPU compile): 256k (512
            # threads x 32 elements, refilled, 2 CTAs an SM) spilled 24 B, 16k (128 threads x 32, 8 an SM) 16 B.
            # 80 fit (fewer CTAs an SM for the fused-residual signature only; the capped grid then takes two waves)
            self.held_min_regs = max(self.held_min_regs, 80)
        if fp8_out == "per_token" and kind == "layer" and not has_residual and elems >= 64:
            # LayerNorm's per-token FP8 epilogue at 64 elements a thread spilled 160 B at 128 registers (32k, 256
            # threads; CPU compile)
            self.staged_min_regs = self.held_min_regs = 168
        if plan.welford and kind == "layer":
            # the (count, mean, M2) merge keeps three values a row live through the butterfly: it spilled
            # at the 64-register floor of the staged plans (CPU compile, 16k / 64k)
            self.staged_min_regs = max(self.staged_min_regs, 80)
            self.held_min_regs = max(self.held_min_regs, 80)
        self.staged_rows = (dtype,) * (1 + has_residual)
        self.staged_params = (w_dtype,) * (int(has_weight) + int(has_bias))

    @cute.jit
    def __call__(self, x: cute.Tensor, w, b, res, out: cute.Tensor, res_out, mean, rstd: cute.Tensor, scales,
                 eps: Float32, max_ctas: Int32, stream):
        self.kernel(x, w, b, res, out, res_out, mean, rstd, scales, eps).launch(
            **self.grid(extent(x, 0), max_ctas), stream=stream, use_pdl=pdl.LAUNCH)

    @cute.kernel
    def kernel(self, x: cute.Tensor, w, b, res, out: cute.Tensor, res_out, mean, rstd: cute.Tensor, scales,
               eps: Float32):
        pdl.enter()  # (launched as a programmatic dependent: collectives.pdl)
        layer = self.kind == "layer"
        tidx, _, _ = cute.arch.thread_idx()
        bidx, rank, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        rows, n = extent(x, 0), extent(x, 1)
        smem = cutlass.memory.SmemAllocator()
        welford = layer and self.plan.welford  # one reduction of (count, mean, M2) instead of two sums
        sites = ((3,) if welford else (1, 1)) if layer else (1,)
        amax_site = len(sites)  # per_token: the row's amax
        red = RowReducer.allocate(smem, self.threads, self.tpr, self.cluster_n,
                                  sites + (1,) if self.fp8_out == "per_token" else sites, self.plan.cluster_sync,
                                  self.plan.cluster_fold)
        block_buf = None
        if cutlass.const_expr(self.fp8_out == "block128"):
            slots = fp8.block_smem_slots(self.threads, self.vec, self.tpr, self.vpt)
            if cutlass.const_expr(slots > 0):
                block_buf = smem.allocate_tensor(Float32, cute.make_layout(slots), byte_alignment=16)
        lane = tidx % self.tpr
        sl = RowSlice(self.vec, self.tpr, self.vpt, lane, rank, n, self.staged)
        bufs = self.stage_buffers(smem, (x.element_type, res.element_type) if self.has_residual
                                  else (x.element_type,), tidx // self.tpr)
        # A register plan on the capped grid (`params_in_regs`: the plan's resident_grid) walks many row tiles a CTA:
        # weight and bias held in registers across them instead of loaded per tile (for LayerNorm two more rows'
        # worth of L2 loads a tile). The plain signature only: ptxas widens the held vectors once, outside the loop,
        # and beside a residual's row or an FP8 epilogue that took LayerNorm 8k from 2 CTAs an SM to 1 (CPU compile,
        # residual 128 -> 208 registers, capped at 128 8 B of spills; per-token FP8 125 -> 177)
        hw, hb = self.stage_vectors(smem, sl, tidx // self.tpr, (w, b), with_first_tile=True,
                                    in_regs=self.plan.resident_grid and not self.staged and not self.has_residual
                                    and self.fp8_out == "none")
        inv_n = cute.arch.rcp_approx(Float32(n))  # no IEEE-division subroutine call
        cluster_start(self.cluster_n)
        count, bidx, gdim = self.tile_count(rows, bidx, gdim)
        if cutlass.const_expr(self.prefetch):  # the first tile's rows (beside the weights' copies: one group)
            row0 = bidx * self.rows_per_cta + tidx // self.tpr
            self.fetch_x(sl, x, res, bufs, row0, row0 < rows)
            RowSlice.commit(True)
        for i in cutlass.range(count, unroll=1):
            row = (bidx + i * gdim) * self.rows_per_cta + tidx // self.tpr
            ok = row < rows
            tile = Int32(i)  # the row tile's index: `RowReducer.reduce`
            hx = bufs[0]
            hr = bufs[1] if self.has_residual else None
            if cutlass.const_expr(not self.prefetch):
                hx, hr = self.fetch_x(sl, x, res, bufs, row, ok)
            cluster_join(self.cluster_n, i == 0)
            sl.arrive(self.staged)
            if cutlass.const_expr(self.hold):  # read once; every later pass widens the held vectors again
                hx = sl.read(hx, ok, 0.0)
                if cutlass.const_expr(self.has_residual):
                    hr = sl.read(hr, ok, 0.0)
            xs = self.held_x(sl, hx, hr, ok, res_out)
            if cutlass.const_expr(self.prefetch):  # the row is in registers (widened): refill its buffers
                nrow = row + gdim * self.rows_per_cta  # >= rows past this CTA's last tile
                self.fetch_x(sl, x, res, bufs, nrow, nrow < rows)
                RowSlice.commit(True)
            if cutlass.const_expr(self.has_residual):
                sl.store(res_out[row, None], ok, xs)
            mu = Float32(0.0)
            ds = xs
            if cutlass.const_expr(welford):
                # this thread's count, mean and M2 over its elements inside the row, merged over the row
                cnt = Float32(0.0)
                for k in cutlass.range_constexpr(self.vpt):
                    if sl.valid(k):
                        cnt = cnt + Float32(self.vec)
                mt = sl.sum(xs) * cute.arch.rcp_approx(cutlass.max(cnt, Float32(1.0)))
                dl = [v - mt for v in self.again_x(sl, hx, hr, ok, res_out, xs)]
                _, mu, m2 = red.reduce((cnt, mt, sl.masked_sum([d * d for d in dl])), welford_merge,
                                       Float32(0.0), 0, tile)
                ds = [v - mu for v in self.again_x(sl, hx, hr, ok, res_out, xs)]
                var = m2 * inv_n
            elif cutlass.const_expr(layer):
                mu = red.reduce(sl.sum(xs), add, Float32(0.0), 0, tile) * inv_n
                ds = [v - mu for v in self.again_x(sl, hx, hr, ok, res_out, xs)]
                var = red.reduce(sl.masked_sum([d * d for d in ds]), add, Float32(0.0), 1, tile) * inv_n
            else:
                var = red.reduce(sl.dot(xs, xs), add, Float32(0.0), 0, tile) * inv_n
            if cutlass.const_expr(self.staged):  # the row again, for the output pass (hold: from registers)
                ds = [v - mu for v in self.held_x(sl, hx, hr, ok, res_out, again=True)] if layer \
                    else self.held_x(sl, hx, hr, ok, res_out, again=True)
            r = cute.math.rsqrt(var + eps)
            ys = [d * r for d in ds]
            if cutlass.const_expr(self.has_weight):
                ws = self.vector_of(sl, hw)
                ys = [y * c for y, c in zip(ys, ws)]
            if cutlass.const_expr(self.has_bias):
                bs = self.vector_of(sl, hb)
                ys = [y + c for y, c in zip(ys, bs)]
            if cutlass.const_expr(self.fp8_out == "none"):
                sl.store(out[row, None], ok, ys)
            else:
                ys = [y.to(self.dtype).to(Float32) for y in ys]  # the plain kernel's y
                self.store_fp8(sl, red, block_buf, out, scales, row, ok, ys, amax_site, tile)
            if ok and lane == 0 and rank == 0:
                rstd[row] = r
                if cutlass.const_expr(layer):
                    mean[row] = mu
            red.end_tile()
        if cutlass.const_expr(self.staged and self.rows_per_cta == 1 and (self.has_weight or self.has_bias)):
            cute.arch.cp_async_wait_group(0)  # the weights' copies, in a CTA that had no tile to wait for them

    @cute.jit
    def fetch_x(self, sl: RowSlice, x: cute.Tensor, res, bufs: list, row, ok):
        """Start fetching `row` of x (and of the residual) into `bufs` (staging) or registers; the held rows."""
        hx = sl.fetch(x[row, None], ok, 0.0, bufs[0])
        hr = None
        if cutlass.const_expr(self.has_residual):
            hr = sl.fetch(res[row, None], ok, 0.0, bufs[1])
        return hx, hr

    def held_x(self, sl: RowSlice, hx, hr, ok, res_out, again: bool = False):
        """The fp32 row x (x + residual, rounded to the residual's dtype) from the held row(s);
        `again` (a later pass over a row held in 16 bits, `hold`): widened by other instructions
        (`vector_io.widen_again`) so the first pass's fp32 copy is not kept live instead."""
        widen = widen_again if again and self.hold else (lambda v: v.to(Float32))
        xs = [widen(v) for v in sl.read(hx, ok, 0.0)]
        if self.has_residual:
            rs = [widen(v) for v in sl.read(hr, ok, 0.0)]
            xs = [(a + c).to(res_out.element_type).to(Float32) for a, c in zip(xs, rs)]
        return xs

    def again_x(self, sl: RowSlice, hx, hr, ok, res_out, xs):
        """`xs` for a later pass: the same values with register staging, read again with smem (with
        `hold`: widened again from the held 16-bit vectors, so no fp32 row stays live across a reduction)."""
        return self.held_x(sl, hx, hr, ok, res_out, again=True) if self.staged else xs

    @cute.jit
    def store_fp8(self, sl: RowSlice, red: RowReducer, block_buf, out: cute.Tensor, scales: cute.Tensor, row, ok,
                  ys, amax_site: cutlass.Constexpr[int], tile):
        """Quantize the row's y (fp32 vectors) to e4m3 in `out`, its scales into `scales`."""
        valid = [sl.valid(k) for k in range(self.vpt)]
        if cutlass.const_expr(self.fp8_out == "per_token"):
            amax = red.reduce(fp8.held_amax(ys, valid), fp8.fmax, Float32(0.0), amax_site, tile)
            s = fp8.scale_of(amax, False)
            sl.store(out[row, None], ok, fp8.to_e4m3(ys, fp8.inverse(s)))
            if ok and sl.lane == 0 and sl.rank == 0:
                scales[row, 0] = s
        else:
            amaxes = fp8.row_block_amaxes(sl, ys, block_buf)
            _, kgroup = fp8.block_geometry(self.vec, self.tpr, self.vpt)
            qs = []
            for g in cutlass.range_constexpr(len(amaxes)):
                s = fp8.scale_of(amaxes[g], False)
                qs.extend(fp8.to_e4m3(ys[g * kgroup:(g + 1) * kgroup], fp8.inverse(s)))
                blk, writer = fp8.block_of(sl, g)
                if ok and writer:
                    scales[row, blk] = s
            sl.store(out[row, None], ok, qs)


class NormBwd(HeldRowKernel):
    """dx for y = norm(x) given dy, from x and the saved mean/rstd; plus fp32 partials of dweight
    (and dbias) per CTA: dw_partial (CTAs, N), summed over CTAs by the caller.

    RMSNorm:   xh = x * rstd,          dx = rstd * (w*dy - xh * mean(xh * w*dy))
    LayerNorm: xh = (x - mean) * rstd, dx = rstd * (w*dy - xh * mean(xh * w*dy) - mean(w*dy))
    dw = sum over rows of dy * xh, db = sum of dy. With `dres` (the gradient reaching the
    residual-sum output) dx += dres. With `plan.prefetch` the next tile's x, dy, rstd and mean are
    fetched while this one is computed (`HeldRowKernel.fetch_rows`); dres is loaded per tile.
    """

    pipelined = True
    # `HeldRowPlan.hold`: x and dy read out of their staging buffers once into registers (16-bit), the
    # output pass widening them again instead of re-reading shared memory; with `prefetch` the buffers are then
    # refilled with the next tile (one buffer each, as the held forwards), where the double-buffered prefetch does
    # not fit beside the shared accumulators (LayerNorm 256k: 224 KiB a CTA; PC sampling there: 16.7 % of
    # the samples on the first read of a landed row, nothing in flight while a tile is reduced and stored)
    holds = True
    held_min_regs = 128
    # ncu, LayerNorm backward 32768x4096 (t256 r128 u4, accumulators in shared memory): 29.7 % of the warps' cycles
    # stalled on the short scoreboard, the samples on the adds right after each accumulator's LDS.128 and on registers
    # reused after its STS.128 (few warps resident to hide it). Only with the row staged in shared memory (its registers
    # free), both accumulators together at most 32 elements a thread: RMSNorm 64k t256 u4 c8 118 -> 113 registers, 314.5
    # -> 290.6 us (H200). With the row held in registers they cost more registers than their count (RMSNorm t128 u4: 106
    # -> 158, LayerNorm t128 u2: 80 -> 126) and were slower where they fit (RMSNorm 4k t512 u1 prefetch: 44 -> 56
    # registers, 223.1 -> 231.2 us).
    ACC_REG_ELEMS = NORM_BWD_ACC_REG_ELEMS

    def __init__(self, kind: str, dtype, w_dtype, vec: int, index64: bool, plan: HeldRowPlan,
                 has_weight: bool, has_bias: bool, has_dres: bool):
        super().__init__(vec, index64, plan)
        self.kind, self.dtype, self.w_dtype = kind, dtype, w_dtype
        self.has_weight, self.has_bias, self.has_dres = has_weight, has_bias, has_dres
        self.staged_rows = (dtype, dtype)
        self.staged_params = (w_dtype,) if has_weight else ()
        self.accumulators = int(has_weight) + int(has_bias)  # fp32 row slices in shared memory (see below)
        self.staged_min_regs = 128
        # dweight/dbias accumulate in registers for staged plans with few of them (ACC_REG_ELEMS fp32 a
        # thread, both together), else in shared memory (a private slot per thread, read-modify-written per row)
        self.acc_in_regs = bwd_acc_in_regs(plan, vec, self.accumulators)
        # ... and with one row group a CTA (nothing to fold) the partial rows go from the registers to global memory:
        # no shared slots at all (the norms at 128k-256k: 64-128 KiB a CTA freed for staging, e.g. a second buffer)
        self.direct_partial = bwd_direct_partial(plan, vec, self.accumulators)
        self.accumulators = bwd_smem_accumulators(plan, vec, self.accumulators)

    @cute.jit
    def __call__(self, x: cute.Tensor, w, dy: cute.Tensor, dres, mean, rstd: cute.Tensor, dx: cute.Tensor,
                 dw_partial, db_partial, max_ctas: Int32, stream):
        self.kernel(x, w, dy, dres, mean, rstd, dx, dw_partial, db_partial).launch(
            **self.grid(extent(x, 0), max_ctas), stream=stream)

    @cute.kernel
    def kernel(self, x: cute.Tensor, w, dy: cute.Tensor, dres, mean, rstd: cute.Tensor, dx: cute.Tensor,
               dw_partial, db_partial):
        layer = self.kind == "layer"
        vec, vpt, tpr = self.vec, self.vpt, self.tpr
        tidx, _, _ = cute.arch.thread_idx()
        bidx0, rank, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        rows, n = extent(x, 0), extent(x, 1)
        smem = cutlass.memory.SmemAllocator()
        red = RowReducer.allocate(smem, self.threads, tpr, self.cluster_n, (2,) if layer else (1,),
                                  self.plan.cluster_sync, self.plan.cluster_fold)
        lane = tidx % tpr
        group = tidx // tpr
        sl = RowSlice(vec, tpr, vpt, lane, rank, n, self.staged)
        hold = self.holders(sl, smem, (x.element_type, dy.element_type), group)
        (hw,) = self.stage_vectors(smem, sl, group, (w,))
        inv_n = cute.arch.rcp_approx(Float32(n))  # no IEEE-division subroutine call
        # dweight/dbias accumulators: a private copy per thread (no races, no barriers in the loop), in
        # registers where `acc_in_regs`, else in shared memory (in registers they would double the
        # register footprint of the plans that hold the row in registers). The shared slots also collect the registers'
        # sums after the loop, for the CTA's fold over its row groups (`write_partial`).
        slots = not self.direct_partial
        dw_buf = self.accumulator(smem, group, lane) if self.has_weight and slots else None
        db_buf = self.accumulator(smem, group, lane) if self.has_bias and slots else None
        dw_acc = self.acc_of(dw_buf, lane, group) if self.has_weight else None
        db_acc = self.acc_of(db_buf, lane, group) if self.has_bias else None
        cluster_start(self.cluster_n)
        count, bidx, gdim = my_tile_count(rows, self.rows_per_cta, bidx0, gdim, self.index64)
        stats = None
        if cutlass.const_expr(self.prefetch):  # the first tile's rows and statistics
            stats = cute.make_rmem_tensor((2,), Float32)
            row0 = bidx * self.rows_per_cta + group
            self.fetch_rows(sl, hold, [x[row0, None], dy[row0, None]], row0 < rows, 0.0, 0)
            stats[0], stats[1] = self.row_stats(mean, rstd, row0, row0 < rows)
            sl.commit(self.staged)
        # the backward kernels walk several tiles per CTA (capped grids): one wait, after the first
        # prefetch's loads are issued (without prefetch, at the start; in the loop it cost a spill)
        cluster_join(self.cluster_n, True)
        for i in cutlass.range(count, unroll=1):
            row = (bidx + i * gdim) * self.rows_per_cta + group
            ok = row < rows
            parity = Int32(i % 2)
            tile = Int32(i)
            if cutlass.const_expr(self.prefetch):
                hx, hdy = self.held_rows(sl, hold, parity)
                r, mu = stats[0], stats[1]
                if cutlass.const_expr(self.hold):  # one buffer each: this tile's rows read out before the refill
                    sl.arrive(self.staged)
                    hx = sl.read(hx, ok, 0.0)
                    hdy = sl.read(hdy, ok, 0.0)
                nrow = row + gdim * self.rows_per_cta  # >= rows past this CTA's last tile
                # (the other stage of two; a held plan's one buffer takes no stage index: `fetch_rows`)
                self.fetch_rows(sl, hold, [x[nrow, None], dy[nrow, None]], nrow < rows, 0.0, 1 - parity)
                stats[0], stats[1] = self.row_stats(mean, rstd, nrow, nrow < rows)
                if cutlass.const_expr(self.hold):
                    RowSlice.commit(True)
                else:
                    sl.arrive(self.staged, 1)
            else:
                r = Float32(0.0)
                mu = Float32(0.0)
                if ok:
                    r = rstd[row]
                    if cutlass.const_expr(layer):
                        mu = mean[row]
                hx = sl.fetch(x[row, None], ok, 0.0, hold[0])
                hdy = sl.fetch(dy[row, None], ok, 0.0, hold[1])
                sl.arrive(self.staged)
                if cutlass.const_expr(self.hold):
                    hx = sl.read(hx, ok, 0.0)
                    hdy = sl.read(hdy, ok, 0.0)
            xs = sl.to_f32(sl.read(hx, ok, 0.0))
            dys = sl.to_f32(sl.read(hdy, ok, 0.0))
            xh = [(v - mu) * r for v in xs]
            # Accumulate dweight/dbias first: dy is then dead once w * dy is formed, which keeps two
            # (not three) row-sized fp32 arrays live across the reduction.
            for k in cutlass.range_constexpr(vpt):
                if cutlass.const_expr(self.has_weight):
                    dw_acc[None, k].store(dw_acc[None, k].load() + dys[k] * xh[k])
                if cutlass.const_expr(self.has_bias):
                    db_acc[None, k].store(db_acc[None, k].load() + dys[k])
            wdy = dys
            if cutlass.const_expr(self.has_weight):
                ws = self.vector_of(sl, hw)
                wdy = [d * c for d, c in zip(dys, ws)]
            c1 = Float32(0.0)
            c2 = Float32(0.0)
            if cutlass.const_expr(layer):
                c1, c2 = red.reduce((sl.sum([a * g for a, g in zip(xh, wdy)]), sl.sum(wdy)), add_pairs,
                                    (Float32(0.0), Float32(0.0)), 0, tile)
            else:
                c1 = red.reduce(sl.sum([a * g for a, g in zip(xh, wdy)]), add, Float32(0.0), 0, tile)
            c1 = c1 * inv_n
            c2 = c2 * inv_n
            if cutlass.const_expr(self.staged):  # x, dy (and w) again for the output pass
                if cutlass.const_expr(self.hold):  # from the held 16-bit vectors (`widen_again`: not merged)
                    xh = [(widen_again(v) - mu) * r for v in hx]
                    wdy = [widen_again(v) for v in hdy]
                else:
                    xh = [(v - mu) * r for v in sl.again(hx, xs, ok, 0.0)]
                    wdy = sl.again(hdy, dys, ok, 0.0)
                if cutlass.const_expr(self.has_weight):
                    wdy = [d * c for d, c in zip(wdy, self.vector_of(sl, hw))]
            dxs = [(g - (a * c1 + c2)) * r for a, g in zip(xh, wdy)]
            if cutlass.const_expr(self.has_dres):
                drs = sl.to_f32(sl.load(dres[row, None], ok, 0.0))
                dxs = [d + e for d, e in zip(dxs, drs)]
            sl.store(dx[row, None], ok, dxs)
            red.end_tile()
        if cutlass.const_expr(self.direct_partial):  # one row group: this thread's sums are the CTA's
            for acc, partial in ((dw_acc, dw_partial), (db_acc, db_partial)):
                if cutlass.const_expr(acc is not None):
                    pv = sl.view(partial[bidx0, None])
                    for k in cutlass.range_constexpr(vpt):
                        if sl.valid(k):
                            pv[None, sl.index(k)].store(acc[None, k].load())
        else:
            if cutlass.const_expr(self.acc_in_regs):  # the registers' sums into this thread's shared slots
                for buf, acc in ((dw_buf, dw_acc), (db_buf, db_acc)):
                    if cutlass.const_expr(buf is not None):
                        mine = buf[None, None, lane, group]
                        for k in cutlass.range_constexpr(vpt):
                            mine[None, k].store(acc[None, k].load())
            cute.arch.barrier()
            if cutlass.const_expr(self.has_weight):
                self.write_partial(smem, dw_buf, dw_partial, sl, group, bidx0)
            if cutlass.const_expr(self.has_bias):
                self.write_partial(smem, db_buf, db_partial, sl, group, bidx0)

    def residency_smem_bytes(self) -> int:
        """As if the accumulators had their shared slots (`direct_partial` frees them): the register cap of the
        measured plans stays (LayerNorm 64k at 2 CTAs an SM would get 128 registers and spill 72 B); the freed
        shared memory goes to what a plan stages (an fp32 weight, a second buffer), not to more CTAs."""
        return self.row_smem_bytes(int(self.has_weight) + int(self.has_bias))

    @cute.jit
    def row_stats(self, mean, rstd: cute.Tensor, row, ok):
        """(rstd, mean) of `row` (mean 0 for RMSNorm), both 0 where `ok` is false."""
        r = Float32(0.0)
        mu = Float32(0.0)
        if ok:
            r = rstd[row]
            if cutlass.const_expr(self.kind == "layer"):
                mu = mean[row]
        return r, mu

    def acc_of(self, buf: cute.Tensor, lane, group) -> cute.Tensor:
        """This thread's zeroed (vec, vpt) accumulator: registers (`acc_in_regs`) or its slot of `buf`."""
        if self.acc_in_regs:
            acc = cute.make_rmem_tensor((self.vec, self.vpt), Float32)
            acc.fill(0.0)
            return acc
        return buf[None, None, lane, group]

    def accumulator(self, smem, group, lane) -> cute.Tensor:
        """This thread's zeroed (vec, vpt) fp32 accumulator in shared memory: element (e, k) of
        row group g, lane l at ((g * vpt + k) * tpr + l) * vec + e, so a row group's accumulators
        for vector k are contiguous (conflict-free 128-bit accesses)."""
        vec, vpt, tpr = self.vec, self.vpt, self.tpr
        buf = smem.allocate_tensor(
            Float32, cute.make_layout((vec, vpt, tpr, self.rows_per_cta), stride=(1, tpr * vec, vec, vpt * tpr * vec)),
            byte_alignment=16)
        if not self.acc_in_regs:
            mine = buf[None, None, lane, group]
            for k in range(vpt):
                mine[None, k].store(cute.full((vec,), 0.0, Float32))
        return buf

    @cute.jit
    def write_partial(self, smem, buf: cute.Tensor, partial: cute.Tensor, sl: RowSlice, group, bidx):
        """Sum the accumulators of the CTA's row groups in group order (after a CTA barrier) and
        write the CTA's partial row."""
        if group == 0:
            pv = sl.view(partial[bidx, None])
            for k in cutlass.range_constexpr(self.vpt):
                total = buf[None, k, sl.lane, 0].load()
                # A runtime loop: short rows put up to 256 row groups in a CTA, and unrolling them
                # all (x vpt) made the kernel take a minute to compile.
                for g in cutlass.range(1, self.rows_per_cta, unroll=4):
                    total = total + buf[None, k, sl.lane, g].load()
                if sl.valid(k):
                    pv[None, sl.index(k)].store(total)
