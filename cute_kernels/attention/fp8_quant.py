"""FP8 attention's quantization side (FA3's FP8 path): the Walsh-Hadamard transform of head rows, and the e4m3
quantization of Q, K, V with per-head or per-128-row-block scales, Q and K optionally rotated first.

Roofline: memory-bound. The transform reads and writes each row once (2 x 2 bytes per bf16 element) and adds
log2(D) butterflies per element; the quantization reads 2 bytes and writes 1 per element (per-head scales read the
input twice: 5 bytes an element). A few flops and shuffles per element against those bytes: the floor is the bytes
over the copy bandwidth.

A head row of D elements is held by `tpr` consecutive lanes of a warp, each holding `e` contiguous elements:
e = max(vec, D / 32) with vec the elements of a 128-bit access (8 in bf16/fp16, 4 in fp32), so the loads are
128-bit (e4m3 stores 64-bit) and tpr = D / e is 8, 16 or 32 lanes. The transform (Sylvester order, stride 1, 2, 4,
..., D / 2, `fwht`): the strides below e are butterflies inside a lane's registers, the strides from e up are
`shfl.sync.bfly` exchanges with lane ^ (stride / e), where the lane holding the upper element computes
partner - own and the lower one own + partner (one fma with +-1 each: exactly a + b and a - b). Then one multiply
by RN(1 / sqrt(D)). fp32 math throughout; the reference (`fp8_reference.hadamard_fp32`) does the same operations in
the same order, so the results are bitwise equal.

`Hadamard` (the op `hadamard`): a CTA of `threads` lanes covers threads / tpr rows per pass, `unroll` passes (all
loads issued first), rows past the end load the last row and store nothing.

`AttnQuantFP8` (the op `quantize_attention_fp8`): a CTA per (128-row block, head, batch) of x (B, S, H, D), or
with `cluster` = c a cluster of c CTAs of 128 / c rows each (at D = 256: fewer registers a thread, several CTAs an
SM); the block's 128 x D values are held in registers (fp32, after the optional rotation), its amax reduced over the
CTA (`collectives.reduce.group_reduce`, NaN ignored) and over the cluster (`cluster_reduce`, distributed shared
memory), and the e4m3 values written with `collectives.quantize`'s scale
rule (scale = max(amax, 1e-4) / 448, q = e4m3(x * (1 / scale))). Modes: "block" does it in one pass (a scale per
block); per-head scales take two launches, "amax" (each block's amax into a (B, H, blocks) workspace, nothing
else written) then "head" (every CTA folds its head's block amaxes, in a fixed order, into the head's amax, and
quantizes its block; the block-0 CTA writes the head's scale). No atomics: the results do not depend on the CTAs'
order.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from collectives import pdl
from collectives.quantize import BLOCK, E4M3, fmax, inverse, scale_of, vector_amax
from collectives.reduce import cluster_reduce, cluster_smem_slots, group_reduce, group_smem_slots
from collectives.vector_io import extent, row_vectors

MODES = ("block", "amax", "head")


def row_geometry(d: int, width: int, elems: int = 0) -> tuple[int, int, int]:
    """(vec, e, tpr) for head rows of d elements of a `width`-bit type: elements per 128-bit access, elements a
    lane holds (`elems`, or by default max(vec, d / 32): a row over up to a warp), lanes a row. More elements a lane
    move butterfly stages from shuffles into registers (D 256: 16 a lane leaves 4 shuffle stages of 16 values a lane
    where 8 left 5 of 8)."""
    vec = 128 // width
    e = elems or max(vec, d // 32)
    if e % vec or d % e or d // e > 32 or (d // e) & (d // e - 1):
        raise ValueError(f"{e} elements a lane: need a multiple of {vec} dividing D {d} into a power-of-two count "
                         f"of at most 32 lanes")
    return vec, e, d // e


def fwht(vals: list, lane, tpr: int) -> list:
    """The unnormalized Walsh-Hadamard transform of a row held as `tpr` lanes x len(vals) fp32 scalars (lane `lane`
    of its row group holds elements [lane * e, (lane + 1) * e)): butterflies of stride 1, 2, ..., D / 2. Every lane
    of the warp must call it (the shuffles)."""
    e = len(vals)
    vals = list(vals)
    h = 1
    while h < e:  # strides inside a lane: (a, b) -> (a + b, a - b)
        for i in range(e):
            if not i & h:
                a, b = vals[i], vals[i + h]
                vals[i], vals[i + h] = a + b, a - b
        h *= 2
    off = 1
    while off < tpr:  # strides across lanes: the lane with bit `off` set holds the upper elements
        sign = Float32(1.0) - Float32(2.0) * Float32((lane // off) % 2)  # +1 lower, -1 upper
        for i in range(e):
            other = cute.arch.shuffle_sync_bfly(vals[i], offset=off)
            vals[i] = cute.math.fma(sign, vals[i], other)  # own + other, or other - own: exact +-1 products
        off *= 2
    return vals


def load_piece(row: cute.Tensor, lane, vec: int, e: int) -> list:
    """Lane `lane`'s e contiguous elements of a head row (a 1-D tensor of static length), as e // vec 128-bit
    vector loads (TensorSSA in the row's dtype)."""
    rv = row_vectors(row, vec)
    per = e // vec
    return [rv[None, lane * per + k].load() for k in range(per)]


def widen(piece: list) -> list:
    """The loaded vectors of `load_piece` as a list of fp32 scalars."""
    out = []
    for v in piece:
        f = v.to(Float32)
        out += [f[i] for i in range(cute.size(f.shape))]
    return out


def rotate(vals: list, signs, lane, tpr: int, d: int) -> list:
    """H diag(signs) applied to a held row (normalized by RN(1 / sqrt(d))); `signs` a list of fp32 scalars or None."""
    if signs is not None:
        vals = [v * s for v, s in zip(vals, signs)]
    c = Float32(1.0 / math.sqrt(d))
    return [v * c for v in fwht(vals, lane, tpr)]


def to_vector(vals: list):
    """fp32 scalars as one fp32 TensorSSA (through a register tensor)."""
    r = cute.make_rmem_tensor((len(vals),), Float32)
    for i in range(len(vals)):
        r[i] = vals[i]
    return r.load()


def as_vector(vals: list, dtype) -> cute.Tensor:
    """fp32 scalars converted to `dtype`, in a register tensor."""
    out = cute.make_rmem_tensor((len(vals),), dtype)
    out.store(to_vector(vals).to(dtype))
    return out


class Hadamard:
    """y = (x * signs) H / sqrt(D) for the rows of x (M, D), one rounding to x's dtype; y (M, D) of x's dtype;
    signs (D,) fp32 (read only when `signed`)."""

    def __init__(self, dtype, d: int, signed: bool, threads: int = 256, unroll: int = 2):
        self.dtype, self.d, self.signed, self.threads, self.unroll = dtype, d, signed, threads, unroll
        self.vec, self.e, self.tpr = row_geometry(d, dtype.width)
        if threads % 32 or threads % self.tpr:
            raise ValueError(f"hadamard: threads must be a multiple of 32, got {threads}")
        self.rows_per_pass = threads // self.tpr
        self.rows_per_cta = self.rows_per_pass * unroll

    @cute.jit
    def __call__(self, x: cute.Tensor, y: cute.Tensor, signs: cute.Tensor, stream):
        ctas = (extent(x, 0) + self.rows_per_cta - 1) // self.rows_per_cta
        self.kernel(x, y, signs).launch(grid=[cutlass.max(ctas, 1), 1, 1], block=[self.threads, 1, 1], stream=stream,
                                        use_pdl=pdl.LAUNCH)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mY: cute.Tensor, mSigns: cute.Tensor):
        pdl.enter()  # (launched as a programmatic dependent: collectives.pdl)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        rows = extent(mX, 0)
        lane = tidx % self.tpr
        first = bidx * self.rows_per_cta + tidx // self.tpr
        held = []
        for u in cutlass.range_constexpr(self.unroll):  # every load in flight before the first shuffle
            row = first + u * self.rows_per_pass
            r = cutlass.min(row, rows - 1)
            held.append((row, load_piece(mX[r, None], lane, self.vec, self.e)))
        signs = None
        if cutlass.const_expr(self.signed):
            signs = widen(load_piece(mSigns, lane, 4, self.e))
        per = self.e // self.vec
        for u in cutlass.range_constexpr(self.unroll):
            row, piece = held[u]
            out = as_vector(rotate(widen(piece), signs, lane, self.tpr, self.d), self.dtype)
            if row < rows:
                yv = row_vectors(mY[row, None], self.vec)
                for k in cutlass.range_constexpr(per):
                    o = cute.make_rmem_tensor((self.vec,), self.dtype)
                    for i in cutlass.range_constexpr(self.vec):
                        o[i] = out[k * self.vec + i]
                    yv[None, lane * per + k].store(o.load())


