"""Expert parallelism over `torch.distributed`: the experts sharded over the ranks, tokens exchanged by
`all_to_all_single`, the per-rank work done by the MoE ops (or, in the CPU tests, by their torch references).

Rank r of W owns the E / W experts [r E / W, (r + 1) E / W). One forward (`EPMoE.forward`):

1. route this rank's tokens over all E experts;
2. each token goes once to every rank that owns one of its experts (DeepEP's convention: a token counts once per
   destination rank), in destination order and token order; the counts are exchanged first (all_to_all of W
   integers), then read on the host: the split sizes are the one host synchronization, so this path cannot be
   captured in a CUDA graph;
3. the rows and their routing (each slot's expert local to the receiver, -1 for a slot served elsewhere, and its
   weight) are exchanged;
4. the receiver lays its rows out for its experts (`routing_of` with the -1 slots skipped), runs them
   (`expert_fn`), and combines each row's local slots in slot order (its partial sum);
5. the partials go back (reverse all_to_all, in `combine_dtype`: bf16 as DeepEP sends them) and each source adds its
   token's partials in rank order, in fp32, rounded once.

Every order is fixed (ranks, tokens, slots), so a forward is bitwise reproducible for a given world size; against the
one-rank layer it differs only by the partials' grouping and rounding (calc_diff, not bits).

With `chunks` > 1 the tokens are split into that many consecutive ranges and the exchanges overlap the experts' work:
the counts of every chunk go in one all_to_all (still one host synchronization), then chunk i + 1's rows travel
(asynchronous collectives: NCCL runs them on its own stream, so on the GPU they overlap the grouped GEMMs of chunk i)
while chunk i is computed, and each chunk's partials go back while the next is computed. A token lives in one chunk
and its partials are still added in rank order, so the result equals the unchunked forward's wherever the experts
compute a row independently of the others in its batch (bitwise in the CPU tests). The CPU tests run all of this in
2-4 gloo processes.
"""

from __future__ import annotations

import time
from typing import Callable

import torch
import torch.distributed as dist

from cute_kernels.moe.reference import Routing, combine, dispatch, route, routing_of


