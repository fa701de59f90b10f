"""Torch ops of the MoE family: dispatch and combine between token rows and a grouped GEMM's layout.

    rows = ck.moe_dispatch(x, r, layout="contiguous")      # (T k + E 127, H) or (E, max_m, H)
    out = ck.moe_combine(y, r, r.topk_weights, layout="contiguous")   # (T, H)

r is a `Routing` (`moe_route`): each token's k slots name
their row of the contiguous layout (`token_rows`) or their masked slot (`token_slots`), -1 for none. The ops under
them, `cute_kernels::moe_dispatch_rows(x, rows, num_rows, weights=None)` and `cute_kernels::moe_combine_rows(y, rows,
weights)`, take that (T, k) int32 map directly. Layout rows no slot names are left unwritten (the grouped GEMM skips
or ignores them; combine never reads them). Combine sums a token's slots in slot order in fp32 and rounds once:
bit-identical run to run.

Autograd: dispatch and combine are each other's transposes. d(dispatch)/dx is combine with unit weights; combine's
gradient to y is the weighted dispatch (w[t, s] g[t] into each slot's row), to the weights the per-slot dot
<g[t], y[row]> (in torch: a gather and a sum).
"""

from __future__ import annotations

import torch

from cute_kernels import dtypes
from cute_kernels.torch_ops import call, check_tensor, placeholder, register_op
from schedules.hardware import num_sms

ROW_TORCH = (torch.bfloat16, torch.float16)
MAX_TOP_K = 16
MAX_CTAS_PER_SM = 16  # CTAs of 128 threads resident an SM; past that the CTAs loop over tokens
# The quantizing dispatch writes its scales row-major (each row's H / 128 scales in whole sectors) into a scratch and
# copies them to quantize_1x128's M-major layout afterwards, instead of storing them M-major directly: there a 32-byte
# sector holds one K-block of 8 consecutive rows of an expert, written by 8 different tokens' CTAs, 4 bytes each.
# perf/lab/moe_ab.py at T16384 E256 (H100): 779 us M-major, 491 row-major alone, 578 with the copy (torch's strided
# copy of 29 MiB takes ~90 us of it); the bf16 dispatch 796.
DISPATCH_ROW_MAJOR_SCALES = True
# How they reach the M-major layout: "torch" (a strided `copy_`) or "transpose" (`ck.transpose`'s kernel writing the
# layout's storage, (H / 128, rows rounded up to 4) row-major): the dispatch 579 -> 519 us at T16384 E256 (H100,
# moe_ab's "dispatch op transpose copy"), the layer 1.17x -> 1.13x its two grouped GEMMs
DISPATCH_SCALES_COPY = "transpose"


def _check_rows(name, t, rows, weights=None):
    check_tensor(name, t, allowed=ROW_TORCH)
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D (rows, H), got shape {tuple(t.shape)}")
    if not isinstance(rows, torch.Tensor) or rows.dtype != torch.int32 or rows.dim() != 2:
        raise TypeError(f"rows must be an int32 (tokens, top_k) tensor, got "
                        f"{getattr(rows, 'dtype', type(rows).__name__)} {tuple(getattr(rows, 'shape', ()))}")
    if not 1 <= rows.shape[1] <= MAX_TOP_K:
        raise ValueError(f"rows has top_k = {rows.shape[1]} columns; 1 to {MAX_TOP_K} are supported")
    if rows.device != t.device:
        raise ValueError(f"rows is on {rows.device} but {name} is on {t.device}")
    if weights is not None:
        if not isinstance(weights, torch.Tensor) or weights.shape != rows.shape:
            raise ValueError(f"weights must have rows' shape {tuple(rows.shape)}, got "
                             f"{tuple(getattr(weights, 'shape', ()))}")
        if not weights.is_floating_point() or weights.device != t.device:
            raise TypeError(f"weights must be a floating-point tensor on {t.device}, got {weights.dtype} on "
                            f"{weights.device}")


def _kernel_ok(t: torch.Tensor) -> bool:
    """Rows of whole 16-byte vectors: unit inner stride, H and the row stride multiples of 8, 16-byte base."""
    return t.shape[1] % 8 == 0 and t.stride(1) == 1 and t.stride(0) % 8 == 0 and t.data_ptr() % 16 == 0


