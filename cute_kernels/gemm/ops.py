"""Torch op `cute_kernels::gemm`: act(a @ b + bias) with torch.matmul's semantics for 2-D and 3-D
inputs (lesson 10).

a is (M, K) or (L, M, K), b is (K, N) or (L, K, N) (a 2-D operand is shared by every batch), bf16 or
fp16, either row- or column-major: the kernel reads both majors of both operands directly (TMA +
WGMMA take K-major and MN-major tiles), so `a.t()` or `b.t()` cost nothing. The output is a new
row-major tensor of a's dtype (or `out_dtype`: bf16, fp16 or fp32); fp32 accumulation.

Layouts TMA cannot address are copied first into a contiguous buffer (one extra read and write of
that operand, counted in the benchmarks): no unit-stride dim, a leading stride or base address not
16-byte aligned (e.g. K odd for a row-major bf16 A), or a 2-D operand paired with a batched one
whose batch must be expanded. An output whose row length N is not a multiple of 8 is written into a
padded buffer and returned as a view of it. K = 0 gives act(bias) (or zeros) without a launch.

Torch op `cute_kernels::gemm_swiglu`: silu(a @ b_gate) * (a @ b_up) in one GEMM, the gated product computed on the
fp32 accumulator in the epilogue and only the (M, I) result written (the MLP's gate / up projection and its
activation: no (M, 2I) intermediate, no second pass). b is (K, 2I) with its columns interleaved in blocks of 8
(gate 0-7, up 0-7, gate 8-15, ...): `pack_gate_up(w_gate, w_up)` builds that weight (2I, K) from the two (I, K)
projection weights, and b = packed.t(). A schedule the gated epilogue cannot run (split-K, tile_n not a multiple of
64) runs the plain GEMM and `swiglu` on its de-interleaved halves instead.

Torch op `cute_kernels::addmm`: beta * c + alpha * (a @ b) as torch.addmm (2-D and 3-D like `gemm`), c broadcastable
to the output, in a's dtype: the kernel's epilogue reads c and rounds the fp32 sum once (a residual added where the
projection is written: no second pass). Decode-shaped calls (the streaming kernel's M <= 16) fuse it too.
"""

from __future__ import annotations

import torch

from cute_kernels import dtypes
from cute_kernels.gemv import ops as gv
from cute_kernels.torch_ops import call, check_tensor, register_op
from schedules.gemm import GLU_BLOCK, GemmSchedule, adapted, call_schedule, launch_clusters
from schedules.hardware import num_sms
from schedules.w4a16 import use_stream

AB_TORCH = (torch.bfloat16, torch.float16)
OUT_TORCH = AB_TORCH + (torch.float32,)  # fp32 outputs: plain 64-bit smem stores before the TMA store (no stmatrix)
ACTIVATIONS = ("none", "relu", "gelu", "silu")
_dummy_bias: dict[tuple, torch.Tensor] = {}


