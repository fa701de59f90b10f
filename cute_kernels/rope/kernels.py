"""Rotary position embedding (RoPE) of q and k, one pass over each (curriculum: the inference layer).

For a head row x of D elements at position p and rotary dims r <= D, angle index i < r / 2 has the angle table
entries c = cos[p, i], s = sin[p, i] (fp32, (max_pos, r / 2)). The rotation pairs
- NeoX style (`interleaved=False`): x[i] with x[i + r / 2];
- GPT-J style (`interleaved=True`): x[2 i] with x[2 i + 1];
and writes (a, b) -> (a c - b s, b c + a s) in fp32 (`collectives.rotary`), rounded once to x's dtype; dims past r pass through (copied by
the out-of-place kernel, untouched in place). `inverse` rotates by -angle (s -> -s): the backward, since the
rotation is orthogonal.

Roofline: 4 bytes an element for bf16 (read and write), plus the angle rows (r / 2 x 8 bytes a token, read once
from DRAM and then from L1 / L2 by every head of the token): a memory-bound map. The work items are vectors of
`vec` elements: a NeoX item is one vector of each half (vec pairs), a GPT-J item one vector (vec / 2 pairs), a
pass-through item one vector copied. Items are numbered with the vector fastest, then the head, then the token
(consecutive threads touch consecutive memory of a (B, S, H, D) tensor) and walked grid-stride
(`schedules.grid_stride`, `schedules.walks.strided_fold`: `unroll` items' loads in flight before the first use).
The grid is split between q and k in proportion to their items: one launch for both, each CTA on one tensor.

Tensors as the kernel sees them: q, q_out (B, S, H_q, D), k, k_out (B, S, H_k, D) with a unit-stride D and any
other strides (a varlen (T, H, D) tensor is B = 1); cos, sin (max_pos, r / 2), unit-stride columns; positions
(B, S) int32 / int64 (absent: p = s). A position outside [0, max_pos) is clamped (no out-of-bounds read; the op
checks with `validate=True`).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from collectives import pdl
from collectives.rotary import rotate_halves, rotate_pairs
from collectives.vector_io import row_vectors
from schedules.grid_stride import GridStride
from schedules.walks import strided_fold


class RotaryEmbedding:
    def __init__(self, dtype, head_dim: int, rotary_dim: int, interleaved: bool, vec: int, positions: str,
                 inverse: bool, inplace: bool, index64: bool, schedule: GridStride):
        from cute_kernels.rope import rotary_vec_error

        err = rotary_vec_error(vec, head_dim, rotary_dim, interleaved)
        if err:
            raise ValueError(f"rope: {err}")
        half = rotary_dim // 2
        self.dtype, self.d, self.r, self.half = dtype, head_dim, rotary_dim, half
        self.interleaved, self.vec, self.positions = interleaved, vec, positions
        self.inverse, self.inplace, self.index64, self.s = inverse, inplace, index64, schedule
        # items of one head row: rotated vectors, and the pass-through vectors the out-of-place kernel copies
        self.rot_items = (rotary_dim if interleaved else half) // vec
        self.copy_items = 0 if inplace else (head_dim - rotary_dim) // vec
        # angle entries one item uses: vec (NeoX) or vec / 2 (GPT-J)
        self.angles = vec // 2 if interleaved else vec

    @cute.jit
    def __call__(self, q: cute.Tensor, k: cute.Tensor, q_out: cute.Tensor, k_out: cute.Tensor, cos: cute.Tensor,
                 sin: cute.Tensor, pos: cute.Tensor, max_ctas_q: Int32, max_ctas_k: Int32, stream):
        """The grid: each tensor's one-pass CTA count, capped at its share of the schedule's cap (`max_ctas_*`,
        from the host)."""
        rows_q = cute.size(q, mode=[0]) * cute.size(q, mode=[1]) * cute.size(q, mode=[2])
        rows_k = cute.size(k, mode=[0]) * cute.size(k, mode=[1]) * cute.size(k, mode=[2])
        per = self.s.items_per_cta_pass()
        ctas_q = cutlass.min((rows_q * self.rot_items + per - 1) // per, max_ctas_q)
        ctas_k = cutlass.min((rows_k * self.rot_items + per - 1) // per, max_ctas_k)
        grid = [cutlass.max(Int32(ctas_q + ctas_k), 1), 1, 1]
        self.kernel(q, k, q_out, k_out, cos, sin, pos, Int32(ctas_q), Int32(ctas_k)).launch(
            grid=grid, block=[self.s.threads, 1, 1], stream=stream, use_pdl=pdl.LAUNCH)

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mQo: cute.Tensor, mKo: cute.Tensor, mCos: cute.Tensor,
               mSin: cute.Tensor, mPos: cute.Tensor, ctas_q: Int32, ctas_k: Int32):
        pdl.enter()  # (launched as a programmatic dependent: collectives.pdl)
        bidx, _, _ = cute.arch.block_idx()
        if bidx < ctas_q:
            self.walk(mQ, mQo, mCos, mSin, mPos, bidx, ctas_q)
        elif bidx < ctas_q + ctas_k:
            self.walk(mK, mKo, mCos, mSin, mPos, bidx - ctas_q, ctas_k)

    @cute.jit
    def walk(self, mX: cute.Tensor, mO: cute.Tensor, mCos: cute.Tensor, mSin: cute.Tensor, mPos: cute.Tensor,
             cta, ctas):
        """This CTA's share (`cta` of `ctas`) of one tensor's items: the rotated ones, then the pass-through ones."""
        tidx, _, _ = cute.arch.thread_idx()
        idx = Int64 if cutlass.const_expr(self.index64) else Int32
        seq = cute.size(mX, mode=[1])
        heads = cute.size(mX, mode=[2])
        rows = cute.size(mX, mode=[0]) * seq * heads
        first, stride, pass_stride = self.s.thread_walk(idx(cta), idx(ctas), idx(tidx))
        vec, rot = self.vec, self.rot_items
        n_tab = cute.size(mCos, mode=[0])

        def coords(j, per_row):
            c = j % per_row
            row = j // per_row
            h = row % heads
            tok = row // heads
            b = tok // seq
            return b, tok - b * seq, h, c

        def position(b, s):
            p = Int32(s)
            if cutlass.const_expr(self.positions != "none"):
                p = Int32(mPos[b, s])
            return cutlass.max(cutlass.min(p, n_tab - 1), 0)

        def load(j):
            b, s, h, c = coords(j, rot)
            p = position(b, s)
            xv = row_vectors(mX[b, s, h, None], vec)
            cs = row_vectors(mCos[p, None], self.angles)[None, c].load()
            sn = row_vectors(mSin[p, None], self.angles)[None, c].load()
            if cutlass.const_expr(self.interleaved):
                x = xv[None, c].load()
                return (b, s, h, c, x, x, cs, sn)
            return (b, s, h, c, xv[None, c].load(), xv[None, c + self.half // vec].load(), cs, sn)

        def step(acc, j, vals):
            b, s, h, c, x1, x2, cs, sn = vals
            ov = row_vectors(mO[b, s, h, None], vec)
            if cutlass.const_expr(self.interleaved):
                ov[None, c].store(rotate_pairs(x1, cs, sn, self.inverse).to(self.dtype))
            else:
                o1, o2 = rotate_halves(x1, x2, cs, sn, self.inverse)
                ov[None, c].store(o1.to(self.dtype))
                ov[None, c + self.half // vec].store(o2.to(self.dtype))
            return acc

        strided_fold(rows * rot, first, stride, pass_stride, self.s.unroll, load, step, Int32(0))

        if cutlass.const_expr(self.copy_items > 0):
            cp = self.copy_items
            base = self.r // vec

            def load_copy(j):
                b, s, h, c = coords(j, cp)
                return (b, s, h, c, row_vectors(mX[b, s, h, None], vec)[None, base + c].load())

            def step_copy(acc, j, vals):
                b, s, h, c, x = vals
                row_vectors(mO[b, s, h, None], vec)[None, base + c].store(x)
                return acc

            strided_fold(rows * cp, first, stride, pass_stride, self.s.unroll, load_copy, step_copy, Int32(0))
