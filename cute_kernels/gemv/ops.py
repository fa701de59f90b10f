"""Torch op `cute_kernels::gemv`: y = W x for decode-shaped x (lesson 3).

`gemv(w, x)`: w (N, K); x (K,) -> y (N,), or x (K, B) with 1 <= B <= 8 -> y (N, B), like `w @ x`.
fp32 accumulation in a fixed order (deterministic), one rounding to the dtype of w and x (same
dtype required). The kernel reads each column of x contiguously: pass x as the transposed view of a
(B, K) tensor (`x = xt.t()`, e.g. the (B, K) activations of a decode step) and nothing is copied; a
(K, B) row-major x is first transposed into a small (B, K) buffer. A w whose last dim is not
unit-stride is copied (a (N, K) view with a row stride, e.g. a slice of a fused weight, is read in
place). Not differentiable (inference op). Kernels: for B >= 2 columns (B >= 5 on W of fewer than 16 rows
per SM: `schedules.gemv.use_tensor_cores`), bf16 / fp16, K a multiple of 8 and 16-byte aligned rows, the
tensor-core kernel (`cute_kernels.gemv.mma`:
mma.sync with x^T as A, 8 rows of W as B); otherwise the FMA kernel with a register tile (`cute_kernels.gemv.kernels`).
"""

from __future__ import annotations

import torch

from cute_kernels import dtypes
from cute_kernels.gemv import GEMV, GEMV_MMA
from cute_kernels.torch_ops import INDEX32_LIMIT, call, check_tensor, placeholder, register_op
from schedules.gemv import plan_gemv, plan_gemv_mma, use_tensor_cores
from schedules.hardware import num_sms

MAX_COLS = 8


def _gemv_fake(w, x):
    check_tensor("w", w)
    check_tensor("x", x)
    if w.dim() != 2:
        raise ValueError(f"w must be 2-D (N, K), got shape {tuple(w.shape)}")
    if x.dim() not in (1, 2):
        raise ValueError(f"x must be 1-D (K,) or 2-D (K, B), got shape {tuple(x.shape)}")
    if x.dtype != w.dtype:
        raise TypeError(f"x has dtype {x.dtype} but w has {w.dtype}; cast one of them first")
    if x.device != w.device:
        raise ValueError(f"x is on {x.device} but w is on {w.device}")
    if x.shape[0] != w.shape[1]:
        raise ValueError(f"x has {x.shape[0]} rows but w has {w.shape[1]} columns (shapes {tuple(w.shape)} and "
                         f"{tuple(x.shape)})")
    if x.dim() == 2 and not 1 <= x.shape[1] <= MAX_COLS:
        raise ValueError(f"x must have 1 to {MAX_COLS} columns (decode-shaped), got {x.shape[1]}; use a GEMM")
    shape = (w.shape[0],) if x.dim() == 1 else (w.shape[0], x.shape[1])
    return torch.empty(shape, dtype=w.dtype, device=w.device)


def _mma_ok(w, k, aligned) -> bool:
    """The tensor-core kernel's needs: 16-bit elements, K a multiple of 8, 16-byte aligned rows."""
    return aligned and w.element_size() == 2 and k % 8 == 0


