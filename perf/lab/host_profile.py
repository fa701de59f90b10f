"""Where the host's time goes when it queues one forward of the Llama layer (prefill or an eager decode step):
cProfile over forwards queued behind a GPU spin (so no call waits on the GPU), sorted by own time and by
cumulative time.

    python3 -m perf.lab.host_profile [bf16|fp8|w4a16] [B S] [decode]
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time

import torch


def main(argv):
    w = argv[0] if argv else "bf16"
    b, s = (int(argv[1]), int(argv[2])) if len(argv) > 2 else (1, 4096)
    decode = "decode" in argv
    from cute_kernels.models.driver import random_state_dict
    from cute_kernels.models.llama import LlamaConfig, LlamaDecoderLayer

    cfg = LlamaConfig()
    layer = LlamaDecoderLayer(cfg, w).load_hf_state_dict(random_state_dict(cfg))
    if decode:
        from cute_kernels.models.bench import _session

        sess = _session(layer, b, s)

        def f():
            return sess._step(advance=False)
    else:
        x = torch.randn(b, s, cfg.hidden, device="cuda").to(torch.bfloat16)

        def f():
            return layer(x)
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    ts = []
    for _ in range(10):
        torch.cuda._sleep(100_000_000)
        t0 = time.perf_counter()
        f()
        ts.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
    print(f"{w} {'decode' if decode else 'prefill'} B {b} S {s}: host per forward (GPU kept busy) "
          f"median {sorted(ts)[5]:.0f} us, min {min(ts):.0f} us")
    pr = cProfile.Profile()
    torch.cuda._sleep(400_000_000)
    pr.enable()
    for _ in range(10):
        f()
    pr.disable()
    torch.cuda.synchronize()
    for key in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(pr, stream=out).sort_stats(key).print_stats(35)
        print(out.getvalue()[-9000:])


if __name__ == "__main__":
    main(sys.argv[1:])
