"""Torch ops `cute_kernels::copy`, `::add`, `::axpby` (lesson 1).

Outputs are new contiguous tensors of the input's shape and dtype. A non-contiguous input is first
copied into a contiguous buffer (one extra read and write of it); operands whose data pointer is not
16-byte aligned (a view with an odd offset) take the scalar variant of the kernel instead of the
128-bit one. Math is fp32 with one rounding to the output dtype, as in torch.
"""

from __future__ import annotations

import torch

from cute_kernels import catalog, dtypes
from cute_kernels.torch_ops import INDEX32_LIMIT, call, check_like, check_tensor, flat, register_op
from schedules.bulk_chunks import SIZE_CLASSES as _BULK_CLASSES
from schedules.bulk_chunks import BulkChunks
from schedules.bulk_chunks import pick as pick_bulk
from schedules.grid_stride import GridStride, pick
from schedules.hardware import num_sms

_CHECK32_FROM = 2**24
_fns: dict[tuple, object] = {}


def _launch(op: str, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, a: float, b: float,
            schedule: GridStride | BulkChunks | None = None) -> None:
    """Run kernel `elementwise.<op>` on flat contiguous tensors (n >= 1) under the tuned schedule
    for its size (or `schedule`). The common case costs one dict lookup: a launch memo holds the compiled
    function (from the compile cache) and its grid cap per (op, dtype, alignment, index width, schedule, device).
    A `BulkChunks` schedule (copy only) runs the TMA bulk-copy kernel; operands that are not 16-byte
    aligned take the grid-stride kernel instead. Without `schedule`, copy takes the bulk kernel in
    the sizes `schedules.bulk_chunks.SIZE_CLASSES` lists (none yet)."""
    n = out.numel()
    aligned = x.data_ptr() % 16 == 0 and y.data_ptr() % 16 == 0 and out.data_ptr() % 16 == 0
    sched = schedule
    if sched is None and _BULK_CLASSES and aligned:
        sched = pick_bulk(op, n * out.element_size())
    bulk = type(sched) is BulkChunks
    if bulk and (op != "copy" or not aligned):
        if op != "copy":
            raise ValueError(f"a BulkChunks schedule is for copy only, got op {op!r}")
        sched, bulk = None, False
    sched = sched or pick(op, n * out.element_size())
    dev = out.get_device()
    # 64-bit indices past 2^31 - 1 elements, and below that where the 32-bit grid arithmetic would
    # wrap (`GridStride.index32_ok`; never under 2^24 elements for any unroll < 127). The bulk
    # kernel's 32-bit indices stay below n.
    wide = n > INDEX32_LIMIT or (not bulk and n >= _CHECK32_FROM and not sched.index32_ok(
        n, 16 // out.element_size() if aligned else 1, num_sms(dev)))
    key = (op, x.dtype, aligned, wide, id(sched), dev)
    hit = _fns.get(key)
    if hit is None:
        spec = catalog.get(f"elementwise.{op}")
        if bulk:
            fn = spec.compiled(dtype=dtypes.name_of(x.dtype), index64=key[3], mode="bulk",
                               chunk_bytes=sched.chunk_bytes, pieces=sched.pieces)
            cap = 0  # unused: the grid is one CTA per chunk
        else:
            fn = spec.compiled(dtype=dtypes.name_of(x.dtype), aligned=key[2], index64=key[3],
                               threads=sched.threads, unroll=sched.unroll, ctas_per_sm=sched.ctas_per_sm,
                               order=sched.order)
            cap = sched.max_ctas(num_sms(key[5]))
        # Keyed by the schedule's identity (hashing a dataclass costs more than the lookup); keep
        # the schedule alive with the entry so its id is never reused for another one.
        hit = _fns[key] = (fn, cap, sched)
    hit[0](x, y, out, a, b, hit[1])


def _unary_fake(x):
    check_tensor("x", x)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _binary_fake(x, y):
    check_tensor("x", x)
    check_like("y", y, "x", x)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _axpby_fake(a, x, b, y):
    return _binary_fake(x, y)


def _copy_cuda(x):
    out = _unary_fake(x)
    if out.numel():
        xf = flat(x)
        _launch("copy", xf, xf, flat(out), 1.0, 0.0)
    return out


def _add_cuda(x, y):
    out = _binary_fake(x, y)
    if out.numel():
        _launch("add", flat(x), flat(y), flat(out), 1.0, 1.0)
    return out


def _axpby_cuda(a, x, b, y):
    out = _binary_fake(x, y)
    if out.numel():
        _launch("axpby", flat(x), flat(y), flat(out), float(a), float(b))
    return out


def _no_context(ctx, inputs, output):
    pass


def _axpby_setup(ctx, inputs, output):
    ctx.a, ctx.b = inputs[0], inputs[2]


register_op("cute_kernels::copy", "(Tensor x) -> Tensor", _copy_cuda, _unary_fake,
            lambda ctx, g: g, _no_context)
register_op("cute_kernels::add", "(Tensor x, Tensor y) -> Tensor", _add_cuda, _binary_fake,
            lambda ctx, g: (g, g), _no_context)
register_op("cute_kernels::axpby", "(float a, Tensor x, float b, Tensor y) -> Tensor", _axpby_cuda, _axpby_fake,
            lambda ctx, g: (None, g * ctx.a, None, g * ctx.b), _axpby_setup)


# --- public wrappers -----------------------------------------------------------------------------
_FLOATS = frozenset(dtypes.FLOAT_TORCH)


def _eager(op: str, x, y, a: float, b: float):
    """The common eager call in one Python frame: plain contiguous CUDA tensors of one dtype, shape
    and device, no autograd, not traced, 1 <= n < 2^31. Returns None when any of that does not hold,
    and the caller takes the general path (named checks, copies, the registered op). On the GPU
    host's Python every frame and attribute read costs ~0.2-0.5 us, which is why this is flat."""
    if (type(x) is not torch.Tensor or type(y) is not torch.Tensor or not x.is_cuda or x.dtype not in _FLOATS
            or y.dtype is not x.dtype or not x.is_contiguous() or not y.is_contiguous()
            or (y is not x and (x.shape != y.shape or x.get_device() != y.get_device()))
            or torch.compiler.is_compiling()
            or (torch.is_grad_enabled() and (x.requires_grad or y.requires_grad))):
        return None
    n = x.numel()
    if n == 0 or n > INDEX32_LIMIT:
        return None
    out = torch.empty_like(x)
    if x.dim() == 1:
        _launch(op, x, y, out, a, b)
    else:
        _launch(op, x.view(-1), y.view(-1), out.view(-1), a, b)
    return out


def copy(x: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of `x` (bf16/fp16/fp32, CUDA)."""
    out = _eager("copy", x, x, 1.0, 0.0)
    if out is not None:
        return out
    return call("cute_kernels::copy", x)


def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x + y for tensors of the same shape and dtype."""
    out = _eager("add", x, y, 1.0, 1.0)
    if out is not None:
        return out
    return call("cute_kernels::add", x, y)


def axpby(a: float, x: torch.Tensor, b: float, y: torch.Tensor) -> torch.Tensor:
    """a*x + b*y, computed in fp32 and rounded once to the dtype of x and y."""
    out = _eager("axpby", x, y, float(a), float(b))
    if out is not None:
        return out
    return call("cute_kernels::axpby", float(a), x, float(b), y)
