"""A/B of the bf16 decoder layer's decode-step fusions, each variant its own captured step, all timed in the same
interleaved rounds (CUDA graph replays, L2 flushed):

- `now`: the layer as it is (gate / up with SwiGLU in the epilogue, the residual in down's epilogue);
- `add`: down as gemm, then `add` (the residual a kernel of its own);
- `swiglu`: gate / up as a plain GEMM over unpacked weights, then `swiglu` on its halves;
- `both`: both of the above (the layer before those fusions);
- `fused_merge`: decode attention's split partials merged by the last split instead of the merge kernel;
- `stream_glu`: gate / up with SwiGLU by the streaming kernel's gated epilogue (gemv.stream) instead of the GEMM's;
- `stream_all`: every M <= 16 projection by the streaming kernel (`gemv.ops.STREAM = True`), gate / up as `stream_glu`.

    python3 -m perf.lab.decode_ab [B ctx]
"""

from __future__ import annotations

import sys
from contextlib import ExitStack
from unittest import mock

import torch


def main(argv):
    import dataclasses

    from cute_kernels.attention import decode_ops
    from cute_kernels.bench import harness as H
    from cute_kernels.gemv import ops as gv
    from cute_kernels.models import llama
    from cute_kernels.models.bench import _session
    from cute_kernels.models.driver import random_state_dict

    b, ctx = (int(argv[0]), int(argv[1])) if len(argv) > 1 else (1, 4096)
    cfg = llama.LlamaConfig()
    sd = random_state_dict(cfg)
    layer = llama.LlamaDecoderLayer(cfg, "bf16").load_hf_state_dict(sd)
    i = cfg.intermediate
    w_gu = torch.cat((sd["mlp.gate_proj.weight"], sd["mlp.up_proj.weight"])).to(layer.dtype).contiguous()

    def unfused_swiglu(a, _packed):
        gu = llama.gemm(a, w_gu.t())
        return llama.swiglu(gu[:, :i], gu[:, i:])

    def add_after(c, a, w):
        return llama.add(c, llama.gemm(a, w))

    sched = decode_ops.default_decode_schedule

    def fused_merge(*args, **kw):
        return dataclasses.replace(sched(*args, **kw), fused_merge=True)

    def stream_glu(a, packed_t):
        return gv.skinny(a, packed_t.t(), gated=True)

    patches = {"now": {}, "add": {"addmm": add_after}, "swiglu": {"gemm_swiglu": unfused_swiglu},
               "both": {"addmm": add_after, "gemm_swiglu": unfused_swiglu}, "fused_merge": {"merge": fused_merge},
               "stream_glu": {"gemm_swiglu": stream_glu}, "stream_all": {"gemm_swiglu": stream_glu, "STREAM": True}}
    targets = {"merge": (decode_ops, "default_decode_schedule"), "STREAM": (gv, "STREAM")}
    sessions, fns = [], {}
    for name, p in patches.items():
        with ExitStack() as stack:
            for attr, fn in p.items():
                stack.enter_context(mock.patch.object(*targets.get(attr, (llama, attr)), fn))
            sess = _session(layer, b, ctx)
        sessions.append(sess)
        fns[name] = sess.graph.replay
    res = H.do_bench_interleaved(fns)
    base = res["now"]["median_ms"]
    print(f"bf16 decode step B {b} ctx {ctx}, CUDA graph, interleaved rounds")
    print("| variant | us | x now |\n|---|---|---|")
    for name in fns:
        t = res[name]["median_ms"]
        print(f"| {name} | {t * 1e3:.1f} | {t / base:.3f} |")
    del sessions
    torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:])
