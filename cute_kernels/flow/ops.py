"""Torch ops of the flow family (lesson 15): `cute_kernels::flow_update`, `::ddim_step`, `::ddpm_step`,
`::timestep_embedding`.

- `flow_update(x, ks, coeffs, dt, cfg_scale=None)`: x + dt * sum_i coeffs[i] * k_i in one pass, fp32 math, one
  rounding to x's dtype; with `cfg_scale` each k_i is a pair (uncond, cond) combined first as u + s (c - u). The k
  share one float dtype, which may differ from x's (a bf16 network's velocity updating an fp32 state). Terms with a
  zero coefficient are not read; past four terms the update runs in passes of four over an fp32 partial sum (still
  one rounding to x's dtype). Differentiable (the update is linear).
- `ddim_step` / `ddpm_step`: one reverse step of diffusers' DDIM / DDPM schedulers (`kernels.DiffusionStep` has the
  formulas) from x_t and the network's output. The cumulative alphas are tensors (one value, or one per batch row
  of x) read by the kernel, and the noise is an argument: no RNG and no host sync inside, so a captured graph replays
  with new timesteps and noise. Not differentiable.
- `timestep_embedding(t, dim, ...)`: diffusers' `get_timestep_embedding` (B, dim); not differentiable in t.

Inputs of any layout are accepted (non-contiguous ones are copied first); operands not 16-byte aligned take the
scalar variant of a kernel.
"""

from __future__ import annotations

import math

import torch

from cute_kernels import catalog, dtypes
from cute_kernels.flow import vec_for
from cute_kernels.flow.kernels import MAX_TERMS, PREDICTIONS
from cute_kernels.flow.sampler import FlowSampler, sample_flow  # noqa: F401  (the family's public sampler)
from cute_kernels.torch_ops import (
    _OPS,
    INDEX32_LIMIT,
    aligned16,
    call,
    check_tensor,
    direct_call_ok,
    flat,
    register_op,
)
from schedules.grid_stride import pick
from schedules.hardware import num_sms


def _schedule(out: torch.Tensor):
    """The grid-stride schedule for tensors of out's size: the elementwise family's, measured for add (two inputs, one
    output, as the Euler update and a noiseless step; its large-size config is `FLOW_TUNED`)."""
    return pick("add", out.numel() * out.element_size())


def _wide(n: int, vec: int, dev: int, sched) -> bool:
    """64-bit indexing past 2^31 elements, and below where the 32-bit grid walk would wrap (`GridStride.index32_ok`)."""
    return n > INDEX32_LIMIT or (n >= 2**24 and not sched.index32_ok(n, vec, num_sms(dev)))


# --- flow_update ----------------------------------------------------------------------------------------------------
def _check_update(x, ks, coeffs, cfg):
    check_tensor("x", x)
    if len(ks) != len(coeffs) * (2 if cfg else 1):
        raise ValueError(f"coeffs has {len(coeffs)} entries but ks has {len(ks) // (2 if cfg else 1)} "
                         f"{'(uncond, cond) pairs' if cfg else 'tensors'}")
    for i, k in enumerate(ks):
        name = f"ks[{i // 2}][{i % 2}]" if cfg else f"ks[{i}]"
        check_tensor(name, k)
        if k.dtype != ks[0].dtype:
            raise TypeError(f"{name} has dtype {k.dtype} but ks[0] has {ks[0].dtype}: the k tensors share one dtype")
        if k.shape != x.shape:
            raise ValueError(f"{name} has shape {tuple(k.shape)} but x has {tuple(x.shape)} (no broadcasting)")
        if k.device != x.device:
            raise ValueError(f"{name} is on {k.device} but x is on {x.device}")


def _flow_update_fake(x, ks, coeffs, dt, cfg_scale=None):
    _check_update(x, ks, coeffs, cfg_scale is not None)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _update_pass(x, ks, coeffs, dt, cfg_scale, out):
    """One launch: out = x + dt * sum of up to MAX_TERMS terms (flat contiguous tensors, n >= 1)."""
    cfg = cfg_scale is not None
    terms = len(coeffs)
    xn, kn = dtypes.name_of(x.dtype), dtypes.name_of(ks[0].dtype)
    aligned = aligned16(x, out, *ks)
    vec = vec_for((xn, kn), aligned)
    n, dev, sched = out.numel(), out.get_device(), _schedule(out)
    fn = catalog.get("flow.update").compiled(sched, dtype=xn, k_dtype=kn, terms=terms, cfg=cfg, aligned=aligned,
                                             index64=_wide(n, vec, dev, sched))
    k8 = list(ks) + [ks[0]] * (8 - len(ks))
    c4 = [float(c) for c in coeffs] + [0.0] * (MAX_TERMS - terms)
    fn(x, *k8, out, *c4, float(dt), float(cfg_scale or 0.0), sched.max_ctas(num_sms(dev)))


