"""Input validation shared by the torch ops. Every error names the argument and what was wrong.

Checks run in both the real and the fake (meta) implementation, so a bad call fails the same way in
eager mode and while `torch.compile` traces.
"""

from __future__ import annotations

import torch

from cute_kernels import dtypes

FLOAT_DTYPES = dtypes.FLOAT_TORCH
# Sizes and offsets past this need a kernel's 64-bit variant; a grid cap of this means no cap.
INDEX32_LIMIT = 2**31 - 1
UNCAPPED = 2**31 - 1


def check_tensor(name: str, t, *, allowed=FLOAT_DTYPES, min_ndim: int = 0) -> None:
    if type(t) is torch.Tensor and t.is_cuda and t.dtype in allowed and t.dim() >= min_ndim:
        return  # the common case, decided in a few attribute reads
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cuda":
        raise ValueError(f"{name} must be on a CUDA device, got device '{t.device}'")
    if t.dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        raise TypeError(f"{name} has dtype {str(t.dtype).replace('torch.', '')}; supported: {names}")
    if t.dim() < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s), got shape {tuple(t.shape)}")


def check_like(name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    """`t` must match `ref` in dtype, device and shape (no broadcasting, no type promotion)."""
    check_tensor(name, t)
    if type(t) is torch.Tensor and t.dtype is ref.dtype and t.shape == ref.shape and t.get_device() == ref.get_device():
        return  # the common case (get_device is cheap, but unavailable on fake CUDA tensors without CUDA)
    if t.dtype != ref.dtype:
        raise TypeError(f"{name} has dtype {t.dtype} but {ref_name} has {ref.dtype}; cast one of them first")
    if t.device != ref.device:
        raise ValueError(f"{name} is on {t.device} but {ref_name} is on {ref.device}")
    if t.shape != ref.shape:
        raise ValueError(
            f"{name} has shape {tuple(t.shape)} but {ref_name} has {tuple(ref.shape)} (broadcasting is not supported)"
        )


def check_out_dtype(name: str, dtype) -> None:
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be one of bfloat16, float16, float32 or None, got {dtype}")


def flat(t: torch.Tensor) -> torch.Tensor:
    """t as a 1-D contiguous tensor, the input every elementwise kernel takes (a view when t is
    contiguous, else a contiguous copy)."""
    if not t.is_contiguous():
        t = t.contiguous()
    return t if t.dim() == 1 else t.view(-1)


def rows_of(x: torch.Tensor) -> torch.Tensor:
    """x as a (M, N) matrix with unit stride along N, the input every row-wise kernel takes (a view
    when possible, else a contiguous copy; a 0-d tensor is one row of one element)."""
    n = x.shape[-1] if x.dim() else 1
    if x.dim() and x.stride(-1) != 1:
        x = x.contiguous()
    try:
        x2 = x.view(-1, n)
    except RuntimeError:
        x2 = x.contiguous().view(-1, n)
    if x2.shape[0] <= 1:  # a single row: its stride is never used; give it one the kernel accepts
        x2 = x2.as_strided((x2.shape[0], n), (-(-max(n, 1) // 16) * 16, 1))
    return x2


_placeholders: dict = {}


def placeholder(device, shape=(1, 1), dtype=torch.int32) -> torch.Tensor:
    """A small zero tensor for a kernel argument that is not read (one per device, shape and dtype, kept)."""
    key = (device, tuple(shape), dtype)
    t = _placeholders.get(key)
    if t is None:
        t = _placeholders[key] = torch.zeros(shape, dtype=dtype, device=device)
    return t


_split_counters: dict = {}


def split_counters(device, n: int) -> torch.Tensor:
    """n int32 counters for a kernel whose last CTA of each cell (a split-K tile, a split-KV row tile) merges the
    splits' partials: zeroed once per device and stream and reset to 0 by each launch's last CTA of every cell, so no
    memset runs per call and a graph may capture the launch (launches of one stream run in order; another stream
    gets its own). Grown, never shrunk; a shape that needs more cells than a capture's warm-up call made would
    allocate during the capture."""
    stream = torch.cuda.current_stream(device).cuda_stream
    key = (device, stream)
    t = _split_counters.get(key)
    if t is None or t.numel() < n:
        t = _split_counters[key] = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
    return t[:n]


def tidy_unit_strides(t: torch.Tensor, every: int = 8) -> torch.Tensor:
    """t with the strides of its size-1 dims (but the last) set to `every`: never used in an index, but a kernel
    compiled for strides divisible by its vector width checks them."""
    dims = list(zip(t.shape[:-1], t.stride()[:-1]))
    if all(sz != 1 or st % every == 0 for sz, st in dims):
        return t
    return t.as_strided(t.shape, [every if sz == 1 else st for sz, st in dims] + [t.stride(-1)])


def aligned16(*ts: torch.Tensor) -> bool:
    return all(t.data_ptr() % 16 == 0 for t in ts)


def fresh_copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of t in a new (allocator-aligned) buffer. `t.contiguous()` is no substitute when t's base is
    misaligned or a size-1 dim has an odd stride: a view whose strides already count as contiguous comes back
    unchanged, misaligned as it was."""
    return t.clone(memory_format=torch.contiguous_format)


def register_op(qualname: str, schema: str, cuda_impl, fake_impl, backward=None, setup_context=None,
                materialize_grads: bool = True) -> None:
    """Define `qualname` with its CUDA implementation and its fake (meta) implementation.

    The fake implementation validates before it allocates, so it also serves as the CPU
    implementation: a CPU tensor gets the named device error instead of the dispatcher's
    missing-kernel error. With `backward`, the op's autograd is registered, and the same `setup_context` and
    `backward` also make the eager `torch.autograd.Function` that `call` uses; `materialize_grads=False` hands its
    backward None for an output that got no gradient (a `backward` that handles None: no zero tensor to fill and
    read; the registered op's autograd, under torch.compile, still passes zeros).
    """
    torch.library.define(qualname, schema)
    torch.library.impl(qualname, "CUDA")(cuda_impl)
    torch.library.impl(qualname, "CPU")(fake_impl)
    torch.library.register_fake(qualname)(fake_impl)
    _IMPLS[qualname] = cuda_impl
    # the positions of the schema's Tensor / Tensor? arguments (`call` checks what the caller passed there)
    ns, name = qualname.split("::")
    _OPS[qualname] = op = getattr(getattr(torch.ops, ns), name)
    _TENSOR_ARGS[qualname] = tuple(
        (i, isinstance(a.type, torch.OptionalType)) for i, a in enumerate(op.default._schema.arguments)
        if isinstance(a.type, torch.TensorType)
        or isinstance(a.type, torch.OptionalType) and isinstance(a.type.getElementType(), torch.TensorType))
    if backward is not None:
        torch.library.register_autograd(qualname, backward, setup_context=setup_context)
        _FUNCTIONS[qualname] = _eager_function(qualname, cuda_impl, backward, setup_context, materialize_grads)


# The CUDA implementation, the registered op, its tensor arguments' positions and, for ops with autograd, the eager
# autograd.Function of each registered op (`call`).
_IMPLS: dict = {}
_OPS: dict = {}
_TENSOR_ARGS: dict = {}
_FUNCTIONS: dict = {}


def _eager_function(qualname: str, cuda_impl, backward, setup_context, materialize_grads: bool = True):
    """`qualname`'s autograd as a `torch.autograd.Function` over its CUDA implementation: the registered
    `setup_context` and `backward`, without the dispatcher and the custom-op autograd wrapper around them. Desk CPU,
    a two-output dummy op with the same registration: 237 us per forward + backward through the dispatcher, 151 us
    with its backward's op called directly, 105 us as a Function (on the H200's host a norm backward's
    autograd call had measured 165-334 us, `perf.host_time`)."""

    def forward(ctx, *args):
        if not materialize_grads:
            ctx.set_materialize_grads(False)
        out = cuda_impl(*args)
        setup_context(ctx, args, out)
        return out

    def backward_(ctx, *grads):
        return backward(ctx, *grads)

    name = qualname.split("::")[-1]
    return type(f"{name}_function", (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward_)})


def call(qualname: str, *args):
    """Run registered op `qualname` on `args` by the cheapest path that keeps its semantics:
    - plain tensors, nothing to differentiate, not being traced (`direct_call_ok`): its CUDA implementation, no
      dispatcher (~30 us of Python for a custom op with autograd); backward formulas run so, grad being off;
    - plain CUDA tensors that need gradients, not traced: its eager autograd.Function (`_eager_function`);
    - else (torch.compile tracing, FakeTensors and other subclasses, double backward of a backward op): the
      registered op, so autograd, FakeTensor and torch.compile see it as usual."""
    # what was passed for the schema's tensors (an absent optional one left out; anything else that is not a plain
    # tensor sends the call to the registered op, whose dispatcher names the argument)
    tensors = [args[i] for i, optional in _TENSOR_ARGS[qualname] if i < len(args) and not (optional and args[i] is None)]
    if direct_call_ok(*tensors):
        return _IMPLS[qualname](*args)
    fn = _FUNCTIONS.get(qualname)
    if fn is not None and not torch.compiler.is_compiling() and all(type(t) is torch.Tensor and t.is_cuda
                                                                    for t in tensors):
        return fn.apply(*args)
    return _OPS[qualname](*args)


def direct_call_ok(*ts) -> bool:
    """True when a public op may call its CUDA implementation directly instead of going through
    the dispatcher (which costs ~30 us of Python for a custom op with autograd): plain tensors, no
    autograd needed, not being traced by torch.compile. Otherwise the registered op runs, so
    autograd, FakeTensor and torch.compile see it as usual."""
    if torch.compiler.is_compiling():
        return False
    grad = torch.is_grad_enabled()
    for t in ts:
        if type(t) is not torch.Tensor or (grad and t.requires_grad):
            return False
    return True
