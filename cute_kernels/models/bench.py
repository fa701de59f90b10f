"""Benchmark suites of the decoder layer (`LlamaDecoderLayer`, Llama-3-8B shapes: hidden 4096, 32 / 8 heads, D 128,
MLP 14336).

`llama_decode`: one decode step captured in a CUDA graph (each replay redoes the same position), B = 1-64 at 4k-32k
tokens of KV cache, bf16 / FP8 / W4A16 weights; TB/s over the step's bytes (the weights in their format + the KV
read + the activations), % of the read ceiling measured in the same run (so 100 / % is the step's multiple of its
bytes roofline). The W4A16 and FP8 rows are timed beside the bf16 layer's step. The breakdown (extra table): each
stage's GPU time between CUDA events recorded at its boundaries in an eager step queued behind a spin (so the host
is ahead and the gaps are the GPU's), its bytes floor at the read ceiling and the %.

`llama_prefill`: the layer's forward over B x S tokens (no cache), beside transformers' LlamaDecoderLayer with the
same bf16 weights under torch.compile (sdpa attention), in the same interleaved rounds; TFLOP/s over the layer's
matmul + causal attention FLOPs, % of a same-run torch.matmul at 8192^3.
"""

from __future__ import annotations

import time

import torch

from cute_kernels.bench import harness as H


