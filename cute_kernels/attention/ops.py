"""Torch op `cute_kernels::flash_attn`: O = softmax(scale * Q K^T [softcap] [mask]) V and the fp32
log-sum-exp (natural log) per query row, on Hopper.

q is (B, S_q, H_q, D), k and v are (B, S_k, H_kv, D), bf16 or fp16, D in {64, 96, 128, 192, 256},
H_q a multiple of H_kv (GQA/MQA: query head h reads K/V head h // (H_q / H_kv)). Any strides with a
unit-stride last dim are read in place (e.g. slices of a packed QKV tensor, or (B, H, S, D) tensors
transposed to (B, S, H, D)); strides TMA cannot address (not multiples of 16 bytes) are copied first.

Masks, FlashAttention's convention: `causal` aligns the diagonal to the bottom right when
S_q != S_k (query i sees keys j <= i + S_k - S_q); `window=(left, right)` keeps keys
i + S_k - S_q - left <= j <= i + S_k - S_q + right, -1 meaning unbounded (causal is right = 0).
A query that sees no key gets O = 0 and LSE = +inf (as FlashAttention: exp(s - LSE) = 0, not NaN). `softcap > 0` applies cap * tanh(s / cap) to
the scaled logits.

Returns O (B, S_q, H_q, D) in q's dtype, and with `return_lse=True` also LSE (B, H_q, S_q) fp32.
Differentiable in q, k, v (`cute_kernels::flash_attn_bwd`, `backward.py`), also through a gradient flowing
into the returned LSE; `deterministic=True` makes the backward's dQ bit-identical from run to run.

`cute_kernels::flash_attn_varlen` (FlashAttention's varlen interface): q (total_q, H_q, D), k and v
(total_k, H_kv, D) hold B sequences packed along the first axis; sequence b is rows
[cu_seqlens_q[b], cu_seqlens_q[b + 1]) of q and [cu_seqlens_k[b], cu_seqlens_k[b + 1]) of k/v
(int32 tensors of length B + 1 on q's device); max_seqlen_q bounds every q length (it sizes the
grid); max_seqlen_k is accepted for FlashAttention's signature and not needed. Masks are per sequence (causal bottom-right aligned in each). Returns O (total_q, H_q, D)
and LSE (H_q, total_q) fp32, FlashAttention's varlen LSE layout. Only the sequences' rows,
[cu_seqlens_q[0], cu_seqlens_q[B]), are written. As in FlashAttention the offsets are trusted, not
checked (that would cost a device-to-host sync): they must be non-decreasing, within q's / k's rows,
and no q length may exceed max_seqlen_q (the rows past it would be left unwritten). K/V rows a
sequence's last block reaches past its end (the next sequence's, or rows past cu_seqlens_k[B]) are
read and masked; V there must be finite (its probabilities are 0, and 0 * inf is NaN in P V).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from cute_kernels import dtypes
from cute_kernels.torch_ops import call, register_op
from schedules.attention import HEAD_DIMS, AttentionSchedule, default_schedule
from schedules.attention_bwd import default_bwd_schedule, varlen_total_tiles

AB_TORCH = (torch.bfloat16, torch.float16)
LOG2E = math.log2(math.e)


def _check(q, k, v, window_left, window_right, softmax_scale, softcap, varlen: bool = False):
    dims, what = (3, "(total_seqlen, heads, head_dim)") if varlen else (4, "(batch, seqlen, heads, head_dim)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cuda":
            raise ValueError(f"{name} must be on a CUDA device, got device '{t.device}'")
        if t.dtype not in AB_TORCH:
            raise TypeError(f"{name} has dtype {str(t.dtype).replace('torch.', '')}; supported: bfloat16, float16")
        if t.dim() != dims:
            raise ValueError(f"{name} must be {dims}-D {what}, got shape {tuple(t.shape)}")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but q has {q.dtype}; cast one of them first")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    d = q.shape[-1]
    if d not in HEAD_DIMS:
        raise ValueError(f"head dim (q.shape[{dims - 1}]) must be one of {HEAD_DIMS}, got {d}")
    if k.shape[-1] != d or v.shape[-1] != d:
        raise ValueError(f"head dims differ: q {d}, k {k.shape[-1]}, v {v.shape[-1]} (a different V head dim is "
                         "not supported)")
    if k.shape != v.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have the same shape")
    if not varlen and k.shape[0] != q.shape[0]:
        raise ValueError(f"batch sizes differ: q {q.shape[0]}, k {k.shape[0]}")
    hq, hk = q.shape[-2], k.shape[-2]
    if hk == 0 or hq % hk:
        raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({hk}) (GQA/MQA)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise ValueError(f"{name} must have a contiguous last dim (stride 1), got strides {tuple(t.stride())}")
    _check_options(window_left, window_right, softmax_scale, softcap)


def _check_options(window_left, window_right, softmax_scale, softcap):
    """The window bounds, the softmax scale and the softcap every attention op takes."""
    for name, w in (("window[0] (left)", window_left), ("window[1] (right)", window_right)):
        if w < -1:
            raise ValueError(f"{name} must be >= 0, or -1 for unbounded, got {w}")
    if softmax_scale is not None and not softmax_scale > 0:
        raise ValueError(f"softmax_scale must be > 0, got {softmax_scale}")
    if not softcap >= 0:
        raise ValueError(f"softcap must be >= 0 (0: off), got {softcap}")


def _bounds(causal, window_left, window_right, rows):
    """The window's (left, right) as the kernels take them (causal is right = 0), each clipped to a bound past every
    one of `rows` rows (all of q's and k's, of any sequence when packed): the same mask, no int32 overflow."""
    cap = 2 * rows + 1
    right = 0 if causal else window_right
    return min(window_left, cap), min(right, cap)


def _tma_ok(t: torch.Tensor) -> bool:
    e = t.element_size()
    return t.data_ptr() % 16 == 0 and all((t.stride(i) * e) % 16 == 0 or t.shape[i] == 1 for i in range(3))


def _kernel_view(t: torch.Tensor, v_layout: bool = False) -> torch.Tensor:
    """(B, S, H, D) -> the kernel's (S, D, H, B) (or (D, S, H, B) for V), copied when TMA cannot
    read it; strides of size-1 modes (never followed) replaced by small aligned ones."""
    if not _tma_ok(t):
        t = t.contiguous()
    b, s, h, d = t.shape
    strides = [t.stride(i) if t.shape[i] > 1 else 8 * (s + h + d) for i in range(3)]
    if max(strides) >= 2**31:
        raise ValueError(f"strides {tuple(t.stride())} need 64-bit indexing (not supported yet)")
    t = t.as_strided(t.shape, (*strides, 1))
    return t.permute(3, 1, 2, 0) if v_layout else t.permute(1, 3, 2, 0)


def _compiled(dtype, d, mask, softcap: bool, sched: AttentionSchedule, varlen: bool = False):
    """The kernel for `sched` and this signature, from the compile cache (`KernelSpec.compiled`)."""
    from cute_kernels.attention import FLASH_ATTN

    return FLASH_ATTN.compiled(sched, dtype=dtypes.name_of(dtype), head_dim=d, mask=mask, softcap=softcap,
                               varlen=varlen)


_counters: dict = {}


def _tile_counter(device: torch.device) -> torch.Tensor:
    """The int32 counter a `dynamic` schedule hands its tiles out with (`schedules.walks.take_tile`), one per
    device and stream: zeroed once, and reset to 0 by each launch's last fetch, so no memset runs per call and a
    CUDA graph may capture the launch. (Launches of one stream run in order; another stream gets its own.)"""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (device, stream)
    t = _counters.get(key)
    if t is None:
        t = _counters[key] = torch.zeros(1, dtype=torch.int32, device=device)
    return t


def _scalars(d, softmax_scale, softcap):
    """(scale_log2, scale_lse, scale_over_cap, cap) of the kernel: with a softcap the scale is folded
    into the tanh's argument and the capped logits are used as they are."""
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    if softcap > 0:
        return LOG2E, 1.0, scale / softcap, float(softcap)
    return scale * LOG2E, scale, 1.0, 1.0


