"""QAT fake-quant kernels (curriculum lesson 17): the elementwise fake-quant with its packed STE mask, the STE
backward, the learnable (LSQ / LSQ+) backward with its per-scale sums, and the moving-average min / max observer.

The rules (rounding, clamping, zero points, the e4m3 grid) are `cute_kernels.qat.reference`'s, which states them;
every kernel evaluates them with the same fp32 / fp64 operations in the same order.

Layout: x is flat and contiguous, viewed as (outer, C, inner) with the scale of element i at c = (i // inner) % C.
The two elementwise kernels walk items of 8 elements (`MASK_VEC`, one 16-byte vector for 16-bit types, two for fp32)
grid-stride (`schedules.grid_stride`, `schedules.walks.strided_fold`); an item's 8 STE bits are one byte of the mask
(bit k of byte b: element 8 b + k), so the mask costs 1/8 byte an element. The last CTA's thread 0 does the n % 8
tail. Where the scale varies along an item (`mode` "element": inner % 8 != 0) each element walks its own index.

The two reduction kernels read x as rows (R, L) = (outer C, inner), row r of channel r % C, split when rows alone
leave SMs idle (`schedules.row_tiling.plan_rows`: column chunks for the learnable backward; for the observer, CTA
passes dealt out in turn, so the grid reads a row from its start up); a row's threads reduce through
`collectives.reduce`. With one split and one row per channel (`merge` False) the row's owner finishes the channel;
otherwise every CTA stores its rows' partials and the last CTA to finish (`collectives.split_counter`) combines each
channel's partials in a fixed order (a warp a channel): deterministic, no float atomics.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, Float64, Int32, Int64, Uint8
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T

from collectives import pdl
from collectives.ptx import asm_f32
from collectives.quantize import E4M3, E4M3_MAX, inverse
from collectives.reduce import add_pairs, group_smem, warp_reduce
from collectives.reduce import group_reduce as _group_reduce
from collectives.rowwise import HeldRowKernel, RowReducer, RowSlice
from collectives.split_counter import last_split
from collectives.vector_io import as_vectors, extent, widen_again
from collectives.vector_map import map_grid, thread_walk
from cute_kernels.qat import observed_rows_regs
from schedules.grid_stride import GridStride
from schedules.row_tiling import HeldRowPlan, RowTiling
from schedules.walks import SplitRowWalk, interleaved_split, row_tile_grid, strided_fold

MASK_VEC = 8  # elements of one map item = bits of one mask byte
QTYPES = ("int", "e4m3")
ZP_RULES = ("int", "round", "half_up", "float")
MODES = ("scalar", "tensor", "vector", "element")
INF = float("inf")
_MERGE_BAR = 1  # named barrier of the last CTA's hand-off (barrier 0 is the row reductions')
_MERGE_BATCH = 8  # partials a lane of the last CTA loads at once


# --- the per-element rules -------------------------------------------------------------------------------------------
def min_nan(a, b) -> Float32:
    """min.NaN.f32: a NaN operand gives NaN (torch's aminmax propagates NaN)."""
    return asm_f32("min.NaN.f32 $0, $1, $2;", a, b)


def max_nan(a, b) -> Float32:
    return asm_f32("max.NaN.f32 $0, $1, $2;", a, b)


def clamp(v, lo, hi):
    """min(max(v, lo), hi) by max.f32 / min.f32: a NaN v gives lo."""
    return cute.arch.fmin(cute.arch.fmax(v, lo), hi)


def zero_point(raw, rule: str, qmin: Float32, qmax: Float32) -> Float32:
    """The fp32 zero point of a loaded value under `rule` (`reference.zero_point_of`); +0.0 for a rounded -0.0 (torch
    rounds through an integer), so that (clamp(r) - zp) of an r of 0 is +0."""
    z = Float32(raw)
    if cutlass.const_expr(rule == "round"):
        z = clamp(cute.math.roundeven(z), qmin, qmax) + Float32(0.0)
    elif cutlass.const_expr(rule == "half_up"):
        z = cute.math.trunc(clamp(z + Float32(0.5), qmin, qmax)) + Float32(0.0)
    return z


def int_rule(v: Float32, s: Float32, inv: Float32, z: Float32, qmin: Float32, qmax: Float32, fused: bool):
    """(y in fp32, in range) of one element on the integer grid: r = rint(v inv) + z (`fused`: rint(fma(v, inv, z)),
    the float-zero-point rule), y = (clamp(r) - z) s."""
    if cutlass.const_expr(fused):
        r = cute.math.roundeven(cute.math.fma(v, inv, z)) + Float32(0.0)
    else:
        r = cute.math.roundeven(v * inv) + z
    ok = (r >= qmin) & (r <= qmax)
    return (clamp(r, qmin, qmax) - z) * s, ok


def e4m3_round(t: list) -> list:
    """e4m3(t) back in fp32 for fp32 scalars t (`cvt.rn.satfinite.e4m3x2.f32`: nearest even, saturating to +-448, NaN
    kept), through a register vector (an even count of lanes)."""
    k = len(t) + len(t) % 2
    r = cute.make_rmem_tensor((k,), Float32)
    for e in range(k):
        r[e] = t[e] if e < len(t) else Float32(0.0)
    q = r.load().to(E4M3).to(Float32)
    return [q[e] for e in range(len(t))]


def quantize_item(vals: list, s: list, inv: list, z: list, qmin, qmax, qtype: str, fused: bool):
    """([y fp32], bits) of a list of fp32 elements with their scale, reciprocal and zero point: bit e of `bits` is
    element e's STE mask."""
    ys, bits = [], Int32(0)
    if cutlass.const_expr(qtype == "e4m3"):
        t = [vals[e] * inv[e] for e in range(len(vals))]
        q = e4m3_round(t)
        for e in range(len(vals)):
            ys.append(q[e] * s[e])
            ok = (t[e] <= Float32(E4M3_MAX)) & (t[e] >= Float32(-E4M3_MAX))
            bits = bits | cutlass.select_(ok, Int32(1 << e), Int32(0))
    else:
        for e in range(len(vals)):
            y, ok = int_rule(vals[e], s[e], inv[e], z[e], qmin, qmax, fused)
            ys.append(y)
            bits = bits | cutlass.select_(ok, Int32(1 << e), Int32(0))
    return ys, bits


# --- the elementwise fake-quant --------------------------------------------------------------------------------------
class FakeQuant:
    """y = fake_quant(x) and (with `mask`) the packed STE bits m, over flat x of n elements.

    `mode` says where an element's scale / zero point come from: "scalar" the kernel's arguments (s_arg, z_arg),
    "tensor" element 0 of `scale` / `zp`, "vector" c = (8 j // inner) % C once an item (inner % 8 == 0), "element"
    per element (any inner). `zp_rule` (`ZP_RULES`): the zero point tensor's meaning ("int": int32; "round": float,
    rounded and clamped: the learnable forward; "float": float, the fused rint(fma(x, inv, zp)) rule). `gated`: an
    int64 flag (the observer's fake_quant_on) of 0 passes x through with every bit set."""

    def __init__(
        self, dtype, qtype: str, zp_rule: str, mode: str, mask: bool, gated: bool, index64: bool, schedule: GridStride
    ):
        if qtype not in QTYPES or zp_rule not in ZP_RULES or mode not in MODES:
            raise ValueError(f"qtype / zp_rule / mode must be in {QTYPES} / {ZP_RULES} / {MODES}")
        self.dtype, self.qtype, self.zp_rule, self.mode = dtype, qtype, zp_rule, mode
        self.mask, self.gated, self.index64, self.schedule = mask, gated, index64, schedule
        self.vec = MASK_VEC

    @cute.jit
    def __call__(
        self,
        x: cute.Tensor,
        y: cute.Tensor,
        m: cute.Tensor,
        scale: cute.Tensor,
        zp: cute.Tensor,
        flag: cute.Tensor,
        s_arg: Float32,
        z_arg: Float32,
        inner: Int32,
        channels: Int32,
        qmin: Float32,
        qmax: Float32,
        max_ctas: Int32,
        stream,
    ):
        ctas, passes = map_grid(extent(x, 0) // self.vec, self.schedule, max_ctas, self.index64)
        self.kernel(x, y, m, scale, zp, flag, s_arg, z_arg, inner, channels, qmin, qmax, passes).launch(
            grid=[ctas, 1, 1], block=[self.schedule.threads, 1, 1], stream=stream, use_pdl=pdl.LAUNCH
        )

    def _qparams(self, s, z_raw, qmin, qmax):
        return s, inverse(s), zero_point(z_raw, self.zp_rule, qmin, qmax)

    def _channel(self, i, inner, channels):
        return (i // inner) % channels

    @cute.kernel
    def kernel(
        self,
        x: cute.Tensor,
        y: cute.Tensor,
        m: cute.Tensor,
        scale: cute.Tensor,
        zp: cute.Tensor,
        flag: cute.Tensor,
        s_arg: Float32,
        z_arg: Float32,
        inner: Int32,
        channels: Int32,
        qmin: Float32,
        qmax: Float32,
        passes: Int32,
    ):
        pdl.enter()  # (launched as a programmatic dependent: collectives.pdl)
        vec, sched, mode = self.vec, self.schedule, self.mode
        fused = self.zp_rule == "float"
        n = extent(x, 0)
        first, stride, pass_stride, (tidx, bidx, gdim) = thread_walk(sched, n, self.index64)
        if cutlass.const_expr(self.index64):
            inner_i, chan_i, zero_i = Int64(inner), Int64(channels), Int64(0)
        else:
            inner_i, chan_i, zero_i = inner, channels, Int32(0)
        on = Int32(1)
        if cutlass.const_expr(self.gated):
            on = cutlass.select_(flag[0] != Int64(0), Int32(1), Int32(0))
        q0 = None
        if cutlass.const_expr(mode == "scalar"):
            q0 = (s_arg, inverse(s_arg), z_arg)
        elif cutlass.const_expr(mode == "tensor"):
            q0 = self._qparams(scale[0], zp[0], qmin, qmax)
        xv = as_vectors(x, n, vec)
        yv = as_vectors(y, n, vec)

        def load(j):
            vals = xv[None, j].load()
            if cutlass.const_expr(mode in ("scalar", "tensor")):
                return (vals,)
            i0 = j * vec
            if cutlass.const_expr(mode == "vector"):
                c = self._channel(i0, inner_i, chan_i)
                return (vals, scale[c], zp[c])
            q = i0 // inner_i
            rem = i0 - q * inner_i
            c = q % chan_i
            cs = [c]
            for _ in cutlass.range_constexpr(
                1, vec
            ):  # the next element's channel: one more along inner, wrapping into the next
                rem = rem + 1
                wrap = rem == inner_i
                rem = cutlass.select_(wrap, zero_i, rem)
                c = cutlass.select_(wrap, c + 1, c)
                c = cutlass.select_(c == chan_i, zero_i, c)
                cs.append(c)
            return (vals, *[scale[c] for c in cs], *[zp[c] for c in cs])

        def step(acc, j, loaded):
            f = loaded[0].to(Float32)
            v = [f[e] for e in range(vec)]
            if cutlass.const_expr(mode in ("scalar", "tensor")):
                s, inv, z = [q0[0]] * vec, [q0[1]] * vec, [q0[2]] * vec
            elif cutlass.const_expr(mode == "vector"):
                one = self._qparams(loaded[1], loaded[2], qmin, qmax)
                s, inv, z = [one[0]] * vec, [one[1]] * vec, [one[2]] * vec
            else:
                qs = [self._qparams(loaded[1 + e], loaded[1 + vec + e], qmin, qmax) for e in range(vec)]
                s, inv, z = [q[0] for q in qs], [q[1] for q in qs], [q[2] for q in qs]
            ys, bits = quantize_item(v, s, inv, z, qmin, qmax, self.qtype, fused)
            out = cute.make_rmem_tensor((vec,), Float32)
            for e in cutlass.range_constexpr(vec):
                out[e] = cutlass.select_(on != 0, ys[e], v[e]) if cutlass.const_expr(self.gated) else ys[e]
            yv[None, j].store(out.load().to(self.dtype))
            if cutlass.const_expr(self.mask):
                if cutlass.const_expr(self.gated):
                    bits = cutlass.select_(on != 0, bits, Int32(0xFF))
                m[j] = Uint8(bits)
            return acc

        strided_fold(
            n // vec,
            first,
            stride,
            pass_stride,
            sched.unroll,
            load,
            step,
            Int32(0),
            full_passes=None if cutlass.const_expr(self.index64) else passes,
        )
        # the n % 8 elements past the last item, by thread 0 of the last CTA, and their mask byte
        base = (n // vec) * vec
        if base < n and bidx == gdim - 1 and tidx == 0:
            bits = Int32(0)
            for e in cutlass.range_constexpr(vec - 1):
                i = base + e
                if i < n:
                    v = x[i].to(Float32)
                    if cutlass.const_expr(q0 is not None):
                        s, inv, z = q0
                    else:
                        c = self._channel(i, inner_i, chan_i)
                        s, inv, z = self._qparams(scale[c], zp[c], qmin, qmax)
                    ys, b = quantize_item([v], [s], [inv], [z], qmin, qmax, self.qtype, fused)
                    out = ys[0]
                    if cutlass.const_expr(self.gated):
                        out = Float32(cutlass.select_(on != 0, out, v))
                        b = Int32(cutlass.select_(on != 0, b, Int32(1)))
                    y[i] = out.to(self.dtype)
                    bits = bits | (b << e)
            if cutlass.const_expr(self.mask):
                m[n // vec] = Uint8(bits)


# --- the STE backward ------------------------------------------------------------------------------------------------
class SteBackward:
    """dx = dy * bit(m) over flat dy of n elements (torch's `dY * mask`: a masked-out negative dy gives -0.0)."""

    def __init__(self, dtype, index64: bool, schedule: GridStride):
        self.dtype, self.index64, self.schedule = dtype, index64, schedule
        self.vec = MASK_VEC

    @cute.jit
    def __call__(self, dy: cute.Tensor, dx: cute.Tensor, m: cute.Tensor, max_ctas: Int32, stream):
        ctas, passes = map_grid(extent(dy, 0) // self.vec, self.schedule, max_ctas, self.index64)
        self.kernel(dy, dx, m, passes).launch(
            grid=[ctas, 1, 1], block=[self.schedule.threads, 1, 1], stream=stream, use_pdl=pdl.LAUNCH
        )

    @cute.kernel
    def kernel(self, dy: cute.Tensor, dx: cute.Tensor, m: cute.Tensor, passes: Int32):
        pdl.enter()
        vec, sched = self.vec, self.schedule
        n = extent(dy, 0)
        first, stride, pass_stride, (tidx, bidx, gdim) = thread_walk(sched, n, self.index64)
        gv = as_vectors(dy, n, vec)
        dv = as_vectors(dx, n, vec)

        def load(j):
            return gv[None, j].load(), m[j]

        def step(acc, j, loaded):
            f = loaded[0].to(Float32)
            bits = Int32(loaded[1])
            out = cute.make_rmem_tensor((vec,), Float32)
            for e in cutlass.range_constexpr(vec):
                out[e] = f[e] * cutlass.select_(((bits >> e) & Int32(1)) != 0, Float32(1.0), Float32(0.0))
            dv[None, j].store(out.load().to(self.dtype))
            return acc

        strided_fold(
            n // vec,
            first,
            stride,
            pass_stride,
            sched.unroll,
            load,
            step,
            Int32(0),
            full_passes=None if cutlass.const_expr(self.index64) else passes,
        )
        base = (n // vec) * vec
        if base < n and bidx == gdim - 1 and tidx == 0:
            bits = Int32(m[n // vec])
            for e in cutlass.range_constexpr(vec - 1):
                if base + e < n:
                    keep = cutlass.select_(((bits >> e) & Int32(1)) != 0, Float32(1.0), Float32(0.0))
                    dx[base + e] = (dy[base + e].to(Float32) * keep).to(self.dtype)


# --- the row walks: learnable backward and observer ------------------------------------------------------------------
class _RowKernel:
    """What the learnable backward and the observer share: rows (R, L) of x, `vec`-element vectors (1: scalar), split
    into `splits` column chunks on grid y, a CTA of `tiling.threads` threads taking row tiles grid-stride; per row a
    pair of fp32 values reduced by `op` over the row's threads; then each channel finished by its row's owner
    (`merge` False: one row per channel, one split) or by the last CTA from every CTA's partials."""

    width = 2  # fp32 accumulators a thread folds a row into (reduced over the row's threads together)

    def __init__(self, dtype, vec: int, index64: bool, merge: bool, tiling: RowTiling):
        self.dtype, self.vec, self.index64, self.merge, self.tiling = dtype, vec, index64, merge, tiling

    def _smem(self):
        smem = cutlass.memory.SmemAllocator()
        buf = group_smem(smem, Float32, self.tiling.threads, self.tiling.threads_per_row, self.width)
        slot = smem.allocate_tensor(Int32, cute.make_layout(1), byte_alignment=4) if self.merge else None
        return buf, slot

    @cute.jit
    def _rows(self, x: cute.Tensor, splits, buf, fold, init, op, finish, partial: cute.Tensor, row_pair=None):
        """For every row of this CTA: fold(row, walk, split, splits, acc) accumulates into `acc` (a `width`-element
        fp32 register tensor starting at `init`), the row's threads combine by `op`, row_pair(row, reduced) (default:
        the two values as they are) gives the row's pair (a, b), and the row's lane 0 calls finish(row, a, b) (no
        merge) or stores (a, b) into partial[row, split]."""
        tpr = self.tiling.threads_per_row
        rows, n = extent(x, 0), extent(x, 1)
        if cutlass.const_expr(self.index64):
            assert n.dtype is Int64 and rows.dtype is Int64, "64-bit variant traced with 32-bit sizes"
        w = SplitRowWalk.create(self.tiling, rows, n, self.vec, splits, self.index64)
        _, split, _ = cute.arch.block_idx()
        for i in cutlass.range(w.count, unroll=1):
            row = w.row(i)
            acc = cute.make_rmem_tensor((self.width,), Float32)
            for k in cutlass.range_constexpr(self.width):
                acc[k] = Float32(init[k])
            if row < rows:
                fold(row, w, split, splits, acc)
            tot = _group_reduce(tuple(acc[k] for k in range(self.width)), op, tpr, buf)
            if cutlass.const_expr(row_pair is not None):
                tot = row_pair(row, tot)
            if row < rows and w.lane == 0:
                if cutlass.const_expr(self.merge):
                    partial[row, split, 0] = tot[0]
                    partial[row, split, 1] = tot[1]
                else:
                    finish(row, tot[0], tot[1])
            if cutlass.const_expr(buf is not None):
                cute.arch.barrier()  # the shared slots are rewritten by the next tile

    @cute.jit
    def _merge(
        self, counter: cute.Tensor, slot: cute.Tensor, partial: cute.Tensor, rows, channels, splits, init, op, finish
    ):
        """The last CTA to finish: channel c's partials (rows o C + c of every split, o < rows / C) folded by a warp
        in (o, split) order and its lanes' results by a butterfly; lane 0 calls finish(c, a, b)."""
        threads = self.tiling.threads
        tidx, _, _ = cute.arch.thread_idx()
        gx, gy, _ = cute.arch.grid_dim()
        bar = pipeline.NamedBarrier(barrier_id=_MERGE_BAR, num_threads=threads)
        if last_split(counter, 0, Int32(gx * gy), slot, bar, tidx == 0):
            warp, lane = tidx // 32, tidx % 32
            items = (rows // channels) * splits
            for c in cutlass.range(warp, channels, threads // 32, unroll=1):
                a = Float32(init[0])
                b = Float32(init[1])
                # _MERGE_BATCH partials a lane loaded into registers before any is folded: they are L2 round trips
                # (a per-tensor reduction's one channel has ~33 a lane), which an unrolled loop still waited for one
                # by one (ptxas put each load right before its fold); the fold order, hence the bits, is unchanged
                pair = cute.make_rmem_tensor((2 * _MERGE_BATCH,), Float32)
                for k0 in cutlass.range(lane, items, 32 * _MERGE_BATCH, unroll=1):
                    for j in cutlass.range_constexpr(_MERGE_BATCH):
                        k = cutlass.min(k0 + 32 * j, items - 1)
                        o = k // splits
                        r = o * channels + c
                        sp = k - o * splits
                        pair[2 * j] = partial[r, sp, 0]
                        pair[2 * j + 1] = partial[r, sp, 1]
                    for j in cutlass.range_constexpr(_MERGE_BATCH):
                        if k0 + 32 * j < items:
                            a, b = op((a, b), (pair[2 * j], pair[2 * j + 1]))
                tot = warp_reduce((a, b), op)
                if lane == 0:
                    finish(c, tot[0], tot[1])


class LearnableBackward(_RowKernel):
    """dx = dy * mask and the scale / zero-point gradients (LSQ / LSQ+, torch's learnable fake-quant backward) of x
    viewed as rows (outer C, L): row r has channel c = r % C; out_s[c], out_z[c] are the sums over its elements of
    the terms of `reference.learnable_grads` (`zp_rule` "half_up" per-tensor, "round" otherwise).

    The sums are factored so that an element costs ~16 fp32 instructions instead of ~30 (the learnable backward at
    16-bit is otherwise close to issue-bound at HBM speed): with r = rint(x inv) + z, c = clamp(r) (in range iff
    c == r) and e = (c - z) s - x,

        dscale = gf (inv * sum_in dy e + sum_out dy (c - z)),      dzp = gf (-s) sum_out dy,

    one fma an element into each of three running sums (two interleaved sets: shorter chains), the per-channel
    factors applied once a row and grad_factor once a channel. The sums are the terms' sums in another order and
    rounding (the GPU tests hold them to 2x torch's own error against fp64)."""

    width = 3

    def __init__(self, dtype, vec: int, index64: bool, zp_rule: str, merge: bool, tiling: RowTiling):
        super().__init__(dtype, vec, index64, merge, tiling)
        if zp_rule not in ("round", "half_up"):
            raise ValueError(f"zp_rule must be round or half_up, got {zp_rule!r}")
        self.zp_rule = zp_rule

    @cute.jit
    def __call__(
        self,
        x: cute.Tensor,
        dy: cute.Tensor,
        dx: cute.Tensor,
        scale: cute.Tensor,
        zp: cute.Tensor,
        partial: cute.Tensor,
        out_s: cute.Tensor,
        out_z: cute.Tensor,
        counter: cute.Tensor,
        splits: Int32,
        channels: Int32,
        qmin: Float32,
        qmax: Float32,
        gf: Float32,
        max_ctas: Int32,
        stream,
    ):
        ctas = row_tile_grid(extent(x, 0), max_ctas, self.tiling)
        self.kernel(x, dy, dx, scale, zp, partial, out_s, out_z, counter, splits, channels, qmin, qmax, gf).launch(
            grid=[ctas, splits, 1],
            block=[self.tiling.threads, 1, 1],
            stream=stream,
            use_pdl=pdl.LAUNCH,
            min_blocks_per_mp=1,  # (see Observer.__call__)
        )

    @staticmethod
    def element(v, g, s, inv, z, qmin, qmax, sums: list, k: int):
        """dx (fp32) of one element; its terms added into sums[k] (dy e in range), sums[k + 1] (dy (c - z) out of
        range), sums[k + 2] (dy out of range)."""
        r = cute.math.roundeven(v * inv) + z
        c = clamp(r, qmin, qmax)
        inr = r == c  # (NaN: c is qmin, r is not)
        q = c - z
        zero = Float32(0.0)
        sums[k] = cute.math.fma(g, cutlass.select_(inr, q * s - v, zero), sums[k])
        sums[k + 1] = cute.math.fma(g, cutlass.select_(inr, zero, q), sums[k + 1])
        sums[k + 2] = sums[k + 2] + cutlass.select_(inr, zero, g)
        return g * cutlass.select_(inr, Float32(1.0), zero)

    @cute.kernel
    def kernel(
        self,
        x: cute.Tensor,
        dy: cute.Tensor,
        dx: cute.Tensor,
        scale: cute.Tensor,
        zp: cute.Tensor,
        partial: cute.Tensor,
        out_s: cute.Tensor,
        out_z: cute.Tensor,
        counter: cute.Tensor,
        splits: Int32,
        channels: Int32,
        qmin: Float32,
        qmax: Float32,
        gf: Float32,
    ):
        pdl.enter()
        vec, tpr, unroll = self.vec, self.tiling.threads_per_row, self.tiling.unroll
        buf, slot = self._smem()
        n = extent(x, 1)
        chan = Int64(channels) if cutlass.const_expr(self.index64) else channels

        def qparams(row):
            c = row % chan
            s = scale[c]
            return s, inverse(s), zero_point(zp[c], self.zp_rule, qmin, qmax)

        def fold(row, w, split, nsplit, acc):
            dxt = dx  # (a local: the staged branch below stores into it)
            s, inv, z = qparams(row)
            xv = as_vectors(x[row, None], n, vec)
            gv = as_vectors(dy[row, None], n, vec)
            dv = as_vectors(dx[row, None], n, vec)
            sums = cute.make_rmem_tensor((6,), Float32)  # two interleaved sets of the three sums
            for k in cutlass.range_constexpr(6):
                sums[k] = Float32(0.0)

            def load(j):
                return xv[None, w.v_begin + j].load(), gv[None, w.v_begin + j].load()

            def step(a, j, vals):
                fx, fg = vals[0].to(Float32), vals[1].to(Float32)
                out = cute.make_rmem_tensor((vec,), Float32)
                for e in cutlass.range_constexpr(vec):
                    t = [sums[k] for k in range(6)]
                    out[e] = self.element(fx[e], fg[e], s, inv, z, qmin, qmax, t, 3 * (e % 2))
                    for k in cutlass.range_constexpr(6):
                        sums[k] = t[k]
                dv[None, w.v_begin + j].store(out.load().to(self.dtype))
                return a

            if cutlass.const_expr(vec > 1):  # the n % vec elements past the last vector (the last split's), first:
                # a predicate computed before the fold stays live across it (ptxas spilled it)
                if split == nsplit - 1:
                    for k in cutlass.range_constexpr(-(-vec // tpr)):
                        t = w.lane + k * tpr
                        if t < w.tail:
                            col = w.nv * vec + t
                            ts = [sums[i] for i in range(6)]
                            d = self.element(
                                x[row, col].to(Float32), dy[row, col].to(Float32), s, inv, z, qmin, qmax, ts, 0
                            )
                            for i in cutlass.range_constexpr(6):
                                sums[i] = ts[i]
                            dxt[row, col] = d.to(self.dtype)
            strided_fold(w.v_count, w.lane, tpr, tpr * unroll, unroll, load, step, Int32(0), tail_branch=True)
            for k in cutlass.range_constexpr(3):
                acc[k] = sums[k] + sums[k + 3]

        def row_pair(row, tot):
            """(dscale, dzp) of a row before grad_factor: inv * sum_in + sum_out (c - z), -s * sum_out dy."""
            s, inv, _ = qparams(cutlass.min(row, extent(x, 0) - 1))
            return cute.math.fma(tot[0], inv, tot[1]), -s * tot[2]

        def finish(c, a, b):
            out_s[c] = a * gf
            out_z[c] = b * gf

        self._rows(x, splits, buf, fold, (0.0, 0.0, 0.0), add_pairs, finish, partial, row_pair)
        if cutlass.const_expr(self.merge):
            self._merge(counter, slot, partial, extent(x, 0), chan, splits, (0.0, 0.0), add_pairs, finish)


def _min_max(a, b):
    return min_nan(a[0], b[0]), max_nan(a[1], b[1])


def _rcp_approx_f64(b: Float64) -> Float64:
    return Float64(
        llvm.inline_asm(
            T.f64(),
            [Float64(b).ir_value()],
            "rcp.approx.ftz.f64 $0, $1;",
            "=d,d",
            has_side_effects=False,
            is_align_stack=False,
        )
    )


def div_f64(a: Float64, b: Float64) -> Float64:
    """a / b in fp64 for normal operands and quotient, without `div.rn.f64`: ptxas expands that into a slow-path
    subroutine call whose stack frame is local memory. The reciprocal refined by three Newton steps from
    rcp.approx, then Markstein's correction q + (a - b q) y in one fma: the correctly rounded quotient (an exact
    quotient comes out exact); the reciprocal's last rounding could in principle leave the result an ulp off."""
    one = Float64(1.0)
    y = _rcp_approx_f64(b)
    for _ in range(3):
        y = cute.math.fma(y, cute.math.fma(-b, y, one), y)
    q = a * y
    return cute.math.fma(cute.math.fma(-b, q, a), y, q)


def div_f32(a: Float32, b: Float32) -> Float32:
    """a / b in fp32 for normal operands and quotient, without `div.rn.f32` (see `div_f64`): Markstein's
    correction on the correctly rounded reciprocal (`collectives.quantize.inverse`)."""
    y = inverse(b)
    q = a * y
    return cute.math.fma(cute.math.fma(-b, q, a), y, q)


TINY_SCALE = 2.0**-128  # 1 / s rounds to fp32 infinity exactly when 0 < s <= 2^-128


def choose_qparams(mn: Float32, mx: Float32, qmin: Int32, qmax: Int32, symmetric: bool):
    """(scale, zero point) of the range [mn, mx] as torch's CUDA ChooseQuantizationParamsKernelImpl computes them
    (`reference.choose_qparams`): fp32 divisions for the symmetric range, fp64 for the scale and the zero point."""
    zero = Float32(0.0)
    if cutlass.const_expr(symmetric):
        sqmin = -((qmax - qmin) // 2 + 1)
        sqmax = (qmax - qmin) // 2
        both = (mn < zero) & (mx > zero)
        a = cute.math.abs(div_f32(mn, Float32(sqmin)))
        b = cute.math.abs(div_f32(mx, Float32(sqmax)))
        ms = Float64(Float32(cutlass.select_(a < b, b, a)))  # std::max(a, b)
        mn = Float32(cutlass.select_(both, (ms * Float64(sqmin)).to(Float32), mn))
        mx = Float32(cutlass.select_(both, (ms * Float64(sqmax)).to(Float32), mx))
    mn = Float32(cutlass.select_(zero < mn, zero, mn))  # std::min(mn, 0.f)
    mx = Float32(cutlass.select_(mx < zero, zero, mx))  # std::max(mx, 0.f)
    scale = div_f64(Float64(mx) - Float64(mn), Float64(qmax - qmin)).to(Float32)
    bad = cute.math.abs(scale) <= Float32(TINY_SCALE)  # scale == 0 or isinf(1.0f / scale)
    scale = Float32(cutlass.select_(bad, Float32(0.1), scale))
    sd = Float64(scale)
    lo = div_f64(Float64(mn), sd)
    hi = div_f64(Float64(mx), sd)
    e_min = Float64(Int32(cutlass.select_(qmin < 0, -qmin, qmin))) + cute.math.abs(lo)
    e_max = Float64(Int32(cutlass.select_(qmax < 0, -qmax, qmax))) + cute.math.abs(hi)
    init = Float64(cutlass.select_(e_min < e_max, Float64(qmin) - lo, Float64(qmax) - hi))
    if cutlass.const_expr(symmetric):
        init = Float64(cutlass.select_((mn < zero) & (mx > zero), Float64(qmin + qmax) * Float64(0.5), init))
    z = Int32(cute.math.roundeven(init))
    z = Int32(cutlass.select_(init < Float64(qmin), qmin, Int32(cutlass.select_(init > Float64(qmax), qmax, z))))
    return scale, z


class Observer(_RowKernel):
    """torch's fused moving-average min / max observer over rows (R, L) of x (R = 1 per-tensor, R = C per-channel
    along axis 0): each row's min / max (NaN propagates) and then, per row, running = running + c (cur - running)
    (cur while running is +-inf) when observer_on == 1, and the qparams of the running range (`choose_qparams`) into
    scale / zero_point when fake_quant_on == 1. With observer_on != 1 the rows are not read."""

    def __init__(self, dtype, vec: int, index64: bool, symmetric: bool, merge: bool, tiling: RowTiling):
        super().__init__(dtype, vec, index64, merge, tiling)
        self.symmetric = symmetric

    @cute.jit
    def __call__(
        self,
        x: cute.Tensor,
        observer_on: cute.Tensor,
        fake_quant_on: cute.Tensor,
        running_min: cute.Tensor,
        running_max: cute.Tensor,
        scale: cute.Tensor,
        zp: cute.Tensor,
        partial: cute.Tensor,
        counter: cute.Tensor,
        splits: Int32,
        averaging: Float32,
        qmin: Int32,
        qmax: Int32,
        max_ctas: Int32,
        stream,
    ):
        ctas = row_tile_grid(extent(x, 0), max_ctas, self.tiling)
        self.kernel(
            x,
            observer_on,
            fake_quant_on,
            running_min,
            running_max,
            scale,
            zp,
            partial,
            counter,
            splits,
            averaging,
            qmin,
            qmax,
        ).launch(
            grid=[ctas, splits, 1],
            block=[self.tiling.threads, 1, 1],
            stream=stream,
            use_pdl=pdl.LAUNCH,
            # one resident CTA asked for: left to itself ptxas aimed at four (64 registers) and spilled the
            # loop-invariant predicates of some variants (8 B of local memory) rather than use more registers
            min_blocks_per_mp=1,
        )

    @cute.kernel
    def kernel(
        self,
        x: cute.Tensor,
        observer_on: cute.Tensor,
        fake_quant_on: cute.Tensor,
        running_min: cute.Tensor,
        running_max: cute.Tensor,
        scale: cute.Tensor,
        zp: cute.Tensor,
        partial: cute.Tensor,
        counter: cute.Tensor,
        splits: Int32,
        averaging: Float32,
        qmin: Int32,
        qmax: Int32,
    ):
        pdl.enter()
        vec, tpr, unroll = self.vec, self.tiling.threads_per_row, self.tiling.unroll
        buf, slot = self._smem()
        n = extent(x, 1)
        observe = observer_on[0] == Int64(1)

        def fold(row, w, split, nsplit, acc):
            xv = as_vectors(x[row, None], n, vec)
            count = cutlass.select_(observe, w.nv, w.nv * 0)  # observer off: nothing read
            # the splits interleaved a CTA pass apart (split s takes passes s, s + splits, ...; min / max are the
            # same bits in any order): the grid reads the row from its start up, so the end, which the fake-quant
            # pass reads first (`QAT_QUANTIZE_MAP`), is what the L2 holds when this kernel ends
            first, pass_stride = interleaved_split(split, nsplit, w.lane, tpr, unroll)
            if cutlass.const_expr(self.index64):
                first, pass_stride = Int64(first), Int64(pass_stride)

            def load(j):
                return xv[None, j].load()

            def step(a, j, v):
                f = v.to(Float32)
                lo, hi = f[0], f[0]
                for e in cutlass.range_constexpr(1, vec):
                    lo, hi = min_nan(lo, f[e]), max_nan(hi, f[e])
                acc[0] = min_nan(acc[0], lo)
                acc[1] = max_nan(acc[1], hi)
                return a

            if cutlass.const_expr(vec > 1):  # the tail first (see LearnableBackward)
                if observe & (split == nsplit - 1):
                    for k in cutlass.range_constexpr(-(-vec // tpr)):
                        t = w.lane + k * tpr
                        if t < w.tail:
                            v = x[row, w.nv * vec + t].to(Float32)
                            acc[0] = min_nan(acc[0], v)
                            acc[1] = max_nan(acc[1], v)
            strided_fold(count, first, tpr, pass_stride, unroll, load, step, Int32(0), tail_branch=True)

        def finish(r, cur_min, cur_max):
            rmin, rmax, st, zt = running_min, running_max, scale, zp  # (locals: the staged branches store into them)
            lo = rmin[r]
            hi = rmax[r]
            if observer_on[0] == Int64(1):  # (reloaded: keeping the flag live to the last CTA's merge spilled it)
                inf = Float32(INF)
                lo = Float32(
                    cutlass.select_((lo == inf) | (lo == -inf), cur_min, cute.math.fma(averaging, cur_min - lo, lo))
                )
                hi = Float32(
                    cutlass.select_((hi == inf) | (hi == -inf), cur_max, cute.math.fma(averaging, cur_max - hi, hi))
                )
                rmin[r] = lo
                rmax[r] = hi
            if fake_quant_on[0] == Int64(1):
                s, z = choose_qparams(lo, hi, qmin, qmax, self.symmetric)
                st[r] = s
                zt[r] = z

        init = (INF, -INF)
        self._rows(x, splits, buf, fold, init, _min_max, finish, partial)
        if cutlass.const_expr(self.merge):
            self._merge(counter, slot, partial, extent(x, 0), extent(x, 0), splits, init, _min_max, finish)


def _observed_pair(a, b):
    """The row reduction of `ObservedRows`: (min, max) of the row's elements and the running (min, max) that only
    the row's lane 0 loaded (the others contribute -inf / +inf: max / min keep it, NaN included)."""
    return min_nan(a[0], b[0]), max_nan(a[1], b[1]), max_nan(a[2], b[2]), min_nan(a[3], b[3])


class ObservedRows(HeldRowKernel):
    """The per-channel fused observer and its fake-quant in ONE pass: rows (C, L) of x (channel r = row r, L % 8 == 0)
    held by a row group (`collectives.rowwise`: `threads_per_row` threads, `unroll` 16-byte vectors each, staged in
    shared memory or in registers), the row's min / max reduced over its threads, the moving average and the qparams
    (`choose_qparams`) computed by every thread of the row from the same values (lane 0 stores them), then the
    fake-quant of the held row with them, y and the packed STE mask. A mask byte is 8 elements: one 16-bit vector,
    or two fp32 vectors, which lanes 2i and 2i + 1 of the row hold (same k), lane 2i storing their byte (so fp32 rows
    need threads_per_row >= 2).
    Exactly the observer followed by the gated per-channel fake-quant (`Observer`, then `FakeQuant` "vector" with
    int zero points): the same operations in the same order, so the same bits, with x read once instead of twice.
    Only lane 0 of a row reads the running range and writes the state, after the reduction it took part in: no
    thread reads what another writes.
    `prefetch` (`HeldRowPlan.prefetch`): a CTA walking several rows has the next row's copies in flight while it
    reduces, computes the qparams of and quantizes this one (two staging buffers, cp.async groups), so the loads do not
    stop at each row's reduction and fp64 qparams; each thread refills only the slots it read itself a row earlier.
    The same operations per row: the same bits."""

    pipelined = True

    def __init__(self, dtype, symmetric: bool, mask: bool, index64: bool, tiling: RowTiling, staging: str = "smem",
                 prefetch: bool = False):
        vec = 128 // dtype.width
        super().__init__(vec, index64, HeldRowPlan(tiling, staging=staging, prefetch=prefetch))
        if vec * self.tpr < MASK_VEC:
            raise ValueError(
                f"ObservedRows: a mask byte's 8 elements span two lanes of the row at most (fp32 rows "
                f"need threads_per_row >= 2), got threads_per_row {self.tpr} for {dtype}"
            )
        self.dtype, self.symmetric, self.mask = dtype, symmetric, mask
        self.staged_min_regs = observed_rows_regs(self.vpt * 16)  # the staged plan's register floor
        self.staged_rows = (dtype,)  # (`HeldRowKernel.grid` sizes the CTAs per SM of a staged plan by them)

    @cute.jit
    def __call__(
        self,
        x: cute.Tensor,
        y: cute.Tensor,
        m: cute.Tensor,
        observer_on: cute.Tensor,
        fake_quant_on: cute.Tensor,
        running_min: cute.Tensor,
        running_max: cute.Tensor,
        scale: cute.Tensor,
        zp: cute.Tensor,
        averaging: Float32,
        qmin: Int32,
        qmax: Int32,
        max_ctas: Int32,
        stream,
    ):
        self.kernel(
            x, y, m, observer_on, fake_quant_on, running_min, running_max, scale, zp, averaging, qmin, qmax
        ).launch(**self.grid(extent(x, 0), max_ctas), stream=stream, use_pdl=pdl.LAUNCH)

    @cute.kernel
    def kernel(
        self,
        x: cute.Tensor,
        y: cute.Tensor,
        m: cute.Tensor,
        observer_on: cute.Tensor,
        fake_quant_on: cute.Tensor,
        running_min: cute.Tensor,
        running_max: cute.Tensor,
        scale: cute.Tensor,
        zp: cute.Tensor,
        averaging: Float32,
        qmin: Int32,
        qmax: Int32,
    ):
        pdl.enter()
        vec = self.vec
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        rows, n = extent(x, 0), extent(x, 1)
        smem = cutlass.memory.SmemAllocator()
        red = RowReducer.allocate(smem, self.threads, self.tpr, 1, (4,))
        lane = tidx % self.tpr
        sl = RowSlice(vec, self.tpr, self.vpt, lane, 0, n)
        group = tidx // self.tpr
        (hold,) = self.holders(sl, smem, (x.element_type,), group)
        observe = observer_on[0] == Int64(1)
        quant = fake_quant_on[0] == Int64(1)  # new qparams (the observer's rule)
        apply = fake_quant_on[0] != Int64(0)  # the fake-quant itself (FakeQuant's gate)
        qmin_f, qmax_f = Float32(qmin), Float32(qmax)
        inf = Float32(INF)
        nv = n // vec
        count, bidx, gdim = self.tile_count(rows, bidx, gdim)
        if cutlass.const_expr(self.prefetch):  # the first row's copies
            row0 = bidx * self.rows_per_cta + group
            self.fetch_rows(sl, [hold], [x[row0, None]], row0 < rows, 0.0, 0)
            sl.commit(self.staged)
        for i in cutlass.range(count, unroll=1):
            row = (bidx + i * gdim) * self.rows_per_cta + group
            ok = row < rows
            # the row, held in its own type: in registers, or (staging "smem") in shared memory by cp.async, every byte
            # in flight at once and no register tied up across the qparams' fp64 work
            if cutlass.const_expr(self.prefetch):
                parity = Int32(i % 2)
                (held,) = self.held_rows(sl, [hold], parity)
                nrow = row + gdim * self.rows_per_cta  # >= rows past this CTA's last row
                self.fetch_rows(sl, [hold], [x[nrow, None]], nrow < rows, 0.0, 1 - parity)
                sl.arrive(self.staged, 1)  # this row's group has landed, the next row's stays in flight
            else:
                held = sl.fetch(x[row, None], ok, 0.0, hold)
                sl.arrive(self.staged)
            vals = sl.read(held, ok, 0.0)
            lo, hi = inf, -inf
            for k in cutlass.range_constexpr(self.vpt):
                f = vals[k].to(Float32)
                vlo, vhi = f[0], f[0]
                for e in cutlass.range_constexpr(1, vec):
                    vlo, vhi = min_nan(vlo, f[e]), max_nan(vhi, f[e])
                take = sl.valid(k)
                lo = Float32(cutlass.select_(take, min_nan(lo, vlo), lo))
                hi = Float32(cutlass.select_(take, max_nan(hi, vhi), hi))
            old_lo, old_hi = -inf, inf  # (the reduction's identities for the running pair)
            if ok and lane == 0:
                old_lo = running_min[row]
                old_hi = running_max[row]
            cur_lo, cur_hi, run_lo, run_hi = red.reduce((lo, hi, old_lo, old_hi), _observed_pair, None, 0, Int32(i))
            if observe:  # (the Observer's finish, in every thread of the row)
                run_lo = Float32(
                    cutlass.select_(
                        (run_lo == inf) | (run_lo == -inf), cur_lo, cute.math.fma(averaging, cur_lo - run_lo, run_lo)
                    )
                )
                run_hi = Float32(
                    cutlass.select_(
                        (run_hi == inf) | (run_hi == -inf), cur_hi, cute.math.fma(averaging, cur_hi - run_hi, run_hi)
                    )
                )
            s, zi = Float32(1.0), Int32(0)
            if quant:
                s, zi = choose_qparams(run_lo, run_hi, qmin, qmax, self.symmetric)
            elif apply & ok:  # a flag neither 0 nor 1: the stored qparams, which nothing rewrites then
                s = scale[row]
                zi = zp[row]
            if ok and lane == 0:
                rmin, rmax, st, zt = running_min, running_max, scale, zp
                if observe:
                    rmin[row] = run_lo
                    rmax[row] = run_hi
                if quant:
                    st[row] = s
                    zt[row] = zi
            inv = inverse(s)
            z = zero_point(zi, "int", qmin_f, qmax_f)
            yrow = sl.vectors(y[row, None])
            vals = sl.read(held, ok, 0.0)  # (staged: read again; registers: the same values)
            for k in cutlass.range_constexpr(self.vpt):
                # widened again by other instructions, so that the first pass's fp32 copy of the row is not what stays
                # live across the reduction (`vector_io.widen_again`)
                f = widen_again(vals[k])
                v = [f[e] for e in range(vec)]
                ys, bits = quantize_item(v, [s] * vec, [inv] * vec, [z] * vec, qmin_f, qmax_f, "int", False)
                out = cute.make_rmem_tensor((vec,), Float32)
                for e in cutlass.range_constexpr(vec):
                    out[e] = cutlass.select_(apply, ys[e], v[e])
                bits = Int32(cutlass.select_(apply, bits, Int32((1 << vec) - 1)))
                if cutlass.const_expr(vec < MASK_VEC):  # fp32: the odd lane's 4 bits join its even neighbour's
                    bits = bits | (cute.arch.shuffle_sync_bfly(bits, offset=1) << vec)
                if ok and sl.valid(k):  # (stored vector by vector: no row of outputs held)
                    sl.vector(yrow, k).store(out.load().to(self.dtype))
                    if cutlass.const_expr(self.mask):
                        if cutlass.const_expr(vec == MASK_VEC):
                            m[row * nv + sl.index(k)] = Uint8(bits)
                        elif lane % 2 == 0:
                            m[(row * nv + sl.index(k)) // 2] = Uint8(bits)
            red.end_tile()
