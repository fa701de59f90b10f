"""Sampler steps of flow matching and diffusion (curriculum lesson 15): the solver's update, the DDIM / DDPM step and
the sinusoidal time embedding.

Roofline: each step is a few fp32 operations per element against the tensors it moves, so memory-bound; a sampler
step on a robot's action chunk (50 x 32 values) moves kilobytes and is launch-bound instead, which is why the
sampler captures its whole loop in one CUDA graph (`cute_kernels.flow.sampler`).

- `FlowUpdate`: out = x + dt * sum_i c_i k_i over 1-4 terms, each k_i optionally a classifier-free-guidance pair
  combined first (k_i = u_i + s (c_i - u_i)); every stage point and final combination of a fixed-grid Runge-Kutta
  method is one such call. Bytes: (1 + terms (x2 with guidance) + 1) tensors.
- `DiffusionStep`: x_{t-1} from x_t, the network's output (epsilon, sample or v) and optionally the noise, with the
  scheduler's cumulative alphas read from device tensors (one per batch row, or one for all), so a captured graph
  replays with any timestep table. Bytes: 3-4 tensors.
- `TimestepEmbedding`: (B, dim) sin / cos features of B times; a thread per output element.

Schedule: the elementwise grid-stride map (`collectives.vector_map.map_vectors`) over 128-bit vectors of the widest
operand; all math in fp32, one rounding per output.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from collectives import pdl
from collectives.trig import sincos
from collectives.vector_io import extent
from collectives.vector_map import map_grid, map_vectors
from schedules.grid_stride import GridStride

MAX_TERMS = 4  # RK4's final combination; its stage points take 1-3
PREDICTIONS = ("epsilon", "sample", "v_prediction")
VARIANCE_FLOOR = 1e-20  # DDPM's posterior variance is clamped here before its square root (as diffusers)


class FlowUpdate:
    """out = x + dt * sum_{i < terms} c_i k_i on flat tensors of one length; with `cfg`, the inputs after x are
    (u_0, c_0, u_1, c_1, ...) and k_i = u_i + s (c_i - u_i). x and out share `x_dtype`; the k share `k_dtype`
    (a bf16 network's velocity updating an fp32 state). `__call__` always takes x, eight k tensors and out; the
    ones past the variant's count are ignored (pass x)."""

    def __init__(self, terms: int, cfg: bool, x_dtype, k_dtype, vec: int, index64: bool, schedule: GridStride):
        if not 1 <= terms <= MAX_TERMS:
            raise ValueError(f"terms must be in [1, {MAX_TERMS}], got {terms}")
        self.terms, self.cfg, self.x_dtype, self.k_dtype = terms, cfg, x_dtype, k_dtype
        self.vec, self.index64, self.schedule = vec, index64, schedule

    def inputs(self) -> int:
        return self.terms * (2 if self.cfg else 1)

    def _f(self, coefs, dt, s, xv, *kv):
        acc = None
        for i in range(self.terms):
            if cutlass.const_expr(self.cfg):
                u = kv[2 * i].to(Float32)
                k = u + s * (kv[2 * i + 1].to(Float32) - u)
            else:
                k = kv[i].to(Float32)
            term = coefs[i] * k
            acc = term if acc is None else acc + term
        return ((xv.to(Float32) + dt * acc).to(self.x_dtype),)

    @cute.jit
    def __call__(self, x: cute.Tensor, k0: cute.Tensor, k1: cute.Tensor, k2: cute.Tensor, k3: cute.Tensor,
                 k4: cute.Tensor, k5: cute.Tensor, k6: cute.Tensor, k7: cute.Tensor, out: cute.Tensor,
                 c0: Float32, c1: Float32, c2: Float32, c3: Float32, dt: Float32, scale: Float32, max_ctas: Int32,
                 stream):
        ctas, passes = map_grid(cute.size(out, mode=[0]) // self.vec, self.schedule, max_ctas, self.index64)
        self.kernel(x, k0, k1, k2, k3, k4, k5, k6, k7, out, c0, c1, c2, c3, dt, scale, passes).launch(
            grid=[ctas, 1, 1], block=[self.schedule.threads, 1, 1], stream=stream, use_pdl=pdl.LAUNCH)

    @cute.kernel
    def kernel(self, x: cute.Tensor, k0: cute.Tensor, k1: cute.Tensor, k2: cute.Tensor, k3: cute.Tensor,
               k4: cute.Tensor, k5: cute.Tensor, k6: cute.Tensor, k7: cute.Tensor, out: cute.Tensor,
               c0: Float32, c1: Float32, c2: Float32, c3: Float32, dt: Float32, scale: Float32, passes: Int32):
        ks = (k0, k1, k2, k3, k4, k5, k6, k7)[: self.inputs()]
        coefs = (c0, c1, c2, c3)

        def f(xv, *kv):
            return self._f(coefs, dt, scale, xv, *kv)

        map_vectors((x, *ks), (out,), f, self.vec, self.schedule, self.index64, full_passes=passes)


class DiffusionStep:
    """x_prev from x_t and the network's output m (and the noise, when `noisy`), on flat tensors of one length and
    dtype; `alpha_t`, `alpha_prev` are fp32 cumulative alphas (alphas_cumprod at t and at the previous step), one
    per batch row (`per_row` elements each, `batched`) or one for all. The rules are diffusers' schedulers':

    - the prediction: "epsilon" x0 = (x - sqrt(1 - a) m) / sqrt(a); "sample" x0 = m, eps = (x - sqrt(a) x0) /
      sqrt(1 - a); "v_prediction" x0 = sqrt(a) x - sqrt(1 - a) m, eps = sqrt(a) m + sqrt(1 - a) x; with `clip`, x0
      is clamped to [-r, r] and eps recomputed from it;
    - "ddim": sigma = eta sqrt((1 - a') / (1 - a) (1 - a / a')), x_prev = sqrt(a') x0 + sqrt(1 - a' - sigma^2) eps
      (+ sigma noise);
    - "ddpm": b = 1 - a / a', x_prev = sqrt(a') b / (1 - a) x0 + sqrt(a / a') (1 - a') / (1 - a) x
      (+ sqrt(max((1 - a') / (1 - a) b, 1e-20)) noise).

    `__call__` always takes x, m, noise and out (noise ignored unless `noisy`: pass x)."""

    def __init__(self, kind: str, prediction: str, clip: bool, noisy: bool, batched: bool, dtype, vec: int,
                 index64: bool, schedule: GridStride):
        if kind not in ("ddim", "ddpm"):
            raise ValueError(f"kind must be 'ddim' or 'ddpm', got {kind!r}")
        if prediction not in PREDICTIONS:
            raise ValueError(f"prediction must be one of {PREDICTIONS}, got {prediction!r}")
        self.kind, self.prediction, self.clip, self.noisy, self.batched = kind, prediction, clip, noisy, batched
        self.dtype, self.vec, self.index64, self.schedule = dtype, vec, index64, schedule

    def _f(self, mA, mP, per_row, eta, r, idx, xv, mv, *nv):
        row = idx // per_row if cutlass.const_expr(self.batched) else 0
        a, ap = mA[row], mP[row]
        sa = cute.math.sqrt(a)
        s1a = cute.math.sqrt(1.0 - a)
        x, m = xv.to(Float32), mv.to(Float32)
        x0, eps = None, None
        if cutlass.const_expr(self.prediction == "epsilon"):
            x0, eps = (x - s1a * m) * (1.0 / sa), m
        elif cutlass.const_expr(self.prediction == "sample"):
            x0 = m
        else:
            x0, eps = sa * x - s1a * m, sa * m + s1a * x
        if cutlass.const_expr(self.clip):
            x0 = cute.where(x0 > r, r, cute.where(x0 < -r, -r, x0))
        if cutlass.const_expr(self.kind == "ddim"):
            if cutlass.const_expr(self.clip or self.prediction == "sample"):
                eps = (x - sa * x0) * (1.0 / s1a)
            var = (1.0 - ap) / (1.0 - a) * (1.0 - a / ap)
            sigma = eta * cute.math.sqrt(var)
            res = cute.math.sqrt(ap) * x0 + cute.math.sqrt(1.0 - ap - sigma * sigma) * eps
            noise_scale = sigma
        else:
            beta = 1.0 - a / ap
            inv = 1.0 / (1.0 - a)
            res = (cute.math.sqrt(ap) * beta * inv) * x0 + (cute.math.sqrt(a / ap) * (1.0 - ap) * inv) * x
            noise_scale = cute.math.sqrt(cutlass.max((1.0 - ap) * inv * beta, Float32(VARIANCE_FLOOR)))
        if cutlass.const_expr(self.noisy):
            res = res + noise_scale * nv[0].to(Float32)
        return (res.to(self.dtype),)

    @cute.jit
    def __call__(self, x: cute.Tensor, m: cute.Tensor, noise: cute.Tensor, out: cute.Tensor, alpha_t: cute.Tensor,
                 alpha_prev: cute.Tensor, per_row, eta: Float32, clip: Float32, max_ctas: Int32, stream):
        ctas, passes = map_grid(cute.size(out, mode=[0]) // self.vec, self.schedule, max_ctas, self.index64)
        self.kernel(x, m, noise, out, alpha_t, alpha_prev, per_row, eta, clip, passes).launch(
            grid=[ctas, 1, 1], block=[self.schedule.threads, 1, 1], stream=stream, use_pdl=pdl.LAUNCH)

    @cute.kernel
    def kernel(self, x: cute.Tensor, m: cute.Tensor, noise: cute.Tensor, out: cute.Tensor, alpha_t: cute.Tensor,
               alpha_prev: cute.Tensor, per_row, eta: Float32, clip: Float32, passes: Int32):
        ins = (x, m, noise) if cutlass.const_expr(self.noisy) else (x, m)

        def f(idx, xv, mv, *nv):
            return self._f(alpha_t, alpha_prev, per_row, eta, clip, idx, xv, mv, *nv)

        map_vectors(ins, (out,), f, self.vec, self.schedule, self.index64, with_index=True, full_passes=passes)


class TimestepEmbedding:
    """out (B, dim) from t (B,) fp32, as diffusers' `get_timestep_embedding`: with half = dim // 2,
    f_i = exp(-ln(max_period) i / (half - shift)), args = scale t f_i; the row is [sin(args), cos(args)] ([cos, sin]
    with `flip`), a zero last column when dim is odd. exp is the accurate expf, sin and cos `collectives.trig`'s
    (about an ulp, no local memory), the arguments rounded as torch rounds them, so the result tracks torch's fp32 to
    an ulp of the argument. A thread per output element, grid-stride."""

    def __init__(self, flip: bool, out_dtype, threads: int = 256):
        self.flip, self.out_dtype, self.threads = flip, out_dtype, threads

    @cute.jit
    def __call__(self, t: cute.Tensor, out: cute.Tensor, log_period: Float32, shift: Float32, scale: Float32,
                 max_ctas: Int32, stream):
        n = extent(out, 0) * extent(out, 1)
        ctas = cutlass.max(cutlass.min((n + self.threads - 1) // self.threads, max_ctas), 1)
        self.kernel(t, out, log_period, shift, scale).launch(grid=[ctas, 1, 1], block=[self.threads, 1, 1],
                                                             stream=stream, use_pdl=pdl.LAUNCH)

    @cute.kernel
    def kernel(self, mT: cute.Tensor, mO: cute.Tensor, log_period: Float32, shift: Float32, scale: Float32):
        pdl.enter()
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        rows, dim = extent(mO, 0), extent(mO, 1)
        half = dim // 2
        denom = Float32(half) - shift
        for e in cutlass.range(bidx * self.threads + tidx, rows * dim, gdim * self.threads, unroll=1):
            b = e // dim
            j = e - b * dim
            i = j if j < half else j - half
            arg = mT[b] * cute.math.exp(-log_period * Float32(i) / denom)
            arg = scale * arg
            first, second = sincos(arg)
            if cutlass.const_expr(self.flip):
                first, second = second, first
            v = Float32(0.0)
            if j < half:
                v = first
            elif j < 2 * half:
                v = second
            mO[b, j] = v.to(self.out_dtype)

