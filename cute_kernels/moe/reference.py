"""The MoE layer's routing, dispatch and combine in plain torch: the semantics the kernels implement, the reference
their tests compare against, and the stand-ins the CPU tests of the expert-parallel orchestration run.

Routing (`route`): scores = softmax(logits) or sigmoid(logits) in fp32; the selection adds the correction bias
(DeepSeek-V3) and, with groups, keeps only the experts of the `topk_groups` best groups (a group's score: the sum of
its two best selection scores with a bias, its best without); the top-k experts of the selection, ties to the lowest
expert index; their weights are the unbiased scores, renormalized to sum 1 (`renormalize`) and times
`routed_scaling_factor`.

The two layouts the grouped FP8 GEMMs read, both deterministic (a token's copies keep token order inside an expert):
- contiguous (`fp8_gemm_grouped_contiguous`): expert e's rows start at a multiple of 128 (`ALIGN`); `m_indices` is
  the expert of each row, -1 for padding; sized for the worst case T k + E (ALIGN - 1) rows, `rows_used` (on the
  device) the end of the last expert's padded block; `row_source` the copy (t k + slot) in each row, -1 for padding;
  `token_rows` (T, k) the row of each copy.
- masked (`fp8_gemm_grouped_masked`): (E, max_m) slots an expert; a copy past its expert's max_m is dropped and
  counted (`dropped`); `masked_m` = min(count, max_m); `masked_source` (E, max_m) the copy in each slot, -1 past
  masked_m; `token_slots` (T, k) e max_m + position, -1 for a dropped copy.

Dispatch gathers x's rows into a layout (padding rows zero here; the kernels leave them unwritten and nothing reads
them as data); combine sums each token's k expert rows times its weights in slot order, in fp32, rounded once.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

ALIGN = 128  # the contiguous layout's row alignment per expert (the grouped GEMM's M tile)
SCORINGS = ("softmax", "sigmoid")


class Routing(NamedTuple):
    topk_ids: torch.Tensor  # (T, k) int32
    topk_weights: torch.Tensor  # (T, k) fp32
    counts: torch.Tensor  # (E,) int32: copies routed to each expert (before any capacity drop)
    offsets: torch.Tensor  # (E + 1,) int32: exclusive prefix sums of counts
    m_indices: torch.Tensor  # (T k + E (ALIGN - 1),) int32: each contiguous row's expert, -1 padding
    row_source: torch.Tensor  # (same,) int32: the copy t k + slot in each contiguous row, -1 padding
    token_rows: torch.Tensor  # (T, k) int32: each copy's contiguous row
    rows_used: torch.Tensor  # (1,) int32: the contiguous rows through the last expert's padded block
    masked_m: torch.Tensor  # (E,) int32: min(counts, max_m)
    masked_source: torch.Tensor  # (E, max_m) int32: the copy in each masked slot, -1 past masked_m
    token_slots: torch.Tensor  # (T, k) int32: each copy's masked slot e max_m + i, -1 when dropped
    dropped: torch.Tensor  # (1,) int32: copies past their expert's max_m


def contiguous_rows(tokens: int, top_k: int, experts: int) -> int:
    """The contiguous layout's worst-case rows: every copy, plus up to ALIGN - 1 padding rows an expert."""
    return tokens * top_k + experts * (ALIGN - 1)