def _launch(direction, src, dst, rows, weights, weighted=False, scales=None):
    from cute_kernels.moe import MOE_TOKEN_ROWS

    fn = MOE_TOKEN_ROWS.compiled(direction=direction, dtype=dtypes.name_of(src.dtype), top_k=rows.shape[1],
                                 weighted=weighted, quantize=scales is not None)
    if scales is None:
        scales = weights  # (unread)
    fn(src, dst, rows, weights, scales, MAX_CTAS_PER_SM * num_sms(src.get_device()))


def _dispatch_cuda(x, rows, num_rows: int, weights=None):
    _check_rows("x", x, rows, weights)
    if rows.shape[0] != x.shape[0]:
        raise ValueError(f"rows has {rows.shape[0]} tokens but x has {x.shape[0]}")
    out = torch.empty(num_rows, x.shape[1], dtype=x.dtype, device=x.device)
    if x.shape[0] == 0 or x.shape[1] == 0 or num_rows == 0:
        return out
    w = weights.float() if weights is not None else placeholder(x.device, (1, rows.shape[1]), torch.float32)
    if not _kernel_ok(x):
        x = x.contiguous()
    if not _kernel_ok(x) or not _kernel_ok(out):  # H not a multiple of 8: torch
        ok = rows >= 0
        tok = torch.arange(x.shape[0], device=x.device).unsqueeze(1).expand_as(rows)
        vals = x[tok[ok]].float() * (w[ok].unsqueeze(1) if weights is not None else 1.0)
        out[rows[ok].long()] = vals.to(x.dtype)
        return out
    _launch("dispatch", x, out, rows, w, weights is not None)
    return out


def _dispatch_fake(x, rows, num_rows: int, weights=None):
    _check_rows("x", x, rows, weights)
    return torch.empty(num_rows, x.shape[1], dtype=x.dtype, device=x.device)


def _combine_cuda(y, rows, weights):
    _check_rows("y", y, rows, weights)
    t = rows.shape[0]
    out = torch.empty(t, y.shape[1], dtype=y.dtype, device=y.device)
    if t == 0 or y.shape[1] == 0:
        return out
    if y.shape[0] == 0:  # no rows at all: every slot empty
        return out.zero_()
    if not _kernel_ok(y):
        y = y.contiguous()
    if not _kernel_ok(y):
        from cute_kernels.moe.reference import combine_rows as combine_torch

        return combine_torch(y, rows, weights).to(y.dtype)
    _launch("combine", y, out, rows, weights.float())
    return out


def _combine_fake(y, rows, weights):
    _check_rows("y", y, rows, weights)
    return torch.empty(rows.shape[0], y.shape[1], dtype=y.dtype, device=y.device)


def _dispatch_setup(ctx, inputs, output):
    x, rows, num_rows, weights = inputs
    ctx.save_for_backward(rows, weights)


def _dispatch_backward(ctx, g):
    """dx[t] = sum over slots of (w[t, s]) g[rows[t, s]]: combine."""
    rows, weights = ctx.saved_tensors
    w = weights if weights is not None else torch.ones(rows.shape, dtype=torch.float32, device=g.device)
    return combine_rows(g.contiguous(), rows, w), None, None, None


def _combine_setup(ctx, inputs, output):
    y, rows, weights = inputs
    ctx.save_for_backward(y, rows, weights)


def _combine_backward(ctx, g):
    """dy: the weighted dispatch of g into each slot's row (rows no slot names get 0); dw[t, s] = <g[t], y[row]>."""
    y, rows, weights = ctx.saved_tensors
    gy = gw = None
    if ctx.needs_input_grad[0]:
        gy = dispatch_rows(g.contiguous(), rows, y.shape[0], weights)
        named = torch.zeros(y.shape[0], dtype=torch.int32, device=y.device)  # (no host sync: a scatter, not a mask)
        named.scatter_reduce_(0, rows.clamp(min=0).long().flatten(), (rows >= 0).int().flatten(), reduce="amax")
        gy = torch.where(named.unsqueeze(1) > 0, gy, torch.zeros((), dtype=gy.dtype, device=gy.device))
    if ctx.needs_input_grad[2]:
        r = rows.long()
        dots = (g.float().unsqueeze(1) * y[r.clamp(min=0)].float()).sum(-1)
        gw = torch.where(r >= 0, dots, 0.0).to(weights.dtype)
    return gy, None, gw