class AttnQuantFP8:
    """x (B, S, H, D) bf16/fp16 -> q (B, S, H, D) e4m3 and fp32 dequant scales (x ~= q * scale), per 128-row block
    of a head or per head (module docstring: `mode`); with `hadamard`, x is rotated by H diag(signs) first.

    Tensors: x, q (B, S, H, D) any strides with unit stride along D (multiples of 8 elements for x, 16 for q);
    scales (B, H, blocks) fp32 ("block": every entry written; "head": a (B, H, 1) view, entry 0 written by the
    block-0 CTA); amax (B, H, blocks) fp32 ("amax" writes it, "head" reads it); signs (D,) fp32."""

    def __init__(self, dtype, d: int, mode: str, hadamard: bool, threads: int = 512, cluster: int = 1,
                 elems: int = 0):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.dtype, self.d, self.mode, self.hadamard, self.threads = dtype, d, mode, hadamard, threads
        self.cluster = cluster  # CTAs sharing a 128-row block (its amax folded over the cluster in shared memory)
        if cluster not in (1, 2, 4):
            raise ValueError(f"fp8_attn_quant: cluster must be 1, 2 or 4, got {cluster}")
        self.vec, self.e, self.tpr = row_geometry(d, dtype.width, elems)
        self.rows_per_pass = threads // self.tpr
        self.rows = BLOCK // cluster  # rows a CTA holds
        if threads % 32 or not 1 <= self.rows_per_pass <= self.rows or self.rows % self.rows_per_pass:
            raise ValueError(f"fp8_attn_quant: threads / {self.tpr} lanes a row must divide the {self.rows} rows a "
                             f"CTA holds, got threads={threads}, cluster={cluster}")
        self.passes = self.rows // self.rows_per_pass
        self.slots = max(group_smem_slots(threads, threads), 1)
        self.cslots = cluster_smem_slots(1, cluster)

    @cute.jit
    def __call__(self, x: cute.Tensor, q: cute.Tensor, scales: cute.Tensor, amax: cute.Tensor, signs: cute.Tensor,
                 stream):
        blocks = (extent(x, 1) + BLOCK - 1) // BLOCK
        if cutlass.const_expr(self.cluster > 1):
            self.kernel(x, q, scales, amax, signs).launch(grid=[blocks * self.cluster, extent(x, 2), extent(x, 0)],
                                                          block=[self.threads, 1, 1], cluster=[self.cluster, 1, 1],
                                                          stream=stream, use_pdl=pdl.LAUNCH)
        else:
            self.kernel(x, q, scales, amax, signs).launch(grid=[blocks, extent(x, 2), extent(x, 0)],
                                                          block=[self.threads, 1, 1], stream=stream,
                                                          use_pdl=pdl.LAUNCH)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor, mA: cute.Tensor, mSigns: cute.Tensor):
        pdl.enter()  # (launched as a programmatic dependent: collectives.pdl)
        tidx, _, _ = cute.arch.thread_idx()
        bx, h, b = cute.arch.block_idx()
        blk, rank = bx // self.cluster, bx % self.cluster  # (the cluster's CTAs are consecutive along x)
        smem = cutlass.memory.SmemAllocator()
        buf = smem.allocate_tensor(Float32, cute.make_layout(self.slots), byte_alignment=16)
        cbuf = None
        if cutlass.const_expr(self.cluster > 1):
            cbuf = smem.allocate_tensor(Float32, cute.make_layout(self.cslots), byte_alignment=16)
        seq = extent(mX, 1)
        lane = tidx % self.tpr
        first = blk * BLOCK + rank * self.rows + tidx // self.tpr
        held = []
        for p in cutlass.range_constexpr(self.passes):  # every load in flight before the first shuffle
            row = first + p * self.rows_per_pass
            r = cutlass.min(row, seq - 1)  # rows past the end read the last row: counted nowhere, stored nowhere
            held.append((row, load_piece(mX[b, r, h, None], lane, self.vec, self.e)))
        signs = None
        if cutlass.const_expr(self.hadamard):
            signs = widen(load_piece(mSigns, lane, 4, self.e))
        vals = []
        m = Float32(0.0)
        for p in cutlass.range_constexpr(self.passes):
            row, piece = held[p]
            v = widen(piece)
            if cutlass.const_expr(self.hadamard):
                v = rotate(v, signs, lane, self.tpr, self.d)
            vals.append(v)
            if cutlass.const_expr(self.mode != "head"):
                a = vector_amax(to_vector(v))
                if row < seq:
                    m = cute.arch.fmax(m, a)
        if cutlass.const_expr(self.mode == "head"):  # the head's amax: the max of its blocks' (fixed order)
            nblocks = (seq + BLOCK - 1) // BLOCK
            for i in cutlass.range(tidx, nblocks, self.threads, unroll=1):
                m = cute.arch.fmax(m, mA[b, h, i])
        amax = group_reduce(m, fmax, self.threads, buf)
        if cutlass.const_expr(self.cluster > 1 and self.mode != "head"):  # the block's amax over the cluster
            amax = cluster_reduce(amax, fmax, self.cluster, cbuf, 0, tidx, rank)
        if cutlass.const_expr(self.mode == "amax"):
            if tidx == 0 and rank == 0:
                mA[b, h, blk] = amax
        else:
            scale = scale_of(amax, False)
            inv = inverse(scale)
            for p in cutlass.range_constexpr(self.passes):
                row = held[p][0]
                qv = cute.make_rmem_tensor((self.e,), E4M3)
                qv.store((to_vector(vals[p]) * inv).to(E4M3))
                if row < seq:
                    row_vectors(mQ[b, row, h, None], self.e)[None, lane].store(qv.load())
            if tidx == 0 and rank == 0:
                if cutlass.const_expr(self.mode == "block"):
                    mS[b, h, blk] = scale
                else:
                    if blk == 0:
                        mS[b, h, 0] = scale