def check_route_args(logits: torch.Tensor, top_k: int, scoring: str, n_groups, topk_groups, bias, max_m) -> None:
    """Named errors for `route`'s arguments (shared by the reference and the op)."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise ValueError(f"logits must be a (tokens, experts) tensor, got {getattr(logits, 'shape', type(logits))}")
    if not logits.is_floating_point():
        raise TypeError(f"logits must be floating point, got {logits.dtype}")
    experts = logits.shape[1]
    if not 1 <= top_k <= experts:
        raise ValueError(f"top_k must be in [1, experts = {experts}], got {top_k}")
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {SCORINGS}, got {scoring!r}")
    if (n_groups is None) != (topk_groups is None):
        raise ValueError("n_groups and topk_groups go together (group-limited routing)")
    if n_groups is not None:
        if n_groups < 1 or experts % n_groups:
            raise ValueError(f"n_groups must divide experts = {experts}, got {n_groups}")
        if not 1 <= topk_groups <= n_groups:
            raise ValueError(f"topk_groups must be in [1, n_groups = {n_groups}], got {topk_groups}")
        if top_k > topk_groups * (experts // n_groups):
            raise ValueError(f"top_k = {top_k} exceeds the {topk_groups * (experts // n_groups)} experts of the "
                             f"{topk_groups} kept groups")
    if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (experts,)):
        raise ValueError(f"bias must be an (experts,) = ({experts},) tensor, got {getattr(bias, 'shape', bias)}")
    if max_m is not None and max_m < 0:
        raise ValueError(f"max_m must be >= 0 or None, got {max_m}")


def _stable_topk(v: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest along the last dim, ties to the lowest index (a stable descending sort)."""
    return torch.sort(v, dim=-1, descending=True, stable=True).indices[..., :k]


