"""Torch ops of the QAT family (lesson 17): fake-quant with the straight-through estimator, its learnable form and
the fused moving-average observer. The rules are `cute_kernels.qat.reference`'s (torch's CUDA kernels', bit for
bit where torch has the mode).

- `fake_quant(x, scale, zero_point, quant_min, quant_max, axis=None, group_size=None, qtype="int")`: per-tensor
  (scale a float or a 1-element tensor), per-channel (`axis`, scale (C,)) or per-group (`group_size` consecutive
  elements of the last dim, scale of numel N / group_size); zero_point None (symmetric), an int, an int32 tensor
  or a float tensor (per-channel float zero points: torch's rint(fma(x, inv, zp)) rule); `qtype="e4m3"` emulates
  e4m3 (no zero point; quant_min / quant_max None or -448 / 448). Differentiable in x: dx = dy * mask (STE), the
  mask stored packed, 8 elements a byte, by the forward.
- `fake_quant_learnable(x, scale, zero_point, quant_min, quant_max, axis=None, group_size=None, grad_factor=1.0)`:
  torch's `_fake_quantize_learnable_per_{tensor,channel}_affine` (and per-group): a float zero point, rounded in the
  forward; the backward gives dx and the scale / zero-point gradients (LSQ / LSQ+), summed deterministically.
- `fake_quant_observed(x, observer_on, fake_quant_on, running_min, running_max, scale, zero_point,
  averaging_const, quant_min, quant_max, ch_axis, per_row_fake_quant=False, symmetric_quant=False)`: torch's
  `fused_moving_avg_obs_fake_quant`; updates running_min / running_max / scale / zero_point in place, with no host
  sync (the flags are read on the device), then fake-quantizes with the new qparams.

Inputs: x bf16 / fp16 / fp32 on CUDA, any layout (non-contiguous or misaligned x is copied first); outputs are
contiguous. Values are not checked against the qparams' ranges on the host (that would be a sync): an int zero point
outside [quant_min, quant_max] is used as given.
"""

from __future__ import annotations

import math

import torch

from cute_kernels import dtypes
from cute_kernels.qat import (
    FAKE_QUANT,
    LEARNABLE_BWD,
    LEARNABLE_PLAN,
    MASK_VEC,
    OBSERVE,
    OBSERVE_ROWS,
    OBSERVED_ROWS_PREFETCH,
    OBSERVER_PLAN,
    QAT_MAP,
    QAT_QUANTIZE_MAP,
    STE_BWD,
    observed_row_max,
    observed_rows_plan,
)
from cute_kernels.qat import reference as R
from cute_kernels.torch_ops import (
    INDEX32_LIMIT,
    call,
    check_tensor,
    fresh_copy,
    placeholder,
    register_op,
    split_counters,
)
from schedules.hardware import num_sms
from schedules.row_tiling import plan_rows

QUANT_LIMIT = 2**24  # quant_min / quant_max are exact in fp32 (the kernels compare in fp32)
E4M3_RANGE = (-448, 448)
_MIN_ROW = 64  # per-channel learnable rows shorter than this are gathered channel-first first (see `_rows_layout`)
# The per-tensor fake-quant forward walks x from its end down (`QAT_QUANTIZE_MAP`), meeting first what the observer's
# reduce pass read last; False walks it from the start (`QAT_MAP`), for A/B runs (`perf/lab/qat_linear_ab.py`).
QUANTIZE_DESCENDING = True
# `qat.observe_rows` with the next row's copies in flight under this one (`OBSERVED_ROWS_PREFETCH`); False: the
# single-buffer kernel, for A/B runs.
OBSERVE_ROWS_PREFETCH = OBSERVED_ROWS_PREFETCH


# --- validation ------------------------------------------------------------------------------------------------------
def _check_x(x):
    check_tensor("x", x)


