"""The SIMT rungs of the GEMM ladder (lesson 10): shared-memory tiling, then register tiling, on the
CUDA cores (fp32 FMA), before the WGMMA kernel in `gemm.py` takes the tensor cores.

Roofline: the same 2 M N K FLOPs as the WGMMA GEMM, but the ceiling is the fp32 FMA rate of the CUDA
cores, ~67 TFLOP/s on an H200 (132 SMs x 128 lanes x 2 FLOPs x ~1.98 GHz), 15x below the tensor
cores. What separates the two rungs is shared-memory traffic per FMA:

* `thr_m = thr_n = 1` (the "smem-tiled" rung): each thread owns one output; per K step it reads one
  A and one B value from shared memory for one FMA: two smem loads per FMA caps it far below the FMA
  rate (shared memory serves 32 words per cycle per SM, the FMA units 128 lanes).
* `thr_m = thr_n = 8` (the "register-tiled" rung): each thread owns an 8x8 block of outputs; per K
  step it reads 8 A and 8 B values and does 64 FMAs (an outer product): 4 FMAs per smem word.

Schedule: one CTA per (tile_m, tile_n) output tile, K walked in tile_k slices: every thread copies
its share of the A and B slices to shared memory (fp32, A stored transposed, rows padded by a word,
so the compute loop reads rows of both), barrier, the outer-product loop, barrier. Thread (tx, ty) owns rows ty + i*TY and
columns tx + j*TX (strided, so a warp's B reads are consecutive words: no bank conflicts).
Operands: A (M, K) and B (K, N) row-major, C (M, N) row-major; sizes symbolic, edges predicated.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from collectives.vector_io import extent


@dataclass(frozen=True)
class SimtTiling:
    tile_m: int = 128
    tile_n: int = 128
    tile_k: int = 8
    thr_m: int = 8
    thr_n: int = 8

    def __post_init__(self):
        if self.tile_m % self.thr_m or self.tile_n % self.thr_n:
            raise ValueError("thr_m/thr_n must divide tile_m/tile_n")
        if not 32 <= self.threads <= 1024 or self.threads % 32:
            raise ValueError(f"{self} gives {self.threads} threads; need a multiple of 32 in [32, 1024]")

    @property
    def tx(self) -> int:
        return self.tile_n // self.thr_n

    @property
    def ty(self) -> int:
        return self.tile_m // self.thr_m

    @property
    def threads(self) -> int:
        return self.tx * self.ty

    def __str__(self) -> str:
        return f"{self.tile_m}x{self.tile_n}x{self.tile_k}_r{self.thr_m}x{self.thr_n}"


SMEM_TILED = SimtTiling(tile_m=32, tile_n=32, tile_k=32, thr_m=1, thr_n=1)
REGISTER_TILED = SimtTiling()


class SimtGemm:
    def __init__(self, dtype, out_dtype, tiling: SimtTiling):
        self.dtype, self.out_dtype, self.t = dtype, out_dtype, tiling

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, stream):
        t = self.t
        m, n = extent(c, 0), extent(c, 1)
        self.kernel(a, b, c).launch(grid=[(n + t.tile_n - 1) // t.tile_n, (m + t.tile_m - 1) // t.tile_m, 1],
                                    block=[t.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor):
        t = self.t
        tid, _, _ = cute.arch.thread_idx()
        bn, bm, _ = cute.arch.block_idx()
        m, n, k = extent(c, 0), extent(c, 1), extent(a, 1)
        m0, n0 = bm * t.tile_m, bn * t.tile_n

        smem = cutlass.memory.SmemAllocator()
        # A is stored transposed; its rows are padded by one word so that the copy's column writes
        # (consecutive k of one row of A) land in different banks.
        sA = smem.allocate_tensor(Float32, cute.make_layout((t.tile_k, t.tile_m), stride=(t.tile_m + 1, 1)), 16)
        sB = smem.allocate_tensor(Float32, cute.make_layout((t.tile_k, t.tile_n), stride=(t.tile_n, 1)), 16)
        acc = cute.make_rmem_tensor((t.thr_m, t.thr_n), Float32)
        acc.fill(0.0)
        a_frag = cute.make_rmem_tensor((t.thr_m,), Float32)
        b_frag = cute.make_rmem_tensor((t.thr_n,), Float32)
        tx, ty = tid % t.tx, tid // t.tx

        a_loads = -(-(t.tile_m * t.tile_k) // t.threads)
        b_loads = -(-(t.tile_k * t.tile_n) // t.threads)
        for kt in cutlass.range((k + t.tile_k - 1) // t.tile_k, unroll=1):
            k0 = kt * t.tile_k
            # A slice (tile_m, tile_k): consecutive threads read consecutive k (coalesced), stored
            # transposed as (tile_k, tile_m).
            for r in cutlass.range_constexpr(a_loads):
                e = tid + r * t.threads
                if e < t.tile_m * t.tile_k:
                    row, col = e // t.tile_k, e % t.tile_k
                    v = Float32(0.0)
                    if m0 + row < m and k0 + col < k:
                        v = a[m0 + row, k0 + col].to(Float32)
                    sA[col, row] = v
            for r in cutlass.range_constexpr(b_loads):
                e = tid + r * t.threads
                if e < t.tile_k * t.tile_n:
                    row, col = e // t.tile_n, e % t.tile_n
                    v = Float32(0.0)
                    if k0 + row < k and n0 + col < n:
                        v = b[k0 + row, n0 + col].to(Float32)
                    sB[row, col] = v
            cute.arch.barrier()
            for kk in cutlass.range_constexpr(t.tile_k):
                for i in cutlass.range_constexpr(t.thr_m):
                    a_frag[i] = sA[kk, ty + i * t.ty]
                for j in cutlass.range_constexpr(t.thr_n):
                    b_frag[j] = sB[kk, tx + j * t.tx]
                for i in cutlass.range_constexpr(t.thr_m):
                    for j in cutlass.range_constexpr(t.thr_n):
                        acc[i, j] = acc[i, j] + a_frag[i] * b_frag[j]
            cute.arch.barrier()

        for i in cutlass.range_constexpr(t.thr_m):
            for j in cutlass.range_constexpr(t.thr_n):
                gm, gn = m0 + ty + i * t.ty, n0 + tx + j * t.tx
                if gm < m and gn < n:
                    c[gm, gn] = acc[i, j].to(self.out_dtype)
