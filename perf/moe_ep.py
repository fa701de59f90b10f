"""The expert-parallel MoE layer across GPUs (issue 42): correctness against the one-GPU layer, dispatch / combine
bandwidth beside a bare all-to-all and an eager torch dispatch, and the chunked overlap.

    torchrun --nproc-per-node 2 perf/moe_ep.py --out $OUT/moe_ep_x2      # one process per GPU, NCCL
    python3 perf/moe_ep.py --smoke                                        # 2 gloo processes on CPU, small sizes

Per rank, DeepEP's benchmark setting by default: 4096 tokens, hidden 7168, top-8 of 256 experts, FP8 dispatch (e4m3
rows and their 1x128 scales), bf16 combine. Bytes as DeepEP counts them: the rows a rank receives from other ranks
(a token once per destination rank, however many of its experts live there); rows to itself are reported apart.
Rank 0 writes `moe_ep.json` and `moe_ep.md` under --out. NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
In --smoke mode the experts are the torch reference (dequantize, matmul) and times are host times: it checks the
script's paths, not speed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """DeepGEMM's similarity measure: 1 - 2 <x, y> / (|x|^2 + |y|^2), in fp64."""
    x, y = x.double(), y.double()
    den = (x * x + y * y).sum()
    return float(1 - 2 * (x * y).sum() / den) if den > 0 else 0.0


def _timer(cuda: bool):
    """(start, stop) -> ms: CUDA events on the GPU, host time on CPU."""
    if cuda:
        def run(fn):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            out = fn()
            e.record()
            torch.cuda.synchronize()
            return s.elapsed_time(e), out
    else:
        def run(fn):
            t0 = time.perf_counter()
            out = fn()
            return (time.perf_counter() - t0) * 1e3, out
    return run


def _median(fn, reps, cuda):
    timed = _timer(cuda)
    ts = []
    for _ in range(reps):
        dist.barrier()
        ts.append(timed(fn)[0])
    return statistics.median(ts)


def _phase_ms(marks, a, b, cuda):
    return marks[a].elapsed_time(marks[b]) if cuda else (marks[b] - marks[a]) * 1e3


def _weights(args, dev):
    """Every expert's FP8 weights, identical on every rank (seeded on the device), with their 128x128 scales."""
    from cute_kernels.quantize.ops import quantize_128x128, quantize_128x128_reference

    quant = quantize_128x128 if dev.type == "cuda" else quantize_128x128_reference
    g = torch.Generator(device=dev).manual_seed(1234)
    e, h, i = args.experts, args.hidden, args.inter
    w13, s13, w2, s2 = [], [], [], []
    for _ in range(e):
        q, s = quant(torch.randn(2 * i, h, generator=g, device=dev).mul_(h**-0.5).to(torch.bfloat16))
        w13.append(q)
        s13.append(s)
        q, s = quant(torch.randn(h, i, generator=g, device=dev).mul_(i**-0.5).to(torch.bfloat16))
        w2.append(q)
        s2.append(s)
    router = torch.randn(e, h, generator=g, device=dev).mul_(h**-0.5).to(torch.bfloat16)
    return router, torch.stack(w13), torch.stack(s13), torch.stack(w2), torch.stack(s2)


def _expert_fn(args, w13, s13, w2, s2, dev):
    if dev.type == "cuda":
        from cute_kernels.moe.ops import moe_experts_fp8

        return lambda rows, r: moe_experts_fp8(rows[0], rows[1], r, w13, s13, w2, s2)
    from cute_kernels.quantize.ops import dequantize_128x128

    w13f = [dequantize_128x128(w13[e], s13[e]) for e in range(w13.shape[0])]
    w2f = [dequantize_128x128(w2[e], s2[e]) for e in range(w2.shape[0])]
    inter = w13.shape[1] // 2

    def fn(rows, r):  # the torch reference of moe_experts_fp8 on the dequantized rows
        q, s = rows
        x = q.float() * s.repeat_interleave(128, dim=1)
        out = torch.zeros(x.shape[0], w2.shape[1])
        for row in range(x.shape[0]):
            e = int(r.m_indices[row])
            if e >= 0:
                hh = x[row] @ w13f[e].t()
                out[row] = (torch.nn.functional.silu(hh[:inter]) * hh[inter:]) @ w2f[e].t()
        return out.to(torch.bfloat16)
    return fn