def _flow_update_cuda(x, ks, coeffs, dt, cfg_scale=None):
    out = _flow_update_fake(x, ks, coeffs, dt, cfg_scale)
    if out.numel() == 0:
        return out
    cfg = cfg_scale is not None
    per = 2 if cfg else 1
    live = [i for i, c in enumerate(coeffs) if c != 0.0 and dt != 0.0]
    xf, of = flat(x), out.view(-1)
    if not live:
        of.copy_(xf)
        return out
    kf = [flat(k) for k in ks]
    passes = [live[s:s + MAX_TERMS] for s in range(0, len(live), MAX_TERMS)]
    # past four terms the partial sums stay in fp32 (one rounding to x's dtype, at the end)
    acc = of if len(passes) == 1 or of.dtype == torch.float32 else torch.empty(of.shape, dtype=torch.float32,
                                                                               device=of.device)
    src = xf if acc is of else xf.float()
    for part in passes:
        _update_pass(src, [kf[i * per + j] for i in part for j in range(per)], [coeffs[i] for i in part], dt,
                     cfg_scale, acc)
        src = acc
    if acc is not of:
        of.copy_(acc)
    return out


def _flow_update_setup(ctx, inputs, output):
    x, ks, coeffs, dt, cfg_scale = inputs
    ctx.k_dtype = ks[0].dtype if ks else x.dtype
    ctx.coeffs, ctx.dt, ctx.cfg_scale = list(coeffs), dt, cfg_scale


def _flow_update_backward(ctx, g):
    """dx = g; dk_i = dt c_i g (guidance pairs: (1 - s) and s of that)."""
    grads = []
    for c in ctx.coeffs:
        w = ctx.dt * c
        if ctx.cfg_scale is None:
            grads.append((g * w).to(ctx.k_dtype))
        else:
            grads += [(g * (w * (1.0 - ctx.cfg_scale))).to(ctx.k_dtype), (g * (w * ctx.cfg_scale)).to(ctx.k_dtype)]
    return g, grads, None, None, None


register_op("cute_kernels::flow_update", "(Tensor x, Tensor[] ks, float[] coeffs, float dt, float? cfg_scale) -> Tensor",
            _flow_update_cuda, _flow_update_fake, _flow_update_backward, _flow_update_setup)


def flow_update(x: torch.Tensor, ks, coeffs, dt: float, cfg_scale: float | None = None) -> torch.Tensor:
    """x + dt * sum_i coeffs[i] * ks[i] in one pass (fp32 math, one rounding to x's dtype); with `cfg_scale`, each
    ks[i] is a pair (uncond, cond) combined first as uncond + cfg_scale * (cond - uncond). Every stage point and
    final combination of a fixed-grid Runge-Kutta step (`cute_kernels.flow.sampler.TABLEAUX`) is one call."""
    cfg = cfg_scale is not None
    if cfg:
        for i, k in enumerate(ks):
            if not isinstance(k, (tuple, list)) or len(k) != 2:
                raise TypeError(f"with cfg_scale, ks[{i}] must be an (uncond, cond) pair, got {type(k).__name__}")
        flat_ks = [t for pair in ks for t in pair]
    else:
        flat_ks = list(ks)
    coeffs = [float(c) for c in coeffs]
    args = (x, flat_ks, coeffs, float(dt), None if cfg_scale is None else float(cfg_scale))
    if direct_call_ok(x, *flat_ks):
        return _flow_update_cuda(*args)
    return _OPS["cute_kernels::flow_update"](*args)


# --- DDIM / DDPM ------------------------------------------------------------------------------------------------------
def _check_alpha(name, a, x):
    check_tensor(name, a, allowed=(torch.float32, torch.float64, torch.bfloat16, torch.float16))
    rows = x.shape[0] if x.dim() else 1
    if a.numel() not in (1, rows):
        raise ValueError(f"{name} must hold one value or one per batch row of x ({rows}), got shape {tuple(a.shape)}")
    if a.device != x.device:
        raise ValueError(f"{name} is on {a.device} but x is on {x.device}")


