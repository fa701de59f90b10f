"""Prefill, then decode steps with the step captured in a CUDA graph: the driver of `LlamaDecoderLayer`.

    python3 -m cute_kernels.models.driver [--tiny] [--weights bf16|fp8|w4a16] [--batch B] [--prompt S] [--steps N]

prints the prefill time, the captured step's time and each kernel's share (torch.profiler over replays).
"""

from __future__ import annotations

import argparse

import torch

from cute_kernels.models.llama import LlamaConfig, LlamaDecoderLayer


def random_state_dict(cfg: LlamaConfig, device="cuda", seed: int = 0) -> dict:
    """An HF-named state dict of random weights (scaled like an initialized layer)."""
    g = torch.Generator(device=device).manual_seed(seed)
    h, d, i = cfg.hidden, cfg.head_dim, cfg.intermediate

    def w(n, k):
        return (torch.randn(n, k, generator=g, device=device) / k ** 0.5).to(torch.bfloat16)

    return {"input_layernorm.weight": (1 + 0.1 * torch.randn(h, generator=g, device=device)).to(torch.bfloat16),
            "post_attention_layernorm.weight": (1 + 0.1 * torch.randn(h, generator=g, device=device)).to(torch.bfloat16),
            "self_attn.q_proj.weight": w(cfg.heads * d, h), "self_attn.k_proj.weight": w(cfg.kv_heads * d, h),
            "self_attn.v_proj.weight": w(cfg.kv_heads * d, h), "self_attn.o_proj.weight": w(h, cfg.heads * d),
            "mlp.gate_proj.weight": w(i, h), "mlp.up_proj.weight": w(i, h), "mlp.down_proj.weight": w(h, i)}


class DecodeSession:
    """A layer, its contiguous KV cache and a captured decode step: `prefill(x)` fills the cache, `step(x)` runs
    one token per sequence through the graph and advances the lengths."""

    def __init__(self, layer: LlamaDecoderLayer, batch: int, capacity: int):
        cfg = layer.cfg
        self.layer = layer
        dev = layer.cos.device
        self.kc = torch.zeros(batch, capacity, cfg.kv_heads, cfg.head_dim, dtype=layer.dtype, device=dev)
        self.vc = torch.zeros_like(self.kc)
        self.lens = torch.zeros(batch, dtype=torch.int32, device=dev)
        self.x = torch.zeros(batch, 1, cfg.hidden, dtype=layer.dtype, device=dev)
        self.graph = None
        self.out = None

    def prefill(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layer(x, kv_cache=(self.kc, self.vc, self.lens, None))
        self.lens += x.shape[1]
        return out

    def _step(self, advance: bool = True):
        out = self.layer(self.x, kv_cache=(self.kc, self.vc, self.lens, None))
        if advance:
            self.lens += 1
        return out

    def capture(self, advance: bool = True):
        """Capture one step; `advance=False` leaves the lengths alone (each replay redoes the same position: what a
        benchmark times)."""
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        saved = self.lens.clone()
        with torch.cuda.stream(s):  # compile every kernel of the step outside the capture
            self._step(advance)
        torch.cuda.current_stream().wait_stream(s)
        self.lens.copy_(saved)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = self._step(advance)
        self.lens.copy_(saved)  # (the capture ran the step once more)

    def step(self, x: torch.Tensor) -> torch.Tensor:
        self.x.copy_(x)
        self.graph.replay()
        return self.out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--weights", default="bf16")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=32)
    a = ap.parse_args(argv)
    cfg = LlamaConfig.tiny() if a.tiny else LlamaConfig()
    layer = LlamaDecoderLayer(cfg, a.weights).load_hf_state_dict(random_state_dict(cfg))
    sess = DecodeSession(layer, a.batch, a.prompt + a.steps + 16)
    x = torch.randn(a.batch, a.prompt, cfg.hidden, device="cuda").to(torch.bfloat16)
    sess.prefill(x)
    sess.capture()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    tok = torch.randn(a.batch, 1, cfg.hidden, device="cuda").to(torch.bfloat16)
    e0.record()
    for _ in range(a.steps):
        sess.step(tok)
    e1.record()
    torch.cuda.synchronize()
    print(f"{a.weights} B={a.batch} context {a.prompt}: decode step {e0.elapsed_time(e1) / a.steps * 1e3:.1f} us "
          f"(CUDA graph, {a.steps} steps)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