def _one_gpu(args, x, logits, weights, dev):
    """The one-GPU layer on this rank's tokens with every expert local (no exchange)."""
    from cute_kernels.moe.reference import route

    router, w13, s13, w2, s2 = weights
    if dev.type == "cuda":
        import cute_kernels as ck
        from cute_kernels.moe.ops import moe_experts_fp8

        r = ck.moe_route(logits, args.topk)
        xq, sx = ck.moe_dispatch(x, r, quantize="1x128")
        return ck.moe_combine(moe_experts_fp8(xq, sx, r, w13, s13, w2, s2), r, r.topk_weights)
    from cute_kernels.moe.reference import combine, dispatch

    r = route(logits, args.topk)
    rows = dispatch(x, r, quantize="1x128")
    return combine(_expert_fn(args, w13, s13, w2, s2, dev)(rows, r), r, r.topk_weights, out_dtype=torch.bfloat16)


def _eager_dispatch(x, topk_ids, per_rank, world, group):
    """The plain-torch dispatch the issue compares against: sort tokens by destination rank, exchange the split
    sizes (one host sync), all_to_all the FP8 rows and scales (quantized in torch), permute by expert on the
    receiver."""
    from cute_kernels.moe.ep import destinations

    mask = destinations(topk_ids, per_rank, world)
    dest = mask.nonzero()  # (token, rank) pairs, token-major
    order = torch.argsort(dest[:, 1], stable=True)
    tok, rk = dest[order, 0], dest[order, 1]
    counts = torch.bincount(rk, minlength=world)
    recv = torch.empty_like(counts)
    dist.all_to_all_single(recv, counts, group=group)
    sc, rc = counts.tolist(), recv.tolist()
    rows = x[tok].float()
    blocks = rows.view(rows.shape[0], -1, 128)
    scale = (blocks.abs().amax(-1, keepdim=True) / 448.0).clamp(min=1e-10)
    q = (blocks / scale).to(torch.float8_e4m3fn).view(torch.uint8).view(rows.shape[0], -1)
    out_q = q.new_empty(sum(rc), q.shape[1])
    out_s = scale.new_empty(sum(rc), scale.shape[1])
    dist.all_to_all_single(out_q, q, rc, sc, group=group)
    dist.all_to_all_single(out_s, scale.squeeze(-1).contiguous(), rc, sc, group=group)
    ids = topk_ids[tok].long()
    ids_out = ids.new_empty(sum(rc), ids.shape[1])
    dist.all_to_all_single(ids_out, ids, rc, sc, group=group)
    first = ids_out.min(1).values  # receiver-side permutation by (an) expert of each row
    perm = torch.argsort(first, stable=True)
    return out_q[perm], out_s[perm]


