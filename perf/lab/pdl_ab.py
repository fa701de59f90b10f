"""A/B of programmatic dependent launch (collectives.pdl) on the decoder layer's captured decode step: the same
layers' steps traced once with PDL and once without (`pdl.LAUNCH` flipped, the compile cache's memory cleared, so
every kernel is traced again), timed in the same interleaved rounds.

    python3 -m perf.lab.pdl_ab [B ctx]
"""

from __future__ import annotations

import sys

import torch


def main(argv):
    from collectives import pdl
    from cute_kernels.bench import harness as H
    from cute_kernels.jit import default_cache
    from cute_kernels.models.bench import _session
    from cute_kernels.models.driver import random_state_dict
    from cute_kernels.models.llama import WEIGHTS, LlamaConfig, LlamaDecoderLayer

    b, ctx = (int(argv[0]), int(argv[1])) if len(argv) > 1 else (1, 4096)
    cfg = LlamaConfig()
    sd = random_state_dict(cfg)
    layers = {w: LlamaDecoderLayer(cfg, w).load_hf_state_dict(sd) for w in WEIGHTS}
    sessions, fns = [], {}
    for flag in (True, False):
        pdl.LAUNCH = flag
        default_cache().clear_memory()
        for w in WEIGHTS:
            sess = _session(layers[w], b, ctx)
            sessions.append(sess)
            fns[f"{w} {'pdl' if flag else 'plain'}"] = sess.graph.replay
    pdl.LAUNCH = True
    res = H.do_bench_interleaved(fns)
    print(f"decode step B {b} ctx {ctx}, CUDA graph, interleaved rounds (us)")
    print("| weights | PDL | plain | plain / PDL |\n|---|---|---|---|")
    for w in WEIGHTS:
        a, p = res[f"{w} pdl"]["median_ms"] * 1e3, res[f"{w} plain"]["median_ms"] * 1e3
        print(f"| {w} | {a:.1f} | {p:.1f} | {p / a:.3f} |")
    del sessions
    torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:])