def _flash_attn_cuda(q, k, v, causal=False, window_left=-1, window_right=-1, softmax_scale=None, softcap=0.0,
                     deterministic=False, schedule: AttentionSchedule | None = None):
    _check(q, k, v, window_left, window_right, softmax_scale, softcap)
    b, sq, hq, d = q.shape
    sk = k.shape[1]
    out = torch.empty(b, sq, hq, d, dtype=q.dtype, device=q.device)
    lse = torch.empty(b, hq, sq, dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out, lse
    if sk == 0:
        out.zero_()
        lse.fill_(float("inf"))
        return out, lse
    from cute_kernels.attention import mask_name

    left, right = _bounds(causal, window_left, window_right, sq + sk)
    sched = schedule or default_schedule(d, right >= 0, sk)
    fn = _compiled(q.dtype, d, mask_name(left, right), softcap > 0, sched)
    fn(_kernel_view(q), _kernel_view(k), _kernel_view(v, True), _kernel_view(out), lse.permute(2, 1, 0),
       _tile_counter(q.device), *_scalars(d, softmax_scale, softcap), left, right)
    return out, lse


def _flash_attn_fake(q, k, v, causal=False, window_left=-1, window_right=-1, softmax_scale=None, softcap=0.0,
                     deterministic=False):
    _check(q, k, v, window_left, window_right, softmax_scale, softcap)
    b, sq, hq, d = q.shape
    return (torch.empty(b, sq, hq, d, dtype=q.dtype, device=q.device),
            torch.empty(b, hq, sq, dtype=torch.float32, device=q.device))


def _setup(ctx, inputs, output):
    q, k, v, causal, window_left, window_right, softmax_scale, softcap, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.args = (causal, window_left, window_right, softmax_scale, softcap, deterministic)


def _backward(ctx, g_out, g_lse):
    q, k, v, out, lse = ctx.saved_tensors
    if g_out is None:
        g_out = torch.zeros_like(out)
    dq, dk, dv = call("cute_kernels::flash_attn_bwd", g_out, q, k, v, out, lse, g_lse, *ctx.args)
    return dq, dk, dv, None, None, None, None, None, None


register_op("cute_kernels::flash_attn", "(Tensor q, Tensor k, Tensor v, bool causal=False, int window_left=-1, "
            "int window_right=-1, float? softmax_scale=None, float softcap=0.0, bool deterministic=False) -> "
            "(Tensor, Tensor)",
            _flash_attn_cuda, _flash_attn_fake, _backward, _setup, materialize_grads=False)


def flash_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
               window: tuple[int, int] = (-1, -1), softmax_scale: float | None = None, softcap: float = 0.0,
               return_lse: bool = False, deterministic: bool = False):
    """softmax(softmax_scale * q k^T) v for (B, S, H, D) bf16/fp16 tensors (see the module doc);
    returns out, or (out, lse) with `return_lse`. `deterministic`: the backward adds dQ's contributions in a
    fixed order (bit-identical gradients from run to run)."""
    if not (isinstance(window, (tuple, list)) and len(window) == 2):
        raise ValueError(f"window must be a pair (left, right) of ints, -1 for unbounded, got {window!r}")
    left, right = int(window[0]), int(window[1])
    out, lse = call("cute_kernels::flash_attn", q, k, v, causal, left, right, softmax_scale, softcap,
                    bool(deterministic))
    return (out, lse) if return_lse else out