def route(logits: torch.Tensor, top_k: int, scoring: str = "softmax", n_groups: int | None = None,
          topk_groups: int | None = None, renormalize: bool = True, bias: torch.Tensor | None = None,
          routed_scaling_factor: float = 1.0, max_m: int | None = None) -> Routing:
    """The routing of the module doc; `max_m` None builds no masked layout ((E, 0) slots, every copy dropped)."""
    check_route_args(logits, top_k, scoring, n_groups, topk_groups, bias, max_m)
    t, e = logits.shape
    dev = logits.device
    lf = logits.float()
    scores = torch.softmax(lf, -1) if scoring == "softmax" else torch.sigmoid(lf)
    sel = scores + bias.float() if bias is not None else scores.clone()
    if n_groups is not None:
        g = sel.view(t, n_groups, e // n_groups)
        per = g.topk(min(2, g.shape[-1]), -1).values.sum(-1) if bias is not None else g.max(-1).values
        keep = torch.zeros(t, n_groups, dtype=torch.bool, device=dev)
        keep.scatter_(1, _stable_topk(per, topk_groups), True)
        sel = sel.masked_fill(~keep.repeat_interleave(e // n_groups, 1), float("-inf"))
    ids = _stable_topk(sel, top_k)
    w = scores.gather(1, ids)
    if renormalize:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    w = w * routed_scaling_factor
    ids32 = ids.to(torch.int32)
    return _layouts(ids32, w, e, max_m)


def _layouts(ids: torch.Tensor, weights: torch.Tensor, experts: int, max_m: int | None) -> Routing:
    """Counts, offsets and both layouts of a (T, k) expert assignment (each token's k experts distinct; an id of -1
    routes that copy nowhere: expert parallelism's copies bound for other ranks). Fixed-size device ops only (no
    boolean indexing, no bincount): no host synchronization, so it captures in a CUDA graph."""
    t, k = ids.shape
    dev = ids.device
    n = t * k
    i32, i64 = torch.int32, torch.long
    flat = ids.reshape(-1).long()  # copy c = t k + slot
    valid = flat >= 0
    key = torch.where(valid, flat, experts)  # -1 -> an extra bucket, sorted last
    counts_all = torch.zeros(experts + 1, dtype=i64, device=dev).scatter_add_(0, key, torch.ones_like(key))
    counts = counts_all[:experts]
    offsets_all = torch.zeros(experts + 2, dtype=i64, device=dev)
    offsets_all[1:] = counts_all.cumsum(0)
    # each copy's rank inside its expert, in copy order (token order: a token sends one copy an expert)
    order = torch.sort(key, stable=True).indices
    rank = torch.empty_like(key)
    rank[order] = torch.arange(n, device=dev) - offsets_all[key[order]]
    padded = (counts + ALIGN - 1) // ALIGN * ALIGN
    pstart = torch.zeros(experts + 1, dtype=i64, device=dev)
    pstart[1:] = padded.cumsum(0)
    rows = contiguous_rows(t, k, experts)
    copies = torch.arange(n, device=dev)
    token_rows = torch.where(valid, pstart[key.clamp(max=max(experts - 1, 0))] + rank, -1)
    dump = torch.where(valid, token_rows, rows)  # invalid copies scatter into one extra row, dropped after
    m_indices = torch.full((rows + 1,), -1, dtype=i32, device=dev).scatter_(0, dump, flat.to(i32))[:rows]
    row_source = torch.full((rows + 1,), -1, dtype=i32, device=dev).scatter_(0, dump, copies.to(i32))[:rows]
    mm = 0 if max_m is None else max_m
    kept = valid & (rank < mm)
    token_slots = torch.where(kept, key * mm + rank, -1)
    slot_dump = torch.where(kept, token_slots, experts * mm)
    masked_source = torch.full((experts * mm + 1,), -1, dtype=i32, device=dev).scatter_(
        0, slot_dump, copies.to(i32))[:experts * mm]
    return Routing(ids, weights.float(), counts.to(i32), offsets_all[:experts + 1].to(i32), m_indices, row_source,
                   token_rows.view(t, k).to(i32), pstart[-1:].to(i32), counts.clamp(max=mm).to(i32),
                   masked_source.view(experts, mm), token_slots.view(t, k).to(i32),
                   (valid & ~kept).sum().view(1).to(i32))


def routing_of(ids: torch.Tensor, weights: torch.Tensor, experts: int, max_m: int | None = None) -> Routing:
    """The layouts of a given (T, k) assignment over `experts` (ids in [0, experts) or -1: routed elsewhere)."""
    return _layouts(ids.to(torch.int32), weights, experts, max_m)


def dispatch(x: torch.Tensor, r: Routing, layout: str = "contiguous", quantize: str | None = None):
    """x (T, H) gathered into the layout: (rows, H) contiguous or (E, max_m, H) masked, padding zero; with
    quantize="1x128" the e4m3 rows and their (rows, H / 128) fp32 scales (`quantize_1x128`'s layout)."""
    k = r.topk_ids.shape[1]
    src = r.row_source if layout == "contiguous" else r.masked_source.reshape(-1)
    out = torch.zeros(src.numel(), x.shape[1], dtype=x.dtype, device=x.device)
    used = src >= 0
    out[used] = x[src[used].long() // k]
    if layout == "masked":
        out = out.view(*r.masked_source.shape, x.shape[1])
    if quantize == "1x128":
        from cute_kernels.quantize.ops import quantize_1x128_reference

        flat = out.reshape(-1, x.shape[1])
        q, s = quantize_1x128_reference(flat)
        return q.view(out.shape), s.view(*out.shape[:-1], -1)
    return out


def combine(y: torch.Tensor, r: Routing, topk_weights: torch.Tensor, layout: str = "contiguous",
            out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """out[t] = sum over slots s (in order) of topk_weights[t, s] * y[row of (t, s)], fp32, rounded once; a dropped
    copy (masked layout) adds nothing."""
    rows = r.token_rows if layout == "contiguous" else r.token_slots
    return combine_rows(y.reshape(-1, y.shape[-1]), rows, topk_weights).to(out_dtype)


def combine_rows(y: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """`combine` on the (T, k) row map itself, in fp32 (T, H): slot by slot in order, a slot with row -1 adds
    nothing. Fixed-size ops (no boolean indexing): also the op's fallback for rows the kernel cannot read."""
    acc = torch.zeros(rows.shape[0], y.shape[-1], dtype=torch.float32, device=y.device)
    for s in range(rows.shape[1]):
        row = rows[:, s].long()
        picked = weights[:, s].float().unsqueeze(1) * y[row.clamp(min=0)].float()
        acc += torch.where((row >= 0).unsqueeze(1), picked, 0.0)
    return acc
