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
one-rank layer it differs only by the partials' grouping and rounding (calc_diff, not bits). The chunked exchange
overlapped with the grouped GEMMs (a second stream) belongs to the GPU path; this module is its logic, which the CPU
tests run in 2-4 gloo processes.
"""

from __future__ import annotations

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


def _exchange(t: torch.Tensor, send_counts: list[int], recv_counts: list[int], group) -> torch.Tensor:
    out = t.new_empty((sum(recv_counts), *t.shape[1:]))
    dist.all_to_all_single(out, t.contiguous(), recv_counts, send_counts, group=group)
    return out


class EPMoE:
    """One rank's share of an expert-parallel MoE layer. `expert_fn(rows, routing)` computes the rank's experts on
    rows in the contiguous layout of `routing` (local expert ids) and returns their outputs in that layout."""

    def __init__(self, experts: int, top_k: int, expert_fn: Callable[[torch.Tensor, Routing], torch.Tensor],
                 group=None, combine_dtype: torch.dtype = torch.bfloat16, **route_kwargs):
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        if experts % self.world:
            raise ValueError(f"experts = {experts} must divide over the {self.world} ranks")
        self.experts, self.top_k, self.expert_fn, self.group = experts, top_k, expert_fn, group
        self.per_rank = experts // self.world
        self.combine_dtype = combine_dtype
        self.route_kwargs = route_kwargs

    def forward(self, x: torch.Tensor, logits: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """x (T, H) and logits (T, E) of this rank's tokens -> (T, H) in `out_dtype`. On CUDA tensors the routing,
        dispatch and combine are the MoE ops; elsewhere (the gloo tests) their torch references."""
        route_fn, dispatch_fn, combine_fn = _ops(x)
        r = route_fn(logits, self.top_k, **self.route_kwargs)
        send_index, counts, send_ids, send_w = send_plan(r.topk_ids, r.topk_weights, self.per_rank, self.world)
        recv = torch.empty_like(counts)
        dist.all_to_all_single(recv, counts, group=self.group)
        sc, rc = counts.tolist(), recv.tolist()  # the host synchronization of the split sizes
        rows = _exchange(x[send_index], sc, rc, self.group)
        ids = _exchange(send_ids, sc, rc, self.group)
        w = _exchange(send_w, sc, rc, self.group)
        local = routing_of(ids, w, self.per_rank)
        y = self.expert_fn(dispatch_fn(rows, local), local)
        partial = combine_fn(y, local, w, self.combine_dtype)
        back = _exchange(partial, rc, sc, self.group)
        out = torch.zeros(x.shape[0], x.shape[1] if y.dim() < 2 else y.shape[-1], dtype=torch.float32,
                          device=x.device)
        start = 0
        for n in sc:  # rank order: a token's partials added in a fixed order
            seg = send_index[start:start + n]
            out[seg] += back[start:start + n].float()
            start += n
        return out.to(out_dtype)