def weight_bytes(n: int, k: int, weights: str) -> int:
    """Bytes of an (N, K) projection's weight in a format: bf16, FP8 with fp32 128x128-block scales, or int4 with
    bf16 scales per 128 along K."""
    if weights == "bf16":
        return n * k * 2
    if weights == "fp8":
        return n * k + -(-n // 128) * -(-k // 128) * 4
    return n * k // 2 + n * (k // 128) * 2


def stage_bytes(cfg, weights: str, b: int, ctx: int, s: int = 1) -> dict:
    """Each stage's DRAM bytes at its floor (weights once, the KV cache read once, activations in and out)."""
    h, i, d, hq, hk = cfg.hidden, cfg.intermediate, cfg.head_dim, cfg.heads, cfg.kv_heads
    t = b * s
    kv = b * ctx * hk * d * 2 * 2

    def proj(n, k):
        return weight_bytes(n, k, weights) + t * (n + k) * 2

    return {"norm_in": 2 * t * h * 2 + h * 2, "qkv": proj(cfg.qkv_out, h),
            "attention": kv + t * (hq * 2 + hk * 4) * d * 2, "o_proj": proj(h, hq * d),
            "norm_post": 4 * t * h * 2 + h * 2, "gate_up": proj(2 * i, h), "swiglu": 3 * t * i * 2,
            "down": proj(h, i), "residual": 3 * t * h * 2}


def _fold_fused(sb: dict, present: dict) -> dict:
    """Stage bytes with each stage the layer fused away (no mark of its own: bf16's swiglu into gate_up, its residual
    add into down) counted in the stage before it."""
    out: dict = {}
    last = None
    for st, nbytes in sb.items():
        if st in present or last is None:
            last = st
            out[st] = out.get(st, 0) + nbytes
        else:
            out[last] += nbytes
    return out


def _session(layer, b: int, ctx: int):
    from cute_kernels.models.driver import DecodeSession

    sess = DecodeSession(layer, b, ctx + 16)
    sess.kc.normal_()
    sess.vc.normal_()
    sess.lens.fill_(ctx)
    sess.x.copy_(H.randn(b, 1, layer.cfg.hidden, seed=5))
    sess.capture(advance=False)
    return sess


def _breakdown(sess, reps: int = 5) -> dict:
    """{stage: median us} of eager steps, between the CUDA events the layer records at its stage boundaries (in the
    layer's order)."""
    layer = sess.layer
    per: dict = {}
    for _ in range(reps):
        layer.marks = []
        torch.cuda._sleep(40_000_000)  # ~20 ms: the host queues the whole eager step before the GPU reaches it
        sess._step(advance=False)
        torch.cuda.synchronize()
        marks, layer.marks = layer.marks, None
        for (name, e0), (_, e1) in zip(marks, marks[1:]):
            per.setdefault(name, []).append(e0.elapsed_time(e1) * 1e3)
    return {st: sorted(v)[len(v) // 2] for st, v in per.items()}


def llama_decode(shapes=None, quick=False, ceilings=None):
    from cute_kernels.models.driver import random_state_dict
    from cute_kernels.models.llama import WEIGHTS, LlamaConfig, LlamaDecoderLayer

    cfg = LlamaConfig()
    read_bw = ceilings["read"]
    cases = shapes or ([(1, 4096)] if quick else [(1, 4096), (1, 32768), (4, 4096), (16, 4096), (64, 4096),
                                                  (16, 32768)])
    sd = random_state_dict(cfg)
    layers = {w: LlamaDecoderLayer(cfg, w).load_hf_state_dict(sd) for w in WEIGHTS}
    del sd
    rows, tables, times = [], [], {}
    for b, ctx in cases:
        sessions = {w: _session(layers[w], b, ctx) for w in WEIGHTS}
        H.progress(f"  llama decode B {b} ctx {ctx}")
        res = H.do_bench_interleaved({w: sessions[w].graph.replay for w in WEIGHTS})
        for w in WEIGHTS:
            sb = stage_bytes(cfg, w, b, ctx)
            t = res[w]["median_ms"]
            times[(w, b, ctx)] = t
            refs = {} if w == "bf16" else {"ours bf16 weights": res["bf16"]["median_ms"]}
            rows.append(H.Row("decode step", w, f"B{b} ctx{ctx}", sum(sb.values()), 0, t, refs, "read", read_bw,
                              note=f"floor {sum(sb.values()) / read_bw / 1e6:.1f} us"))
            if b == 1 and ctx == 4096:
                bd = _breakdown(sessions[w])
                lines = [f"#### {w} weights, B = 1, 4k context (step in graph: {t * 1e3:.1f} us)", "",
                         "| stage | us | floor us | % of floor speed |", "|---|---|---|---|"]
                fused = _fold_fused(sb, bd)
                for st, us in bd.items():
                    fl = fused[st] / read_bw / 1e6
                    lines.append(f"| {st} | {us:.1f} | {fl:.1f} | {100 * fl / us:.0f} % |")
                tot = sum(bd.values())
                fl = sum(sb.values()) / read_bw / 1e6
                lines.append(f"| eager total | {tot:.1f} | {fl:.1f} | {100 * fl / tot:.0f} % |")
                tables.append("\n".join(lines))
        del sessions
        torch.cuda.empty_cache()
    checks = []
    if ("bf16", 1, 4096) in times:
        t = times[("bf16", 1, 4096)] * 1e3
        fl = sum(stage_bytes(cfg, "bf16", 1, 4096).values()) / read_bw / 1e6
        checks.append({"target": "bf16 decode B = 1, 4k context <= 1.25x its bytes roofline (and <= 135 us)",
                       "measured": f"{t:.1f} us = {t / fl:.2f}x the {fl:.1f} us floor", "ok": t <= 1.25 * fl and t <= 135})
        w4 = times[("w4a16", 1, 4096)] * 1e3
        checks.append({"target": "W4A16 decode >= 2.2x our bf16 decode at B = 1", "measured": f"{t / w4:.2f}x "
                       f"({w4:.1f} us)", "ok": t / w4 >= 2.2})
    extra = "### Per-stage breakdown (eager step, CUDA events at the stage boundaries)\n\n" + "\n\n".join(tables)
    return rows, ["ours bf16 weights"], checks, extra, {}


def _hf_layer(cfg, sd):
    """transformers' LlamaDecoderLayer with the same weights and its rotary embedding, or None without
    transformers."""
    try:
        import transformers
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer as HFLayer
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    except ImportError:
        return None
    hc = transformers.LlamaConfig(hidden_size=cfg.hidden, num_attention_heads=cfg.heads,
                                  num_key_value_heads=cfg.kv_heads, head_dim=cfg.head_dim,
                                  intermediate_size=cfg.intermediate, rms_norm_eps=cfg.eps, rope_theta=cfg.rope_theta,
                                  max_position_embeddings=cfg.max_pos, attn_implementation="sdpa")
    hf = HFLayer(hc, layer_idx=0).cuda().to(torch.bfloat16).eval()
    hf.load_state_dict(sd)
    return hf, LlamaRotaryEmbedding(hc).cuda()


def llama_prefill(shapes=None, quick=False, ceilings=None):
    from cute_kernels.models.driver import random_state_dict
    from cute_kernels.models.llama import WEIGHTS, LlamaConfig, LlamaDecoderLayer

    cfg = LlamaConfig()
    cases = shapes or ([(1, 4096)] if quick else [(1, 4096), (1, 8192), (4, 2048)])
    sd = random_state_dict(cfg)
    layers = {w: LlamaDecoderLayer(cfg, w).load_hf_state_dict(sd) for w in WEIGHTS}
    hf = _hf_layer(cfg, sd)
    del sd
    comp = torch.compile(hf[0]) if hf is not None else None  # one compiled layer (recompiled per shape)
    peak = H.compute_ceiling("bf16")
    h, i, d = cfg.hidden, cfg.intermediate, cfg.head_dim
    lin = h * cfg.qkv_out + h * cfg.heads * d + 3 * h * i
    rows, checks = [], []
    for b, s in cases:
        x = H.randn(b, s, h, seed=7)
        flops = 2 * b * s * lin + 2 * b * cfg.heads * d * s * s  # causal attention: half of 4 B H D S^2
        nbytes = sum(stage_bytes(cfg, "bf16", b, 0, s).values())
        fns = {w: (lambda w=w: layers[w](x)) for w in WEIGHTS}
        if hf is not None:
            pos = torch.arange(s, device="cuda")[None].expand(b, -1)
            with torch.no_grad():
                pe = hf[1](x, pos)

            def run_hf():
                with torch.no_grad():
                    return comp(x, position_ids=pos, position_embeddings=pe)

            fns["HF torch.compile bf16"] = run_hf
        H.progress(f"  llama prefill B {b} S {s}")
        res = H.do_bench_interleaved(fns)
        refs = {k: v["median_ms"] for k, v in res.items() if k not in WEIGHTS}
        for w in WEIGHTS:
            rows.append(H.Row("prefill", w, f"B{b} S{s}", nbytes, flops, res[w]["median_ms"], refs, "tflops",
                              peak.tflops))
    if hf is not None:
        for w, goal in (("bf16", 1.0), ("fp8", 1.3)):
            r = min((r for r in rows if r.dtype == w), key=lambda r: r.ratio("HF torch.compile bf16"))
            checks.append({"target": f"{w} weights >= {goal}x torch.compile of the transformers layer (bf16)",
                           "measured": f"min {r.ratio('HF torch.compile bf16'):.2f}x ({r.shape})",
                           "ok": r.ratio("HF torch.compile bf16") >= goal})
    extra = peak.line() + "\n\n" + _prefill_breakdown(layers["bf16"], *cases[0])
    return rows, ["HF torch.compile bf16"], checks, extra, peak.meta()


def _prefill_breakdown(layer, b: int, s: int, reps: int = 5) -> str:
    """Per-stage times of the bf16 layer's prefill (CUDA events at its stage boundaries) beside the same stage in
    torch where one op does it (the projections: torch.matmul; attention: SDPA's cuDNN causal; the norms and
    SwiGLU: torch.compile of the formula), as a markdown table."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    cfg = layer.cfg
    h, hq, hk, d, i = cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.intermediate
    t = b * s
    x = H.randn(b, s, h, seed=7)
    per: dict = {}
    host = []
    for _ in range(reps):
        layer.marks = []
        torch.cuda._sleep(40_000_000)  # ~20 ms: the host queues the whole forward before the GPU reaches it
        t0 = time.perf_counter()
        layer(x)
        host.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
        marks, layer.marks = layer.marks, None
        for (name, e0), (_, e1) in zip(marks, marks[1:]):
            per.setdefault(name, []).append(e0.elapsed_time(e1) * 1e3)
    ours = {st: sorted(v)[len(v) // 2] for st, v in per.items()}
    host_us = sorted(host)[len(host) // 2]
    a = H.randn(t, h, seed=1)
    p = layer.p
    q, k, v = (H.randn(b, n, s, d, seed=j) for j, n in ((2, hq), (3, hk), (4, hk)))
    o2 = H.randn(t, hq * d, seed=5)
    gu = H.randn(t, 2 * i, seed=6)
    g = H.randn(t, i, seed=8)
    norm = torch.compile(lambda z, w: (z.float() * torch.rsqrt(z.float().pow(2).mean(-1, keepdim=True) + cfg.eps)
                                       * w.float()).to(z.dtype))
    glu = torch.compile(lambda z: (torch.nn.functional.silu(z[:, :i].float()) * z[:, i:].float()).to(z.dtype))

    def sdpa():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch_fns = {"norm_in": lambda: norm(a, p["w_in"]), "qkv": lambda: a @ p["w_qkv"].t(), "attention": sdpa,
                 "o_proj": lambda: o2 @ p["w_o"].t(), "norm_post": lambda: norm(a, p["w_post"]),
                 "gate_up": lambda: a @ p["w_gu"].t(), "swiglu": lambda: glu(gu), "down": lambda: g @ p["w_down"].t(),
                 "residual": lambda: a + a}
    ref = {st: H.do_bench(f)["median_ms"] * 1e3 for st, f in torch_fns.items()}
    if "swiglu" not in ours:  # SwiGLU fused into the gate / up GEMM: torch's two stages against our one
        ref["gate_up"] += ref.pop("swiglu")
    if "residual" not in ours:  # the residual add in the down projection's epilogue: torch's matmul + add
        ref["down"] += ref.pop("residual")
    lines = [f"### Per-stage breakdown, bf16 prefill B {b} S {s} (eager, CUDA events at the stage boundaries, the "
             f"forward queued behind a spin so the gaps are the GPU's; the host spends {host_us:.0f} us queueing it)", "",
             "| stage | ours us | torch us (one op; gate_up without a swiglu stage: matmul + torch.compile's SwiGLU) "
             "| x torch |", "|---|---|---|---|"]
    for st, us in ours.items():
        r = ref.get(st)
        lines.append(f"| {st} | {us:.1f} | {f'{r:.1f}' if r else 'n/a'} | {f'{r / us:.2f}' if r else 'n/a'} |")
    lines.append(f"| total | {sum(ours.values()):.1f} | | |")
    return "\n".join(lines)


SUITES = {"llama_decode": llama_decode, "llama_prefill": llama_prefill}
PEERS: dict[str, tuple[str, ...]] = {"llama_decode": (), "llama_prefill": ("transformers",)}
