"""The SASS instruction mix of each WGMMA loop of the attention forward (or, `--backward`, the backward's main
kernel), ours beside FA4's Hopper kernel, on the CPU (sm_90a; no GPU needed).

    CUTE_DSL_ARCH=sm_90a python -m perf.loop_mix --head-dim 128 [--causal] [--backward]
        [--params '{"double_p": true}'] [--no-fa4] [--top 16]

For each backward branch whose body holds WGMMAs (HGMMA) it prints the body's span, its HGMMA count, its
instruction count and its most frequent opcodes. The steady K/V loop is the smallest body with 2 x (D + tile_n)
/ 16 HGMMAs of one consumer step (ours without `double_p`: 16 at D = 128; FA4's: 16). Ours is compiled from the
catalogue (`flash_attn` with `--params`); FA4's from its `interface._flash_attn_fwd` under torch's fake-tensor
mode with `_arch=90`, which needs the flash-attn-4 and quack-kernels wheels installed without their dependencies
(`pip install --no-deps`; `../shared/device/peers/`) plus einops. quack's autotuner imports triton, which a CPU box
lacks; a stub module stands in for it (FA4's forward does not autotune).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import tempfile
import types
from pathlib import Path


def loops(sass: str) -> tuple[collections.Counter, list[tuple[int, int, int, int, collections.Counter]]]:
    """(opcode counts of the whole kernel, [(start, end, HGMMA, instructions, opcode counts)] per back-edge loop)."""
    labels, ops, pending = {}, [], []
    for line in sass.splitlines():
        m = re.match(r"^(\.L_x_\d+):", line.strip())
        if m:
            pending.append(m.group(1))
            continue
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)", line)
        if m:
            addr = int(m.group(1), 16)
            for p in pending:
                labels[p] = addr
            pending = []
            ops.append((addr, m.group(3).split(".")[0], line))
    out = []
    for addr, op, line in ops:
        m = re.search(r"\(\.?(L_x_\d+)\)", line) if op == "BRA" else None
        start = labels.get("." + m.group(1)) if m else None
        if start is not None and start < addr:
            body = collections.Counter(o for a, o, _ in ops if start <= a <= addr)
            if body["HGMMA"]:
                out.append((start, addr, body["HGMMA"], sum(body.values()), body))
    return collections.Counter(o for _, o, _ in ops), out


def ours_sass(head_dim: int, causal: bool, params: dict, backward: bool = False) -> str:
    from cute_kernels import catalog
    from cute_kernels.artifacts import compile_with_artifacts

    spec = catalog.get("flash_attn_bwd" if backward else "flash_attn")
    p = spec.resolve({"head_dim": head_dim, **({"mask": "causal"} if causal else {}), **params})
    _, files = compile_with_artifacts(spec, p, tempfile.mkdtemp(prefix="loop_mix_"))
    if "sass" not in files:
        raise SystemExit("no nvdisasm >= 13.4 here (pip install nvidia-cuda-nvdisasm)")
    return files["sass"].read_text()


def fa4_sass(head_dim: int, causal: bool, dump: str, seqlen: int = 8192, backward: bool = False) -> str:
    """FA4's kernel, compiled with CUTE_DSL_KEEP / CUTE_DSL_DUMP_DIR = `dump` (set before the DSL loads); the
    backward's kernel selection follows FLASH_ATTENTION_ARCH (set here to sm_90)."""
    stub = types.ModuleType("quack.autotuner")
    stub.__file__ = "quack_autotuner_stub.py"
    stub.autotune = lambda *a, **k: (lambda fn: fn)
    stub.AutotuneConfig = type("AutotuneConfig", (), {"__init__": lambda self, *a, **k: None})
    import torch
    sys.modules.setdefault("quack.autotuner", stub)
    from flash_attn.cute import interface
    from torch._subclasses.fake_tensor import FakeTensorMode

    from cute_kernels.report import disassemble

    os.environ.setdefault("FLASH_ATTENTION_NUM_SMS", "132")
    h = 2048 // head_dim
    with FakeTensorMode(allow_non_fake_inputs=True):
        q, k, v = (torch.empty(2, seqlen, h, head_dim, dtype=torch.bfloat16, device="cuda") for _ in range(3))
        if backward:
            os.environ.setdefault("FLASH_ATTENTION_ARCH", "sm_90")
            o = torch.empty_like(q)
            lse = torch.empty(2, h, seqlen, dtype=torch.float32, device="cuda")
            interface._flash_attn_bwd(q, k, v, o, torch.empty_like(q), lse, causal=causal)
        else:
            interface._flash_attn_fwd(q, k, v, causal=causal, _arch=90)
    pat = "*BackwardSm90*.cubin" if backward else "*flash_fwd_sm90*.cubin"
    cubins = sorted(Path(dump).glob(pat), key=lambda f: f.stat().st_mtime)
    if not cubins:
        raise SystemExit(f"FA4 left no cubin in {dump}")
    return disassemble(cubins[-1])


def report(name: str, sass: str, top: int) -> None:
    total, found = loops(sass)
    print(f"== {name}: {sum(total.values())} instructions, {total['HGMMA']} HGMMA")
    for start, end, h, n, body in sorted(found, key=lambda t: (t[1] - t[0])):
        mix = ", ".join(f"{o} {c}" for o, c in body.most_common(top))
        print(f"  loop {start:#07x}-{end:#07x}: HGMMA {h:3d}, {n:5d} instructions: {mix}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--params", default="{}", help="catalogue params of ours, as JSON")
    ap.add_argument("--no-fa4", action="store_true")
    ap.add_argument("--backward", action="store_true", help="the backward's main kernel (flash_attn_bwd)")
    ap.add_argument("--top", type=int, default=16)
    a = ap.parse_args(argv)
    dump = tempfile.mkdtemp(prefix="loop_mix_fa4_")  # the DSL reads these when it loads
    os.environ.update(CUTE_DSL_KEEP="ptx,cubin", CUTE_DSL_DUMP_DIR=dump)
    what = f"{' backward' if a.backward else ''} d{a.head_dim}{' causal' if a.causal else ''}"
    report(f"ours{what} {a.params}", ours_sass(a.head_dim, a.causal, json.loads(a.params), a.backward), a.top)
    if not a.no_fa4:
        report(f"FA4 sm90{what}", fa4_sass(a.head_dim, a.causal, dump, backward=a.backward), a.top)


if __name__ == "__main__":
    main()
