"""A Llama decoder layer built only from this project's ops, with the weights in bf16, FP8 (block-scaled) or W4A16.

    h1, s   = rms_norm(x, w_in)                       (a stack fuses the previous layer's residual add here)
    q, k, v = views of gemm(h1, W_qkv^T)              (q, k, v projections fused along N)
    prefill: q, k = rope(q, k); append k, v to the cache when one is given; o = flash_attn(q, k, v, causal)
    decode:  o = flash_attn_with_kvcache(q, cache, k, v, rotary_cos / rotary_sin): RoPE, append and attention
    a       = gemm(o, W_o^T)
    h2, s   = rms_norm(a, w_post, residual=x)         (s = x + a)
    m       = gemm(swiglu(gemm(h2, W_gu^T) halves), W_down^T)    (bf16 / W4A16: gemm_swiglu / gemm_w4a16_swiglu, the
                                                               activation in the GEMM's epilogue over interleaved
                                                               gate / up rows)
    out     = s + m                                   (bf16, W4A16: the add in down's epilogue)

`load_hf_state_dict` takes the state dict of Hugging Face transformers' `LlamaDecoderLayer` (its names:
input_layernorm.weight, self_attn.{q,k,v,o}_proj.weight, post_attention_layernorm.weight,
mlp.{gate,up,down}_proj.weight) and fuses q / k / v and gate / up along N. `reference_forward` is the same layer in
plain torch (fp32 math on any device), the layer's CPU-side twin. HF's rotary embedding is NeoX-style (rotate_half)
with inverse frequencies theta^(-2i / D): `rope_tables` builds the same angles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

import cute_kernels
from cute_kernels.attention.decode_ops import append_kv

# The ops as module globals (torch.compile traces them; it refuses `import cute_kernels` inside forward).
cute_kernels.load_ops()
(add, addmm, flash_attn, flash_attn_with_kvcache, fp8_gemm, gemm, gemm_swiglu, gemm_w4a16, gemm_w4a16_swiglu,
 quantize_1x128, rms_norm, rope, swiglu) = (getattr(cute_kernels, n) for n in (
    "add", "addmm", "flash_attn", "flash_attn_with_kvcache", "fp8_gemm", "gemm", "gemm_swiglu", "gemm_w4a16",
    "gemm_w4a16_swiglu", "quantize_1x128", "rms_norm", "rope", "swiglu"))

WEIGHTS = ("bf16", "fp8", "w4a16")


@dataclass(frozen=True)
class LlamaConfig:
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    intermediate: int = 14336
    eps: float = 1e-5
    rope_theta: float = 500000.0
    max_pos: int = 8192

    @staticmethod
    def tiny() -> LlamaConfig:
        return LlamaConfig(hidden=256, heads=4, kv_heads=2, head_dim=64, intermediate=512, max_pos=512)

    @property
    def qkv_out(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim


HF_KEYS = ("input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
           "self_attn.o_proj.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
           "mlp.down_proj.weight")


def fuse_hf_state_dict(sd: dict, cfg: LlamaConfig) -> dict:
    """Our parameters from an HF LlamaDecoderLayer state dict: {w_in, w_qkv (q; k; v), w_o, w_post, w_gu (gate;
    up), w_down}; every HF key must be there with its shape."""
    missing = [k for k in HF_KEYS if k not in sd]
    if missing:
        raise KeyError(f"state dict lacks {', '.join(missing)} (a transformers LlamaDecoderLayer's keys)")
    h, d = cfg.hidden, cfg.head_dim
    want = {"input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,),
            "self_attn.q_proj.weight": (cfg.heads * d, h), "self_attn.k_proj.weight": (cfg.kv_heads * d, h),
            "self_attn.v_proj.weight": (cfg.kv_heads * d, h), "self_attn.o_proj.weight": (h, cfg.heads * d),
            "mlp.gate_proj.weight": (cfg.intermediate, h), "mlp.up_proj.weight": (cfg.intermediate, h),
            "mlp.down_proj.weight": (h, cfg.intermediate)}
    for k, shape in want.items():
        if tuple(sd[k].shape) != shape:
            raise ValueError(f"{k} has shape {tuple(sd[k].shape)}, the config wants {shape}")
    return {"w_in": sd["input_layernorm.weight"], "w_post": sd["post_attention_layernorm.weight"],
            "w_qkv": torch.cat([sd[f"self_attn.{p}_proj.weight"] for p in "qkv"], 0),
            "w_o": sd["self_attn.o_proj.weight"],
            "w_gu": torch.cat([sd["mlp.gate_proj.weight"], sd["mlp.up_proj.weight"]], 0),
            "w_down": sd["mlp.down_proj.weight"]}


def reference_forward(p: dict, x: torch.Tensor, cfg: LlamaConfig, positions: torch.Tensor | None = None):
    """The layer (HF's math: RMSNorm in fp32, NeoX RoPE, causal GQA attention, SwiGLU) in plain torch, fp32 inside,
    output in x's dtype; x (B, S, hidden), positions (B, S) or None (0 .. S - 1)."""
    from cute_kernels.rope.ops import rope_reference, rope_tables

    b, s, _ = x.shape
    f = {k: v.float() for k, v in p.items()}
    xf = x.float()

    def norm(t, w):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + cfg.eps) * w

    h1 = norm(xf, f["w_in"])
    qkv = h1 @ f["w_qkv"].t()
    hq, hk, d = cfg.heads, cfg.kv_heads, cfg.head_dim
    q, k, v = qkv.split([hq * d, hk * d, hk * d], -1)
    q, k, v = q.view(b, s, hq, d), k.view(b, s, hk, d), v.view(b, s, hk, d)
    cos, sin = rope_tables(cfg.max_pos, d, cfg.rope_theta, device=x.device)
    q, k = rope_reference(q, k, cos, sin, positions)
    rep = hq // hk
    kk = k.repeat_interleave(rep, 2).transpose(1, 2)
    vv = v.repeat_interleave(rep, 2).transpose(1, 2)
    sc = (q.transpose(1, 2) @ kk.transpose(-1, -2)) / math.sqrt(d)
    sc = sc.masked_fill(torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
    o = (sc.softmax(-1) @ vv).transpose(1, 2).reshape(b, s, hq * d)
    s1 = xf + o @ f["w_o"].t()
    h2 = norm(s1, f["w_post"])
    gu = h2 @ f["w_gu"].t()
    g, u = gu.chunk(2, -1)
    return (s1 + (torch.nn.functional.silu(g) * u) @ f["w_down"].t()).to(x.dtype)


class LlamaDecoderLayer(nn.Module):
    """One decoder layer of our ops (module doc). `weights`: "bf16", "fp8" (1x128 activations, 128x128 weight
    blocks, e4m3) or "w4a16" (int4 groups of 128). Parameters are plain tensors held by the module (inference)."""

    def __init__(self, cfg: LlamaConfig = LlamaConfig(), weights: str = "bf16", device="cuda",
                 dtype=torch.bfloat16):
        super().__init__()
        if weights not in WEIGHTS:
            raise ValueError(f"weights must be one of {WEIGHTS}, got {weights!r}")
        self.cfg, self.weights, self.dtype = cfg, weights, dtype
        self.p: dict = {}
        self.q: dict = {}  # the projections in the chosen weight format
        from cute_kernels.rope.ops import rope_tables

        self.cos, self.sin = rope_tables(cfg.max_pos, cfg.head_dim, cfg.rope_theta, device=device)
        self.marks: list | None = None  # a list: each stage's start recorded as (name, CUDA event) into it

    def _mark(self, name: str) -> None:
        """A stage boundary for the benchmark's breakdown (events on the stream: no host sync)."""
        if self.marks is not None:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append((name, e))

    def load_hf_state_dict(self, sd: dict) -> LlamaDecoderLayer:
        """The parameters of `fuse_hf_state_dict`; with bf16 and W4A16 weights w_gu's gate and up rows interleaved in
        blocks of 8 (`pack_gate_up`: the fused SwiGLU GEMMs' layout)."""
        self.p = {k: v.to(self.dtype).contiguous() for k, v in fuse_hf_state_dict(sd, self.cfg).items()}
        if self.weights in ("bf16", "w4a16"):  # the fused SwiGLU GEMMs' layout
            from cute_kernels.gemm.ops import pack_gate_up

            self.p["w_gu"] = pack_gate_up(*self.p["w_gu"].chunk(2))
        self.q = {}
        for name in ("w_qkv", "w_o", "w_gu", "w_down"):
            w = self.p[name]
            if self.weights == "fp8":
                from cute_kernels.quantize.ops import quantize_128x128

                self.q[name] = quantize_128x128(w)
            elif self.weights == "w4a16":
                from cute_kernels.w4a16.pack import pack_int4

                self.q[name] = pack_int4(w, 128, symmetric=True)
        return self

    # --- one projection in the chosen weight format ------------------------------------------------------------------
    def _linear(self, x2: torch.Tensor, name: str) -> torch.Tensor:
        if self.weights == "bf16":
            return gemm(x2, self.p[name].t())
        if self.weights == "w4a16":
            wp, s, z = self.q[name]
            return gemm_w4a16(x2, wp, s, z, 128)
        wq, ws = self.q[name]
        xq, xs = quantize_1x128(x2)
        return fp8_gemm(xq, xs, wq, ws, out_dtype=self.dtype)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None, kv_cache=None) -> torch.Tensor:
        """x (B, S, hidden). kv_cache: None (prefill without a cache), or (k_cache, v_cache, cache_seqlens,
        block_table or None) in `flash_attn_with_kvcache`'s layouts: with S <= 16 and a cache this is a decode
        step (RoPE at the cache positions, k / v appended, attention over the cache); otherwise a prefill that
        also fills the cache from cache_seqlens on. cache_seqlens is not advanced (the caller does)."""
        cfg = self.cfg
        b, s, h = x.shape
        hq, hk, d = cfg.heads, cfg.kv_heads, cfg.head_dim
        x2 = x.reshape(b * s, h)
        self._mark("norm_in")
        h1 = rms_norm(x2, self.p["w_in"], cfg.eps)
        self._mark("qkv")
        qkv = self._linear(h1, "w_qkv").view(b, s, hq + 2 * hk, d)
        q, k, v = qkv[:, :, :hq], qkv[:, :, hq:hq + hk], qkv[:, :, hq + hk:]
        self._mark("attention")
        if kv_cache is not None and s <= 16 and positions is None:
            kc, vc, lens, table = kv_cache
            o = flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, block_table=table, causal=True,
                                           rotary_cos=self.cos, rotary_sin=self.sin)
        else:
            # rope reads the strided q / k views of qkv and writes them contiguous (one pass, no copies first);
            # flash_attn reads v in place
            q, k = rope(q, k, self.cos, self.sin, positions=positions)
            if kv_cache is not None:
                kc, vc, lens, table = kv_cache
                append_kv(kc, vc, k, v, lens, table)
            o = flash_attn(q, k, v, causal=True)
        self._mark("o_proj")
        a = self._linear(o.reshape(b * s, hq * d), "w_o")
        self._mark("norm_post")
        h2, s1 = rms_norm(a, self.p["w_post"], cfg.eps, residual=x2)
        self._mark("gate_up")
        if self.weights == "bf16":  # SwiGLU in the GEMM's epilogue (one stage)
            g = gemm_swiglu(h2, self.p["w_gu"].t())
        elif self.weights == "w4a16":
            wp, sc, z = self.q["w_gu"]
            g = gemm_w4a16_swiglu(h2, wp, sc, z, 128)
        else:
            gu = self._linear(h2, "w_gu")
            self._mark("swiglu")
            g = swiglu(gu[:, :cfg.intermediate], gu[:, cfg.intermediate:])
        self._mark("down")
        if self.weights == "bf16":  # the residual added in the down projection's epilogue (one stage)
            out = addmm(s1, g, self.p["w_down"].t()).view(b, s, h)
        elif self.weights == "w4a16":
            wp, sc, z = self.q["w_down"]
            out = gemm_w4a16(g, wp, sc, z, 128, residual=s1).view(b, s, h)
        else:
            m = self._linear(g, "w_down")
            self._mark("residual")
            out = add(s1, m).view(b, s, h)
        self._mark("end")
        return out