def _check_step(x, m, alpha_t, alpha_prev, noise, prediction_type, clip_sample, noise_needed):
    check_tensor("x", x)
    check_tensor("model_output", m)
    if m.dtype != x.dtype or m.shape != x.shape or m.device != x.device:
        raise ValueError(f"model_output ({m.dtype}, {tuple(m.shape)}, {m.device}) must match x ({x.dtype}, "
                         f"{tuple(x.shape)}, {x.device})")
    _check_alpha("alpha_t", alpha_t, x)
    _check_alpha("alpha_prev", alpha_prev, x)
    if prediction_type not in PREDICTIONS:
        raise ValueError(f"prediction_type must be one of {PREDICTIONS}, got {prediction_type!r}")
    if clip_sample is not None and not clip_sample > 0:
        raise ValueError(f"clip_sample must be positive (the clamp's range), got {clip_sample}")
    if noise is not None:
        check_tensor("noise", noise)
        if noise.dtype != x.dtype or noise.shape != x.shape or noise.device != x.device:
            raise ValueError(f"noise ({noise.dtype}, {tuple(noise.shape)}, {noise.device}) must match x")
    elif noise_needed:
        raise ValueError("noise is required when eta > 0: the step draws no random numbers (pass a tensor like x, "
                         "e.g. torch.randn_like(x))")


def _alphas(a: torch.Tensor) -> torch.Tensor:
    a = a.reshape(-1)
    return a if a.dtype == torch.float32 and a.is_contiguous() else a.to(torch.float32).contiguous()


def _diffusion(kind, x, m, alpha_t, alpha_prev, eta, noise, prediction_type, clip_sample):
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    n = out.numel()
    if n == 0:
        return out
    at, ap = _alphas(alpha_t), _alphas(alpha_prev)
    batched = at.numel() > 1 or ap.numel() > 1
    if batched:
        rows = x.shape[0]
        at, ap = at.expand(rows).contiguous(), ap.expand(rows).contiguous()
    per_row = n // x.shape[0] if batched else n
    noisy = noise is not None and (kind == "ddpm" or eta > 0)
    ins = [flat(x), flat(m)] + ([flat(noise)] if noisy else [])
    name = dtypes.name_of(x.dtype)
    vec = dtypes.vec_of(name)
    aligned = aligned16(out, *ins) and (not batched or per_row % vec == 0)
    vec = vec if aligned else 1
    dev, sched = out.get_device(), _schedule(out)
    wide = _wide(n, vec, dev, sched)
    fn = catalog.get("flow.diffusion_step").compiled(
        sched, dtype=name, kind=kind, prediction=prediction_type, clip=clip_sample is not None, noisy=noisy,
        batched=batched, aligned=aligned, index64=wide)
    of = out.view(-1)
    fn(ins[0], ins[1], ins[2] if noisy else ins[0], of, at, ap, per_row, float(eta),
       float(clip_sample or 0.0), sched.max_ctas(num_sms(dev)))
    return out


def _ddim_fake(x, model_output, alpha_t, alpha_prev, eta=0.0, noise=None, prediction_type="epsilon",
               clip_sample=None):
    if not eta >= 0:
        raise ValueError(f"eta must be >= 0, got {eta}")
    _check_step(x, model_output, alpha_t, alpha_prev, noise, prediction_type, clip_sample, eta > 0)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _ddim_cuda(x, model_output, alpha_t, alpha_prev, eta=0.0, noise=None, prediction_type="epsilon",
               clip_sample=None):
    _ddim_fake(x, model_output, alpha_t, alpha_prev, eta, noise, prediction_type, clip_sample)
    return _diffusion("ddim", x, model_output, alpha_t, alpha_prev, eta, noise, prediction_type, clip_sample)


def _ddpm_fake(x, model_output, alpha_t, alpha_prev, noise=None, prediction_type="epsilon", clip_sample=None):
    _check_step(x, model_output, alpha_t, alpha_prev, noise, prediction_type, clip_sample, False)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _ddpm_cuda(x, model_output, alpha_t, alpha_prev, noise=None, prediction_type="epsilon", clip_sample=None):
    _ddpm_fake(x, model_output, alpha_t, alpha_prev, noise, prediction_type, clip_sample)
    return _diffusion("ddpm", x, model_output, alpha_t, alpha_prev, 0.0, noise, prediction_type, clip_sample)


register_op("cute_kernels::ddim_step",
            "(Tensor x, Tensor model_output, Tensor alpha_t, Tensor alpha_prev, float eta=0.0, Tensor? noise=None, "
            "str prediction_type='epsilon', float? clip_sample=None) -> Tensor", _ddim_cuda, _ddim_fake)
register_op("cute_kernels::ddpm_step",
            "(Tensor x, Tensor model_output, Tensor alpha_t, Tensor alpha_prev, Tensor? noise=None, "
            "str prediction_type='epsilon', float? clip_sample=None) -> Tensor", _ddpm_cuda, _ddpm_fake)