def _check_grid(quant_min, quant_max, qtype: str):
    """The integer grid's bounds (None for e4m3 -> (-448, 448)); named errors."""
    if qtype not in R.QTYPES:
        raise ValueError(f"qtype must be one of {R.QTYPES}, got {qtype!r}")
    if qtype == "e4m3":
        if (quant_min, quant_max) not in ((None, None), E4M3_RANGE):
            raise ValueError(
                f"qtype='e4m3' saturates at +-448: quant_min / quant_max must be None or -448 / 448, got "
                f"{quant_min} / {quant_max}"
            )
        return E4M3_RANGE
    for name, v in (("quant_min", quant_min), ("quant_max", quant_max)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise TypeError(f"{name} must be an int, got {v!r}")
        if abs(v) > QUANT_LIMIT:
            raise ValueError(f"{name} must be within +-2^24 (exact in fp32), got {v}")
    if quant_min > quant_max:
        raise ValueError(f"quant_min ({quant_min}) must be <= quant_max ({quant_max})")
    return quant_min, quant_max


def _expected_numel(lay: R.Layout) -> int:
    return lay.channels


def _check_scale(scale, x, lay: R.Layout, name: str = "scale"):
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor (or a float for per-tensor), got {type(scale).__name__}")
    if scale.device != x.device:
        raise ValueError(f"{name} is on {scale.device} but x is on {x.device}")
    if scale.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"{name} has dtype {scale.dtype}; supported: float32, bfloat16, float16")
    k = _expected_numel(lay)
    if lay.mode == "channel" and scale.dim() != 1:
        raise ValueError(f"{name} must be 1-D (C,) for per-channel quantization, got shape {tuple(scale.shape)}")
    if scale.numel() != k:
        what = {"tensor": "1 (per-tensor)", "channel": f"C = {k} (x.shape[axis])", "group": f"N / group_size = {k}"}[
            lay.mode
        ]
        raise ValueError(f"{name} must have {what} elements, got shape {tuple(scale.shape)}")


def _check_zero_point(zp, x, lay: R.Layout, floating_only: bool = False, name: str = "zero_point"):
    allowed = (torch.float32, torch.bfloat16, torch.float16) + (() if floating_only else (torch.int32, torch.int64))
    if not isinstance(zp, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(zp).__name__}")
    if zp.device != x.device:
        raise ValueError(f"{name} is on {zp.device} but x is on {x.device}")
    if zp.dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        raise TypeError(f"{name} has dtype {str(zp.dtype).replace('torch.', '')}; supported: {names}")
    if zp.numel() != _expected_numel(lay):
        raise ValueError(
            f"{name} must have as many elements as scale ({_expected_numel(lay)}), got shape {tuple(zp.shape)}"
        )


def _layout(x, axis, group_size) -> R.Layout:
    lay = R.layout_of(x.shape, axis, group_size)
    if lay.mode != "tensor" and (lay.inner > INDEX32_LIMIT or lay.channels > INDEX32_LIMIT):
        raise ValueError(f"x {tuple(x.shape)}: a per-scale extent of 2^31 elements or more is not supported")
    return lay


# --- operands --------------------------------------------------------------------------------------------------------
def _flat(t: torch.Tensor) -> torch.Tensor:
    """t as a flat contiguous tensor with a 16-byte aligned base (a view when it already is, else a copy)."""
    if not t.is_contiguous() or t.data_ptr() % 16:
        t = fresh_copy(t)
    return t.view(-1)


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).to(torch.float32).contiguous()


def _zp_operand(zp, lay: R.Layout, device):
    """(zero point tensor as the kernel reads it, its rule)."""
    if zp is None:
        return placeholder(device, (lay.channels,), torch.int32), "int"
    if zp.dtype in (torch.int32, torch.int64):
        return zp.reshape(-1).to(torch.int32).contiguous(), "int"
    return _f32(zp), "float"


def _wide(n: int, sms: int) -> bool:
    """64-bit indexing: past 2^31 elements, or where the 32-bit walk would wrap (`GridStride.index32_ok`)."""
    return n > INDEX32_LIMIT or (n >= 2**24 and not QAT_MAP.index32_ok(n, MASK_VEC, sms))


def _new(t: torch.Tensor) -> torch.Tensor:
    """A contiguous output of t's shape and dtype (by torch.empty, which the GPU tests poison with NaN)."""
    return torch.empty(t.shape, dtype=t.dtype, device=t.device)


