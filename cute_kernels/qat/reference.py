"""QAT fake-quant in plain torch: the rules the kernels implement, bit for bit, and the reference their tests compare
against. Every rounding step is written out (fp32 operations are torch fp32 operations, each rounded once; `fma32` is
one rounding of an exact product plus an addend), so the same function runs on CPU and GPU with the same bits.

The rules are torch's CUDA kernels' (`aten/src/ATen/native/quantized/cuda/FakeQuantizeCore.cu`, the per-channel
integer-zero-point form `nearbyint(x * inv_scale) + zero_point` that torch 2.9-2.13 ship, and
`fused_obs_fake_quant.cu`):

    inv   = RN(1 / scale)                                  (fp32, correctly rounded)
    r     = rint(x * inv) + zp                             (integer zero point: rint = round half to even)
    r     = rint(fma(x, inv, zp))                          (float zero point, per-channel: one fused rounding)
    mask  = quant_min <= r <= quant_max                    (the STE mask: the gradient passes where it is 1)
    y     = RN_dtype(RN((clamp(r, quant_min, quant_max) - zp) * scale))

A NaN x gives r = NaN: clamped to quant_min (as torch's CPU kernels), mask 0; +-inf clamps to the range's ends with
mask 0. e4m3 emulation (no torch op): v = RN(x * inv), q = e4m3(v) rounded to nearest even and saturated to +-448
(`cvt.rn.satfinite`), y = RN_dtype(RN(q * scale)), mask = |v| <= 448.

Layouts (`layout_of`): x is viewed as (outer, C, inner) with the scale (and zero point) indexed by the middle mode:
per-tensor (1, 1, N); per-channel along `axis` (prod(shape[:axis]), shape[axis], prod(shape[axis + 1:])); per-group
along the last dim, groups of `group_size` consecutive elements (1, N / group_size, group_size).

Learnable (LSQ / LSQ+, torch's `_fake_quantize_learnable_per_{tensor,channel}_affine`): the forward rounds a float
zero point, zp = clamp(rint(zp), qmin, qmax); the backward recomputes r from x with its own zero point (per-tensor:
trunc(clamp(zp + 0.5)), as torch's `_get_zero_point_from_tensor(..., is_forward=False)`; per-channel and per-group:
clamp(rint(zp))) and gives, per element, dx = dy * mask and

    in range:  dscale = ((dy * (xfq - x)) * inv) * grad_factor,   dzp = 0            (xfq = RN((clamp(r) - zp) s))
    below:     dscale = (dy * (qmin - zp)) * grad_factor,          dzp = ((-dy) * s) * grad_factor
    above:     dscale = (dy * (qmax - zp)) * grad_factor,          dzp = ((-dy) * s) * grad_factor

summed over the elements sharing a scale (fp32 terms; the order of the sum is the implementation's).

Observer (`observe`, torch's `fused_moving_avg_obs_fake_quant` on CUDA): the min / max of x (per tensor, or per
channel along axis 0), the moving average running = running + c (cur - running) (one fma; running = cur while it is
+-inf), then `choose_qparams` (fbgemm's ChooseQuantizationParams as torch's CUDA kernel computes it, in fp32 and
fp64), then the fake-quant with those qparams; `fake_quant_on` = 0 passes x through with mask 1.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

QTYPES = ("int", "e4m3")
ZP_RULES = ("int", "round", "half_up", "float")
E4M3_MAX = 448.0


class Layout(NamedTuple):
    mode: str  # "tensor", "channel" or "group"
    outer: int
    channels: int
    inner: int


def _numel(shape) -> int:
    return math.prod(shape)


def layout_of(shape, axis=None, group_size=None) -> Layout:
    """x's (outer, C, inner) view for per-tensor, per-channel (`axis`) or per-group (`group_size`, along the last
    dim) quantization; ValueError naming the argument when they do not fit x's shape."""
    shape = tuple(shape)
    n = _numel(shape)
    if axis is not None and group_size is not None:
        if not shape or axis not in (-1, len(shape) - 1):
            raise ValueError(f"group_size groups the last dim: axis must be None or the last dim, got axis={axis}")
        axis = None
    if group_size is not None:
        if not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"group_size must be a positive int, got {group_size!r}")
        if not shape or shape[-1] % group_size:
            raise ValueError(f"group_size={group_size} must divide the last dim of x (shape {shape})")
        return Layout("group", 1, n // group_size, group_size)
    if axis is None:
        return Layout("tensor", 1, 1, n)
    if not isinstance(axis, int) or not -len(shape) <= axis < len(shape):
        raise ValueError(f"axis must be a dim of x (shape {shape}), got {axis!r}")
    axis %= len(shape)
    return Layout("channel", _numel(shape[:axis]), shape[axis], _numel(shape[axis + 1 :]))


def expand(t: torch.Tensor, shape, lay: Layout) -> torch.Tensor:
    """A per-scale tensor (numel 1, C or N / group_size) broadcast to x's `shape` through the (outer, C, inner) view."""
    v = t.reshape(1, lay.channels, 1).expand(lay.outer, lay.channels, lay.inner)
    return v.reshape(shape)


def fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """RN32(a * b + c) for fp32 operands: the product is exact in fp64 (24 x 24 bits), the sum rounds once in fp64 and
    once to fp32 (a double rounding that differs from one fused rounding only when the fp64 sum lands exactly on an
    fp32 midpoint it was not on: about 2^-29 of random inputs)."""
    return (a.double() * b.double() + c.double()).float()


def zero_point_of(zp: torch.Tensor, rule: str, qmin: int, qmax: int) -> torch.Tensor:
    """The fp32 zero point the arithmetic uses under `rule`: "int" as given, "float" as given (a float zero point),
    "round" clamp(rint(zp)), "half_up" trunc(clamp(zp + 0.5)) (torch's learnable per-tensor backward)."""
    z = zp.float()
    if rule == "round":  # (+ 0.0: a -0.0 becomes +0.0, as through torch's integer zero point)
        return torch.round(z).clamp(qmin, qmax) + 0.0
    if rule == "half_up":
        return torch.trunc((z + 0.5).clamp(qmin, qmax)) + 0.0
    if rule not in ("int", "float"):
        raise ValueError(f"zp rule must be one of {ZP_RULES}, got {rule!r}")
    return z


def _clamp_nan_low(r: torch.Tensor, qmin: float, qmax: float) -> torch.Tensor:
    """clamp(r, qmin, qmax) with NaN taken to qmin (the kernels' max.f32 / min.f32 ignore a NaN operand)."""
    return torch.where(torch.isnan(r), torch.full_like(r, qmin), r).clamp(qmin, qmax)


def fake_quant(
    x: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor | None,
    quant_min: int,
    quant_max: int,
    axis=None,
    group_size=None,
    qtype: str = "int",
    zp_rule: str = "int",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, mask) by the rules above; scale / zero_point have numel 1, C or N / group_size (any shape of that numel)."""
    if qtype not in QTYPES:
        raise ValueError(f"qtype must be one of {QTYPES}, got {qtype!r}")
    lay = layout_of(x.shape, axis, group_size)
    xf = x.float()
    s = expand(scale.float(), x.shape, lay)
    inv = 1.0 / s
    if qtype == "e4m3":
        v = xf * inv
        q = v.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float()
        return (q * s).to(x.dtype), v.abs() <= E4M3_MAX
    zp = torch.zeros(lay.channels) if zero_point is None else zero_point
    z = expand(zero_point_of(zp.to(x.device), zp_rule, quant_min, quant_max), x.shape, lay)
    r = torch.round(fma32(xf, inv, z)) if zp_rule == "float" else torch.round(xf * inv) + z
    mask = (r >= quant_min) & (r <= quant_max)
    y = (_clamp_nan_low(r, quant_min, quant_max) - z) * s
    return y.to(x.dtype), mask


def ste_backward(dy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """dx = dy * mask as torch's `dY * mask` (a masked-out negative dy gives -0.0)."""
    return dy * mask.to(dy.dtype)


def learnable_grads(
    dy,
    x,
    scale,
    zero_point,
    quant_min,
    quant_max,
    axis=None,
    group_size=None,
    grad_factor=1.0,
    zp_rule=None,
    cpu_rule: bool = False,
):
    """(dx, dscale per element, dzero_point per element), fp32 terms as torch's CUDA backward (`zp_rule`: default
    "half_up" per-tensor, "round" otherwise). `cpu_rule`: r = rint(zp + x * inv) instead, as torch's CPU kernel."""
    lay = layout_of(x.shape, axis, group_size)
    if zp_rule is None:
        zp_rule = "half_up" if lay.mode == "tensor" else "round"
    xf, g = x.float(), dy.float()
    s = expand(scale.float(), x.shape, lay)
    inv = 1.0 / s
    z = expand(zero_point_of(zero_point, zp_rule, quant_min, quant_max), x.shape, lay)
    r = torch.round(z + xf * inv) if cpu_rule else torch.round(xf * inv) + z
    inr = (r >= quant_min) & (r <= quant_max)
    gf = torch.tensor(grad_factor, dtype=torch.float32)
    xfq = (r.clamp(quant_min, quant_max) - z) * s
    ds_in = ((g * (xfq - xf)) * inv) * gf
    ds_out = torch.where(r < quant_min, g * (quant_min - z), g * (quant_max - z)) * gf
    ds = torch.where(inr, ds_in, ds_out)
    dzp = torch.where(inr, torch.zeros_like(g), ((-g) * s) * gf)
    return (g * inr.float()).to(x.dtype), ds, dzp


def per_scale_sum(t: torch.Tensor, lay: Layout) -> torch.Tensor:
    """The fp64 sum of a per-element tensor over the elements sharing each scale: (C,)."""
    return t.double().reshape(lay.outer, lay.channels, lay.inner).sum(dim=(0, 2))


def moving_average(running: torch.Tensor, cur: torch.Tensor, c: float, fma: bool = True) -> torch.Tensor:
    """running + c (cur - running) in fp32 (one fused rounding with `fma`, as nvcc contracts it; two without, as
    torch's CPU code), cur where running is +-inf."""
    cf = torch.tensor(c, dtype=torch.float32)
    d = cur - running
    upd = fma32(cf.expand_as(d), d, running) if fma else running + cf * d
    return torch.where(torch.isinf(running), cur, upd)


def choose_qparams(min_val: torch.Tensor, max_val: torch.Tensor, qmin: int, qmax: int, symmetric: bool):
    """(scale fp32, zero_point int32) per element of the fp32 ranges, as torch's CUDA ChooseQuantizationParams:
    symmetric ranges from fp32 divisions, the scale from fp64 (rounded to fp32), 0.1 when it is 0 or its fp32
    reciprocal overflows, the zero point from the endpoint with the smaller error in fp64, nudged into the range."""
    mn, mx = min_val.float(), max_val.float()
    if symmetric:
        sqmin = -((qmax - qmin) // 2 + 1)
        sqmax = (qmax - qmin) // 2
        both = (mn < 0) & (mx > 0)
        ms = torch.maximum((mn / float(sqmin)).abs(), (mx / float(sqmax)).abs()).double()
        mn = torch.where(both, (ms * sqmin).float(), mn)
        mx = torch.where(both, (ms * sqmax).float(), mx)
    zero = torch.zeros_like(mn)
    mn = torch.where(zero < mn, zero, mn)  # std::min(min_val, 0.f)
    mx = torch.where(mx < zero, zero, mx)  # std::max(max_val, 0.f)
    scale = ((mx.double() - mn.double()) / float(qmax - qmin)).float()
    bad = (scale == 0) | torch.isinf(1.0 / scale)
    scale = torch.where(bad, torch.full_like(scale, 0.1), scale)
    sd = scale.double()
    lo, hi = mn.double() / sd, mx.double() / sd
    z_min, z_max = qmin - lo, qmax - hi
    e_min, e_max = abs(qmin) + lo.abs(), abs(qmax) + hi.abs()
    init = torch.where(e_min < e_max, z_min, z_max)
    if symmetric:
        init = torch.where((mn < 0) & (mx > 0), torch.full_like(init, (qmin + qmax) / 2), init)
    zp = torch.where(
        init < qmin,
        torch.full_like(init, qmin),
        torch.where(init > qmax, torch.full_like(init, qmax), torch.round(init)),
    )
    return scale, zp.to(torch.int32)


def observe(
    x,
    observer_on,
    fake_quant_on,
    running_min,
    running_max,
    scale,
    zero_point,
    averaging_const,
    quant_min,
    quant_max,
    per_channel=False,
    symmetric=False,
    fma=True,
):
    """torch's fused moving-average observer + fake-quant (CUDA rules), updating running_min / running_max / scale /
    zero_point in place (per-channel: axis 0). Returns (y, mask)."""
    if int(observer_on.reshape(-1)[0]):
        xf = x.float()
        if per_channel:
            flat = xf.reshape(x.shape[0], -1)
            cur_min, cur_max = flat.amin(1), flat.amax(1)
        else:
            cur_min, cur_max = xf.amin().reshape(1), xf.amax().reshape(1)
        running_min.copy_(moving_average(running_min, cur_min, averaging_const, fma))
        running_max.copy_(moving_average(running_max, cur_max, averaging_const, fma))
    if not int(fake_quant_on.reshape(-1)[0]):
        return x.clone(), torch.ones_like(x, dtype=torch.bool)
    s, z = choose_qparams(running_min, running_max, quant_min, quant_max, symmetric)
    scale.copy_(s)
    zero_point.copy_(z)
    return fake_quant(x, scale, zero_point, quant_min, quant_max, axis=0 if per_channel else None)


def pack_mask(mask: torch.Tensor) -> torch.Tensor:
    """A bool mask as the kernels store it: bit k of byte b is element 8 b + k of the flat mask (uint8, ceil(N / 8))."""
    flat = mask.reshape(-1).to(torch.uint8)
    pad = (-flat.numel()) % 8
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8, device=flat.device)
    return (flat.view(-1, 8) * weights).sum(1, dtype=torch.uint8)


def unpack_mask(packed: torch.Tensor, shape) -> torch.Tensor:
    """The bool mask of `shape` from its packed bits (`pack_mask`'s inverse)."""
    n = _numel(shape)
    bits = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8, device=packed.device)
    return ((packed.reshape(-1, 1) & bits) != 0).reshape(-1)[:n].reshape(shape)
