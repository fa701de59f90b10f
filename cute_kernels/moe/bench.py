"""The benchmark suite of the MoE family (lesson 14): dispatch and combine on DeepSeek-V3-like shapes (hidden 7168,
256 experts, top-8) against torch's gather / weighted sum, as TB/s over the bytes each must move (dispatch: x once,
each copy written; combine: each copy read, one row a token written; padding rows not counted) and % of a same-run
copy. Conventions as every suite (`cute_kernels.bench`)."""

from __future__ import annotations

import torch

from cute_kernels.bench import harness as H


def moe(shapes=None, quick=False, ceilings=None):
    import cute_kernels as ck

    shapes = shapes or ([(4096, 7168, 256, 8)] if quick else
                        [(4096, 7168, 256, 8), (16384, 7168, 256, 8), (32768, 7168, 64, 8), (128, 7168, 256, 8),
                         (4096, 2048, 64, 6)])
    copy_bw = ceilings["copy"]
    rows = []
    for t, h, e, k in shapes:
        logits = H.randn(t, e, dtype=torch.float32, seed=1)
        r = ck.moe_route(logits, k)
        x = H.randn(t, h, seed=2)
        tok = torch.arange(t, device="cuda").repeat_interleave(k)
        dst = r.token_rows.reshape(-1).long()
        nbytes = t * h * 2 * (1 + k)

        def torch_dispatch():
            out = torch.empty(r.m_indices.shape[0], h, dtype=x.dtype, device="cuda")
            out[dst] = x[tok]
            return out

        H.progress(f"  moe dispatch T={t} H={h} E={e} k={k}")
        ours = H.do_bench(lambda: ck.moe_dispatch(x, r))["median_ms"]
        rows.append(H.Row("dispatch", "bf16", f"T{t} H{h} E{e} k{k}", nbytes, 0, ours,
                          {"torch": H.do_bench(torch_dispatch)["median_ms"]}, "copy", copy_bw))
        y = H.randn(r.m_indices.shape[0], h, seed=3)
        w = r.topk_weights

        def torch_combine():
            return (y[r.token_rows.long()].float() * w.unsqueeze(2)).sum(1).to(y.dtype)

        H.progress(f"  moe combine T={t} H={h} E={e} k={k}")
        ours = H.do_bench(lambda: ck.moe_combine(y, r, w))["median_ms"]
        rows.append(H.Row("combine", "bf16", f"T{t} H{h} E{e} k{k}", nbytes, 0, ours,
                          {"torch": H.do_bench(torch_combine)["median_ms"]}, "copy", copy_bw))
        # routing: ours (kernel + layouts) against a torch implementation (softmax, topk, sort, bincount, cumsum,
        # index), bytes: the logits read and the ids / weights written
        def torch_route():
            sc = torch.softmax(logits, -1)
            w_, ids = sc.topk(k, -1)
            w_ = w_ / w_.sum(-1, keepdim=True)
            flat = ids.flatten()
            order = torch.sort(flat, stable=True).indices
            counts = torch.bincount(flat, minlength=e)
            offs = torch.cumsum(counts, 0) - counts
            rank = torch.empty_like(flat)
            rank[order] = torch.arange(flat.numel(), device="cuda") - offs[flat[order]]
            return ids, w_, counts, rank

        H.progress(f"  moe route T={t} E={e} k={k}")
        ours = H.do_bench(lambda: ck.moe_route(logits, k))["median_ms"]
        rows.append(H.Row("route", "fp32", f"T{t} H{h} E{e} k{k}", t * e * 4 + t * k * 8, 0, ours,
                          {"torch": H.do_bench(torch_route)["median_ms"]}, "copy", copy_bw))
    checks = []
    rt = [r for r in rows if r.case == "route" and int(r.shape.split(" ")[0][1:]) >= 4096]
    if rt:
        worst = min(rt, key=lambda r: r.refs_ms["torch"] / r.ours_ms)
        checks.append({"target": "routing >= 3x a torch implementation at 4096-32768 tokens",
                       "measured": f"min {worst.refs_ms['torch'] / worst.ours_ms:.2f}x ({worst.shape})",
                       "ok": worst.refs_ms["torch"] / worst.ours_ms >= 3.0})
    big = H.worst(rows, lambda r: r.case != "route" and int(r.shape.split(" ")[0][1:]) >= 4096)
    if big:
        checks.append({"target": "dispatch and combine >= 85 % of copy bandwidth from 4096 tokens",
                       "measured": f"min {big.pct_ceiling:.1f}% ({big.case} {big.shape})",
                       "ok": big.pct_ceiling >= 85.0})
    return rows, ["torch"], checks, "", {}


SUITES = {"moe": moe}
PEERS: dict[str, tuple[str, ...]] = {"moe": ()}