def mask_numel(n: int) -> int:
    """Bytes of the packed STE mask of n elements."""
    return -(-n // MASK_VEC)


def _launch_fake_quant(x, y, m, scale_t, zp_t, rule, flag, lay, qmin, qmax, qtype, s_arg=None, z_arg=None):
    """Run `qat.fake_quant` on flat x -> flat y (and m, the packed mask, unless None)."""
    dev = x.get_device()
    sms = num_sms(dev)
    n = x.numel()
    if s_arg is not None:
        mode = "scalar"
    elif lay.mode == "tensor":
        mode = "tensor"
    else:
        mode = "vector" if lay.inner % MASK_VEC == 0 else "element"
    if qtype == "e4m3" or mode == "scalar":
        rule = "int"
    walk = QAT_QUANTIZE_MAP if QUANTIZE_DESCENDING and mode == "tensor" else QAT_MAP
    fn = FAKE_QUANT.compiled(
        walk,
        dtype=dtypes.name_of(x.dtype),
        index64=_wide(n, sms),
        qtype=qtype,
        zp=rule,
        mode=mode,
        mask=m is not None,
        gated=flag is not None,
    )
    z_dt = torch.int32 if rule == "int" else torch.float32
    fn(
        x,
        y,
        m if m is not None else placeholder(x.device, (1,), torch.uint8),
        scale_t if scale_t is not None else placeholder(x.device, (1,), torch.float32),
        zp_t if zp_t is not None and zp_t.dtype == z_dt else placeholder(x.device, (1,), z_dt),
        flag if flag is not None else placeholder(x.device, (1,), torch.int64),
        float(s_arg if s_arg is not None else 1.0),
        float(z_arg if z_arg is not None else 0.0),
        int(lay.inner) if mode in ("vector", "element") else 1,
        int(lay.channels) if mode in ("vector", "element") else 1,
        float(qmin),
        float(qmax),
        walk.max_ctas(sms),
    )


# --- fake_quant ------------------------------------------------------------------------------------------------------
def _fq_check(x, scale, zero_point, quant_min, quant_max, axis, group_size, qtype, enabled):
    _check_x(x)
    lay = _layout(x, axis, group_size)
    qmin, qmax = _check_grid(quant_min, quant_max, qtype)
    _check_scale(scale, x, lay)
    if zero_point is not None:
        if qtype == "e4m3":
            raise ValueError("qtype='e4m3' has no zero point: pass zero_point=None")
        _check_zero_point(zero_point, x, lay)
    if enabled is not None:
        if enabled.dtype != torch.int64 or enabled.numel() != 1 or enabled.device != x.device:
            raise ValueError(
                f"enabled must be a 1-element int64 tensor on {x.device}, got {enabled.dtype} "
                f"{tuple(enabled.shape)} on {enabled.device}"
            )
    return lay, qmin, qmax


def _fq_outputs(x, with_mask):
    y = _new(x)
    m = torch.empty(mask_numel(x.numel()) if with_mask else 0, dtype=torch.uint8, device=x.device)
    return y, m


def _fq_fake(x, scale, zero_point, quant_min, quant_max, axis, group_size, qtype, enabled, with_mask):
    _fq_check(x, scale, zero_point, quant_min, quant_max, axis, group_size, qtype, enabled)
    return _fq_outputs(x, with_mask)


def _fq_cuda(x, scale, zero_point, quant_min, quant_max, axis, group_size, qtype, enabled, with_mask):
    lay, qmin, qmax = _fq_check(x, scale, zero_point, quant_min, quant_max, axis, group_size, qtype, enabled)
    y, m = _fq_outputs(x, with_mask)
    if x.numel():
        zp_t, rule = _zp_operand(zero_point, lay, x.device)
        _launch_fake_quant(
            _flat(x), y.view(-1), m if with_mask else None, _f32(scale), zp_t, rule, enabled, lay, qmin, qmax, qtype
        )
    return y, m


def _fq_scalar_check(x, scale, zero_point, quant_min, quant_max, qtype):
    _check_x(x)
    qmin, qmax = _check_grid(quant_min, quant_max, qtype)
    if not isinstance(scale, (int, float)) or not scale > 0 or not math.isfinite(scale):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    if qtype == "int" and not quant_min <= zero_point <= quant_max:
        raise ValueError(f"zero_point ({zero_point}) must be between quant_min and quant_max")
    if qtype == "e4m3" and zero_point != 0:
        raise ValueError("qtype='e4m3' has no zero point: pass zero_point=None")
    return qmin, qmax


def _fq_scalar_fake(x, scale, zero_point, quant_min, quant_max, qtype, with_mask):
    _fq_scalar_check(x, scale, zero_point, quant_min, quant_max, qtype)
    return _fq_outputs(x, with_mask)


def _fq_scalar_cuda(x, scale, zero_point, quant_min, quant_max, qtype, with_mask):
    qmin, qmax = _fq_scalar_check(x, scale, zero_point, quant_min, quant_max, qtype)
    y, m = _fq_outputs(x, with_mask)
    if x.numel():
        s32 = float(torch.tensor(scale, dtype=torch.float32))  # torch passes the scale as a float
        _launch_fake_quant(
            _flat(x),
            y.view(-1),
            m if with_mask else None,
            None,
            None,
            "int",
            None,
            R.Layout("tensor", 1, 1, x.numel()),
            qmin,
            qmax,
            qtype,
            s_arg=s32,
            z_arg=zero_point,
        )
    return y, m


def _fq_setup(ctx, inputs, output):
    y, m = output
    ctx.mark_non_differentiable(m)
    ctx.save_for_backward(m)
    ctx.with_mask = inputs[-1]
    ctx.n_inputs = len(inputs)


def _fq_backward(ctx, dy, dm=None):
    (m,) = ctx.saved_tensors
    if not ctx.with_mask:
        raise RuntimeError(
            "fake_quant ran with with_mask=False (no STE mask kept): call it with with_mask=True where "
            "it must be differentiated"
        )
    return (call("cute_kernels::fake_quant_backward", dy, m),) + (None,) * (ctx.n_inputs - 1)


def _ste_check(dy, mask):
    check_tensor("dy", dy)
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.uint8 or mask.dim() != 1:
        raise TypeError(f"mask must be the packed uint8 STE mask (1-D), got {getattr(mask, 'dtype', type(mask))}")
    if mask.numel() != mask_numel(dy.numel()):
        raise ValueError(
            f"mask has {mask.numel()} bytes but dy has {dy.numel()} elements (expected "
            f"{mask_numel(dy.numel())} bytes, 8 elements each)"
        )
    if mask.device != dy.device:
        raise ValueError(f"mask is on {mask.device} but dy is on {dy.device}")


def _ste_fake(dy, mask):
    _ste_check(dy, mask)
    return _new(dy)


def _ste_cuda(dy, mask):
    dx = _ste_fake(dy, mask)
    n = dy.numel()
    if n:
        sms = num_sms(dy.get_device())
        fn = STE_BWD.compiled(QAT_MAP, dtype=dtypes.name_of(dy.dtype), index64=_wide(n, sms))
        fn(_flat(dy), dx.view(-1), mask, QAT_MAP.max_ctas(sms))
    return dx


register_op("cute_kernels::fake_quant_backward", "(Tensor dy, Tensor mask) -> Tensor", _ste_cuda, _ste_fake)
register_op(
    "cute_kernels::fake_quant",
    "(Tensor x, Tensor scale, Tensor? zero_point, int quant_min, int quant_max, int? axis, int? group_size, "
    "str qtype, Tensor? enabled, bool with_mask) -> (Tensor, Tensor)",
    _fq_cuda,
    _fq_fake,
    _fq_backward,
    _fq_setup,
)
register_op(
    "cute_kernels::fake_quant_scalar",
    "(Tensor x, float scale, int zero_point, int quant_min, int quant_max, str qtype, bool with_mask) -> "
    "(Tensor, Tensor)",
    _fq_scalar_cuda,
    _fq_scalar_fake,
    _fq_backward,
    _fq_setup,
)


def _needs_mask(x) -> bool:
    return torch.is_grad_enabled() and isinstance(x, torch.Tensor) and x.requires_grad


def _fake_quant(x, scale, zero_point, quant_min, quant_max, axis, group_size, qtype, with_mask):
    if qtype == "e4m3" and quant_min is None and quant_max is None:
        quant_min, quant_max = E4M3_RANGE
    if quant_min is None or quant_max is None:
        raise ValueError(f"quant_min and quant_max are required for qtype={qtype!r} (e.g. -128 / 127 for int8)")
    if isinstance(scale, (int, float)) and not isinstance(scale, bool):
        if axis is not None or group_size is not None:
            raise ValueError("a number scale is per-tensor: per-channel / per-group take a scale tensor")
        if zero_point is not None and not isinstance(zero_point, int):
            raise TypeError(f"with a number scale, zero_point must be an int or None, got {type(zero_point).__name__}")
        return call(
            "cute_kernels::fake_quant_scalar",
            x,
            float(scale),
            int(zero_point or 0),
            quant_min,
            quant_max,
            qtype,
            with_mask,
        )
    if isinstance(zero_point, int) and not isinstance(zero_point, bool):
        zero_point = torch.full(
            (1,) if axis is None and group_size is None else tuple(scale.shape),
            zero_point,
            dtype=torch.int32,
            device=x.device,
        )
    return call(
        "cute_kernels::fake_quant", x, scale, zero_point, quant_min, quant_max, axis, group_size, qtype, None, with_mask
    )


def fake_quant(
    x: torch.Tensor,
    scale,
    zero_point=None,
    quant_min: int | None = None,
    quant_max: int | None = None,
    axis: int | None = None,
    group_size: int | None = None,
    qtype: str = "int",
) -> torch.Tensor:
    """Fake-quantize x (module doc): y = (clamp(rint(x / scale) + zp, quant_min, quant_max) - zp) * scale, or the
    e4m3 grid; differentiable in x by the STE (dx = dy where rint(x / scale) + zp was in range, 0 elsewhere)."""
    return _fake_quant(x, scale, zero_point, quant_min, quant_max, axis, group_size, qtype, _needs_mask(x))[0]


def fake_quant_with_mask(
    x: torch.Tensor,
    scale,
    zero_point=None,
    quant_min: int | None = None,
    quant_max: int | None = None,
    axis: int | None = None,
    group_size: int | None = None,
    qtype: str = "int",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, mask) as torch's `fake_quantize_*_cachemask`: `fake_quant` and its STE mask as a bool tensor of x's shape
    (unpacked from the kernel's bits: one more pass, for inspection and tests)."""
    y, m = _fake_quant(x, scale, zero_point, quant_min, quant_max, axis, group_size, qtype, True)
    return y, unpack_mask(m, x.shape)


def unpack_mask(packed: torch.Tensor, shape) -> torch.Tensor:
    """The bool STE mask of `shape` from the packed bits the forward stores (bit k of byte b: element 8 b + k of the
    flat x)."""
    return R.unpack_mask(packed, shape)


# --- learnable (LSQ / LSQ+) ------------------------------------------------------------------------------------------
def _learn_check(x, scale, zero_point, quant_min, quant_max, axis, group_size):
    _check_x(x)
    lay = _layout(x, axis, group_size)
    qmin, qmax = _check_grid(quant_min, quant_max, "int")
    if not qmin <= 0 <= qmax:
        raise ValueError(f"the learnable fake-quant needs quant_min <= 0 <= quant_max (as torch), got {qmin} / {qmax}")
    _check_scale(scale, x, lay)
    _check_zero_point(zero_point, x, lay, floating_only=True)
    return lay, qmin, qmax


def _learn_fake(x, scale, zero_point, quant_min, quant_max, axis, group_size, grad_factor):
    _learn_check(x, scale, zero_point, quant_min, quant_max, axis, group_size)
    return _new(x)


def _learn_cuda(x, scale, zero_point, quant_min, quant_max, axis, group_size, grad_factor):
    lay, qmin, qmax = _learn_check(x, scale, zero_point, quant_min, quant_max, axis, group_size)
    y = _new(x)
    if x.numel():
        _launch_fake_quant(
            _flat(x), y.view(-1), None, _f32(scale), _f32(zero_point), "round", None, lay, qmin, qmax, "int"
        )
    return y


def _rows_layout(lay: R.Layout):
    """(rows, row length, rows per channel) of the learnable backward's row view, and whether x must be gathered
    channel-first: per-channel rows (the inner extent) shorter than `_MIN_ROW` would leave the last CTA summing a
    partial per element, so such x is moved channel-first (one copy in, one out) and read as C rows."""
    if lay.mode == "tensor":
        return 1, lay.inner, 1, False
    if lay.mode == "channel" and lay.inner < _MIN_ROW and lay.outer > 1:
        return lay.channels, lay.outer * lay.inner, 1, True
    return lay.outer * lay.channels, lay.inner, lay.outer, False


def _as_rows(t: torch.Tensor, rows: int, length: int, vec: int) -> torch.Tensor:
    v = t.reshape(rows, length)
    if rows == 1:  # a single row: its stride is never used; give it one the kernel's divisibility accepts
        v = v.as_strided((1, length), (-(-max(length, 1) // 16) * 16, 1))
    return v


def _learn_bwd_fake(dy, x, scale, zero_point, quant_min, quant_max, axis, group_size, grad_factor):
    _learn_check(x, scale, zero_point, quant_min, quant_max, axis, group_size)
    check_tensor("dy", dy)
    if dy.shape != x.shape or dy.dtype != x.dtype:
        raise ValueError(f"dy ({dy.dtype}, {tuple(dy.shape)}) must match x ({x.dtype}, {tuple(x.shape)})")
    return (
        _new(x),
        torch.empty_like(scale),
        torch.empty_like(zero_point),
    )


def _learn_bwd_cuda(dy, x, scale, zero_point, quant_min, quant_max, axis, group_size, grad_factor):
    lay, qmin, qmax = _learn_check(x, scale, zero_point, quant_min, quant_max, axis, group_size)
    dx, ds, dz = _learn_bwd_fake(dy, x, scale, zero_point, quant_min, quant_max, axis, group_size, grad_factor)
    if x.numel() == 0:
        return dx, ds.zero_(), dz.zero_()
    rows, length, per_channel, gather = _rows_layout(lay)
    if gather:  # (outer, C, inner) -> (C, outer, inner)

        def move(t):
            return t.reshape(lay.outer, lay.channels, lay.inner).transpose(0, 1).contiguous()

        xs, gs = move(x), move(dy)
        dxs = torch.empty_like(xs)
    else:
        xs, gs, dxs = _flat(x), _flat(dy), dx.view(-1)
    dev = x.get_device()
    sms = num_sms(dev)
    es = x.element_size()
    vec = 16 // es
    aligned = (rows == 1 or length % vec == 0) and xs.data_ptr() % 16 == 0 and gs.data_ptr() % 16 == 0
    vec = vec if aligned else 1
    plan = plan_rows(rows, -(-length // vec), sms, **LEARNABLE_PLAN)
    merge = per_channel > 1 or plan.splits > 1
    chans = lay.channels
    partial = (
        torch.empty(rows, plan.splits, 2, dtype=torch.float32, device=x.device)
        if merge
        else placeholder(x.device, (1, 1, 2), torch.float32)
    )
    out_s = torch.empty(chans, dtype=torch.float32, device=x.device)
    out_z = torch.empty(chans, dtype=torch.float32, device=x.device)
    t = plan.tiling
    fn = LEARNABLE_BWD.compiled(
        t,
        dtype=dtypes.name_of(x.dtype),
        aligned=aligned,
        index64=x.numel() > INDEX32_LIMIT,
        zp="half_up" if lay.mode == "tensor" else "round",
        merge=merge,
    )
    fn(
        _as_rows(xs, rows, length, vec),
        _as_rows(gs, rows, length, vec),
        _as_rows(dxs, rows, length, vec),
        _f32(scale),
        _f32(zero_point),
        partial,
        out_s,
        out_z,
        split_counters(x.device, 1),
        plan.splits,
        chans,
        float(qmin),
        float(qmax),
        float(torch.tensor(grad_factor, dtype=torch.float32)),
        plan.max_ctas(sms),
    )
    if gather:
        dx.copy_(dxs.reshape(lay.channels, lay.outer, lay.inner).transpose(0, 1).reshape(x.shape))
    return dx, out_s.to(scale.dtype).reshape(scale.shape), out_z.to(zero_point.dtype).reshape(zero_point.shape)


def _learn_setup(ctx, inputs, output):
    x, scale, zero_point, quant_min, quant_max, axis, group_size, grad_factor = inputs
    ctx.save_for_backward(x, scale, zero_point)
    ctx.args = (quant_min, quant_max, axis, group_size, grad_factor)


def _learn_backward(ctx, dy):
    x, scale, zero_point = ctx.saved_tensors
    dx, ds, dz = call("cute_kernels::fake_quant_learnable_backward", dy, x, scale, zero_point, *ctx.args)
    return dx, ds, dz, None, None, None, None, None


register_op(
    "cute_kernels::fake_quant_learnable_backward",
    "(Tensor dy, Tensor x, Tensor scale, Tensor zero_point, int quant_min, int quant_max, int? axis, "
    "int? group_size, float grad_factor) -> (Tensor, Tensor, Tensor)",
    _learn_bwd_cuda,
    _learn_bwd_fake,
)
register_op(
    "cute_kernels::fake_quant_learnable",
    "(Tensor x, Tensor scale, Tensor zero_point, int quant_min, int quant_max, int? axis, int? group_size, "
    "float grad_factor) -> Tensor",
    _learn_cuda,
    _learn_fake,
    _learn_backward,
    _learn_setup,
)


def fake_quant_learnable(
    x: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor,
    quant_min: int,
    quant_max: int,
    axis: int | None = None,
    group_size: int | None = None,
    grad_factor: float = 1.0,
) -> torch.Tensor:
    """Learnable fake-quant (LSQ / LSQ+), torch's `_fake_quantize_learnable_per_{tensor,channel}_affine` (and
    per-group): the float zero point rounded and clamped in the forward; gradients for x (STE), scale and
    zero_point (times `grad_factor`, e.g. LSQ's 1 / sqrt(numel * quant_max))."""
    return call(
        "cute_kernels::fake_quant_learnable",
        x,
        scale,
        zero_point,
        quant_min,
        quant_max,
        axis,
        group_size,
        float(grad_factor),
    )


# --- the fused observer ----------------------------------------------------------------------------------------------
def _obs_check(
    x, observer_on, fake_quant_on, running_min, running_max, scale, zero_point, quant_min, quant_max, per_channel
):
    _check_x(x)
    if x.numel() == 0:
        raise ValueError("x is empty: the observer needs at least one element")
    if per_channel and x.dim() < 1:
        raise ValueError("per-channel observation needs x with a channel dim (axis 0)")
    _check_grid(quant_min, quant_max, "int")
    c = x.shape[0] if per_channel else 1
    for name, t in (("observer_on", observer_on), ("fake_quant_on", fake_quant_on)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int64 or t.numel() != 1 or t.device != x.device:
            raise ValueError(
                f"{name} must be a 1-element int64 tensor on {x.device}, got "
                f"{getattr(t, 'dtype', type(t))} {tuple(getattr(t, 'shape', ()))}"
            )
    for name, t, dt in (
        ("running_min", running_min, torch.float32),
        ("running_max", running_max, torch.float32),
        ("scale", scale, torch.float32),
        ("zero_point", zero_point, torch.int32),
    ):
        if not isinstance(t, torch.Tensor) or t.dtype != dt or t.device != x.device:
            raise TypeError(
                f"{name} must be a {str(dt).replace('torch.', '')} tensor on {x.device}, got "
                f"{getattr(t, 'dtype', type(t))} on {getattr(t, 'device', None)}"
            )
        if t.numel() != c or not t.is_contiguous():
            raise ValueError(
                f"{name} must be contiguous with {c} element(s) ({'x.shape[0]' if per_channel else '1'}), "
                f"got shape {tuple(t.shape)}"
            )
    return c


def _obs_fake(
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
    per_channel,
    symmetric,
):
    _obs_check(
        x, observer_on, fake_quant_on, running_min, running_max, scale, zero_point, quant_min, quant_max, per_channel
    )


def _obs_cuda(
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
    per_channel,
    symmetric,
):
    rows = _obs_check(
        x, observer_on, fake_quant_on, running_min, running_max, scale, zero_point, quant_min, quant_max, per_channel
    )
    xs = _flat(x)
    length = xs.numel() // rows
    sms = num_sms(x.get_device())
    vec = 16 // x.element_size()
    aligned = rows == 1 or length % vec == 0
    vec = vec if aligned else 1
    plan = plan_rows(rows, -(-length // vec), sms, **OBSERVER_PLAN)
    merge = plan.splits > 1
    partial = (
        torch.empty(rows, plan.splits, 2, dtype=torch.float32, device=x.device)
        if merge
        else placeholder(x.device, (1, 1, 2), torch.float32)
    )
    fn = OBSERVE.compiled(
        plan.tiling,
        dtype=dtypes.name_of(x.dtype),
        aligned=aligned,
        index64=xs.numel() > INDEX32_LIMIT,
        symmetric=bool(symmetric),
        merge=merge,
    )
    fn(
        _as_rows(xs, rows, length, vec),
        observer_on,
        fake_quant_on,
        running_min,
        running_max,
        scale,
        zero_point,
        partial,
        split_counters(x.device, 1),
        plan.splits,
        float(torch.tensor(averaging_const, dtype=torch.float32)),
        int(quant_min),
        int(quant_max),
        plan.max_ctas(sms),
    )


register_op(
    "cute_kernels::qat_observe",
    "(Tensor x, Tensor observer_on, Tensor fake_quant_on, Tensor(a!) running_min, Tensor(b!) running_max, "
    "Tensor(c!) scale, Tensor(d!) zero_point, float averaging_const, int quant_min, int quant_max, "
    "bool per_channel, bool symmetric) -> ()",
    _obs_cuda,
    _obs_fake,
)


# The per-channel fused observer of 16-bit rows in one pass (`qat.observe_rows`: x read once) where the row fits what a
# CTA holds (staged in shared memory); False runs the two passes (`qat.observe`, then `qat.fake_quant`), as per-tensor
# observation does (H100, QATLinear's 4096 x 4096 weight: 43.2 -> 32.3 us; `perf/lab/qat_linear_ab.py`).
ONE_PASS_ROWS = True


def _one_pass_rows(x: torch.Tensor, per_channel: bool) -> bool:
    if not (ONE_PASS_ROWS and per_channel and x.dim() >= 1):
        return False
    rows = x.shape[0]
    length = x.numel() // rows if rows else 0
    shortest = 64 if x.dtype == torch.float32 else MASK_VEC  # fp32: a mask byte's two vectors on two lanes
    longest = observed_row_max(x.element_size())
    return shortest <= length <= longest and length % MASK_VEC == 0 and x.numel() <= INDEX32_LIMIT


def _obs_rows_fake(
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
    symmetric,
    with_mask,
):
    _obs_check(x, observer_on, fake_quant_on, running_min, running_max, scale, zero_point, quant_min, quant_max, True)
    return _fq_outputs(x, with_mask)


def _obs_rows_cuda(
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
    symmetric,
    with_mask,
):
    y, m = _obs_rows_fake(
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
        symmetric,
        with_mask,
    )
    rows = x.shape[0]
    length = x.numel() // rows
    plan = observed_rows_plan(length, x.element_size(), OBSERVE_ROWS_PREFETCH)
    fn = OBSERVE_ROWS.compiled(
        plan.tiling,
        dtype=dtypes.name_of(x.dtype),
        symmetric=bool(symmetric),
        mask=bool(with_mask),
        staging=plan.staging,
        prefetch=plan.prefetch,
    )
    fn(
        _flat(x).view(rows, length),
        y.view(rows, length),
        m if with_mask else placeholder(x.device, (1,), torch.uint8),
        observer_on,
        fake_quant_on,
        running_min,
        running_max,
        scale,
        zero_point,
        float(torch.tensor(averaging_const, dtype=torch.float32)),
        int(quant_min),
        int(quant_max),
        plan.max_ctas(num_sms(x.get_device())),
    )
    return y, m


register_op(
    "cute_kernels::qat_observe_rows",
    "(Tensor x, Tensor observer_on, Tensor fake_quant_on, Tensor(a!) running_min, Tensor(b!) running_max, "
    "Tensor(c!) scale, Tensor(d!) zero_point, float averaging_const, int quant_min, int quant_max, bool symmetric, "
    "bool with_mask) -> (Tensor, Tensor)",
    _obs_rows_cuda,
    _obs_rows_fake,
)


class _ObservedRows(torch.autograd.Function):
    """`qat_observe_rows` (which updates the observer's state in place, so it cannot carry registered autograd)
    differentiable in x by the STE: the mask it stores, then `fake_quant_backward`."""

    @staticmethod
    def forward(ctx, x, *args):
        y, m = call("cute_kernels::qat_observe_rows", x.detach(), *args, True)
        ctx.save_for_backward(m)
        ctx.n_args = len(args)
        return y

    @staticmethod
    def backward(ctx, dy):
        (m,) = ctx.saved_tensors
        return (call("cute_kernels::fake_quant_backward", dy, m),) + (None,) * ctx.n_args


def fake_quant_observed(
    x: torch.Tensor,
    observer_on: torch.Tensor,
    fake_quant_on: torch.Tensor,
    running_min: torch.Tensor,
    running_max: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor,
    averaging_const: float,
    quant_min: int,
    quant_max: int,
    ch_axis: int,
    per_row_fake_quant: bool = False,
    symmetric_quant: bool = False,
) -> torch.Tensor:
    """torch's `fused_moving_avg_obs_fake_quant`: the moving-average min / max observer (running_min / running_max,
    per tensor or per channel along axis 0) and its qparams (scale / zero_point, updated in place when
    fake_quant_on is 1), then the fake-quant with them (x itself where fake_quant_on is 0), differentiable in x by
    the STE. Two passes, the observer's reduce and the fake-quant; per channel, for rows a CTA holds
    (`_one_pass_rows`), one (`qat.observe_rows`): the same bits, x read once."""
    if per_row_fake_quant and ch_axis != 0:
        raise ValueError(f"per-channel fused observation is along axis 0 (as torch), got ch_axis={ch_axis}")
    grad = _needs_mask(x)
    if _one_pass_rows(x, per_row_fake_quant) and not (grad and torch.compiler.is_compiling()):
        # (under torch.compile a differentiable x takes the two registered ops: autograd cannot be registered on an
        # op that mutates its inputs, and the Function above is for eager mode)
        state = (observer_on, fake_quant_on, running_min, running_max, scale, zero_point)
        args = (*state, float(averaging_const), quant_min, quant_max, bool(symmetric_quant))
        if grad:
            return _ObservedRows.apply(x, *args)
        return call("cute_kernels::qat_observe_rows", x, *args, False)[0]
    call(
        "cute_kernels::qat_observe",
        x.detach(),
        observer_on,
        fake_quant_on,
        running_min,
        running_max,
        scale,
        zero_point,
        float(averaging_const),
        quant_min,
        quant_max,
        bool(per_row_fake_quant),
        bool(symmetric_quant),
    )
    return call(
        "cute_kernels::fake_quant",
        x,
        scale,
        zero_point,
        quant_min,
        quant_max,
        0 if per_row_fake_quant else None,
        None,
        "int",
        fake_quant_on,
        _needs_mask(x),
    )[0]
