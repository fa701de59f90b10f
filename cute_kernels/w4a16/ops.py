"""Torch op `cute_kernels::gemm_w4a16`: y = x W^T with W packed int4 (`pack.py`), and the packing helpers.

x (..., K) bf16 / fp16; w_packed (N, K / 8) int32 from `pack_int4`; scales (N, K / group_size) in x's dtype;
zeros (N, K / group_size) integer values in x's dtype, or None (symmetric weights, zero point 8); group_size 32, 64,
128 or K (per channel). Returns y (..., N) in x's dtype, accumulated in fp32 over the dequantized weight
(q - z) * s rounded once to x's dtype, i.e. x @ unpack_int4(...).T.
M = x's rows: up to 64 in one pass of the streaming kernel (`kernels.py`: W by TMA, each weight byte read once,
mma.sync on the dequantized weight; for groups of 128 or more the scale multiplies the group's fp32 partial sums, so
y = x @ ((q - z) s)^T without the weight's rounding); above that the weight is dequantized in one pass
(`dequantize`, `unpack_int4`'s values) and multiplied by `gemm` (0.62-0.85x cuBLAS bf16 at M 1024-4096: a mainloop
with the dequantization in front of WGMMA is still to come).
Up to 16 rows on weights under `schedules.w4a16.STREAM_MIN_WEIGHTS` the tensor-core GEMV mainloop
(`cute_kernels.gemv.mma`) runs instead (ahead there: both are latency-bound); `STREAM` forces either.
`residual` (the output's shape, x's dtype) is added to the fp32 sums in the streaming kernel's and the GEMM's epilogue
(one rounding; after the GEMV mainloop, a second pass). `cute_kernels::gemm_w4a16_swiglu` takes W =
pack_int4(pack_gate_up(w_gate, w_up)) and returns silu(x W_gate^T) * (x W_up^T), the product formed where the kernel
writes y: gate row r and up row r + 8 of each 16-row block meet in one thread of the streaming kernel.
"""

from __future__ import annotations

import torch

from cute_kernels import dtypes
from cute_kernels.torch_ops import INDEX32_LIMIT, call, fresh_copy, placeholder, register_op, split_counters
from cute_kernels.w4a16.pack import _check_group, pack_int4, unpack_int4  # noqa: F401  (re-exported)
from schedules.gemv import plan_gemv_mma
from schedules.hardware import num_sms
from schedules.w4a16 import col_tiles_of, plan_w4a16, splits_for, use_stream

MMA_MAX_M = 16  # rows of x one pass of the tensor-core GEMV mainloop takes
STREAM_MAX_M = 64  # up to here one pass of the streaming kernel; above, dequantize + `gemm`
STREAM = None  # None: by shape (`schedules.w4a16.use_stream`); True / False: always / never (up to 16 rows)


