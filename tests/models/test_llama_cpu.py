"""CPU: the decoder layer's state-dict mapping (HF names fused along N, shapes checked by name) and its pure-torch
reference against an independent transcription of Hugging Face's Llama layer (rotate_half RoPE, repeat_kv, SDPA)."""

import math

import pytest
import torch
import torch.nn.functional as F

from cute_kernels.models.driver import random_state_dict
from cute_kernels.models.llama import HF_KEYS, LlamaConfig, fuse_hf_state_dict, reference_forward


def _hf_like(sd, x, cfg):
    """Hugging Face's LlamaDecoderLayer, transcribed (fp32)."""
    f = {k: v.float() for k, v in sd.items()}
    b, s, h = x.shape
    d = cfg.head_dim

    def norm(t, w):
        var = t.pow(2).mean(-1, keepdim=True)
        return w * (t * torch.rsqrt(var + cfg.eps))

    res = x.float()
    t = norm(res, f["input_layernorm.weight"])
    q = (t @ f["self_attn.q_proj.weight"].t()).view(b, s, -1, d).transpose(1, 2)
    k = (t @ f["self_attn.k_proj.weight"].t()).view(b, s, -1, d).transpose(1, 2)
    v = (t @ f["self_attn.v_proj.weight"].t()).view(b, s, -1, d).transpose(1, 2)
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    freqs = torch.arange(s).float()[:, None] * inv[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[None, None], emb.sin()[None, None]

    def rot(u):
        a, c = u[..., : d // 2], u[..., d // 2:]
        return torch.cat((-c, a), dim=-1)

    q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
    rep = cfg.heads // cfg.kv_heads
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1 / math.sqrt(d))
    o = o.transpose(1, 2).reshape(b, s, -1) @ f["self_attn.o_proj.weight"].t()
    res = res + o
    t = norm(res, f["post_attention_layernorm.weight"])
    m = (F.silu(t @ f["mlp.gate_proj.weight"].t()) * (t @ f["mlp.up_proj.weight"].t())) @ f["mlp.down_proj.weight"].t()
    return res + m


def test_reference_matches_hf_transcription():
    cfg = LlamaConfig.tiny()
    sd = random_state_dict(cfg, device="cpu", seed=3)
    x = torch.randn(2, 33, cfg.hidden)
    ours = reference_forward(fuse_hf_state_dict(sd, cfg), x, cfg)
    ref = _hf_like(sd, x, cfg)
    assert torch.allclose(ours, ref, atol=2e-4, rtol=2e-4), (ours - ref).abs().max()


def test_state_dict_mapping():
    cfg = LlamaConfig.tiny()
    sd = random_state_dict(cfg, device="cpu")
    p = fuse_hf_state_dict(sd, cfg)
    assert p["w_qkv"].shape == (cfg.qkv_out, cfg.hidden) and p["w_gu"].shape == (2 * cfg.intermediate, cfg.hidden)
    assert torch.equal(p["w_qkv"][cfg.heads * cfg.head_dim:][: cfg.kv_heads * cfg.head_dim],
                       sd["self_attn.k_proj.weight"])
    assert torch.equal(p["w_gu"][cfg.intermediate:], sd["mlp.up_proj.weight"])
    bad = dict(sd)
    del bad["mlp.up_proj.weight"]
    with pytest.raises(KeyError, match="mlp.up_proj.weight"):
        fuse_hf_state_dict(bad, cfg)
    bad = dict(sd)
    bad["self_attn.k_proj.weight"] = bad["self_attn.k_proj.weight"][:-1]
    with pytest.raises(ValueError, match="self_attn.k_proj.weight has shape"):
        fuse_hf_state_dict(bad, cfg)
    assert len(HF_KEYS) == 9
