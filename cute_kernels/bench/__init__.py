"""Benchmark suites of the catalogue (GPU): which cases, which references, which targets.

Each family's suites live in its `bench.py` (`SUITES`: name -> suite function, `PEERS`: the peer packages each
needs); this module collects them in the order of `catalog.FAMILIES` and runs them. `run(what)` with what = a
kernel name (`elementwise.add`), a suite (`elementwise`, `gemm_small`) or `all`. Each suite writes
`<suite>.json`, `.md` and `.png` into the output folder. The harness (CUDA-event medians, L2 flushed, ceilings
measured in the same run) is `cute_kernels.bench.harness`.
"""

from __future__ import annotations

import importlib
import math

from cute_kernels.catalog import FAMILIES

MiB = 1 << 20
# Suites of composed models (no kernel family of their own): after the families'.
MODELS = ("models",)


def suites() -> tuple[dict, dict]:
    """({suite: function}, {suite: peer packages}) of every family, in `FAMILIES` order."""
    found, peers = {}, {}
    for fam in (*FAMILIES, *MODELS):
        mod = importlib.import_module(f"cute_kernels.{fam}.bench")
        found.update(mod.SUITES)
        peers.update(mod.PEERS)
    return found, peers


def suite_names() -> list[str]:
    """The suites' names without importing torch: read from each family's bench.py."""
    import ast
    from pathlib import Path

    names = []
    for fam in (*FAMILIES, *MODELS):
        tree = ast.parse((Path(__file__).resolve().parent.parent / fam / "bench.py").read_text())
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                if getattr(target, "id", None) == "SUITES" and isinstance(node.value, ast.Dict):
                    names += [k.value for k in node.value.keys]
    return names


def check_name(what: str) -> None:
    """SystemExit naming the suites when `what` is none of them (before any GPU is asked for)."""
    names = suite_names()
    if what != "all" and what.split(".")[0] not in names:
        import difflib

        close = difflib.get_close_matches(what.split(".")[0], names, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise SystemExit(f"bench: no suite {what!r}{hint} (suites: {', '.join(names)}, or all)")


def run(what: str, out_dir=None, shapes=None, quick=False) -> int:
    """Run suite(s) `what`; `shapes`: a list of shapes (each a list of ints) instead of the suites' own, or one shape
    (a list of ints, as before)."""
    if shapes and not isinstance(shapes[0], (list, tuple)):
        shapes = [shapes]

    check_name(what)
    import torch

    from cute_kernels.bench import harness as H

    if not torch.cuda.is_available():
        raise SystemExit("bench needs a CUDA GPU")
    SUITES, PEERS = suites()
    families = list(SUITES) if what == "all" else [what.split(".")[0]]
    meta = H.environment()
    H.progress("measuring ceilings (1 GiB d2d copy, 1 GiB torch.sum)")
    copy_bw = H.copy_bandwidth()
    ceilings = {"copy": copy_bw, "read": max(copy_bw, H.read_bandwidth())}
    meta["ceilings"] = ceilings
    failed = 0
    for f in families:
        kwargs = {"quick": quick, "ceilings": ceilings}
        if f == "elementwise" and "." in what:
            kwargs["ops"] = (what.split(".")[1],)
        if shapes:
            if f == "elementwise":
                kwargs["sizes_mib"] = [max(1, math.prod(s) * 2 // MiB) for s in shapes]
            else:
                kwargs["shapes"] = [tuple(s) for s in shapes]
        H.progress(f"suite {f}")
        m = dict(meta)
        m["peers"] = H.peer_versions(PEERS[f]) or "none has this op"
        rows, refs, checks, extra, more = SUITES[f](**kwargs)
        m.update(more)
        print(f"\n## {f}  ({meta['gpu']}, {meta['date']}, commit {meta['commit']})")
        print(f"ceilings: copy {ceilings['copy']:.3f} TB/s, read {ceilings['read']:.3f} TB/s")
        print(H.markdown_table(rows, refs))
        for c in checks:
            print(f"[{'PASS' if c['ok'] else 'FAIL'}] {c['target']}: {c['measured']}")
            failed += not c["ok"]
        if extra:
            print(extra)
        if out_dir:
            files = H.write_results(f, out_dir, m, rows, refs, checks, extra)
            print("wrote " + ", ".join(str(p) for p in files.values()))
    return 0 if failed == 0 else 1
