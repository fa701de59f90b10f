"""The flow family's rules in plain torch, in any dtype (the tests run them in fp64): the solver update, the DDIM and
DDPM steps (diffusers' schedulers, written out), the sinusoidal time embedding (diffusers' `get_timestep_embedding`)
and a fixed-grid ODE loop with torchdiffeq's tableaux (`sampler.TABLEAUX`). Nothing here launches our kernels."""

from __future__ import annotations

import math

import torch


def flow_update(x, ks, coeffs, dt, cfg_scale=None):
    """x + dt * sum_i coeffs[i] * k_i; with `cfg_scale` each k_i is a pair (u, c) taken as u + s (c - u)."""
    acc = torch.zeros_like(x)
    for k, c in zip(ks, coeffs):
        if cfg_scale is not None:
            u, cond = k
            k = u + cfg_scale * (cond - u)
        acc = acc + c * k.to(x.dtype)
    return x + dt * acc


def _alpha(a, x):
    """A cumulative alpha (float, 0-d / one-element tensor, or one per batch row) broadcast against x."""
    a = torch.as_tensor(a, dtype=x.dtype, device=x.device).reshape(-1)
    return a.reshape(-1, *([1] * (x.dim() - 1))) if a.numel() > 1 else a.reshape(())


def predict(x, m, a, prediction_type="epsilon", clip_sample=None):
    """(x0, eps) from the network output m at cumulative alpha a; x0 clamped (and eps recomputed) with clip_sample."""
    sa, s1a = a.sqrt(), (1 - a).sqrt()
    if prediction_type == "epsilon":
        x0, eps = (x - s1a * m) / sa, m
    elif prediction_type == "sample":
        x0 = m
        eps = (x - sa * x0) / s1a
    elif prediction_type == "v_prediction":
        x0, eps = sa * x - s1a * m, sa * m + s1a * x
    else:
        raise ValueError(f"prediction_type must be epsilon, sample or v_prediction, got {prediction_type!r}")
    if clip_sample is not None:
        x0 = x0.clamp(-clip_sample, clip_sample)
        eps = (x - sa * x0) / s1a
    return x0, eps


def ddim_step(x, m, alpha_t, alpha_prev, eta=0.0, noise=None, prediction_type="epsilon", clip_sample=None):
    a, ap = _alpha(alpha_t, x), _alpha(alpha_prev, x)
    x0, eps = predict(x, m, a, prediction_type, clip_sample)
    var = (1 - ap) / (1 - a) * (1 - a / ap)
    sigma = eta * var.sqrt()
    out = ap.sqrt() * x0 + (1 - ap - sigma**2).sqrt() * eps
    if eta > 0:
        out = out + sigma * noise
    return out


def ddpm_step(x, m, alpha_t, alpha_prev, noise=None, prediction_type="epsilon", clip_sample=None):
    a, ap = _alpha(alpha_t, x), _alpha(alpha_prev, x)
    x0, _ = predict(x, m, a, prediction_type, clip_sample)
    beta = 1 - a / ap
    out = ap.sqrt() * beta / (1 - a) * x0 + (a / ap).sqrt() * (1 - ap) / (1 - a) * x
    if noise is not None:
        out = out + ((1 - ap) / (1 - a) * beta).clamp(min=1e-20).sqrt() * noise
    return out


def timestep_embedding(t, dim, max_period=10000.0, flip_sin_to_cos=False, downscale_freq_shift=1.0, scale=1.0,
                       dtype=None):
    """diffusers' get_timestep_embedding in t's float dtype (fp32 for integer t): (B, dim)."""
    ft = t.dtype if t.is_floating_point() else torch.float32
    half = dim // 2
    exponent = -math.log(max_period) * torch.arange(half, dtype=ft, device=t.device) / (half - downscale_freq_shift)
    args = scale * (t.to(ft)[:, None] * torch.exp(exponent)[None, :])
    emb = torch.cat([torch.sin(args), torch.cos(args)], dim=-1)
    if flip_sin_to_cos:
        emb = torch.cat([emb[:, half:], emb[:, :half]], dim=-1)
    if dim % 2:
        emb = torch.nn.functional.pad(emb, (0, 1))
    return emb if dtype is None else emb.to(dtype)


def odeint_fixed(velocity, x0, steps, method="euler", t0=0.0, t1=1.0, cfg_scale=None):
    """x(t1) of dx/dt = velocity(x, t) from x(t0) = x0 by `steps` uniform steps of the fixed-grid method, in x0's
    dtype, with plain torch arithmetic (the solver as torchdiffeq applies its tableau; velocity returns (u, c) with
    cfg_scale). t is passed as a 0-d tensor."""
    from cute_kernels.flow.sampler import tableau

    stages, b = tableau(method)
    grid = torch.linspace(t0, t1, steps + 1, dtype=torch.float64).tolist()
    x = x0
    for n in range(steps):
        ta, dt = grid[n], grid[n + 1] - grid[n]
        ks = []
        for c, a in stages:
            xi = x if not any(a) else flow_update(x, ks, a, dt, cfg_scale)
            ks.append(velocity(xi, torch.tensor(ta + c * dt, dtype=x.dtype, device=x.device)))
        x = flow_update(x, ks, b, dt, cfg_scale)
    return x