# --- varlen: sequences packed along one axis, delimited by cu_seqlens ------------------------------
def _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, window_left, window_right,
                  softmax_scale, softcap):
    _check(q, k, v, window_left, window_right, softmax_scale, softcap, varlen=True)
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.int32:
            raise TypeError(f"{name} must be int32 (the B + 1 sequence offsets), got dtype "
                            f"{str(t.dtype).replace('torch.', '')}")
        if t.dim() != 1 or t.shape[0] < 1:
            raise ValueError(f"{name} must be 1-D of length B + 1 >= 1, got shape {tuple(t.shape)}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ValueError(f"cu_seqlens_q ({cu_seqlens_q.shape[0]}) and cu_seqlens_k ({cu_seqlens_k.shape[0]}) must "
                         "have the same length B + 1")
    for name, m in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if m < 0:
            raise ValueError(f"{name} must be >= 0, got {m}")


def _out_ok(out: torch.Tensor, q: torch.Tensor) -> None:
    """A caller's output buffer: q's shape, dtype and device, writable in place by the kernel."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
    if out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
        raise ValueError(f"out must match q: shape {tuple(q.shape)}, dtype {q.dtype}, device {q.device}; got "
                         f"{tuple(out.shape)}, {out.dtype}, {out.device}")
    if out.stride(-1) != 1 or not _tma_ok(out[None]):
        raise ValueError(f"out must have a unit-stride last dim, 16-byte aligned strides and address, got strides "
                         f"{tuple(out.stride())}")


def _flash_attn_varlen_cuda(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
                            window_left=-1, window_right=-1, softmax_scale=None, softcap=0.0, deterministic=False,
                            schedule: AttentionSchedule | None = None, out: torch.Tensor | None = None):
    """The varlen forward; `out` (optional, q's shape) is written in place: only the rows of the
    sequences, [cu_seqlens_q[0], cu_seqlens_q[B]), are touched."""
    _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, window_left, window_right,
                  softmax_scale, softcap)
    total_q, hq, d = q.shape
    if out is None:
        out = torch.empty(total_q, hq, d, dtype=q.dtype, device=q.device)
    else:
        _out_ok(out, q)
    lse = torch.empty(hq, total_q, dtype=torch.float32, device=q.device)
    max_q = int(max_seqlen_q)
    if out.numel() == 0 or cu_seqlens_q.shape[0] == 1 or max_q == 0:
        return out, lse
    if k.shape[0] == 0:  # every sequence is keyless: O = 0, LSE = +inf on the sequences' rows (no host sync)
        rows = torch.arange(total_q, device=q.device)
        inside = (rows >= cu_seqlens_q[0]) & (rows < cu_seqlens_q[-1])
        out.masked_fill_(inside[:, None, None], 0)
        lse.masked_fill_(inside[None, :], float("inf"))
        return out, lse
    from cute_kernels.attention import mask_name

    left, right = _bounds(causal, window_left, window_right, q.shape[0] + k.shape[0])  # (not trusting max_seqlen_k)
    sched = schedule or default_schedule(d, right >= 0, max_seqlen_k if isinstance(max_seqlen_k, int) else None,
                                         varlen=True)
    fn = _compiled(q.dtype, d, mask_name(left, right), softcap > 0, sched, varlen=True)
    fn(_kernel_view(q[None]), _kernel_view(k[None]), _kernel_view(v[None], True), _kernel_view(out[None]),
       lse.t()[:, :, None], cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous(), max_q,
       *_scalars(d, softmax_scale, softcap), left, right)
    return out, lse


def _flash_attn_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
                            window_left=-1, window_right=-1, softmax_scale=None, softcap=0.0, deterministic=False):
    _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, window_left, window_right,
                  softmax_scale, softcap)
    total_q, hq, d = q.shape
    return (torch.empty(total_q, hq, d, dtype=q.dtype, device=q.device),
            torch.empty(hq, total_q, dtype=torch.float32, device=q.device))


def _setup_varlen(ctx, inputs, output):
    q, k, v, cu_q, cu_k = inputs[:5]
    out, lse = output
    ctx.save_for_backward(q, k, v, cu_q, cu_k, out, lse)
    ctx.rest = inputs[5:]


def _backward_varlen(ctx, g_out, g_lse):
    q, k, v, cu_q, cu_k, out, lse = ctx.saved_tensors
    if g_out is None:
        g_out = torch.zeros_like(out)
    dq, dk, dv = call("cute_kernels::flash_attn_varlen_bwd", g_out, q, k, v, out, lse, g_lse, cu_q, cu_k, *ctx.rest)
    return (dq, dk, dv) + (None,) * 10


register_op("cute_kernels::flash_attn_varlen", "(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
            "int max_seqlen_q, int max_seqlen_k, bool causal=False, int window_left=-1, int window_right=-1, "
            "float? softmax_scale=None, float softcap=0.0, bool deterministic=False) -> (Tensor, Tensor)",
            _flash_attn_varlen_cuda, _flash_attn_varlen_fake, _backward_varlen, _setup_varlen, materialize_grads=False)


def flash_attn_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                      cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                      window: tuple[int, int] = (-1, -1), softmax_scale: float | None = None, softcap: float = 0.0,
                      return_lse: bool = False, deterministic: bool = False):
    """Attention over packed sequences (see the module doc): q (total_q, H_q, D), k/v (total_k, H_kv, D),
    cu_seqlens int32 (B + 1,); returns out (total_q, H_q, D), or (out, lse (H_q, total_q)) with `return_lse`."""
    if not (isinstance(window, (tuple, list)) and len(window) == 2):
        raise ValueError(f"window must be a pair (left, right) of ints, -1 for unbounded, got {window!r}")
    left, right = int(window[0]), int(window[1])
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, left, right, softmax_scale,
            softcap, bool(deterministic))
    out, lse = call("cute_kernels::flash_attn_varlen", *args)
    return (out, lse) if return_lse else out


# --- the backward: preprocess, main, postprocess (`backward.py`) ------------------------------------
def _check_grad(g, out, name="dout"):
    if not isinstance(g, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(g).__name__}")
    if g.shape != out.shape:
        raise ValueError(f"{name} must have the output's shape {tuple(out.shape)}, got {tuple(g.shape)}")
    if g.dtype != out.dtype:
        raise TypeError(f"{name} has dtype {str(g.dtype).replace('torch.', '')}, the output "
                        f"{str(out.dtype).replace('torch.', '')}")
    if g.device != out.device:
        raise ValueError(f"{name} is on {g.device} but the output is on {out.device}")


def _readable(t: torch.Tensor) -> torch.Tensor:
    """`t` itself when TMA can read it in place (unit last stride, 16-byte strides, no zero strides: the
    `.sum().backward()` gradient is an expanded scalar), else a contiguous copy."""
    if t.stride(-1) == 1 and all(t.stride(i) > 0 or t.shape[i] == 1 for i in range(t.dim())) and \
            _tma_ok(t if t.dim() == 4 else t[None]):
        return t
    return t.contiguous()


def _fits_32bit(**tensors) -> None:
    """The backward indexes with 32-bit offsets: every element of each tensor (inputs, gradients, the fp32
    workspace) must lie within 2^31 elements of its base."""
    for name, t in tensors.items():
        span = sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()) if n > 0)
        if span >= 2**31:
            raise ValueError(f"{name} {tuple(t.shape)} spans {span} elements: the backward needs 64-bit indexing for "
                             "it (not supported yet); split the batch")


def _bwd_scalars(d, softmax_scale, softcap):
    """(scale_log2, scale, scale_over_cap, cap) of the backward kernel (as the forward's `_scalars`; `scale` multiplies
    dK here and dQ in the postprocess)."""
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    if softcap > 0:
        return LOG2E, scale, scale / softcap, float(softcap)
    return scale * LOG2E, scale, 1.0, 1.0


def _bwd_kernels(sched, dtype, d, left, right, softcap, deterministic, varlen, dlse=False):
    """The preprocess, main and postprocess kernels for `sched` and this signature, from the compile cache."""
    from cute_kernels.attention import FLASH_ATTN_BWD, FLASH_ATTN_BWD_POST, FLASH_ATTN_BWD_PRE, mask_name

    sig = dict(dtype=dtypes.name_of(dtype), head_dim=d, varlen=varlen)
    return (FLASH_ATTN_BWD_PRE.compiled(None, tile_m=sched.tile_m, dlse=dlse, deterministic=bool(deterministic),
                                        **sig),
            FLASH_ATTN_BWD.compiled(sched, mask=mask_name(left, right), softcap=softcap > 0,
                                    deterministic=bool(deterministic), **sig),
            FLASH_ATTN_BWD_POST.compiled(sched, **sig))


def _flash_attn_bwd_cuda(dout, q, k, v, out, lse, dlse=None, causal=False, window_left=-1, window_right=-1,
                         softmax_scale=None, softcap=0.0, deterministic=False, schedule=None):
    _check(q, k, v, window_left, window_right, softmax_scale, softcap)
    _check_grad(dout, out)
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    dq = torch.empty(b, sq, hq, d, dtype=q.dtype, device=q.device)
    dk = torch.empty(b, sk, hk, d, dtype=q.dtype, device=q.device)
    dv = torch.empty(b, sk, hk, d, dtype=q.dtype, device=q.device)
    if sq == 0 or sk == 0 or b == 0 or hq == 0:
        dq.zero_()
        dk.zero_()
        dv.zero_()
        return dq, dk, dv
    left, right = _bounds(causal, window_left, window_right, sq + sk)
    sched = schedule or default_bwd_schedule(d, right >= 0, deterministic)
    tm = sched.tile_m
    tiles = (sq + tm - 1) // tm
    w = _bwd_workspace(q, k, dout, lse, dlse, (b, hq), tiles, sched, left, right, softmax_scale, softcap, deterministic,
                       varlen=False)
    pre, main, post = w.kernels
    dev, scalars = q.device, w.scalars
    # the kernels' views: rows (S_pad, H, B), the accumulator (tile_m D, tiles, H, B), O / dO / Q / K / V (S, D, H, B)
    rows2, rowsd, acc, do_ = (w.lse2.permute(2, 1, 0), w.dpsum.permute(2, 1, 0), w.dq_acc.permute(3, 2, 1, 0),
                              _kernel_view(w.dout))
    pre(_kernel_view(out), do_, lse.permute(2, 1, 0), w.dlse.permute(2, 1, 0), rows2, rowsd, acc,
        w.sem.permute(2, 1, 0), _no_offsets(dev), sq)
    main(_kernel_view(q), _kernel_view(k), _kernel_view(v), do_, rows2, rowsd, acc, _kernel_view(dk), _kernel_view(dv),
         w.sem.permute(2, 1, 0), *scalars, left, right)
    post(acc, _kernel_view(dq), _no_offsets(dev), sq, scalars[1])
    return dq, dk, dv


def _bwd_workspace(q, k, dout, lse, dlse, lead, tiles, sched, left, right, softmax_scale, softcap, deterministic,
                   varlen):
    """What both backward ops set up, for `tiles` padded query tiles of each `lead` slice ((B, H), or (H,) packed):
    the fp32 row vectors LSE2 and D, the dQ accumulator, the semaphores (deterministic: zeroed by the preprocess), a
    TMA-readable dO (checked against 32-bit offsets), the three kernels, the dLSE the preprocess is given (the LSE
    itself, unread, without one) and the kernels' scalars."""
    dev, tm, d = q.device, sched.tile_m, q.shape[-1]
    dq_acc = torch.empty(*lead, tiles, tm * d, dtype=torch.float32, device=dev)
    dout = _readable(dout)
    _fits_32bit(q=q, k=k, dout=dout, dq_accumulator=dq_acc)
    return SimpleNamespace(
        lse2=torch.empty(*lead, tiles * tm, dtype=torch.float32, device=dev),
        dpsum=torch.empty(*lead, tiles * tm, dtype=torch.float32, device=dev),
        dq_acc=dq_acc, sem=torch.empty(*lead, tiles, dtype=torch.int32, device=dev), dout=dout,
        kernels=_bwd_kernels(sched, q.dtype, d, left, right, softcap, deterministic, varlen, dlse=dlse is not None),
        dlse=lse if dlse is None else dlse, scalars=_bwd_scalars(d, softmax_scale, softcap))


_offsets: dict = {}


def _no_offsets(device) -> torch.Tensor:
    """A placeholder cu_seqlens for the batched pre / postprocess (unread)."""
    t = _offsets.get(device)
    if t is None:
        t = _offsets[device] = torch.zeros(2, dtype=torch.int32, device=device)
    return t


def _flash_attn_bwd_fake(dout, q, k, v, out, lse, dlse=None, causal=False, window_left=-1, window_right=-1,
                         softmax_scale=None, softcap=0.0, deterministic=False):
    _check(q, k, v, window_left, window_right, softmax_scale, softcap)
    _check_grad(dout, out)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


register_op("cute_kernels::flash_attn_bwd", "(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
            "Tensor? dlse=None, bool causal=False, int window_left=-1, int window_right=-1, float? softmax_scale=None, "
            "float softcap=0.0, bool deterministic=False) -> (Tensor, Tensor, Tensor)",
            _flash_attn_bwd_cuda, _flash_attn_bwd_fake)


def _flash_attn_varlen_bwd_cuda(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                max_seqlen_k, causal=False, window_left=-1, window_right=-1, softmax_scale=None,
                                softcap=0.0, deterministic=False, schedule=None):
    _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, window_left, window_right,
                  softmax_scale, softcap)
    _check_grad(dout, out)
    total_q, hq, d = q.shape
    total_k = k.shape[0]
    batch = cu_seqlens_q.shape[0] - 1
    # rows past the last sequence get a zero gradient from the kernels' tail slot (`backward.zero_tail_rows`)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    max_q, max_k = int(max_seqlen_q), int(max_seqlen_k)
    if total_q == 0 or total_k == 0 or batch == 0 or max_q == 0 or max_k == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    left, right = _bounds(causal, window_left, window_right, total_q + total_k)
    sched = schedule or default_bwd_schedule(d, right >= 0, deterministic)
    tm = sched.tile_m
    tiles = varlen_total_tiles(total_q, batch, tm)
    cu_q, cu_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
    w = _bwd_workspace(q, k, dout, lse, dlse, (hq,), tiles, sched, left, right, softmax_scale, softcap, deterministic,
                       varlen=True)
    pre, main, post = w.kernels
    scalars = w.scalars
    # the kernels' views: one packed batch (B = 1)
    rows2, rowsd, acc, do_ = (w.lse2.t()[:, :, None], w.dpsum.t()[:, :, None], w.dq_acc.permute(2, 1, 0)[..., None],
                              _kernel_view(w.dout[None]))
    pre(_kernel_view(out[None]), do_, lse.t()[:, :, None], w.dlse.t()[:, :, None], rows2, rowsd, acc,
        w.sem.t()[:, :, None], cu_q, max_q)
    main(_kernel_view(q[None]), _kernel_view(k[None]), _kernel_view(v[None]), do_, rows2, rowsd, acc,
         _kernel_view(dk[None]), _kernel_view(dv[None]), w.sem.t()[:, :, None], cu_q, cu_k, max_k, *scalars, left, right)
    post(acc, _kernel_view(dq[None]), cu_q, max_q, scalars[1])
    return dq, dk, dv


