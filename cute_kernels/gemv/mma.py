"""GEMV on tensor cores for x of 2-8 columns (curriculum lesson 3, the step after the register tile).

Roofline as `cute_kernels.gemv.kernels`: W (N, K) is read once, 2*N*K*B FLOPs; floor = bytes of W / copy bandwidth.
The FMA kernel at B = 8 spends 64 FFMAs and 24 conversions per 16-byte vector of W and is bound by
instruction issue (40-62 % of copy on the H200); here a warp-level `mma.sync.m16n8k16` (bf16/fp16 in,
fp32 accumulate) does the arithmetic of 8 rows x 8 columns x 16 k per instruction.

Operands of one MMA: A (16 x 16, row x k) is x^T: rows 0..B-1 are the columns of x, rows 8..15 zero;
B (8 x 16, n x k) is 8 consecutive rows of W; C (16 x 8) holds y^T for those rows (its rows >= B are
dropped). Fragments (printed from the DSL's partition, `docs/kernels/gemv.md`), lane = 4 g + c:
A: (g, 2c) (g, 2c+1) (g+8, 2c) (g+8, 2c+1) (g, 2c+8) (g, 2c+9) (g+8, 2c+8) (g+8, 2c+9)
B: (n g, 2c) (g, 2c+1) (g, 2c+8) (g, 2c+9);  C: (g, 2c) (g, 2c+1) (g+8, 2c) (g+8, 2c+1).
A dot product may visit K in any order if both sides use the same one: the k slots of lane c in the
t-th MMA of a 32-wide chunk are mapped to memory k = 32 j + 8 c + 4 t + {0, 1, 2, 3}, so each lane's
B fragments for the chunk's two MMAs are ONE 16-byte load of W row g (a warp reads 8 rows x 64
contiguous bytes) and its A fragments one 16-byte load of x column g at the same k (lanes g >= B
read column B-1 again: A row g only reaches C row g, which is never stored; the A rows g+8 are the
constant zero registers).

Schedule: a CTA owns `row_blocks` (R) blocks of 8 rows; its `warps` warps take the 32-wide K chunks
in turn (warp w: chunks w, w + warps, ...; at any moment the CTA reads warps x 64 contiguous bytes of
each row), `unroll` chunks loaded before their MMAs. One x load serves R row blocks. The warps' fp32
partials meet in shared memory and are summed in warp order (deterministic), y rounded once.
Needs K a multiple of 8 and 16-byte aligned rows (the op runs the FMA kernel otherwise).

Two generalizations serve the W4A16 GEMM (`cute_kernels.w4a16`):
- up to 16 columns: A rows g + 8 are then x columns g + 8 (loaded like rows g) and C values 2, 3 are y columns
  g + 8;
- INT4 weights (`int4`): a lane's share of a chunk (its *unit*) is one 16-byte vector of packed int4, 32 k, so a
  chunk is 128 k and 8 MMAs; the lane's x unit is the 4 vectors at the same k. MMA t takes the unit's values
  4t .. 4t+3 as before, so its B fragment is pairs 2 (t % 2) and 2 (t % 2) + 1 of packed word t // 2, dequantized
  in registers (`collectives.int4`) with the group's scale and zero point (one group per unit: groups of 32 or
  more). K must be a multiple of 32; a partial last chunk zeroes the x of lanes past K.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int64
from cutlass.cute.nvgpu import warp as warp_mma

from collectives import pdl
from collectives.int4 import dequant_pair, magic_of, pair_of
from collectives.vector_io import as_vectors, extent

CHUNK = 32  # k per chunk: two MMAs of k = 16
VEC = 8  # 16-byte vectors of bf16 / fp16


def chunk_slot(lane: int, t: int, e: int) -> tuple[int, int]:
    """Value e (0-3) of `lane`'s B fragment in MMA t of a chunk: (the MMA's k slot, 0-15, from the
    m16n8k16 fragment layout; the memory k inside the 32-wide chunk, from the permutation above). The same
    pair holds for the A fragment's values 0, 1, 4, 5 (x). Host-side (figures, tests)."""
    c = lane % 4
    return 2 * c + e % 2 + 8 * (e // 2), 8 * c + 4 * t + e


class GemvMma:
    """y[n, b] = sum_k W[n, k] * xt[b, k] for W (N, K), xt (B, K), y (N, B); B = `cols` in 1..16. With `int4`, W is
    packed int4 (N, K / 8) int32 with scales (N, K / group) (group 0: per channel, (N, 1)) and, with `zeros`, zero
    points of that shape (integer values in the scales' dtype)."""

    def __init__(self, dtype, cols: int, index64: bool, warps: int = 4, row_blocks: int = 1, unroll: int = 2,
                 int4: bool = False, group: int = 0, zeros: bool = False):
        if not 1 <= cols <= 16:
            raise ValueError(f"cols must be in [1, 16], got {cols}")
        if dtype.width != 16:
            raise ValueError(f"the tensor-core GEMV is for bf16 / fp16, got {dtype}")
        if int4 and group % 32:
            raise ValueError(f"int4 groups must be a multiple of 32 columns, got {group}")
        self.dtype, self.cols, self.index64 = dtype, cols, index64
        self.warps, self.row_blocks, self.unroll = warps, row_blocks, unroll
        self.int4, self.group, self.zeros = int4, group, zeros
        self.unit = 32 if int4 else VEC  # k of one lane's share of a chunk
        self.mmas = self.unit // 4  # MMAs of a chunk
        self.wide = cols > 8  # A rows g + 8 carry x columns 8..15

    @cute.jit
    def __call__(self, w: cute.Tensor, xt: cute.Tensor, y: cute.Tensor, scales: cute.Tensor, zeros: cute.Tensor,
                 stream):
        """`scales`, `zeros`: (N, K / group) with `int4` (zeros read only with `zeros`); else any tensors, unread."""
        rows_per_cta = 8 * self.row_blocks
        ctas = (extent(w, 0) + rows_per_cta - 1) // rows_per_cta
        self.kernel(w, xt, y, scales, zeros).launch(grid=[ctas, 1, 1], block=[32 * self.warps, 1, 1], stream=stream,
                                                    use_pdl=pdl.LAUNCH)

    @cute.kernel
    def kernel(self, w: cute.Tensor, xt: cute.Tensor, y: cute.Tensor, scales: cute.Tensor, zeros: cute.Tensor):
        pdl.enter()  # (launched as a programmatic dependent: collectives.pdl)
        R, B, U, W_ = self.row_blocks, self.cols, self.unroll, self.warps
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        wid = cute.arch.make_warp_uniform(tidx // 32)
        lane = tidx % 32
        g = lane // 4
        c = lane % 4
        rows = extent(w, 0)
        k = extent(xt, 1)
        units = k // self.unit  # lane units of a row
        full = units // 4  # chunks whose 4 units are all inside the row

        op = warp_mma.MmaF16BF16Op(self.dtype, Float32, (16, 8, 16))
        atom = cute.make_mma_atom(op)
        tiled = cute.make_tiled_mma(op)
        a_shape = tiled.get_slice(0).partition_A(cute.make_identity_tensor((16, 16))).shape
        b_shape = tiled.get_slice(0).partition_B(cute.make_identity_tensor((8, 16))).shape
        c_shape = tiled.get_slice(0).partition_C(cute.make_identity_tensor((16, 8))).shape

        base = Int64(bidx) * (8 * R) if cutlass.const_expr(self.index64) else bidx * (8 * R)
        wrow = [cutlass.min(base + 8 * q + g, rows - 1) for q in range(R)]
        if cutlass.const_expr(self.int4):
            wvs = [as_vectors(w[r, None], extent(w, 1), 4) for r in wrow]  # 4 packed words = 32 k a vector
        else:
            wvs = [as_vectors(w[r, None], k, VEC) for r in wrow]
        # lanes g >= B read a copy of the last column; their C rows drop
        xvs = [as_vectors(xt[cutlass.min(g, B - 1), None], k, VEC)]
        if cutlass.const_expr(self.wide):
            xvs.append(as_vectors(xt[cutlass.min(g + 8, B - 1), None], k, VEC))

        accs = [tiled.make_fragment_C(c_shape) for _ in range(R)]
        for q in cutlass.range_constexpr(R):
            accs[q].fill(0.0)
        fa = tiled.make_fragment_A(a_shape)
        fb = tiled.make_fragment_B(b_shape)

        # full chunks of this warp: wid, wid + W_, ...; `U` at a time loaded before their MMAs
        mine = (full - wid + W_ - 1) // W_
        for i in cutlass.range(mine // U, unroll=1):
            js = [(wid + (i * U + u) * W_) * 4 + c for u in range(U)]
            xs = [self._load_x(xvs, j) for j in js]
            ws = [self._load_w(wvs, j) for j in js]
            sz = [self._load_groups(scales, zeros, wrow, j) for j in js]
            for u in cutlass.range_constexpr(U):
                self._mma_chunk(atom, accs, fa, fb, xs[u], ws[u], sz[u])
        for i in cutlass.range(mine - mine % U, mine, unroll=1):
            j = (wid + i * W_) * 4 + c
            self._mma_chunk(atom, accs, fa, fb, self._load_x(xvs, j), self._load_w(wvs, j),
                            self._load_groups(scales, zeros, wrow, j))
        # the partial last chunk: its warp; units past the row as zeros
        if full * 4 < units and wid == full % W_:
            j = full * 4 + c
            nx = self.unit // VEC
            xr = [cute.make_rmem_tensor((nx, VEC), self.dtype) for _ in xvs]
            for x_ in xr:
                x_.fill(0.0)
            wt = cutlass.Int32 if cutlass.const_expr(self.int4) else self.dtype
            wrs = [cute.make_rmem_tensor((4 if cutlass.const_expr(self.int4) else VEC,), wt) for _ in range(R)]
            for q in cutlass.range_constexpr(R):
                wrs[q].fill(0)
            if j < units:
                for h in cutlass.range_constexpr(len(xvs)):
                    for v in cutlass.range_constexpr(nx):
                        xr[h][v, None].store(xvs[h][None, j * nx + v].load())
                for q in cutlass.range_constexpr(R):
                    wrs[q].store(wvs[q][None, j].load())
            jj = cutlass.min(j, units - 1)
            self._mma_chunk(atom, accs, fa, fb, [[x_[v, None].load() for v in range(nx)] for x_ in xr],
                            [wr.load() for wr in wrs], self._load_groups(scales, zeros, wrow, jj))

        # warps' partials (C values 0, 1: y rows 2c, 2c+1 of each block, column g; 2, 3: column g + 8) summed in
        # warp order
        nval = 4 if cutlass.const_expr(self.wide) else 2
        smem = cutlass.memory.SmemAllocator()
        red = smem.allocate_tensor(Float32, cute.make_layout((nval, 32, R, W_)), byte_alignment=16)
        for q in cutlass.range_constexpr(R):
            for e in cutlass.range_constexpr(nval):
                red[e, lane, q, wid] = accs[q][e]
        cute.arch.barrier()
        for s in cutlass.range_constexpr(-(-nval * 32 * R // (32 * W_))):
            i = tidx + s * 32 * W_
            if i < nval * 32 * R:
                e = i % nval
                ln = (i // nval) % 32
                q = i // (32 * nval)
                total = red[e, ln, q, 0]
                for v in cutlass.range_constexpr(1, W_):
                    total = total + red[e, ln, q, v]
                row = base + 8 * q + 2 * (ln % 4) + e % 2
                col = ln // 4 + 8 * (e // 2)
                if row < rows and col < B:
                    y[row, col] = total.to(self.dtype)

    # --- pieces (trace-time helpers: every value they use is an argument) ---------------------------
    def _load_x(self, xvs, j):
        """Unit j of x: for each A row half (g, and g + 8 when wide), its unit / 8 vectors."""
        nx = self.unit // VEC
        return [[xv[None, j * nx + v].load() for v in range(nx)] for xv in xvs]

    def _load_w(self, wvs, j):
        return [wv[None, j].load() for wv in wvs]

    def _load_groups(self, scales, zeros, wrow, j):
        """int4: per row block, (-(M + z) twice, s twice) of unit j's group (one group per unit); else None."""
        if not self.int4:
            return None
        _, magic = magic_of(self.dtype)
        gi = 0 if self.group == 0 else j * self.unit // self.group  # group 0: per channel
        out = []
        for r in wrow:
            s = scales[r, gi]
            if self.zeros:
                off = -(zeros[r, gi].to(Float32) + magic)
            else:
                off = Float32(-(8.0 + magic))
            out.append((pair_of(self.dtype(off), self.dtype), pair_of(s, self.dtype)))
        return out

    def _mma_chunk(self, atom, accs, fa, fb, xu, wrs, groups):
        """A chunk's MMAs per row block from its loaded units (register moves, and the int4 dequantization): MMA t
        takes values 4t..4t+3 of the lane's unit (the K permutation above)."""
        zero = self.dtype(0.0)

        def xval(h, e):  # value e of the unit of A row half h
            return xu[h][e // VEC][e % VEC] if h < len(xu) else zero

        for t in range(self.mmas):
            fa[0] = xval(0, 4 * t + 0)
            fa[1] = xval(0, 4 * t + 1)
            fa[2] = xval(1, 4 * t + 0)
            fa[3] = xval(1, 4 * t + 1)
            fa[4] = xval(0, 4 * t + 2)
            fa[5] = xval(0, 4 * t + 3)
            fa[6] = xval(1, 4 * t + 2)
            fa[7] = xval(1, 4 * t + 3)
            for q in range(len(wrs)):
                if self.int4:
                    words = cute.recast_tensor(fb, cutlass.Int32)
                    neg_off, s2 = groups[q]
                    word = wrs[q][t // 2]
                    words[0] = dequant_pair(word, 2 * (t % 2), neg_off, s2, self.dtype)
                    words[1] = dequant_pair(word, 2 * (t % 2) + 1, neg_off, s2, self.dtype)
                else:
                    for e in range(4):
                        fb[e] = wrs[q][4 * t + e]
                cute.gemm(atom, accs[q], fa, fb, accs[q])