def destinations(topk_ids: torch.Tensor, experts_per_rank: int, world: int) -> torch.Tensor:
    """(T, W) bool: whether token t has an expert on rank d."""
    mask = torch.zeros(topk_ids.shape[0], world, dtype=torch.bool, device=topk_ids.device)
    mask.scatter_(1, topk_ids.long() // experts_per_rank, True)
    return mask


def send_plan(topk_ids: torch.Tensor, topk_weights: torch.Tensor, experts_per_rank: int, world: int):
    """(send_index, send_counts, send_ids, send_weights): the token of each sent row (destination-major, token order
    inside), the rows per destination (W,), and each row's slots as the destination sees them (its local expert or
    -1; the weight, 0 where -1)."""
    mask = destinations(topk_ids, experts_per_rank, world)
    idx = [mask[:, d].nonzero().flatten() for d in range(world)]
    send_index = torch.cat(idx)
    counts = torch.tensor([len(i) for i in idx], dtype=torch.long, device=topk_ids.device)
    dest_of_row = torch.repeat_interleave(torch.arange(world, device=topk_ids.device), counts)
    ids = topk_ids[send_index].long()
    here = ids // experts_per_rank == dest_of_row.unsqueeze(1)
    send_ids = torch.where(here, ids - dest_of_row.unsqueeze(1) * experts_per_rank, -1).to(torch.int32)
    send_w = torch.where(here, topk_weights[send_index].float(), 0.0)
    return send_index, counts, send_ids, send_w


def _ops(x: torch.Tensor):
    """(route, dispatch, combine): the MoE ops for CUDA tensors, the references otherwise."""
    if x.is_cuda:
        import cute_kernels as ck

        def combine_op(y, r, w, dtype):
            if y.dtype not in (torch.bfloat16, torch.float16):
                return combine(y, r, w, out_dtype=dtype)
            return ck.moe_combine(y, r, w).to(dtype)
        return ck.moe_route, ck.moe_dispatch, combine_op
    return route, dispatch, lambda y, r, w, dtype: combine(y, r, w, out_dtype=dtype)


def _exchange(t: torch.Tensor, send_counts: list[int], recv_counts: list[int], group, async_op: bool = False):
    """`t`'s rows sent by `send_counts` per rank; returns the received rows, with the work handle if `async_op`."""
    out = t.new_empty((sum(recv_counts), *t.shape[1:]))
    work = dist.all_to_all_single(out, t.contiguous(), recv_counts, send_counts, group=group, async_op=async_op)
    return (out, work) if async_op else out


class EPMoE:
    """One rank's share of an expert-parallel MoE layer. `expert_fn(rows, routing)` computes the rank's experts on
    rows in the contiguous layout of `routing` (local expert ids) and returns their outputs in that layout. With
    `dispatch_dtype="fp8"` the sender quantizes its rows 1x128 to e4m3 and sends them with their scales (DeepEP's FP8
    dispatch; the receiver does not requantize), and `rows` is the pair (e4m3 rows, (rows, H / 128) fp32 scales) in
    that layout: `cute_kernels.moe.ops.moe_experts_fp8` takes it as it is."""

    def __init__(self, experts: int, top_k: int, expert_fn: Callable[[torch.Tensor, Routing], torch.Tensor],
                 group=None, combine_dtype: torch.dtype = torch.bfloat16, dispatch_dtype: str | None = None,
                 **route_kwargs):
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        if experts % self.world:
            raise ValueError(f"experts = {experts} must divide over the {self.world} ranks")
        self.experts, self.top_k, self.expert_fn, self.group = experts, top_k, expert_fn, group
        self.per_rank = experts // self.world
        if dispatch_dtype not in (None, "fp8"):
            raise ValueError(f"dispatch_dtype must be None (rows as they are) or 'fp8', got {dispatch_dtype!r}")
        self.combine_dtype, self.dispatch_dtype = combine_dtype, dispatch_dtype
        self.route_kwargs = route_kwargs

    def forward(self, x: torch.Tensor, logits: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16,
                chunks: int = 1, marks: dict | None = None) -> torch.Tensor:
        """x (T, H) and logits (T, E) of this rank's tokens -> (T, H) in `out_dtype`. On CUDA tensors the routing,
        dispatch and combine are the MoE ops; elsewhere (the gloo tests) their torch references. `chunks`: the
        token ranges whose exchanges overlap the experts' work (module doc); every rank must pass the same.
        `marks`: a dict that receives a CUDA event (on CPU tensors a host time) at "start", "routed", "dispatched"
        (the rows in the experts' layout on the receiver), "computed" and "combined", the phases of a benchmark
        (with chunks = 1; chunked phases interleave)."""
        if chunks < 1:
            raise ValueError(f"chunks must be >= 1, got {chunks}")

        def mark(name):
            if marks is not None:
                if x.is_cuda:
                    marks[name] = torch.cuda.Event(enable_timing=True)
                    marks[name].record()
                else:
                    marks[name] = time.perf_counter()

        mark("start")
        route_fn, dispatch_fn, combine_fn = _ops(x)
        r = route_fn(logits, self.top_k, **self.route_kwargs)
        mark("routed")
        t = x.shape[0]
        bounds = [(c * t // chunks, (c + 1) * t // chunks) for c in range(chunks)]
        plans = [send_plan(r.topk_ids[a:b], r.topk_weights[a:b], self.per_rank, self.world) for a, b in bounds]
        counts = torch.stack([p[1] for p in plans], 1).reshape(-1)  # (W, chunks): destination-major for all_to_all
        recv = torch.empty_like(counts)
        dist.all_to_all_single(recv, counts, group=self.group)
        sc = counts.view(self.world, chunks).t().tolist()  # the host synchronization of every split size
        rc = recv.view(self.world, chunks).t().tolist()
        self.last_counts = (sc, rc)  # rows sent to / received from each rank, per chunk (the benchmark's bytes)
        fp8 = self.dispatch_dtype == "fp8"

        def send(c):  # chunk c's rows (and their scales) and routing, asynchronously
            index, _, ids, w = plans[c]
            rows = x[bounds[c][0] + index]
            payload = list(_quantize_rows(rows)) if fp8 else [rows]
            return [_exchange(v, sc[c], rc[c], self.group, True) for v in (*payload, ids, w)]

        def received(c, inflight):
            for _, work in inflight:
                work.wait()
            got = [v for v, _ in inflight]
            ids, w = got[-2], got[-1]
            local = routing_of(ids, w, self.per_rank)
            if fp8:
                q, sq = got[0].view(torch.float8_e4m3fn), got[1]
                return (_layout(q, local), _layout(sq, local)), local, w
            return dispatch_fn(got[0], local), local, w

        out = None
        inflight = send(0)
        backs = []
        for c in range(chunks):
            rows, local, w = received(c, inflight)
            if c == 0:
                mark("dispatched")
            if c + 1 < chunks:
                inflight = send(c + 1)
            y = self.expert_fn(rows, local)
            if c == 0:
                mark("computed")
            if out is None:
                out = torch.zeros(t, x.shape[1] if y.dim() < 2 else y.shape[-1], dtype=torch.float32, device=x.device)
            partial = combine_fn(y, local, w, self.combine_dtype)
            backs.append(_exchange(partial, rc[c], sc[c], self.group, True))
        for c, (back, work) in enumerate(backs):
            work.wait()
            index, a, start = plans[c][0], bounds[c][0], 0
            for n in sc[c]:  # rank order: a token's partials added in a fixed order
                out[a + index[start:start + n]] += back[start:start + n].float()
                start += n
        out = out.to(out_dtype)
        mark("combined")
        return out


def _quantize_rows(rows: torch.Tensor):
    """(e4m3 rows viewed as uint8 for the collective, their 1x128 fp32 scales): the FP8 dispatch's payload."""
    if rows.is_cuda:
        from cute_kernels.quantize.ops import quantize_1x128

        q, s = quantize_1x128(rows)
    else:
        from cute_kernels.quantize.ops import quantize_1x128_reference

        q, s = quantize_1x128_reference(rows)
    return q.view(torch.uint8), s


def _layout(t: torch.Tensor, local: Routing) -> torch.Tensor:
    """Received rows of any dtype gathered into the contiguous layout of `local` (padding rows zero bytes): the FP8
    rows and their scales, which arrive quantized."""
    flat = t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t
    # fixed-size ops (a gather, then the padding rows zeroed): no boolean indexing, so no host synchronization
    src = local.row_source
    if flat.shape[0] == 0:  # nothing received: every row of the layout is padding
        out = flat.new_zeros(src.numel(), *flat.shape[1:])
    else:
        out = flat.index_select(0, (src.clamp(min=0) // local.topk_ids.shape[1]).long())
        out.masked_fill_((src < 0).unsqueeze(1), 0)
    return out.view(t.dtype) if t.dtype == torch.float8_e4m3fn else out