def _gemv_cuda(w, x, tensor_cores=None):
    """`tensor_cores`: None = the op's choice (`schedules.gemv.use_tensor_cores`, where `_mma_ok`),
    True / False to force it (benchmarks; True still falls back to the FMA kernel where not `_mma_ok`)."""
    y = _gemv_fake(w, x)
    if y.numel() == 0:
        return y
    if w.shape[1] == 0:
        return y.zero_()
    if w.stride(-1) != 1:
        w = w.contiguous()
    n, k = w.shape
    xt = x.view(1, k) if x.dim() == 1 else x.t()
    if xt.stride(-1) != 1:
        xt = xt.contiguous()
    b = xt.shape[0]
    if n == 1:
        w = w.as_strided((1, k), (-(-k // 16) * 16, 1))
    if b == 1:
        xt = xt.as_strided((1, k), (-(-k // 16) * 16, 1))
    vec = 16 // w.element_size()
    aligned = (w.data_ptr() % 16 == 0 and xt.data_ptr() % 16 == 0 and w.stride(0) % vec == 0
               and xt.stride(0) % vec == 0)
    index64 = n * w.stride(0) > INDEX32_LIMIT
    sms = num_sms(w.device.index or 0)
    if (tensor_cores if tensor_cores is not None else use_tensor_cores(n, b, sms)) and _mma_ok(w, k, aligned):
        plan = plan_gemv_mma(n, k, sms)
        fn = GEMV_MMA.compiled(plan, dtype=dtypes.name_of(w.dtype), cols=b, index64=index64)
        ph = placeholder(w.device, (1, 1), torch.bfloat16)  # (scales, zeros: unread for a 16-bit W)
        fn(w, xt, y.view(n, b), ph, ph)
        return y
    v = vec if aligned else 1
    plan = plan_gemv(n, k // v, b, sms)
    fn = GEMV.compiled(plan.tiling, dtype=dtypes.name_of(w.dtype), cols=b, aligned=aligned, index64=index64,
                       row_block=plan.row_block)
    fn(w, xt, y.view(n, b), plan.max_ctas(sms))
    return y


register_op("cute_kernels::gemv", "(Tensor w, Tensor x) -> Tensor", _gemv_cuda, _gemv_fake)

# x (M, K) @ W^T for W (N, K) at M <= STREAM_MAX_M: the streaming kernel (`gemv.stream`), which `gemm` runs for such
# shapes when STREAM is on (a decode step's projections)
STREAM_MAX_M = 16
STREAM = None  # None: by shape (`schedules.w4a16.use_stream(dense=True)`); True / False: always / never


def stream_ok(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether `skinny(x, w)` takes these operands as they are: 16-bit, 2-D, unit inner strides, 16-byte aligned
    rows, K a multiple of 8, 1 <= M <= STREAM_MAX_M."""
    m, k = x.shape
    return (x.dtype == w.dtype and x.dtype in (torch.bfloat16, torch.float16) and 1 <= m <= STREAM_MAX_M
            and k % 8 == 0 and k > 0 and w.shape[0] > 0 and x.stride(-1) == 1 and w.stride(-1) == 1
            and (m == 1 or x.stride(0) % 8 == 0) and w.stride(0) % 8 == 0
            and x.data_ptr() % 16 == 0 and w.data_ptr() % 16 == 0)


def skinny(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None, plan=None, c: torch.Tensor | None = None,
           alpha: float = 1.0, beta: float = 1.0, gated: bool = False) -> torch.Tensor:
    """y = x @ w.T (M, N) for x (M, K), w (N, K) with `stream_ok`; fp32 accumulation, split K reduced in a fixed
    order (deterministic), one rounding. With `c` (M, N) in x's dtype, any strides: y = alpha x w^T + beta c, still
    one rounding. `gated`: w's rows gate / up blocks of 8 (`pack_gate_up`, N a multiple of 16), y (M, N / 2) =
    silu(x w_gate^T) * (x w_up^T). `plan`: a `W4A16Plan` instead of the op's (benchmarks, the lab)."""
    from cute_kernels.gemv import GEMV_STREAM
    from cute_kernels.w4a16.ops import launch_stream

    m, k = x.shape
    n = w.shape[0] // (2 if gated else 1)
    y = out if out is not None else torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 1 and x.stride(0) % 8:
        x = x.as_strided((1, k), (-(-k // 8) * 8, 1))
    extra = {"gated": True} if gated else {}
    launch_stream(GEMV_STREAM, x, w, y, num_sms(x.device.index or 0), plan, dense=True, src=c, alpha=alpha, beta=beta,
                  **extra)
    return y


def gemv(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """w @ x for w (N, K) and x (K,) or (K, B), B <= 8; fp32 accumulation."""
    return call("cute_kernels::gemv", w, x)
