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
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int64
from cutlass.cute.nvgpu import warp as warp_mma

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
    """y[n, b] = sum_k W[n, k] * xt[b, k] for W (N, K), xt (B, K), y (N, B); B = `cols` in 1..8."""

    def __init__(self, dtype, cols: int, index64: bool, warps: int = 4, row_blocks: int = 1, unroll: int = 2):
        if not 1 <= cols <= 8:
            raise ValueError(f"cols must be in [1, 8], got {cols}")
        if dtype.width != 16:
            raise ValueError(f"the tensor-core GEMV is for bf16 / fp16, got {dtype}")
        self.dtype, self.cols, self.index64 = dtype, cols, index64
        self.warps, self.row_blocks, self.unroll = warps, row_blocks, unroll

    @cute.jit
    def __call__(self, w: cute.Tensor, xt: cute.Tensor, y: cute.Tensor, stream):
        rows_per_cta = 8 * self.row_blocks
        ctas = (extent(w, 0) + rows_per_cta - 1) // rows_per_cta
        self.kernel(w, xt, y).launch(grid=[ctas, 1, 1], block=[32 * self.warps, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, w: cute.Tensor, xt: cute.Tensor, y: cute.Tensor):
        R, B, U, W_ = self.row_blocks, self.cols, self.unroll, self.warps
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        wid = cute.arch.make_warp_uniform(tidx // 32)
        lane = tidx % 32
        g = lane // 4
        c = lane % 4
        rows, k = extent(w, 0), extent(w, 1)
        nv = k // VEC  # 16-byte vectors of a row
        full = nv // 4  # chunks whose 4 vectors are all inside the row

        op = warp_mma.MmaF16BF16Op(self.dtype, Float32, (16, 8, 16))
        atom = cute.make_mma_atom(op)
        tiled = cute.make_tiled_mma(op)
        a_shape = tiled.get_slice(0).partition_A(cute.make_identity_tensor((16, 16))).shape
        b_shape = tiled.get_slice(0).partition_B(cute.make_identity_tensor((8, 16))).shape
        c_shape = tiled.get_slice(0).partition_C(cute.make_identity_tensor((16, 8))).shape

        base = Int64(bidx) * (8 * R) if cutlass.const_expr(self.index64) else bidx * (8 * R)
        wvs = [as_vectors(w[cutlass.min(base + 8 * q + g, rows - 1), None], k, VEC) for q in range(R)]
        xv = as_vectors(xt[cutlass.min(g, B - 1), None], k, VEC)  # lanes g >= B: a copy; their C rows drop

        accs = [tiled.make_fragment_C(c_shape) for _ in range(R)]
        for q in cutlass.range_constexpr(R):
            accs[q].fill(0.0)
        fa = tiled.make_fragment_A(a_shape)
        fb = tiled.make_fragment_B(b_shape)

        # full chunks of this warp: wid, wid + W_, ...; `U` at a time loaded before their MMAs
        mine = (full - wid + W_ - 1) // W_
        for i in cutlass.range(mine // U, unroll=1):
            xs = [xv[None, (wid + (i * U + u) * W_) * 4 + c].load() for u in range(U)]
            ws = [self._load_w(wvs, (wid + (i * U + u) * W_) * 4 + c) for u in range(U)]
            for u in cutlass.range_constexpr(U):
                self._mma_chunk(atom, accs, fa, fb, xs[u], ws[u])
        for i in cutlass.range(mine - mine % U, mine, unroll=1):
            j = (wid + i * W_) * 4 + c
            self._mma_chunk(atom, accs, fa, fb, xv[None, j].load(), self._load_w(wvs, j))
        # the partial last chunk (K % 32 = 8, 16 or 24): its warp, vectors past the row as zeros
        if full * 4 < nv and wid == full % W_:
            xr = cute.make_rmem_tensor((VEC,), self.dtype)
            xr.fill(0.0)
            wrs = [cute.make_rmem_tensor((VEC,), self.dtype) for _ in range(R)]
            for q in cutlass.range_constexpr(R):
                wrs[q].fill(0.0)
            if full * 4 + c < nv:
                xr.store(xv[None, full * 4 + c].load())
                for q in cutlass.range_constexpr(R):
                    wrs[q].store(wvs[q][None, full * 4 + c].load())
            self._mma_chunk(atom, accs, fa, fb, xr, [wr.load() for wr in wrs])

        # warps' partials (C values 0, 1: y rows 2c, 2c+1 of each block, column g) summed in warp order
        smem = cutlass.memory.SmemAllocator()
        red = smem.allocate_tensor(Float32, cute.make_layout((2, 32, R, W_)), byte_alignment=16)
        for q in cutlass.range_constexpr(R):
            red[0, lane, q, wid] = accs[q][0]
            red[1, lane, q, wid] = accs[q][1]
        cute.arch.barrier()
        for s in cutlass.range_constexpr(-(-2 * 32 * R // (32 * W_))):
            i = tidx + s * 32 * W_
            if i < 2 * 32 * R:
                e = i % 2
                ln = (i // 2) % 32
                q = i // 64
                total = red[e, ln, q, 0]
                for v in cutlass.range_constexpr(1, W_):
                    total = total + red[e, ln, q, v]
                row = base + 8 * q + 2 * (ln % 4) + e
                col = ln // 4
                if row < rows and col < B:
                    y[row, col] = total.to(self.dtype)

    # --- pieces (trace-time helpers: every value they use is an argument) ---------------------------
    def _load_w(self, wvs, j):
        return [wv[None, j].load() for wv in wvs]

    def _mma_chunk(self, atom, accs, fa, fb, xr, wrs):
        """A chunk's two MMAs per row block from its loaded vectors (register moves only): MMA t takes
        elements 4t..4t+3 of each vector (the K permutation above)."""
        for t in range(2):
            fa[0] = xr[4 * t + 0]
            fa[1] = xr[4 * t + 1]
            fa[2] = self.dtype(0.0)
            fa[3] = self.dtype(0.0)
            fa[4] = xr[4 * t + 2]
            fa[5] = xr[4 * t + 3]
            fa[6] = self.dtype(0.0)
            fa[7] = self.dtype(0.0)
            for q in range(len(wrs)):
                for e in range(4):
                    fb[e] = wrs[q][4 * t + e]
                cute.gemm(atom, accs[q], fa, fb, accs[q])
