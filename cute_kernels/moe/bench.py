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
    checks = []
    big = H.worst(rows, lambda r: int(r.shape.split(" ")[0][1:]) >= 4096)
    if big:
        checks.append({"target": "dispatch and combine >= 85 % of copy bandwidth from 4096 tokens",
                       "measured": f"min {big.pct_ceiling:.1f}% ({big.case} {big.shape})",
                       "ok": big.pct_ceiling >= 85.0})
    return rows, ["torch"], checks, "", {}


SUITES = {"moe": moe}
PEERS: dict[str, tuple[str, ...]] = {"moe": ()}