def _check(x, w_packed, scales, zeros, group_size):
    from cute_kernels.torch_ops import check_tensor

    check_tensor("x", x, allowed=(torch.bfloat16, torch.float16), min_ndim=1)
    if not isinstance(w_packed, torch.Tensor) or w_packed.dtype != torch.int32 or w_packed.dim() != 2:
        raise TypeError(f"w_packed must be an int32 (N, K / 8) tensor from pack_int4, got "
                        f"{getattr(w_packed, 'dtype', type(w_packed).__name__)} {tuple(getattr(w_packed, 'shape', ()))}")
    n, kw = w_packed.shape
    k = x.shape[-1]
    if 8 * kw != k:
        raise ValueError(f"w_packed has {kw} words a row = K {8 * kw}, but x has K = {k}")
    g = _check_group(k, group_size)
    want = (n, k // g)
    for name, t in (("scales", scales), ("zeros", zeros)):
        if t is None and name == "zeros":
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != x.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but x has {x.dtype}")
        if tuple(t.shape) != want:
            raise ValueError(f"{name} must be (N, K / group_size) = {want}, got {tuple(t.shape)}")
    for name, t in (("w_packed", w_packed), ("scales", scales), ("zeros", zeros)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}")
    return n, k, g


def _check_extras(x, n, residual, gated):
    """The residual (x's rows x N, x's dtype and device) or the gated weight's N (gate / up blocks of 8)."""
    if gated and n % 16:
        raise ValueError(f"w_packed has N = {n} rows: a gated weight's rows are gate / up blocks of 8 (pack_gate_up), "
                         "so N must be a multiple of 16")
    if residual is not None:
        if not isinstance(residual, torch.Tensor):
            raise TypeError(f"residual must be a torch.Tensor, got {type(residual).__name__}")
        if residual.dtype != x.dtype:
            raise TypeError(f"residual has dtype {residual.dtype} but x has {x.dtype}")
        if residual.device != x.device:
            raise ValueError(f"residual is on {residual.device} but x is on {x.device}")
        if tuple(residual.shape) != (*x.shape[:-1], n):
            raise ValueError(f"residual must have the output's shape {(*x.shape[:-1], n)}, got {tuple(residual.shape)}")


def _fake(x, w_packed, scales, zeros=None, group_size=128, residual=None):
    n, _, _ = _check(x, w_packed, scales, zeros, group_size)
    _check_extras(x, n, residual, False)
    return torch.empty((*x.shape[:-1], n), dtype=x.dtype, device=x.device)


def _swiglu_fake(x, w_packed, scales, zeros=None, group_size=128):
    n, _, _ = _check(x, w_packed, scales, zeros, group_size)
    _check_extras(x, n, None, True)
    return torch.empty((*x.shape[:-1], n // 2), dtype=x.dtype, device=x.device)


def _cuda(x, w_packed, scales, zeros=None, group_size=128, residual=None):
    n, k, g = _check(x, w_packed, scales, zeros, group_size)
    _check_extras(x, n, residual, False)
    return _w4a16(x, w_packed, scales, zeros, n, k, g, residual=residual)


def _swiglu_cuda(x, w_packed, scales, zeros=None, group_size=128):
    n, k, g = _check(x, w_packed, scales, zeros, group_size)
    _check_extras(x, n, None, True)
    return _w4a16(x, w_packed, scales, zeros, n, k, g, gated=True)


def _w4a16(x, w_packed, scales, zeros, n, k, g, residual=None, gated=False):
    """y = x W^T (+ residual), or with `gated` silu(x W_gate^T) * (x W_up^T) over W's interleaved gate / up rows: in
    the streaming kernel's epilogue, in the GEMM's past 64 rows, after the GEMV mainloop (which has no epilogue
    options) as a second pass."""
    out = torch.empty((*x.shape[:-1], n // 2 if gated else n), dtype=x.dtype, device=x.device)
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    if m == 0 or n == 0:
        return out
    y = out.view(m, out.shape[-1])
    r2 = residual.reshape(m, n) if residual is not None else None
    if m > STREAM_MAX_M:
        from cute_kernels.gemm.ops import _gemm_cuda

        wd = dequantize(w_packed, scales, zeros, g).t()
        y.copy_(_gemm_cuda(x2, wd, activation="swiglu") if gated else
                _gemm_cuda(x2, wd, beta=1.0, c=r2) if residual is not None else _gemm_cuda(x2, wd))
        return out
    if x2.stride(-1) != 1 or (m > 1 and x2.stride(0) % 8) or x2.data_ptr() % 16:
        x2 = fresh_copy(x2)
    if m == 1 and x2.stride(0) % 8:  # (a single row's stride is never used; TMA wants it 16-byte aligned)
        x2 = x2.as_strided((1, k), (-(-k // 8) * 8, 1))
    w = _packed_rows(w_packed)
    sms = num_sms(x.get_device())
    if m > MMA_MAX_M or (STREAM if STREAM is not None else use_stream(m, n, k)):
        _stream(x2, w, scales, zeros, g, y, sms, src=r2, gated=gated)
        return out
    full = y if not gated else torch.empty((m, n), dtype=x.dtype, device=x.device)
    plan = plan_gemv_mma(n, k // 4, sms)  # (the plan counts 32-wide chunks; an int4 chunk is 128 k)
    wide = max(n * k // 8, m * k) > INDEX32_LIMIT
    from cute_kernels.w4a16 import W4A16_MMA

    fn = W4A16_MMA.compiled(plan, dtype=dtypes.name_of(x.dtype), cols=m, group=0 if g == k else g,
                            zeros=zeros is not None, index64=wide)
    fn(w, x2, full.t(), scales, zeros if zeros is not None else scales)
    if gated:
        from cute_kernels.gemm.ops import _glu_halves
        from cute_kernels.swiglu.ops import swiglu

        y.copy_(swiglu(*_glu_halves(full)))
    elif residual is not None:
        y.add_(r2)
    return out


def _packed_rows(w_packed):
    """w_packed as the kernels read it: unit inner stride, 16-byte aligned rows (else a contiguous copy)."""
    if w_packed.stride(-1) == 1 and w_packed.stride(0) % 4 == 0 and w_packed.data_ptr() % 16 == 0:
        return w_packed
    return w_packed.contiguous()


def dequantize(w_packed, scales, zeros, g):
    """The dequantized weight (N, K) in the scales' dtype by the one-pass kernel (`unpack_int4`'s values)."""
    from cute_kernels.w4a16 import DEQUANT_TUNED, W4A16_DEQUANT

    n, kw = w_packed.shape
    k = 8 * kw
    if n * k > INDEX32_LIMIT:  # (the kernel indexes in 32 bits)
        return unpack_int4(w_packed, scales, zeros, g)
    w = _packed_rows(w_packed)
    out = torch.empty((n, k), dtype=scales.dtype, device=w.device)
    fn = W4A16_DEQUANT.compiled(DEQUANT_TUNED, dtype=dtypes.name_of(scales.dtype), group=0 if g == k else g,
                                zeros=zeros is not None)
    fn(w, scales, zeros if zeros is not None else scales, out, DEQUANT_TUNED.grid(n * k // 32, num_sms(w.get_device())))
    return out


def _stream(x2, w, scales, zeros, g, y, sms, plan=None, src=None, gated=False):
    """The streaming kernel into y (M, N), or (M, N / 2) `gated`; `src`: a residual (M, N) added to the sums; `plan`: a
    `W4A16Plan` instead of the op's (benchmarks, the lab)."""
    from cute_kernels.w4a16 import W4A16_STREAM

    launch_stream(W4A16_STREAM, x2, w, y, sms, plan, False, scales, zeros, src=src, beta=1.0,
                  group=0 if g == x2.shape[1] else g, zeros=zeros is not None, gated=gated)


def launch_stream(spec, x2, w, y, sms, plan=None, dense=False, scales=None, zero_points=None, src=None, alpha=1.0,
                  beta=0.0, **signature):
    """One launch of a streaming-kernel spec (`w4a16.stream`, or `gemv.stream` with `dense`) for x2 (M, K) and W into
    y (M, N): the plan and split of K (`plan` given: only the split), the split workspace and counters, the compiled
    variant for x2's dtype, M's column tiles and `signature` (the spec's compile parameters, `zeros` among them for
    int4: hence the tensor's other name). Unread scales / zero points pass placeholders. `src` (M, N) in y's dtype:
    y = alpha x W^T + beta src (gemv.stream's `source` variant)."""
    m, k = x2.shape
    n = w.shape[0]
    if plan is None:
        plan, splits, per = plan_w4a16(m, n, k, sms, dense)
    else:
        splits, per = splits_for(plan, m, n, k, sms, dense)
    if splits * m * n > INDEX32_LIMIT:
        raise ValueError(f"{spec.name}: x of {m} rows and W of {n} rows exceed the kernel's 32-bit indexing")
    if splits > 1:
        part = torch.empty((splits, m, n), dtype=torch.float32, device=x2.device)
        counter = split_counters(x2.device, -(-n // plan.tile_n))
    else:
        part = placeholder(x2.device, (1, 1, 1), torch.float32)
        counter = placeholder(x2.device, (1,), torch.int32)
    if src is not None:
        signature["source"] = True
    if not signature.get("gated", True):
        del signature["gated"]  # (the compile parameter's default: the cache key as before)
    fn = spec.compiled(plan, dtype=dtypes.name_of(x2.dtype), col_tiles=col_tiles_of(m), **signature)
    scales = scales if scales is not None else placeholder(x2.device, (1, 1), x2.dtype)
    fn(w, x2, y, scales, zero_points if zero_points is not None else scales, part, counter, per, splits,
       src if src is not None else y, float(alpha), float(beta))


register_op("cute_kernels::gemm_w4a16", "(Tensor x, Tensor w_packed, Tensor scales, Tensor? zeros=None, "
            "int group_size=128, Tensor? residual=None) -> Tensor", _cuda, _fake)
register_op("cute_kernels::gemm_w4a16_swiglu", "(Tensor x, Tensor w_packed, Tensor scales, Tensor? zeros=None, "
            "int group_size=128) -> Tensor", _swiglu_cuda, _swiglu_fake)


def gemm_w4a16(x: torch.Tensor, w_packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None = None,
               group_size: int = 128, residual: torch.Tensor | None = None) -> torch.Tensor:
    """y = x W^T with W int4 in groups (see the module doc), + `residual` (the output's shape, x's dtype) added to the
    fp32 sums where the kernel has an epilogue (one rounding); not differentiable (inference weights)."""
    return call("cute_kernels::gemm_w4a16", x, w_packed, scales, zeros, int(group_size), residual)


def gemm_w4a16_swiglu(x: torch.Tensor, w_packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None = None,
                      group_size: int = 128) -> torch.Tensor:
    """silu(x W_gate^T) * (x W_up^T), (..., N / 2), for W = pack_int4(pack_gate_up(w_gate, w_up), ...): gate / up rows
    interleaved in blocks of 8, the product taken from the fp32 sums in the kernel's epilogue (`gemm_swiglu`'s
    int4 twin); not differentiable."""
    return call("cute_kernels::gemm_w4a16_swiglu", x, w_packed, scales, zeros, int(group_size))