def _alpha_tensor(a, like: torch.Tensor) -> torch.Tensor:
    """A cumulative alpha given as a Python number becomes a one-element fp32 tensor on x's device (a fill kernel,
    so this also works under CUDA-graph capture)."""
    if isinstance(a, torch.Tensor):
        return a
    return torch.full((1,), float(a), dtype=torch.float32, device=like.device)


def ddim_step(x: torch.Tensor, model_output: torch.Tensor, alpha_t, alpha_prev, eta: float = 0.0,
              noise: torch.Tensor | None = None, prediction_type: str = "epsilon",
              clip_sample: float | None = None) -> torch.Tensor:
    """One DDIM step x_t -> x_prev (diffusers' DDIMScheduler.step): alpha_t / alpha_prev are alphas_cumprod at t and
    at the previous timestep (tensors of one value or one per batch row, or numbers); `noise` (like x) is required
    when eta > 0; `clip_sample`: clamp the predicted x0 to [-clip_sample, clip_sample]."""
    return call("cute_kernels::ddim_step", x, model_output, _alpha_tensor(alpha_t, x), _alpha_tensor(alpha_prev, x),
                float(eta), noise, prediction_type, None if clip_sample is None else float(clip_sample))


def ddpm_step(x: torch.Tensor, model_output: torch.Tensor, alpha_t, alpha_prev, noise: torch.Tensor | None = None,
              prediction_type: str = "epsilon", clip_sample: float | None = None) -> torch.Tensor:
    """One DDPM step (diffusers' DDPMScheduler.step, variance "fixed_small"): the posterior mean, plus
    sqrt(variance) * noise when `noise` is given (pass None at the last step, as the scheduler adds none at t = 0)."""
    return call("cute_kernels::ddpm_step", x, model_output, _alpha_tensor(alpha_t, x), _alpha_tensor(alpha_prev, x),
                noise, prediction_type, None if clip_sample is None else float(clip_sample))


# --- timestep_embedding -------------------------------------------------------------------------------------------------
def _embedding_fake(t, dim, max_period=10000.0, flip_sin_to_cos=False, downscale_freq_shift=1.0, scale=1.0,
                    dtype=None):
    check_tensor("t", t, allowed=(torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32,
                                  torch.int64))
    if t.dim() != 1:
        raise ValueError(f"t must be 1-D (one time per batch row), got shape {tuple(t.shape)}")
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    if dim >= 2 and dim // 2 == downscale_freq_shift:
        raise ValueError(f"downscale_freq_shift ({downscale_freq_shift}) equals dim // 2: the frequencies divide by 0")
    if not max_period > 0:
        raise ValueError(f"max_period must be positive, got {max_period}")
    out_dtype = dtype or torch.float32
    if out_dtype not in dtypes.FLOAT_TORCH:
        raise TypeError(f"dtype must be bfloat16, float16 or float32, got {out_dtype}")
    return t.new_empty((t.shape[0], dim), dtype=out_dtype)


def _embedding_cuda(t, dim, max_period=10000.0, flip_sin_to_cos=False, downscale_freq_shift=1.0, scale=1.0,
                    dtype=None):
    out = _embedding_fake(t, dim, max_period, flip_sin_to_cos, downscale_freq_shift, scale, dtype)
    if out.numel() == 0:
        return out
    tf = t if t.dtype == torch.float32 and t.is_contiguous() else t.to(torch.float32).contiguous()
    fn = catalog.get("flow.timestep_embedding").compiled(out_dtype=dtypes.name_of(out.dtype), flip=flip_sin_to_cos)
    fn(tf, out, math.log(max_period), float(downscale_freq_shift), float(scale), 8 * num_sms(out.get_device()))
    return out


register_op("cute_kernels::timestep_embedding",
            "(Tensor t, int dim, float max_period=10000.0, bool flip_sin_to_cos=False, float downscale_freq_shift=1.0, "
            "float scale=1.0, ScalarType? dtype=None) -> Tensor", _embedding_cuda, _embedding_fake)


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0, flip_sin_to_cos: bool = False,
                       downscale_freq_shift: float = 1.0, scale: float = 1.0,
                       dtype: torch.dtype | None = None) -> torch.Tensor:
    """(B, dim) sinusoidal features of the B times `t`, as diffusers' `get_timestep_embedding` (same arguments and
    defaults): [sin, cos] of scale * t * exp(-ln(max_period) i / (dim // 2 - downscale_freq_shift)), [cos, sin] with
    flip_sin_to_cos, a zero column last for odd dim; fp32, or `dtype`."""
    return call("cute_kernels::timestep_embedding", t, int(dim), float(max_period), bool(flip_sin_to_cos),
                float(downscale_freq_shift), float(scale), dtype)
