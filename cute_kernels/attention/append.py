"""Append new tokens' K / V rows to a KV cache, optionally rotating q and k first (the fused decode RoPE + append).

A CTA per new token (b, s) and group of `threads / tpr` rows. A token's rows are its q heads (only with RoPE:
rotated into q_out), then its k heads, then its v heads, each row of D elements cut into D / vec vectors, one
thread a vector (`tpr` = D / vec threads a row, consecutive lanes of one warp). At decode sizes the time is a
chain of dependent loads (cache_seqlens, then the block table and the angle rows), so each thread issues its
row's loads before that chain and a token's rows are spread over several CTAs instead of looped over. The token goes to
cache position cache_seqlens[b] + s (`collectives.kv_append.cache_slot`); its RoPE angle is at that position too,
or at positions[b, s] when given. RoPE (`collectives.rotary`): a NeoX thread loads its own vector and its partner
in the other half; a GPT-J thread rotates the pairs inside its vector; columns past the rotary dims pass through.
An FP8 cache with per-token scales reduces each row's amax over its lanes before storing
(`collectives.kv_append`).

Tensors as the kernel sees them (any strides, unit-stride D): q, q_out (B, S, H_q, D) (H_q = 0 without RoPE),
k, v (B, S, H_kv, D), caches (pages, page rows, H_kv, D), scales (pages, page rows, H_kv) (per head: zero page
and row strides), cache_seqlens (B,), block_table (B, max_pages), cos / sin (max_pos, r / 2), positions (B, S).
Nothing outside the appended rows (and their scales) is written.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from collectives import pdl
from collectives.kv_append import cache_slot, row_amax, store_row_vector, token_scale
from collectives.rotary import rotate_pairs
from collectives.vector_io import row_vectors


class KVAppend:
    def __init__(self, dtype, head_dim: int, vec: int, paged: bool, kv_scale: str, rope: str, rotary_dim: int,
                 positions: str, threads: int):
        from cute_kernels.attention import append_vec_error

        err = append_vec_error(vec, head_dim, rope, rotary_dim)
        if err:
            raise ValueError(f"kv_append: {err}")
        tpr = head_dim // vec
        if threads % 32:
            raise ValueError(f"kv_append: threads must be a multiple of 32, got {threads}")
        self.dtype, self.d, self.vec, self.tpr = dtype, head_dim, vec, tpr
        self.paged, self.kv_scale, self.rope, self.r = paged, kv_scale, rope, rotary_dim
        self.positions, self.threads = positions, threads
        self.rows_per_pass = threads // tpr
        self.half_cols = rotary_dim // 2 // vec  # NeoX: vectors in each half
        self.rot_cols = rotary_dim // vec  # vectors inside the rotary dims
        self.angles = vec // 2 if rope == "gptj" else vec

    @cute.jit
    def __call__(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, q_out: cute.Tensor, k_cache: cute.Tensor,
                 v_cache: cute.Tensor, k_scale: cute.Tensor, v_scale: cute.Tensor, seqlens: cute.Tensor,
                 table: cute.Tensor, cos: cute.Tensor, sin: cute.Tensor, pos: cute.Tensor, stream):
        tokens = cute.size(k, mode=[0]) * cute.size(k, mode=[1])
        hq = cute.size(q, mode=[2]) if cutlass.const_expr(self.rope != "none") else 0
        rows = hq + 2 * cute.size(k, mode=[2])
        passes = (rows + self.rows_per_pass - 1) // self.rows_per_pass
        self.kernel(q, k, v, q_out, k_cache, v_cache, k_scale, v_scale, seqlens, table, cos, sin, pos).launch(
            grid=[cutlass.max(tokens, 1), cutlass.max(passes, 1), 1], block=[self.threads, 1, 1], stream=stream,
            use_pdl=pdl.LAUNCH)

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mQo: cute.Tensor, mKc: cute.Tensor,
               mVc: cute.Tensor, mKs: cute.Tensor, mVs: cute.Tensor, mLens: cute.Tensor, mTable: cute.Tensor,
               mCos: cute.Tensor, mSin: cute.Tensor, mPos: cute.Tensor):
        pdl.enter()  # (launched as a programmatic dependent: collectives.pdl)
        tidx, _, _ = cute.arch.thread_idx()
        tok, part, _ = cute.arch.block_idx()
        seq = cute.size(mK, mode=[1])
        b = tok // seq
        s = tok - b * seq
        hq = cute.size(mQ, mode=[2]) if cutlass.const_expr(self.rope != "none") else 0
        hk = cute.size(mK, mode=[2])
        rows = hq + 2 * hk
        vec, tpr = self.vec, self.tpr
        col = tidx % tpr
        row = part * self.rows_per_pass + tidx // tpr
        valid = row < rows
        r = cutlass.min(row, rows - 1)
        other = col + self.half_cols
        if col >= self.half_cols:
            other = col - self.half_cols
        # the row's vectors first: they depend on nothing loaded, so their latency overlaps the chain
        # cache_seqlens -> (block table, angle rows) below
        own = cute.make_rmem_tensor((vec,), self.dtype)
        partner = cute.make_rmem_tensor((vec,), self.dtype)
        if r < hq:
            xv = row_vectors(mQ[b, s, r, None], vec)
            own.store(xv[None, col].load())
            if cutlass.const_expr(self.rope == "neox"):
                partner.store(xv[None, other].load())
        elif r < hq + hk:
            xv = row_vectors(mK[b, s, r - hq, None], vec)
            own.store(xv[None, col].load())
            if cutlass.const_expr(self.rope == "neox"):
                partner.store(xv[None, other].load())
        else:
            own.store(row_vectors(mV[b, s, r - hq - hk, None], vec)[None, col].load())
        at = mLens[b] + s  # the token's cache position
        page, prow = cache_slot(mTable, b, at, cute.size(mKc, mode=[1]), self.paged)
        res = cute.make_rmem_tensor((vec,), Float32)
        res.store(own.load().to(Float32))
        if cutlass.const_expr(self.rope != "none"):
            p = at
            if cutlass.const_expr(self.positions != "none"):
                p = Int32(mPos[b, s])
            p = cutlass.max(cutlass.min(p, cute.size(mCos, mode=[0]) - 1), 0)
            a = col if cutlass.const_expr(self.rope == "gptj") else col % cutlass.max(self.half_cols, 1)
            a = cutlass.min(a, self.r // 2 // self.angles - 1)
            cs = row_vectors(mCos[p, None], self.angles)[None, a].load()
            sn = row_vectors(mSin[p, None], self.angles)[None, a].load()
            if (col < self.rot_cols) & (r < hq + hk):
                if cutlass.const_expr(self.rope == "gptj"):
                    res.store(rotate_pairs(own.load(), cs, sn))
                else:
                    x = own.load().to(Float32)
                    y = partner.load().to(Float32)
                    if col < self.half_cols:
                        res.store(x * cs - y * sn)
                    else:
                        res.store(x * cs + y * sn)
        scale = Float32(1.0)
        if cutlass.const_expr(self.kv_scale == "token"):
            scale = token_scale(row_amax(res.load(), tpr))  # every lane: the shuffles are warp-wide
        if valid:
            if r < hq:
                row_vectors(mQo[b, s, r, None], vec)[None, col].store(res.load().to(self.dtype))
            elif r < hq + hk:
                self.store(mKc, mKs, page, prow, r - hq, col, res, scale)
            else:
                self.store(mVc, mVs, page, prow, r - hq - hk, col, res, scale)

    @cute.jit
    def store(self, mC: cute.Tensor, mS: cute.Tensor, page, prow, h, col, res: cute.Tensor, scale: Float32):
        sc = scale
        if cutlass.const_expr(self.kv_scale == "head"):
            sc = mS[page, prow, h]
        store_row_vector(row_vectors(mC[page, prow, h, None], self.vec)[None, col], res.load(), sc, self.kv_scale)
        if cutlass.const_expr(self.kv_scale == "token"):
            if col == 0:
                mS[page, prow, h] = scale
