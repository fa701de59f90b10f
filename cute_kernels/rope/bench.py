"""The benchmark suite of RoPE: Llama-3-8B's attention (32 query and 8 KV heads, D = 128), prefill token counts up
to 131k and decode batches, both pairings, out of place and in place; beside torch eager in the Hugging Face form
(cos / sin rows gathered and cast, `q * cos + rotate_half(q) * sin`) and its torch.compile, in the same interleaved
rounds. TB/s over the bytes the op must move: q and k read and written, the angle rows of each token read once;
% of the copy bandwidth measured in the same run. No peer package in this project's set has a RoPE op.
"""

from __future__ import annotations

import torch

from cute_kernels.bench import harness as H


def _rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def _hf_rope(q, k, cos, sin, pos):
    """Hugging Face's apply_rotary_pos_emb on (T, H, D) with its (T, D) tables in the input dtype."""
    c = torch.cat((cos, cos), dim=-1)[pos].to(q.dtype)[:, None, :]
    s = torch.cat((sin, sin), dim=-1)[pos].to(q.dtype)[:, None, :]
    return q * c + _rotate_half(q) * s, k * c + _rotate_half(k) * s


def _hf_rope_gptj(q, k, cos, sin, pos):
    """GPT-J pairs in torch: rotate each (even, odd) pair through a (T, H, D / 2, 2) view."""
    c = cos[pos][:, None, :]
    s = sin[pos][:, None, :]

    def one(x):
        xf = x.float().unflatten(-1, (-1, 2))
        a, b = xf[..., 0], xf[..., 1]
        return torch.stack((a * c - b * s, b * c + a * s), dim=-1).flatten(-2).to(x.dtype)

    return one(q), one(k)


def rope(shapes=None, dtypes=(torch.bfloat16,), quick=False, ceilings=None):
    import cute_kernels as ck

    hq, hk, d = 32, 8, 128
    tokens = [131072] if quick else [4096, 32768, 131072]
    decode = [] if quick else [1, 16, 64]
    if shapes:
        tokens, decode = [s[0] for s in shapes], []
    copy_bw = ceilings["copy"]
    eager = {"neox": _hf_rope, "gptj": _hf_rope_gptj}
    comp = {k: H.compiled(f) for k, f in eager.items()}
    cos, sin = ck.rope_tables(131072, d, 500000.0, device="cuda")
    rows = []
    for dt in dtypes:
        for t in tokens + decode:
            q, k = H.randn(t, hq, d, dtype=dt, seed=3), H.randn(t, hk, d, dtype=dt, seed=4)
            # decode tokens sit at scattered positions of long sequences; prefill tokens count up
            pos = (torch.arange(t, device="cuda") if t >= 4096 else
                   torch.randint(0, 131072, (t,), device="cuda", generator=torch.Generator("cuda").manual_seed(5)))
            nbytes = 2 * (q.numel() + k.numel()) * q.element_size() + t * d * 4
            for style in (("neox", "gptj") if t == max(tokens) else ("neox",)):
                inter = style == "gptj"
                qi, ki = q.clone(), k.clone()
                cases = [
                    (f"rope.{style}", lambda: ck.rope(q, k, cos, sin, positions=pos, interleaved=inter)),
                    (f"rope_.{style}", lambda: ck.rope_(qi, ki, cos, sin, positions=pos, interleaved=inter)),
                ]
                refs = {"torch": lambda: eager[style](q, k, cos, sin, pos),
                        "torch.compile": lambda: comp[style](q, k, cos, sin, pos)}
                for case, ours in cases:
                    H.progress(f"  {case} {H.dtype_name(dt)} tokens {t}")
                    res = H.do_bench_interleaved({"ours": ours, **refs})
                    rows.append(H.Row(case, H.dtype_name(dt), f"{t}x{hq}/{hk}x{d}", nbytes, 0, res["ours"]["median_ms"],
                                      {n: res[n]["median_ms"] for n in refs}, "copy", copy_bw))
    # the fused decode step: q, k rotated at their cache positions and k, v appended (a paged cache of 64-row pages)
    from cute_kernels.attention.decode_ops import _append_torch

    for b in ([1] if quick else [1, 16, 64]):
        dt = dtypes[0]
        q, k, v = (H.randn(b, 1, h, d, dtype=dt, seed=6 + i) for i, h in enumerate((hq, hk, hk)))
        per = 4096 // 64
        kc, vc = (H.randn(b * per, 64, hk, d, dtype=dt, seed=9 + i) for i in range(2))
        table = torch.arange(b * per, device="cuda", dtype=torch.int32).view(b, per)
        lens = torch.full((b,), 4000, dtype=torch.int32, device="cuda")
        pos = lens.long()[:, None]

        def unfused():
            qr, kr = ck.rope(q, k, cos, sin, positions=pos)
            _append_torch(kc, vc, kr, v, lens, table)
            return qr

        H.progress(f"  rope_kv_append batch {b}")
        res = H.do_bench_interleaved({"ours": lambda: ck.rope_kv_append(q, k, v, kc, vc, lens, cos, sin,
                                                                         block_table=table),
                                      "rope + torch append": unfused})
        nbytes = (2 * q.numel() + 3 * k.numel() + v.numel()) * q.element_size() + b * d * 4
        rows.append(H.Row("rope_kv_append", H.dtype_name(dt), f"{b}x1x{hq}/{hk}x{d}", nbytes, 0,
                          res["ours"]["median_ms"], {"rope + torch append": res["rope + torch append"]["median_ms"]},
                          "copy", copy_bw))
    checks = []
    fused = [r for r in rows if r.case == "rope_kv_append" and r.shape.startswith("1x")]
    if fused:
        checks.append({"target": "fused decode RoPE + append at B = 1 <= 5 us", "measured":
                       f"{fused[0].ours_ms * 1e3:.1f} us", "ok": fused[0].ours_ms * 1e3 <= 5.0})
    big = [r for r in rows if r.shape.startswith("131072x")]
    if big:
        w = min(big, key=lambda r: r.pct_ceiling)
        checks.append({"target": ">= 90% of copy bandwidth at 131k tokens, 32 / 8 heads", "measured":
                       f"min {w.pct_ceiling:.1f}% ({w.case})", "ok": w.pct_ceiling >= 90.0})
    pre = [r for r in rows if r.case != "rope_kv_append" and int(r.shape.split("x")[0]) >= 4096]
    if pre:
        w = min(pre, key=lambda r: r.ratio("torch.compile"))
        checks.append({"target": ">= 1.0x torch.compile (prefill sizes)", "measured":
                       f"min {w.ratio('torch.compile'):.3f}x ({w.case} {w.shape})", "ok": w.ratio("torch.compile") >= 1.0})
    dec = [r for r in rows if r.case != "rope_kv_append" and int(r.shape.split("x")[0]) < 4096]
    extra = ""
    if dec:
        extra = "Decode rows (1-64 tokens): " + ", ".join(f"{r.case} {r.shape.split('x')[0]} tok {r.ours_ms * 1e3:.1f} us"
                                                          for r in dec)
    return rows, ["torch", "torch.compile", "rope + torch append"], checks, extra, {}


SUITES = {"rope": rope}
PEERS: dict[str, tuple[str, ...]] = {"rope": ()}
