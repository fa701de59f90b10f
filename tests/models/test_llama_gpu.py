"""GPU: LlamaDecoderLayer of our ops against transformers' LlamaDecoderLayer (random weights, no download) and the
pure-torch reference, prefill at bf16 tolerance in bf16 / FP8 / W4A16 weights (the quantized layers against the
reference on their own dequantized weights' scale of error), decode steps through the KV cache (captured in a CUDA
graph) equal to the prefill of the whole sequence, and torch.compile."""

import pytest
import torch

from cute_kernels.models.driver import DecodeSession, random_state_dict
from cute_kernels.models.llama import LlamaConfig, LlamaDecoderLayer, fuse_hf_state_dict, reference_forward
from tests.helpers import rel_err

pytestmark = pytest.mark.gpu
CFG = LlamaConfig(hidden=1024, heads=16, kv_heads=4, head_dim=64, intermediate=2816, max_pos=2048)


def _layer(weights="bf16", cfg=CFG):
    sd = random_state_dict(cfg, seed=1)
    return LlamaDecoderLayer(cfg, weights).load_hf_state_dict(sd), sd


def test_against_transformers():
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer as HFLayer
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    ours, sd = _layer()
    hc = transformers.LlamaConfig(hidden_size=CFG.hidden, num_attention_heads=CFG.heads,
                                  num_key_value_heads=CFG.kv_heads, head_dim=CFG.head_dim,
                                  intermediate_size=CFG.intermediate, rms_norm_eps=CFG.eps,
                                  rope_theta=CFG.rope_theta, max_position_embeddings=CFG.max_pos,
                                  attn_implementation="sdpa")
    hf = HFLayer(hc, layer_idx=0).cuda().to(torch.bfloat16).eval()
    hf.load_state_dict(sd)
    x = torch.randn(2, 300, CFG.hidden, device="cuda").to(torch.bfloat16)
    pos = torch.arange(300, device="cuda")[None].expand(2, -1)
    with torch.no_grad():
        pe = LlamaRotaryEmbedding(hc).cuda()(x, pos)
        out = hf(x, position_ids=pos, position_embeddings=pe)
        ref_hf = out[0] if isinstance(out, tuple) else out
        got = ours(x)
    ref = reference_forward(fuse_hf_state_dict(sd, CFG), x, CFG)
    # HF in bf16 against the fp32 reference: our error must be within 2x of it
    e_hf, e_ours = rel_err(ref_hf, ref), rel_err(got, ref)
    assert e_ours <= 2 * e_hf + 1e-3, (e_ours, e_hf)


@pytest.mark.parametrize("weights", ["bf16", "fp8", "w4a16"])
def test_prefill_against_reference(weights):
    layer, sd = _layer(weights)
    x = torch.randn(1, 257, CFG.hidden, device="cuda").to(torch.bfloat16)
    got = layer(x)
    p = fuse_hf_state_dict(sd, CFG)
    if weights == "w4a16":  # the reference on the dequantized weights
        from cute_kernels.w4a16.pack import unpack_int4

        for name, (wp, s, z) in layer.q.items():
            p[name] = unpack_int4(wp, s, z, 128)
        # w_gu was packed with gate / up rows interleaved in blocks of 8 (`pack_gate_up`): back to [gate; up]
        w = p["w_gu"]
        blocks = w.reshape(w.shape[0] // 16, 2, 8, w.shape[1])
        p["w_gu"] = torch.cat([blocks[:, 0].reshape(-1, w.shape[1]), blocks[:, 1].reshape(-1, w.shape[1])])
    ref = reference_forward(p, x, CFG)
    bound = {"bf16": 1e-2, "fp8": 4e-2, "w4a16": 1e-2}[weights]
    assert torch.isfinite(got).all() and rel_err(got, ref) < bound


@pytest.mark.parametrize("weights", ["bf16", "w4a16"])
def test_decode_steps_match_prefill(weights):
    """Prefill 100 tokens into the cache, then 4 captured decode steps: the outputs equal a prefill of all 104."""
    layer, _ = _layer(weights)
    b = 2
    x = torch.randn(b, 104, CFG.hidden, device="cuda").to(torch.bfloat16)
    full = layer(x)
    sess = DecodeSession(layer, b, 256)
    sess.prefill(x[:, :100])
    sess.capture()
    for t in range(100, 104):
        out = sess.step(x[:, t:t + 1])
        assert rel_err(out, full[:, t:t + 1]) < 1e-2
    assert sess.lens.tolist() == [104, 104]


def test_torch_compile():
    layer, _ = _layer()
    x = torch.randn(1, 64, CFG.hidden, device="cuda").to(torch.bfloat16)
    eager = layer(x)
    comp = torch.compile(layer, fullgraph=True)(x)
    assert rel_err(comp, eager) < 1e-3