def _check(a, b, bias, activation, out_dtype, gated: bool = False):
    for name, t in (("a", a), ("b", b)):
        check_tensor(name, t, allowed=AB_TORCH)
        if t.dim() not in (2, 3):
            raise ValueError(f"{name} must be 2-D or 3-D, got shape {tuple(t.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"a has dtype {a.dtype} but b has {b.dtype}; cast one of them first")
    if a.device != b.device:
        raise ValueError(f"a is on {a.device} but b is on {b.device}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"a {tuple(a.shape)} and b {tuple(b.shape)}: inner dims differ ({a.shape[-1]} vs {b.shape[-2]})")
    if a.dim() == 3 and b.dim() == 3 and a.shape[0] != b.shape[0]:
        raise ValueError(f"a {tuple(a.shape)} and b {tuple(b.shape)}: batch sizes differ")
    if activation not in ACTIVATIONS and not (gated and activation == "swiglu"):
        raise ValueError(f"activation must be one of {ACTIVATIONS[1:]} or None, got {activation!r}")
    if gated and b.shape[-1] % (2 * GLU_BLOCK):
        raise ValueError(f"b {tuple(b.shape)}: its columns are gate / up blocks of {GLU_BLOCK} (pack_gate_up), so "
                         f"N must be a multiple of {2 * GLU_BLOCK}")
    if out_dtype is not None and out_dtype not in OUT_TORCH:
        raise TypeError(f"out_dtype must be bfloat16, float16, float32 or None, got {out_dtype}")
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or bias.dim() != 1 or bias.shape[0] != b.shape[-1]:
            shape = tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__
            raise ValueError(f"bias must be a 1-D tensor of N={b.shape[-1]} elements, got {shape}")
        if bias.device != a.device:
            raise ValueError(f"bias is on {bias.device} but a is on {a.device}")


def _out_shape(a, b, gated: bool = False):
    m, n = a.shape[-2], b.shape[-1] // (2 if gated else 1)
    if a.dim() == 3 or b.dim() == 3:
        return (a.shape[0] if a.dim() == 3 else b.shape[0], m, n)
    return (m, n)


def _tma_ok(t: torch.Tensor, unit: int) -> bool:
    """t (rows, cols, L) view with unit stride on mode `unit`: TMA needs 16-byte aligned base and
    non-unit strides that are multiples of 16 bytes."""
    if t.stride(unit) != 1 and t.shape[unit] > 1:
        return False
    e = t.element_size()
    return t.data_ptr() % 16 == 0 and all(
        (t.stride(i) * e) % 16 == 0 and (t.stride(i) > 0 or t.shape[i] == 1) for i in range(3) if i != unit)


def _operand(x3: torch.Tensor, k_dim: int):
    """x3 as (rows, K, L) for the kernel plus its major ('k' or 'mn'); copies when TMA cannot read it.
    x3 is (L, rows, K) when k_dim == 2 (A), (L, K, rows) when k_dim == 1 (B)."""
    v = x3.permute(1, 2, 0) if k_dim == 2 else x3.permute(2, 1, 0)
    if x3.shape[0] == 1:  # a single batch: its stride is never followed, give it an aligned one
        v = v.as_strided(v.shape, (v.stride(0), v.stride(1), 16 * (v.shape[0] + v.shape[1])))
    if _tma_ok(v, 1):
        return v, "k"
    if _tma_ok(v, 0):
        return v, "mn"
    # Copy into a K-major buffer with an aligned row stride (K padded to 8 elements with zeros).
    rows, k, batch = v.shape
    kp = -(-k // 8) * 8
    buf = torch.zeros(batch, rows, kp, dtype=x3.dtype, device=x3.device)
    buf[:, :, :k] = v.permute(2, 0, 1)
    return buf[:, :, :k].permute(1, 2, 0), "k"


def _compiled(dtype, out_dtype, a_major, b_major, activation, has_bias, sched: GemmSchedule, source: bool = False,
              scale: bool = False):
    """The kernel for `sched` and this signature, from the compile cache (`KernelSpec.compiled`)."""
    from cute_kernels.gemm import GEMM

    return GEMM.compiled(sched, dtype=dtypes.name_of(dtype), out_dtype=dtypes.name_of(out_dtype),
                         a_major="k" if a_major == "k" else "m", b_major="k" if b_major == "k" else "n",
                         activation=activation, bias=has_bias, source=source, scale=scale)


def _gemm_cuda(a, b, bias=None, activation="none", out_dtype=None, schedule: GemmSchedule | None = None,
               alpha: float = 1.0, beta: float = 0.0, c: torch.Tensor | None = None):
    """The op's CUDA body; also the kernel's whole epilogue, act(alpha * (a @ b) + beta * c + bias), with `alpha`,
    `beta` and `c` (the output's shape, any strides, cast to the output dtype) beyond the op's signature."""
    activation = activation or "none"
    gated = activation == "swiglu"  # (gemm_swiglu's body)
    _check(a, b, bias, activation, out_dtype, gated)
    out_dtype = out_dtype or a.dtype
    shape = _out_shape(a, b, gated)
    if c is not None and tuple(c.shape) != tuple(shape):
        raise ValueError(f"c must have the output's shape {tuple(shape)}, got {tuple(c.shape)}")
    if c is not None and c.device != a.device:
        raise ValueError(f"c is on {c.device} but a is on {a.device}")
    source, scale = c is not None and beta != 0.0, alpha != 1.0
    m, n, k = a.shape[-2], b.shape[-1], a.shape[-1]
    batch = shape[0] if len(shape) == 3 else 1
    if m == 0 or n == 0 or batch == 0:
        return torch.empty(shape, dtype=out_dtype, device=a.device)
    if gated and k == 0:
        return torch.zeros(shape, dtype=out_dtype, device=a.device)  # silu(0) * 0
    if k == 0:
        out = torch.zeros(shape, dtype=torch.float32, device=a.device)
        if source:
            out = out + beta * c.float()
        if bias is not None:
            out = out + bias.float()
        return _act_torch(out, activation).to(out_dtype)

    if (schedule is None and (source or not scale) and bias is None and activation == "none"
            and out_dtype == a.dtype and a.dim() == 2 and b.dim() == 2):
        want = gv.STREAM if gv.STREAM is not None else use_stream(m, n, k, dense=True)
        if want and m <= gv.STREAM_MAX_M and gv.stream_ok(a, b.t()):  # decode-shaped x @ W^T, W (N, K) rows
            if source:  # (alpha x W^T + beta c in the kernel's epilogue)
                return gv.skinny(a, b.t(), c=c.to(out_dtype), alpha=alpha, beta=beta)
            return gv.skinny(a, b.t())

    # (L, M, K) and (L, K, N). A batched A with a shared B is one big GEMM (L*M, K) @ (K, N) when A
    # folds; a shared A with a batched B is expanded (and copied by `_operand`).
    batch_fold = a.dim() == 3 and b.dim() == 2 and a.is_contiguous()
    if batch_fold:
        a3, b3 = a.reshape(1, batch * m, k), b.unsqueeze(0)
    else:
        a3 = a if a.dim() == 3 else a.unsqueeze(0).expand(batch, m, k)
        b3 = b if b.dim() == 3 else b.unsqueeze(0).expand(batch, k, n)
    av, a_major = _operand(a3, 2)
    bv, b_major = _operand(b3, 1)
    rows = av.shape[0]
    lb = av.shape[2]
    if schedule is None:
        sched = call_schedule(rows, n, k, a.element_size(), out_dtype.itemsize, a_major == "k", source, gated)
    else:
        sched = adapted(schedule, k, source, gated)
    if gated:
        if sched.gated_error():  # the plain GEMM, then SwiGLU on the de-interleaved halves
            y = _gemm_cuda(a, b, out_dtype=out_dtype, schedule=schedule)
            from cute_kernels.swiglu.ops import swiglu

            gate, up = _glu_halves(y)
            return swiglu(gate, up)
        n = n // 2  # the output's columns from here on
    npad = -(-n // 8) * 8
    out_buf = torch.empty(lb, rows, npad, dtype=out_dtype, device=a.device)
    d = out_buf[:, :, :n].permute(1, 2, 0) if npad != n else out_buf.permute(1, 2, 0)
    if lb == 1:
        d = d.as_strided(d.shape, (d.stride(0), 1, 16 * (rows + npad)))

    if sched.a_rows and (rows > sched.a_rows or a_major != "k"):
        raise ValueError(f"schedule {sched}: a_rows {sched.a_rows} loads only A's first {sched.a_rows} rows of a "
                         f"K-major A; got {rows} rows, A {'K' if a_major == 'k' else 'M'}-major")
    fn = _compiled(a.dtype, out_dtype, a_major, b_major, activation, bias is not None, sched, source, scale)
    sms = num_sms(a.get_device())
    if bias is None:
        bkey = (out_dtype, a.get_device())
        bias_t = _dummy_bias.get(bkey)
        if bias_t is None:
            bias_t = _dummy_bias[bkey] = torch.zeros(8, dtype=out_dtype, device=a.device)
    else:
        bias_t = bias if bias.dtype == out_dtype else bias.to(out_dtype)
    tm, tn = -(-rows // sched.tile_m), -(-n // (sched.tile_n // 2 if gated else sched.tile_n))
    max_clusters = launch_clusters(tm, tn, lb, sched, sms, a.get_device())
    c3 = d
    if source:  # c as the kernel's (rows, n, L) view, like d
        cc = c.to(out_dtype).reshape(lb, rows, n)
        c3 = cc.permute(1, 2, 0)
    if sched.split_k > 1:
        _split_k(fn, av, bv, out_buf, bias_t, sched, max_clusters, sms, alpha)
    else:
        fn(av, bv, d, c3, bias_t, float(alpha), float(beta) if source else 0.0, max_clusters)
    out = out_buf if npad == n else out_buf[:, :, :n]
    if batch_fold:
        return out.view(batch, m, n) if npad == n else out.reshape(batch, m, n)
    return out[0] if len(shape) == 2 else out


_flags: dict = {}


def split_buffers(sched: GemmSchedule, batch: int, rows: int, npad: int, device):
    """A split-K launch's buffers: a fresh fp32 workspace (S * L, M, Np) and, with `sched.split_fixup`,
    the per-tile arrival counts (else None). The counts are zeroed once per (device, stream), grown when
    needed; every launch leaves them zero (the last split of each tile resets its flag), and launches on
    two streams never share them. Shared by the bf16 and FP8 GEMM ops."""
    splits = sched.split_k
    if splits * batch * rows * npad >= 2**31:
        raise ValueError(f"split_k={splits}: the workspace of {splits} x {batch * rows * npad} fp32 elements "
                         "needs 64-bit indexing; use split_k=1 for this shape")
    ws = torch.empty(splits * batch, rows, npad, dtype=torch.float32, device=device)
    if not sched.split_fixup:
        return ws, None
    tiles = -(-rows // sched.tile_m) * -(-npad // sched.tile_n) * batch
    key = (device, torch.cuda.current_stream(device).cuda_stream)
    flags = _flags.get(key)
    if flags is None or flags.numel() < tiles:
        flags = _flags[key] = torch.zeros(max(tiles, 1024), dtype=torch.int32, device=device)
    return ws, flags


def _split_k(fn, av, bv, out_buf, bias_t, sched: GemmSchedule, max_clusters, sms, alpha=1.0):
    """Split-K launch: a fresh fp32 workspace (S, L, M, Np) per call, the GEMM's partials into it,
    the summing pass into out_buf (L, M, Np); with `sched.split_fixup` the GEMM's last split of each
    tile sums them itself (one launch)."""
    from cute_kernels.gemm.kernels import REDUCE_SCHEDULE, REDUCE_VEC

    lb, rows, npad = out_buf.shape
    ws, flags = split_buffers(sched, lb, rows, npad, out_buf.device)
    if flags is not None:
        fn(av, bv, out_buf.permute(1, 2, 0), ws.permute(1, 2, 0), flags, bias_t, float(alpha), max_clusters)
        return
    reduce_ctas = REDUCE_SCHEDULE.grid(out_buf.numel() // REDUCE_VEC, sms)
    fn(av, bv, out_buf.permute(1, 2, 0), ws.permute(1, 2, 0), bias_t, float(alpha), max_clusters, reduce_ctas)


def _act_torch(x, activation):
    if activation == "relu":
        return torch.relu(x)
    if activation == "gelu":
        return torch.nn.functional.gelu(x)
    if activation == "silu":
        return torch.nn.functional.silu(x)
    return x


def _gemm_fake(a, b, bias=None, activation="none", out_dtype=None):
    activation = activation or "none"
    _check(a, b, bias, activation, out_dtype)
    return torch.empty(_out_shape(a, b), dtype=out_dtype or a.dtype, device=a.device)


def _setup(ctx, inputs, output):
    a, b, bias, activation, out_dtype = inputs
    ctx.save_for_backward(a, b, bias)
    ctx.activation = activation or "none"


def _operand_grads(a, b, g, needs):
    """(dL/da, dL/db) of a @ b from dL/d(a @ b) = g (None where `needs` says no): the forward kernel with transposed
    (free: other-major) operands, a shared 2-D operand's gradient summed over the batch."""
    ga = gb = None
    if needs[0]:
        ga = gemm(g, b.transpose(-1, -2))
        if a.dim() == 2 and ga.dim() == 3:
            ga = ga.sum(0)
    if needs[1]:
        gb = gemm(a.transpose(-1, -2), g)
        if b.dim() == 2 and gb.dim() == 3:
            gb = gb.sum(0)
    return ga, gb


def _backward(ctx, g):
    """d(act(a @ b + bias)): the pre-activation is recomputed by one more GEMM when an activation is
    fused (no extra memory kept); both operand gradients reuse the forward kernel with transposed
    (free: other-major) operands."""
    a, b, bias = ctx.saved_tensors
    g = g.to(a.dtype) if ctx.activation == "none" else g  # an fp32 output's gradient: the operands' dtype
    if ctx.activation != "none":
        with torch.enable_grad():
            pre = gemm(a.detach(), b.detach(), bias.detach() if bias is not None else None).float().requires_grad_()
            (g,) = torch.autograd.grad(_act_torch(pre, ctx.activation), pre, g.float())
        g = g.to(a.dtype)
    ga, gb = _operand_grads(a, b, g, ctx.needs_input_grad)
    gbias = None
    if bias is not None and ctx.needs_input_grad[2]:
        gbias = g.reshape(-1, g.shape[-1]).float().sum(0).to(bias.dtype)
    return ga, gb, gbias, None, None


register_op("cute_kernels::gemm", "(Tensor a, Tensor b, Tensor? bias=None, str? activation=None, "
            "ScalarType? out_dtype=None) -> Tensor", _gemm_cuda, _gemm_fake, _backward, _setup)


def gemm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, activation: str | None = None,
         out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """act(a @ b + bias) like torch.matmul for 2-D/3-D bf16/fp16 inputs (fp32 accumulation); the output
    in a's dtype or `out_dtype` (bf16, fp16, fp32)."""
    return call("cute_kernels::gemm", a, b, bias, activation, out_dtype)


def gemm_ladder(a: torch.Tensor, b: torch.Tensor, rung: str = "register", out_dtype: torch.dtype | None = None):
    """a @ b for 2-D inputs on the CUDA cores: the SIMT rungs of lesson 10's ladder ("smem": shared-
    memory tiled, one output per thread; "register": 8x8 outputs per thread), for study and for the
    benchmark's roofline steps. Not a registered op: use `gemm` in models. Inputs whose last dim is
    not unit-stride are copied."""
    from cute_kernels.gemm import GEMM_SIMT, RUNGS

    if rung not in RUNGS:
        raise ValueError(f"rung must be one of {tuple(RUNGS)}, got {rung!r}")
    for name, t in (("a", a), ("b", b)):
        check_tensor(name, t)
        if t.dim() != 2:
            raise ValueError(f"{name} must be a 2-D torch.Tensor, got shape {tuple(t.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"a has dtype {a.dtype} but b has {b.dtype}; cast one of them first")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"a {tuple(a.shape)} and b {tuple(b.shape)}: inner dims differ")
    out_dtype = out_dtype or a.dtype
    a = a if a.stride(1) == 1 else a.contiguous()
    b = b if b.stride(1) == 1 else b.contiguous()
    out = torch.empty(a.shape[0], b.shape[1], dtype=out_dtype, device=a.device)
    if out.numel():
        fn = GEMM_SIMT.compiled(dtype=dtypes.name_of(a.dtype), out_dtype=dtypes.name_of(out_dtype), **RUNGS[rung])
        fn(a, b, out)
    return out


# --- addmm -------------------------------------------------------------------------------------------------------
def _addmm_check(c, a, b):
    _check(a, b, None, "none", None)
    check_tensor("c", c, allowed=AB_TORCH)
    if c.dtype != a.dtype:
        raise TypeError(f"c has dtype {c.dtype} but a has {a.dtype} (the output's); cast it first")
    if c.device != a.device:
        raise ValueError(f"c is on {c.device} but a is on {a.device}")
    shape = _out_shape(a, b)
    try:
        ok = torch.broadcast_shapes(tuple(c.shape), shape) == shape
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"c {tuple(c.shape)} must broadcast to the output's shape {shape}")
    return shape


def _addmm_cuda(c, a, b, beta=1.0, alpha=1.0):
    shape = _addmm_check(c, a, b)
    return _gemm_cuda(a, b, alpha=alpha, beta=beta, c=c.expand(shape))


def _addmm_fake(c, a, b, beta=1.0, alpha=1.0):
    return torch.empty(_addmm_check(c, a, b), dtype=a.dtype, device=a.device)


def _addmm_setup(ctx, inputs, output):
    c, a, b, beta, alpha = inputs
    ctx.save_for_backward(a, b)
    ctx.c_shape, ctx.beta, ctx.alpha = tuple(c.shape), beta, alpha


def _addmm_backward(ctx, g):
    """dc: beta g summed over c's broadcast dims; da, db: the GEMM's operand gradients of alpha g."""
    a, b = ctx.saved_tensors
    gc = None
    if ctx.needs_input_grad[0]:
        gc = (g if ctx.beta == 1.0 else g * ctx.beta).sum_to_size(ctx.c_shape)
    ga, gb = _operand_grads(a, b, g if ctx.alpha == 1.0 else g * ctx.alpha, ctx.needs_input_grad[1:3])
    return gc, ga, gb, None, None


register_op("cute_kernels::addmm", "(Tensor c, Tensor a, Tensor b, float beta=1.0, float alpha=1.0) -> Tensor",
            _addmm_cuda, _addmm_fake, _addmm_backward, _addmm_setup)


def addmm(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, beta: float = 1.0, alpha: float = 1.0) -> torch.Tensor:
    """beta * c + alpha * (a @ b) as torch.addmm, for 2-D / 3-D bf16 / fp16 a and b (`gemm`'s layouts) and c in a's
    dtype, broadcastable to the output; fp32 accumulation, c added in the epilogue, one rounding."""
    return call("cute_kernels::addmm", c, a, b, float(beta), float(alpha))


# --- gemm_swiglu ---------------------------------------------------------------------------------------------------
def pack_gate_up(w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
    """The (2I, K) weight of `gemm_swiglu` from the gate and up projections' (I, K) weights: their rows interleaved
    in blocks of 8 (gate 0-7, up 0-7, gate 8-15, ...); I a multiple of 8. Pass its transpose as b."""
    for name, t in (("w_gate", w_gate), ("w_up", w_up)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ValueError(f"{name} must be a 2-D (I, K) tensor, got {getattr(t, 'shape', type(t).__name__)}")
    if w_gate.shape != w_up.shape or w_gate.shape[0] % GLU_BLOCK:
        raise ValueError(f"w_gate {tuple(w_gate.shape)} and w_up {tuple(w_up.shape)} must have one shape (I, K) with "
                         f"I a multiple of {GLU_BLOCK}")
    if w_gate.dtype != w_up.dtype or w_gate.device != w_up.device:
        raise TypeError(f"w_gate ({w_gate.dtype}, {w_gate.device}) and w_up ({w_up.dtype}, {w_up.device}) differ")
    i, k = w_gate.shape
    return torch.stack((w_gate.reshape(i // GLU_BLOCK, GLU_BLOCK, k), w_up.reshape(i // GLU_BLOCK, GLU_BLOCK, k)),
                       1).reshape(2 * i, k)


def _glu_halves(y: torch.Tensor):
    """(gate, up) columns of an (..., 2I) product with `pack_gate_up`'s interleaved columns, each (..., I)."""
    v = y.reshape(*y.shape[:-1], y.shape[-1] // (2 * GLU_BLOCK), 2, GLU_BLOCK)
    return v[..., 0, :].reshape(*y.shape[:-1], -1), v[..., 1, :].reshape(*y.shape[:-1], -1)


def _gemm_swiglu_cuda(a, b):
    return _gemm_cuda(a, b, activation="swiglu")


def _gemm_swiglu_fake(a, b):
    _check(a, b, None, "swiglu", None, True)
    return torch.empty(_out_shape(a, b, True), dtype=a.dtype, device=a.device)


def _swiglu_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _swiglu_backward(ctx, g):
    """The gate / up product recomputed by one plain GEMM (fp32 out; nothing kept from the forward), the gradient
    of silu(gate) * up in fp32, interleaved back into b's column order, then both operand gradients by the forward
    GEMM with transposed (other-major) operands."""
    a, b = ctx.saved_tensors
    gate, up = (t.float() for t in _glu_halves(gemm(a, b, out_dtype=torch.float32)))
    sg = torch.sigmoid(gate)
    g = g.float()
    d_gate = g * up * sg * (1 + gate * (1 - sg))
    d_up = g * gate * sg
    dy = torch.stack((d_gate.reshape(*g.shape[:-1], -1, GLU_BLOCK), d_up.reshape(*g.shape[:-1], -1, GLU_BLOCK)),
                     -2).reshape(*g.shape[:-1], -1).to(a.dtype)
    return _operand_grads(a, b, dy, ctx.needs_input_grad)


def gemm_swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """silu(a @ b_gate) * (a @ b_up) for 2-D / 3-D bf16 / fp16 inputs, b (K, 2I) with gate / up columns interleaved
    in blocks of 8 (`pack_gate_up(w_gate, w_up).t()`); output (M, I) in a's dtype, the product from the fp32
    accumulator, rounded once."""
    return call("cute_kernels::gemm_swiglu", a, b)


register_op("cute_kernels::gemm_swiglu", "(Tensor a, Tensor b) -> Tensor", _gemm_swiglu_cuda, _gemm_swiglu_fake,
            _swiglu_backward, _swiglu_setup)