def _flash_attn_varlen_bwd_fake(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                max_seqlen_k, causal=False, window_left=-1, window_right=-1, softmax_scale=None,
                                softcap=0.0, deterministic=False):
    _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, window_left, window_right,
                  softmax_scale, softcap)
    _check_grad(dout, out)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


register_op("cute_kernels::flash_attn_varlen_bwd", "(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, "
            "Tensor lse, Tensor? dlse, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, "
            "bool causal=False, int window_left=-1, int window_right=-1, float? softmax_scale=None, "
            "float softcap=0.0, bool deterministic=False) -> (Tensor, Tensor, Tensor)",
            _flash_attn_varlen_bwd_cuda, _flash_attn_varlen_bwd_fake)


# --- decode: the KV-cache op and the attention-state merges (`decode_ops.py`) --------------------------------------
from cute_kernels.attention.decode_ops import (  # noqa: E402,F401  (exported with the family's ops)
    flash_attn_with_kvcache,
    merge_attention_states,
    merge_attention_states_many,
)

# --- FP8 attention (`fp8_ops.py`): the Hadamard transform, the Q / K / V quantizer and the FP8 forward -----------------
from cute_kernels.attention.fp8_ops import (  # noqa: E402,F401  (exported likewise)
    flash_attn_fp8,
    hadamard,
    quantize_attention_fp8,
)