def run(args, rank, world, dev):
    from cute_kernels.moe.ep import EPMoE

    cuda = dev.type == "cuda"
    per = args.experts // world
    weights = _weights(args, dev)
    router, w13, s13, w2, s2 = weights
    sl = slice(rank * per, (rank + 1) * per)
    layer = EPMoE(args.experts, args.topk, _expert_fn(args, w13[sl], s13[sl], w2[sl], s2[sl], dev),
                  combine_dtype=torch.bfloat16, dispatch_dtype="fp8")
    g = torch.Generator(device=dev).manual_seed(100 + rank)
    x = torch.randn(args.tokens, args.hidden, generator=g, device=dev).to(torch.bfloat16)
    logits = (x.float() @ router.float().t())
    results = {"rank": rank, "world": world}

    # correctness: uniform routing, then skewed (rank 0's experts favoured, the last rank's starved)
    skew = logits.clone()
    skew[:, :per] += 4.0
    skew[:, (world - 1) * per:] -= 40.0
    for name, lg in (("uniform", logits), ("skewed", skew)):
        ep = layer.forward(x, lg)
        one = _one_gpu(args, x, lg, weights, dev)
        results[f"calc_diff {name}"] = calc_diff(ep, one)
        results[f"bitwise rerun {name}"] = bool(torch.equal(ep, layer.forward(x, lg)))

    # bandwidth: the phases of the unchunked forward, DeepEP's byte counts
    row_bytes = args.hidden + 4 * (args.hidden // 128)
    phases = {"dispatch": [], "combine": [], "layer": []}
    for _ in range(args.reps):
        marks = {}
        dist.barrier()
        layer.forward(x, logits, marks=marks)
        if cuda:
            torch.cuda.synchronize()
        phases["dispatch"].append(_phase_ms(marks, "routed", "dispatched", cuda))
        phases["combine"].append(_phase_ms(marks, "computed", "combined", cuda))
        phases["layer"].append(_phase_ms(marks, "start", "combined", cuda))
    med = {k: statistics.median(v) for k, v in phases.items()}
    sc, rc = layer.last_counts
    from_others = sum(n for c in rc for src, n in enumerate(c) if src != rank)
    to_self = sum(c[rank] for c in rc)
    results.update({"rows received from others": from_others, "rows to self": to_self,
                    "dispatch ms": med["dispatch"], "combine ms": med["combine"], "layer ms": med["layer"],
                    "dispatch GB/s": from_others * row_bytes / (med["dispatch"] * 1e-3) / 1e9,
                    "combine GB/s": from_others * args.hidden * 2 / (med["combine"] * 1e-3) / 1e9})

    # the bare all-to-all with the same per-pair bytes, and the eager torch dispatch
    send_rows, recv_rows = [sum(c[d] for c in sc) for d in range(world)], [sum(c[d] for c in rc) for d in range(world)]
    sbuf = torch.empty(sum(send_rows) * row_bytes, dtype=torch.uint8, device=dev)
    rbuf = torch.empty(sum(recv_rows) * row_bytes, dtype=torch.uint8, device=dev)
    bare = _median(lambda: dist.all_to_all_single(rbuf, sbuf, [n * row_bytes for n in recv_rows],
                                                  [n * row_bytes for n in send_rows]), args.reps, cuda)
    from cute_kernels.moe.reference import route

    ids = route(logits, args.topk).topk_ids
    eager = _median(lambda: _eager_dispatch(x, ids, per, world, None), args.reps, cuda)
    results.update({"bare all_to_all ms": bare, "eager dispatch ms": eager,
                    "dispatch / bare all_to_all": bare / med["dispatch"],
                    "dispatch / eager": eager / med["dispatch"]})

    # overlap: the layer chunked against unchunked, and the one-GPU layer on the same per-rank work
    for chunks in args.chunks:
        results[f"layer ms chunks={chunks}"] = _median(lambda c=chunks: layer.forward(x, logits, chunks=c), args.reps,
                                                       cuda)
    results["one-GPU layer ms"] = _median(lambda: _one_gpu(args, x, logits, weights, dev), args.reps, cuda)
    return results


def _report(all_results, args, out: Path | None):
    keys = [k for k in all_results[0] if k not in ("rank", "world")]
    lines = ["| " + " | ".join(["what"] + [f"rank {r['rank']}" for r in all_results]) + " |",
             "|---|" + "---|" * len(all_results)]
    for k in keys:
        cells = [f"{r[k]:.4g}" if isinstance(r[k], float) else str(r[k]) for r in all_results]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    md = "\n".join(lines)
    print(md)
    ok = all(r["calc_diff uniform"] < 1e-3 and r["calc_diff skewed"] < 1e-3 for r in all_results)
    print(f"[{'PASS' if ok else 'FAIL'}] calc_diff < 1e-3 against the one-GPU layer, uniform and skewed routing")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "moe_ep.json").write_text(json.dumps({"args": vars(args) | {"out": str(out)}, "ranks": all_results},
                                                    indent=1))
        (out / "moe_ep.md").write_text(f"# MoE expert parallelism, {all_results[0]['world']} ranks\n\n{md}\n")
    return ok


def _main_rank(rank, world, args, port=None):
    if args.smoke:
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
        dev = torch.device("cpu")
    else:
        dist.init_process_group("nccl")
        rank, world = dist.get_rank(), dist.get_world_size()
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(dev)
    try:
        res = run(args, rank, world, dev)
        gathered = [None] * world
        dist.all_gather_object(gathered, res)
        if rank == 0:
            ok = _report(gathered, args, Path(args.out) if args.out else None)
            if not ok:
                raise SystemExit(1)
    finally:
        dist.destroy_process_group()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096, help="tokens per rank")
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--inter", type=int, default=2048, help="each expert's intermediate size")
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--chunks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--out", default="")
    ap.add_argument("--smoke", action="store_true", help="2 gloo processes on CPU with small sizes")
    args = ap.parse_args(argv)
    if args.smoke:
        import socket

        import torch.multiprocessing as mp

        args.tokens, args.hidden, args.inter, args.experts, args.topk, args.reps = 24, 256, 128, 8, 2, 2
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(_main_rank, args=(2, args, port), nprocs=2, join=True)
    else:
        _main_rank(0, 0, args)


if __name__ == "__main__":
    main()