def _dispatch_fp8_fake(x, rows, num_rows: int):
    from cute_kernels.quantize.ops import _quant_1x128_fake

    _check_rows("x", x, rows)
    return _quant_1x128_fake(x.new_empty(num_rows, x.shape[1]))


def _dispatch_fp8_cuda(x, rows, num_rows: int):
    """x's rows quantized once (1x128) into each slot's row: e4m3 (R, H) and fp32 scales (R, H / 128) in
    quantize_1x128's layout (the grouped GEMM reads both without a copy); H % 128 != 0 or awkward strides: the bf16
    dispatch, then quantize_1x128."""
    from cute_kernels.quantize.ops import quantize_1x128

    q, s = _dispatch_fp8_fake(x, rows, num_rows)
    if x.shape[0] == 0 or num_rows == 0 or x.shape[1] == 0:
        return q, s
    if x.shape[1] % 128 == 0 and not _kernel_ok(x):
        x = x.contiguous()
    if x.shape[1] % 128 or not _kernel_ok(x):
        return quantize_1x128(_dispatch_cuda(x, rows, num_rows))
    w = placeholder(x.device, (1, rows.shape[1]), torch.float32)
    if DISPATCH_ROW_MAJOR_SCALES and DISPATCH_SCALES_COPY == "transpose":
        from cute_kernels.transpose.ops import _transpose_cuda

        m, mp = s.shape[0], s.stride(1)  # s: (rows, H / 128), strides (1, mp)
        rm = torch.empty(mp, s.shape[1], dtype=torch.float32, device=x.device)
        _launch("dispatch", x, q, rows, w, scales=rm[:m])
        return q, _transpose_cuda(rm)[:, :m].t()
    if DISPATCH_ROW_MAJOR_SCALES:
        rm = torch.empty(s.shape, dtype=torch.float32, device=x.device)
        _launch("dispatch", x, q, rows, w, scales=rm)
        s.copy_(rm)
    else:
        _launch("dispatch", x, q, rows, w, scales=s)
    return q, s


register_op("cute_kernels::moe_dispatch_rows_fp8", "(Tensor x, Tensor rows, int num_rows) -> (Tensor, Tensor)",
            _dispatch_fp8_cuda, _dispatch_fp8_fake)
register_op("cute_kernels::moe_dispatch_rows", "(Tensor x, Tensor rows, int num_rows, Tensor? weights=None) -> Tensor",
            _dispatch_cuda, _dispatch_fake, _dispatch_backward, _dispatch_setup)
register_op("cute_kernels::moe_combine_rows", "(Tensor y, Tensor rows, Tensor weights) -> Tensor",
            _combine_cuda, _combine_fake, _combine_backward, _combine_setup)


def dispatch_rows(x, rows, num_rows: int, weights=None):
    return call("cute_kernels::moe_dispatch_rows", x, rows, int(num_rows), weights)


def combine_rows(y, rows, weights):
    return call("cute_kernels::moe_combine_rows", y, rows, weights)


# --- routing ------------------------------------------------------------------------------------------------------
def _route_cuda(logits, top_k: int, scoring: str = "softmax", n_groups=None, topk_groups=None, renormalize=True,
                bias=None, routed_scaling_factor: float = 1.0, max_m=None):
    """The routing kernel (`moe.route`: ids and weights) where it applies (E <= 256, k <= 16, fp32 / bf16 logits),
    else the reference's torch ops; then the layouts (`reference._layouts`: fixed-size torch ops)."""
    from cute_kernels.moe.reference import _layouts, check_route_args, route

    if logits.device.type != "cuda":
        raise ValueError(f"logits must be on a CUDA device, got {logits.device}")
    check_route_args(logits, top_k, scoring, n_groups, topk_groups, bias, max_m)
    t, e = logits.shape
    if t == 0 or e > 256 or top_k > 16 or (n_groups or 0) > 32 or logits.dtype not in (torch.float32, torch.bfloat16):
        return tuple(route(logits, top_k, scoring, n_groups, topk_groups, renormalize, bias, routed_scaling_factor,
                           max_m))
    from cute_kernels.moe import MOE_ROUTE

    if logits.stride(1) != 1:
        logits = logits.contiguous()
    ids = torch.empty(t, top_k, dtype=torch.int32, device=logits.device)
    w = torch.empty(t, top_k, dtype=torch.float32, device=logits.device)
    # (without a bias the kernel reads none: a kept placeholder, no memset a call)
    b = bias.float().contiguous() if bias is not None else placeholder(logits.device, (e,), torch.float32)
    fn = MOE_ROUTE.compiled(logits=dtypes.name_of(logits.dtype), experts=e, top_k=top_k, scoring=scoring,
                            groups=n_groups or 0, topk_groups=topk_groups or 1, bias=bias is not None,
                            renormalize=bool(renormalize))
    fn(logits, b, ids, w, float(routed_scaling_factor), MAX_CTAS_PER_SM * num_sms(logits.get_device()))
    if LAYOUT_KERNEL:
        return tuple(layouts(ids, w, e, max_m))
    return tuple(_layouts(ids, w, e, max_m))


