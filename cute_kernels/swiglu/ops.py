"""Torch ops `cute_kernels::silu`, `::swiglu` and their backward ops (lesson 11).

`swiglu(gate, up) = silu(gate) * up`, fused: one pass reads gate and up and writes the output (3
tensors instead of the 5 of `F.silu(gate) * up`); the backward reads gate, up and dout and writes
dgate and dup in one pass. Math is fp32 with one rounding per output (torch eager rounds silu(gate)
to the input dtype before the multiply, so bf16 results can differ from it by an ulp).
Outputs are contiguous, of the input's shape and dtype. Inputs whose rows (last dim) have unit stride
are read in place with any row stride: a common layout is one (..., 2H) projection split in halves,
`x[..., :H]` and `x[..., H:]`, which costs no copy. Other layouts (a strided last dim, leading dims
that do not collapse to one row stride) are copied to a contiguous buffer first; operands not 16-byte
aligned (base, row stride or row length) take the scalar variant.
"""

from __future__ import annotations

import torch

from cute_kernels import catalog, dtypes
from cute_kernels.swiglu import SWIGLU_TUNED
from cute_kernels.torch_ops import (
    INDEX32_LIMIT,
    aligned16,
    call,
    check_like,
    check_tensor,
    fresh_copy,
    register_op,
    rows_of,
)
from schedules.hardware import num_sms


def _operands(ins: list[torch.Tensor]) -> tuple[list[torch.Tensor], bool]:
    """The inputs as the kernel reads them: flat views when all are contiguous, else (rows, cols) matrices with
    unit column stride (`rows_of`: a view where the leading dims collapse to one row stride, else a copy)."""
    if all(t.is_contiguous() for t in ins):
        return [t.view(-1) for t in ins], False
    return [rows_of(t) for t in ins], True


