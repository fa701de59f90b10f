"""CPU: the expert-parallel orchestration (`cute_kernels.moe.ep`) in 2 and 4 gloo processes with the torch references
standing in for the kernels: each rank's output equals the one-process layer on the same tokens (fp32 partials:
to rounding; bf16 partials as DeepEP sends them: within bf16 error), with skewed routing (one rank's experts take
almost every token, another's none) and a rank with no tokens of its own; the chunked forward (asynchronous exchanges
of token ranges overlapping the experts) equal to the unchunked one bitwise; the send plan's counts and order."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from cute_kernels.moe.reference import combine, dispatch, route

E, K, H = 16, 4, 64


def _data(world, h=H):
    g = torch.Generator().manual_seed(0)
    tokens = [37, 0, 53, 20][:world]  # rank 1 has no tokens of its own
    x = [torch.randn(t, h, generator=g) for t in tokens]
    logits = [torch.randn(t, E, generator=g) for t in tokens]
    for lg in logits:
        lg[:, :E // world] += 4.0  # rank 0's experts take almost every token
        lg[:, E // world:2 * E // world] -= 40.0  # rank 1's (with world > 2: rank 1 serves nothing)
    w = torch.randn(E, h, h, generator=g) / h ** 0.5
    return x, logits, w


def _expert_fn(w, first):
    def fn(rows, r):
        out = torch.zeros_like(rows)
        for row in range(rows.shape[0]):
            e = int(r.m_indices[row])
            if e >= 0:
                out[row] = rows[row] @ w[first + e]
        return out
    return fn


def _fp8_expert_fn(w, first):
    """The experts on (e4m3 rows, 1x128 scales): dequantized, then `_expert_fn`'s products."""
    inner = _expert_fn(w, first)

    def fn(rows, r):
        q, s = rows
        return inner(q.float() * s.repeat_interleave(128, dim=1), r)
    return fn


def _reference(x, logits, w):
    r = route(logits, K)
    return combine(_expert_fn(w, 0)(dispatch(x, r), r), r, r.topk_weights, out_dtype=torch.float32)


def _worker(rank, world, port, combine_dtype):
    from cute_kernels.moe.ep import EPMoE

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        x, logits, w = _data(world)
        per = E // world
        layer = EPMoE(E, K, _expert_fn(w, rank * per), combine_dtype=combine_dtype)
        out = layer.forward(x[rank], logits[rank], out_dtype=torch.float32)
        ref = _reference(x[rank], logits[rank], w)
        assert out.shape == ref.shape
        tol = 1e-5 if combine_dtype == torch.float32 else 2e-2
        assert torch.allclose(out, ref, rtol=tol, atol=tol), (rank, (out - ref).abs().max())
        again = layer.forward(x[rank], logits[rank], out_dtype=torch.float32)
        assert torch.equal(out, again)  # fixed orders: bitwise run to run
        for chunks in (2, 3):  # overlapped exchanges of token ranges: the same sums in the same orders
            assert torch.equal(layer.forward(x[rank], logits[rank], out_dtype=torch.float32, chunks=chunks), out)
    finally:
        dist.destroy_process_group()


def _fp8_worker(rank, world, port):
    """FP8 dispatch: each row quantized 1x128 once by its sender; equal to the one-rank layer on the same quantized
    rows (fp32 partials), chunked or not."""
    from cute_kernels.moe.ep import EPMoE
    from cute_kernels.quantize.ops import quantize_1x128_reference

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        x, logits, w = _data(world, h=128)
        per = E // world
        layer = EPMoE(E, K, _fp8_expert_fn(w, rank * per), combine_dtype=torch.float32, dispatch_dtype="fp8")
        marks = {}
        out = layer.forward(x[rank], logits[rank], out_dtype=torch.float32, marks=marks)
        assert list(marks) == ["start", "routed", "dispatched", "computed", "combined"]
        q, s = quantize_1x128_reference(x[rank])
        ref = _reference(q.float() * s.repeat_interleave(128, dim=1), logits[rank], w)
        assert torch.allclose(out, ref, rtol=1e-5, atol=1e-5), (rank, (out - ref).abs().max())
        assert torch.equal(layer.forward(x[rank], logits[rank], out_dtype=torch.float32, chunks=2), out)
    finally:
        dist.destroy_process_group()


def test_ep_fp8_dispatch():
    mp.spawn(_fp8_worker, args=(2, _free_port()), nprocs=2, join=True)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("combine_dtype", [torch.float32, torch.bfloat16])
def test_ep_matches_one_rank(world, combine_dtype):
    mp.spawn(_worker, args=(world, _free_port(), combine_dtype), nprocs=world, join=True)


def test_send_plan_order_and_counts():
    from cute_kernels.moe.ep import send_plan

    ids = torch.tensor([[0, 5], [6, 7], [1, 2], [4, 3]], dtype=torch.int32)  # 8 experts on 2 ranks (4 each)
    w = torch.arange(8, dtype=torch.float32).view(4, 2)
    index, counts, sid, sw = send_plan(ids, w, 4, 2)
    assert index.tolist() == [0, 2, 3, 0, 1, 3] and counts.tolist() == [3, 3]
    assert sid.tolist() == [[0, -1], [1, 2], [-1, 3], [-1, 1], [2, 3], [0, -1]]
    assert sw.tolist() == [[0, 0], [4, 5], [0, 7], [0, 1], [2, 3], [6, 0]]