# The layouts by the `moe.layouts` kernels (a counting sort keeping copy order; bit for bit the reference's on the
# H100, `tests/moe/test_moe_gpu.py::test_layout_kernel_against_reference`) instead of the reference's torch ops (the
# fallback, False); its time beside them is the `moe` suite's to show
LAYOUT_KERNEL = True


def layouts(ids: torch.Tensor, weights: torch.Tensor, experts: int, max_m: int | None = None):
    """`reference._layouts` by the `moe.layouts` kernels: ids (T, k) int32 (-1: routed nowhere) -> a `Routing`."""
    from cute_kernels.moe import MOE_LAYOUTS
    from cute_kernels.moe.reference import Routing, contiguous_rows

    t, k = ids.shape
    dev = ids.device
    mm = max_m or 0
    i32 = torch.int32
    ids = ids.to(i32).contiguous()
    rows = contiguous_rows(t, k, experts)
    kern = MOE_LAYOUTS.compiled(experts=experts)
    p = MOE_LAYOUTS.resolve({"experts": experts})
    chunk = p["warps"] * p["rounds"] * 32
    chunks = max(1, -(-(t * k) // chunk))
    chunk_counts = torch.empty(chunks, experts, dtype=i32, device=dev)
    counts, masked_m = (torch.empty(experts, dtype=i32, device=dev) for _ in range(2))
    offsets, starts = (torch.empty(experts + 1, dtype=i32, device=dev) for _ in range(2))
    token_rows, token_slots = (torch.empty(t, k, dtype=i32, device=dev) for _ in range(2))
    # (filled by the kernels: -1 rows and slots, no drops)
    m_indices, row_source = (torch.empty(rows, dtype=i32, device=dev) for _ in range(2))
    masked_source = torch.empty(experts, mm, dtype=i32, device=dev)
    dropped = torch.empty(1, dtype=i32, device=dev)
    if t * k:
        kern(ids.view(-1), chunk_counts, counts, offsets, starts, masked_m, token_rows.view(-1), m_indices, row_source,
             masked_source.view(-1), token_slots.view(-1), dropped, mm)
    else:
        for z in (counts, offsets, starts, masked_m, dropped):
            z.zero_()
        for z in (m_indices, row_source, masked_source):
            z.fill_(-1)
    return Routing(ids, weights.float(), counts, offsets, m_indices, row_source, token_rows, starts[-1:], masked_m,
                   masked_source, token_slots, dropped)


def _route_fake(logits, top_k: int, scoring: str = "softmax", n_groups=None, topk_groups=None, renormalize=True,
                bias=None, routed_scaling_factor: float = 1.0, max_m=None):
    from cute_kernels.moe.reference import check_route_args, contiguous_rows

    check_route_args(logits, top_k, scoring, n_groups, topk_groups, bias, max_m)
    t, e = logits.shape
    mm = max_m or 0
    rows = contiguous_rows(t, top_k, e)

    def new(*shape, dtype=torch.int32):
        return torch.empty(shape, dtype=dtype, device=logits.device)
    return (new(t, top_k), new(t, top_k, dtype=torch.float32), new(e), new(e + 1), new(rows), new(rows),
            new(t, top_k), new(1), new(e), new(e, mm), new(t, top_k), new(1))


register_op("cute_kernels::moe_route", "(Tensor logits, int top_k, str scoring='softmax', int? n_groups=None, "
            "int? topk_groups=None, bool renormalize=True, Tensor? bias=None, float routed_scaling_factor=1.0, "
            "int? max_m=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, "
            "Tensor, Tensor)", _route_cuda, _route_fake)


def moe_route(logits: torch.Tensor, top_k: int, scoring: str = "softmax", n_groups: int | None = None,
              topk_groups: int | None = None, renormalize: bool = True, bias: torch.Tensor | None = None,
              routed_scaling_factor: float = 1.0, max_m: int | None = None):
    """The routing of `cute_kernels.moe.reference` (softmax / sigmoid scores, DeepSeek-V3's group-limited selection
    with the correction bias, top-k with ties to the lowest expert, renormalized and scaled weights) and both grouped
    GEMM layouts, as a `Routing` of device tensors: the routing kernel (`moe.route`, a warp a token) for the ids and
    weights, fixed-size torch ops for the layouts; no host synchronization (CUDA-graph capturable). `max_m`: the
    masked layout's slots an expert (None: none)."""
    from cute_kernels.moe.reference import Routing

    return Routing(*call("cute_kernels::moe_route", logits, int(top_k), scoring, n_groups, topk_groups,
                         bool(renormalize), bias, float(routed_scaling_factor), max_m))


def _layout_rows(r, layout: str):
    if layout == "contiguous":
        return r.token_rows, r.m_indices.shape[0]
    if layout == "masked":
        return r.token_slots, r.masked_source.numel()
    raise ValueError(f"layout must be 'contiguous' or 'masked', got {layout!r}")


def moe_dispatch(x: torch.Tensor, r, layout: str = "contiguous", quantize: str | None = None):
    """x (T, H) into the layout of routing r: (T k + E 127, H) contiguous or (E, max_m, H) masked; with
    quantize="1x128" the e4m3 rows and their 1x128 scales (quantize_1x128's values and scale layout, quantized once
    a token in the dispatch kernel; masked: (E, max_m, H) and (E, max_m, H / 128))."""
    rows, n = _layout_rows(r, layout)
    shape = (*r.masked_source.shape, x.shape[1]) if layout == "masked" else (n, x.shape[1])
    if quantize is None:
        return dispatch_rows(x, rows, n).view(shape)
    if quantize != "1x128":
        raise ValueError(f"quantize must be None or '1x128', got {quantize!r}")
    q, s = call("cute_kernels::moe_dispatch_rows_fp8", x, rows, int(n))
    return q.view(shape), s.reshape(*shape[:-1], -1)


def moe_combine(y: torch.Tensor, r, topk_weights: torch.Tensor, layout: str = "contiguous") -> torch.Tensor:
    """out[t] = sum over t's slots (in order) of topk_weights[t, s] * y[its row], fp32, rounded once; y in the
    layout of routing r ((rows, H), or (E, max_m, H) masked); differentiable in y and topk_weights."""
    rows, _ = _layout_rows(r, layout)
    return combine_rows(y.reshape(-1, y.shape[-1]), rows, topk_weights)


# --- the FP8 MoE layer (inference) -------------------------------------------------------------------------------
def moe(x: torch.Tensor, router_w: torch.Tensor, w13: torch.Tensor, w13_scales: torch.Tensor, w2: torch.Tensor,
        w2_scales: torch.Tensor, top_k: int, layout: str = "contiguous", max_m: int | None = None, **route_kwargs):
    """An FP8 MoE layer, forward only: route (logits = x router_w^T in fp32) -> dispatch with the 1x128 quantization ->
    grouped GEMM (w13 (E, 2I, H) e4m3, gate rows first then up; scales (E, 2I / 128, H / 128)) -> SwiGLU with the
    1x128 quantization -> grouped GEMM (w2 (E, H, I), scales (E, H / 128, I / 128)) -> combine, bf16 out (T, H).
    `layout` "masked" (with `max_m` slots an expert; copies past it dropped) keeps every count on the device: the
    decode-sized path, capturable in a CUDA graph; `route_kwargs` as `moe_route`. The dispatch quantizes once a
    token; the contiguous layout's first GEMM writes the SwiGLU output already requantized
    (`fp8_gemm_grouped_contiguous_swiglu`), the masked one requantizes in one pass after it (`swiglu_quantize`)."""
    import cute_kernels as ck

    if x.dim() != 2:
        raise ValueError(f"x must be (tokens, hidden), got shape {tuple(x.shape)}")
    e, two_i, h = w13.shape
    if h != x.shape[1] or tuple(w2.shape) != (e, h, two_i // 2) or tuple(router_w.shape) != (e, h):
        raise ValueError(f"x {tuple(x.shape)}, router_w {tuple(router_w.shape)} (E, H), w13 {tuple(w13.shape)} "
                         f"(E, 2I, H) and w2 {tuple(w2.shape)} (E, H, I) disagree")
    if layout == "masked" and max_m is None:
        raise ValueError("the masked layout needs max_m (its slots an expert)")
    logits = ck.gemm(x, router_w.t(), out_dtype=torch.float32)
    r = moe_route(logits, top_k, max_m=max_m if layout == "masked" else None, **route_kwargs)
    xq, sx = moe_dispatch(x, r, layout, quantize="1x128")
    return moe_combine(moe_experts_fp8(xq, sx, r, w13, w13_scales, w2, w2_scales, layout, max_m), r, r.topk_weights,
                       layout)


# The contiguous layout's first GEMM writes the SwiGLU output already quantized (`fp8_gemm_grouped_contiguous_swiglu`,
# bit for bit the unfused pair); False: the bf16 GEMM output, then `swiglu_quantize`.
FUSED_GLU = True


def moe_experts_fp8(xq, sx, r, w13, w13_scales, w2, w2_scales, layout: str = "contiguous", max_m: int | None = None):
    """The experts of `moe` on rows already in routing r's layout: e4m3 rows xq with their 1x128 scales sx -> grouped
    GEMM (w13) -> SwiGLU with the 1x128 requantization -> grouped GEMM (w2); bf16 rows in the same layout. Also the
    expert-parallel layer's per-rank work (`cute_kernels.moe.ep`), on the rows it received."""
    import cute_kernels as ck

    e, two_i, _ = w13.shape
    i = two_i // 2
    if layout == "contiguous" and FUSED_GLU:  # the SwiGLU and its quantization in the first GEMM's epilogue
        gq, sg = ck.fp8_gemm_grouped_contiguous_swiglu(xq, sx, w13, w13_scales, r.m_indices)
        return ck.fp8_gemm_grouped_contiguous(gq, sg, w2, w2_scales, r.m_indices)
    if layout == "contiguous":
        hh = ck.fp8_gemm_grouped_contiguous(xq, sx, w13, w13_scales, r.m_indices)
    else:
        hh = ck.fp8_gemm_grouped_masked(xq, sx, w13, w13_scales, r.masked_m, max(1, max_m))
    h2 = hh.reshape(-1, two_i)
    gq, sg = ck.swiglu_quantize(h2[:, :i], h2[:, i:])  # SwiGLU and the 1x128 requantization in one pass
    if layout == "contiguous":
        return ck.fp8_gemm_grouped_contiguous(gq, sg, w2, w2_scales, r.m_indices)
    return ck.fp8_gemm_grouped_masked(gq.view(e, max_m, i), sg.reshape(e, max_m, -1), w2, w2_scales, r.masked_m,
                                      max(1, max_m))


def moe_reference(x, router_w, w13, w13_scales, w2, w2_scales, top_k: int, quantize_activations: bool = False,
                  **route_kwargs) -> torch.Tensor:
    """`moe` in fp32 torch over the dequantized weights, one expert at a time (no capacity limit); the routing from the
    same fp32 logits. Activations unquantized, or with `quantize_activations` rounded as the layer rounds them (x and
    the SwiGLU output 1x128 to e4m3 and back): then only the GEMMs' and combine's arithmetic differs from the layer's
    (DeepGEMM's calc_diff bound applies)."""
    from cute_kernels.moe.reference import route
    from cute_kernels.quantize.ops import dequantize_1x128, dequantize_128x128, quantize_1x128_reference

    def act(t):
        return dequantize_1x128(*quantize_1x128_reference(t)) if quantize_activations else t

    logits = x.float() @ router_w.float().t()
    r = route(logits, top_k, **route_kwargs)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    i = w13.shape[1] // 2
    for e in range(w13.shape[0]):
        tok, slot = (r.topk_ids == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        a = dequantize_128x128(w13[e], w13_scales[e])
        hh = act(x[tok].float()) @ a.t()
        g = act(torch.nn.functional.silu(hh[:, :i]) * hh[:, i:])
        y = g @ dequantize_128x128(w2[e], w2_scales[e]).t()
        out.index_add_(0, tok, r.topk_weights[tok, slot].unsqueeze(1) * y)
    return out