def _launch(op: str, ins: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
    """Run `swiglu.<op>`: inputs of one shape (any layout, `_operands`), flat contiguous outputs of n >= 1
    elements."""
    ins, strided = _operands(ins)
    n = outs[0].numel()
    sched = SWIGLU_TUNED
    es = outs[0].element_size()
    aligned = aligned16(*ins, *outs)
    span = n
    if strided:  # rows and row strides of whole 16-byte vectors, else the scalar variant
        aligned = aligned and all((t.shape[1] * es) % 16 == 0 and (t.stride(0) * es) % 16 == 0 for t in ins)
        span = max((t.shape[0] - 1) * t.stride(0) + t.shape[1] for t in ins)
    # 64-bit also below 2^31 elements where the 32-bit walk would wrap (`GridStride.index32_ok`)
    wide = max(n, span) > INDEX32_LIMIT or (n >= 2**24 and not sched.index32_ok(
        n, 16 // es if aligned else 1, num_sms(outs[0].get_device())))
    fn = catalog.get(f"swiglu.{op}").compiled(sched, dtype=dtypes.name_of(outs[0].dtype), aligned=aligned, index64=wide,
                                              strided=strided)
    a = ins + [ins[0]] * (3 - len(ins))
    o = outs + [outs[0]] * (2 - len(outs))
    fn(*a, *o, sched.max_ctas(num_sms(outs[0].get_device())))


def _new(x):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


# --- silu ----------------------------------------------------------------------------------------
def _silu_fake(x):
    check_tensor("x", x)
    return _new(x)


def _silu_cuda(x):
    y = _silu_fake(x)
    if y.numel():
        _launch("silu_fwd", [x], [y.view(-1)])
    return y


def _silu_bwd_fake(x, dy):
    check_tensor("x", x)
    check_like("dy", dy, "x", x)
    return _new(x)


def _silu_bwd_cuda(x, dy):
    dx = _silu_bwd_fake(x, dy)
    if dx.numel():
        _launch("silu_bwd", [x, dy], [dx.view(-1)])
    return dx


# --- swiglu --------------------------------------------------------------------------------------
def _swiglu_fake(gate, up):
    check_tensor("gate", gate)
    check_like("up", up, "gate", gate)
    return _new(gate)


def _swiglu_cuda(gate, up):
    out = _swiglu_fake(gate, up)
    if out.numel():
        _launch("swiglu_fwd", [gate, up], [out.view(-1)])
    return out


def _swiglu_bwd_fake(gate, up, dout):
    check_tensor("gate", gate)
    check_like("up", up, "gate", gate)
    check_like("dout", dout, "gate", gate)
    return _new(gate), _new(gate)


def _swiglu_bwd_cuda(gate, up, dout):
    dgate, dup = _swiglu_bwd_fake(gate, up, dout)
    if dgate.numel():
        _launch("swiglu_bwd", [gate, up, dout], [dgate.view(-1), dup.view(-1)])
    return dgate, dup


def _save_inputs(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _silu_backward(ctx, dy):
    (x,) = ctx.saved_tensors
    return call("cute_kernels::silu_backward", x, dy)


def _swiglu_backward(ctx, dout):
    gate, up = ctx.saved_tensors
    return tuple(call("cute_kernels::swiglu_backward", gate, up, dout))


register_op("cute_kernels::silu_backward", "(Tensor x, Tensor dy) -> Tensor", _silu_bwd_cuda, _silu_bwd_fake)
register_op("cute_kernels::swiglu_backward", "(Tensor gate, Tensor up, Tensor dout) -> (Tensor, Tensor)",
            _swiglu_bwd_cuda, _swiglu_bwd_fake)
register_op("cute_kernels::silu", "(Tensor x) -> Tensor", _silu_cuda, _silu_fake, _silu_backward, _save_inputs)
register_op("cute_kernels::swiglu", "(Tensor gate, Tensor up) -> Tensor", _swiglu_cuda, _swiglu_fake,
            _swiglu_backward, _save_inputs)


def silu(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(x) (bf16/fp16/fp32, CUDA), differentiable."""
    return call("cute_kernels::silu", x)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, fused, differentiable (gate and up: same shape and dtype)."""
    return call("cute_kernels::swiglu", gate, up)


# --- SwiGLU with the 1x128 FP8 quantization fused -----------------------------------------------------------------
def _swiglu_quantize_fake(gate, up):
    from cute_kernels.quantize.ops import _quant_1x128_fake

    for name, t in (("gate", gate), ("up", up)):
        check_tensor(name, t, allowed=(torch.bfloat16, torch.float16))
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D (rows, I), got shape {tuple(t.shape)}")
    if up.dtype != gate.dtype or up.shape != gate.shape or up.device != gate.device:
        raise ValueError(f"up ({up.dtype}, {tuple(up.shape)}, {up.device}) must match gate ({gate.dtype}, "
                         f"{tuple(gate.shape)}, {gate.device})")
    return _quant_1x128_fake(gate)


def _swiglu_quantize_cuda(gate, up):
    """The kernel reads rows with unit column stride, I a multiple of 128 and 16-byte aligned rows; other layouts
    copy first, and I off the 128-column block runs swiglu then quantize_1x128 (the bf16 product rounded between)."""
    from cute_kernels.quantize.ops import quantize_1x128
    from cute_kernels.swiglu import SWIGLU_QUANT

    q, s = _swiglu_quantize_fake(gate, up)
    if q.numel() == 0:
        return q, s
    if gate.shape[1] % 128:
        return quantize_1x128(swiglu(gate, up))
    ins = []
    for t in (gate, up):
        if t.stride(1) != 1 or t.stride(0) % 8 or t.data_ptr() % 16:
            t = fresh_copy(t)
        ins.append(t)
    fn = SWIGLU_QUANT.compiled(dtype=dtypes.name_of(gate.dtype))
    fn(*ins, q, s, 16 * num_sms(gate.get_device()))
    return q, s


register_op("cute_kernels::swiglu_quantize", "(Tensor gate, Tensor up) -> (Tensor, Tensor)", _swiglu_quantize_cuda,
            _swiglu_quantize_fake)


def swiglu_quantize(gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, s): silu(gate) * up quantized 1x128 to e4m3 from the fp32 product, in `quantize_1x128`'s layouts (the FP8
    GEMM reads both directly); gate, up (rows, I) bf16 / fp16, row-strided halves welcome. Not differentiable."""
    return call("cute_kernels::swiglu_quantize", gate, up)
