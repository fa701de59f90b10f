"""The benchmark suite of the flow family (lesson 15): the solver update and the DDIM / DDPM step at bandwidth sizes
and on a diffusion latent, and the graph-captured sampler of the example action policy against the same sampler in
plain eager torch.

Bandwidth rows: TB/s over the bytes each op must move, % of the same-run copy ceiling, against torch eager (the
update as `x + dt * k` chains, the steps as diffusers writes them) and torch.compile. The latent row also times one
torch elementwise op over that tensor (`torch.add(x, k, alpha=dt)`, the Euler update itself), the bar for a
launch-sized update. Sampler rows: wall-clock latency per trajectory (host timer around call + synchronize, the
median of many), ours as one CUDA graph replay against the eager torch sampler and network, our ops eager, and the
torch network captured in a graph too.
"""

from __future__ import annotations

import statistics
import time

import torch

from cute_kernels.bench import harness as H

MiB = 1 << 20


def _latency_ms(fns: dict, reps: int = 50) -> dict:
    """Median wall-clock ms of each callable from call to result (synchronized), in interleaved rounds."""
    for f in fns.values():
        f()
    torch.cuda.synchronize()
    times = {k: [] for k in fns}
    names = list(fns)
    for r in range(reps):
        for j in range(len(names)):
            k = names[(r + j) % len(names)]
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fns[k]()
            torch.cuda.synchronize()
            times[k].append((time.perf_counter() - t0) * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def _update_rows(copy_bw, quick):
    import cute_kernels as ck
    from cute_kernels.flow import reference as R

    rows = []
    big = [(64 * MiB // 4,)] if quick else [(64 * MiB // 4,), (256 * MiB // 4,)]
    eager = R.flow_update
    comp = H.compiled(R.flow_update)
    cases = [("euler", 1, None), ("rk4 final", 4, None), ("euler cfg", 1, 3.0)]
    for shape in big + [(16, 4, 128, 128)]:
        x = H.randn(*shape, dtype=torch.float32, seed=1)
        e = x.numel() * 4
        for name, terms, cfg in cases:
            ks = [H.randn(*shape, dtype=torch.float32, seed=10 + i) for i in range(terms * (2 if cfg else 1))]
            kk = ks if cfg is None else [tuple(ks[2 * i:2 * i + 2]) for i in range(terms)]
            co = [0.125, 0.375, 0.375, 0.125][:terms] if terms == 4 else [1.0]
            refs = {"torch": lambda kk=kk, co=co, cfg=cfg: eager(x, kk, co, 0.1, cfg),
                    "torch.compile": lambda kk=kk, co=co, cfg=cfg: comp(x, kk, co, 0.1, cfg)}
            if name == "euler":
                refs["torch.add (one op)"] = lambda k=ks[0]: torch.add(x, k, alpha=0.1)
            H.progress(f"  update {name} {shape}")
            res = H.do_bench_interleaved({"ours": lambda kk=kk, co=co, cfg=cfg: ck.flow_update(x, kk, co, 0.1, cfg),
                                          **refs})
            rows.append(H.Row(f"update {name}", "fp32", "x".join(map(str, shape)), (2 + len(ks)) * e, 0,
                              res["ours"]["median_ms"], {k: res[k]["median_ms"] for k in refs}, "copy", copy_bw))
    return rows


def _step_rows(copy_bw, quick):
    import cute_kernels as ck
    from cute_kernels.flow import reference as R

    rows = []
    at = torch.tensor([0.3], device="cuda")
    ap = torch.tensor([0.5], device="cuda")
    shapes = [(16, 4, 128, 128)] + ([] if quick else [(64 * MiB // 4,)])
    ddim_c, ddpm_c = H.compiled(R.ddim_step), H.compiled(R.ddpm_step)
    for shape in shapes:
        x, m, z = (H.randn(*shape, dtype=torch.float32, seed=s) for s in (3, 4, 5))
        e = x.numel() * 4
        cases = [("ddim eta=0", 3 * e, lambda: ck.ddim_step(x, m, at, ap),
                  lambda: R.ddim_step(x, m, at, ap), lambda: ddim_c(x, m, at, ap)),
                 ("ddpm noise clip", 4 * e, lambda: ck.ddpm_step(x, m, at, ap, z, clip_sample=1.0),
                  lambda: R.ddpm_step(x, m, at, ap, z, clip_sample=1.0),
                  lambda: ddpm_c(x, m, at, ap, z, clip_sample=1.0))]
        for name, nbytes, ours, eager, comp in cases:
            H.progress(f"  {name} {shape}")
            res = H.do_bench_interleaved({"ours": ours, "torch": eager, "torch.compile": comp})
            rows.append(H.Row(name, "fp32", "x".join(map(str, shape)), nbytes, 0, res["ours"]["median_ms"],
                              {k: res[k]["median_ms"] for k in ("torch", "torch.compile")}, "copy", copy_bw))
    return rows


def _sampler_rows(copy_bw, quick):
    from cute_kernels.flow.policy import ActionFlowNet, TorchActionFlowNet
    from cute_kernels.flow.reference import odeint_fixed
    from cute_kernels.flow.sampler import FlowSampler

    net = ActionFlowNet()
    twin = TorchActionFlowNet(net)
    rows = []
    for b in ((1,) if quick else (1, 16, 64)):
        x0 = H.randn(b, 50, 32, dtype=torch.float32, seed=7)
        ours = FlowSampler(net, 10, "euler")
        ours_eager = FlowSampler(net, 10, "euler", graph=False)

        def eager(x0=x0):
            with torch.no_grad():
                return odeint_fixed(twin, x0, 10, "euler")

        torch_graph = FlowSampler(twin, 10, "euler")  # (its update is ours: one small kernel per step)
        H.progress(f"  sampler euler 10 steps B{b}")
        ms = _latency_ms({"ours": lambda: ours(x0), "torch eager": eager, "ours eager": lambda: ours_eager(x0),
                          "torch net, graph": lambda: torch_graph(x0)})
        rows.append(H.Row("sampler euler x10", "bf16", f"B{b} 50x32", 0, 0, ms["ours"],
                          {k: v for k, v in ms.items() if k != "ours"}, "copy", copy_bw,
                          note="wall-clock latency per trajectory"))
    return rows


def flow(shapes=None, quick=False, ceilings=None):
    """(`shapes` is not used: the suite's sizes are the issue's.)"""
    copy_bw = ceilings["copy"]
    rows = _update_rows(copy_bw, quick) + _step_rows(copy_bw, quick) + _sampler_rows(copy_bw, quick)
    checks = []
    w = H.worst(rows, lambda r: r.case.startswith("update") and r.bytes >= 256 * MiB)
    if w:
        checks.append({"target": "update >= 90% of copy bandwidth (>= 256 MiB moved)",
                       "measured": f"min {w.pct_ceiling:.1f}% ({w.case} {w.shape})", "ok": w.pct_ceiling >= 90.0})
    lat = [r for r in rows if r.case == "update euler" and r.shape == "16x4x128x128"]
    if lat:
        q = lat[0].ratio("torch.add (one op)")
        checks.append({"target": "Euler update on a 16x4x128x128 fp32 latent no slower than one torch elementwise op",
                       "measured": f"{q:.3f}x torch.add", "ok": q >= 1.0})
    s1 = [r for r in rows if r.case.startswith("sampler") and r.shape.startswith("B1 ")]
    if s1:
        q = s1[0].ratio("torch eager")
        checks.append({"target": "graph-captured 10-step Euler sampler at batch 1: eager torch / ours >= 5",
                       "measured": f"{q:.2f}x ({s1[0].ours_ms * 1e3:.0f} us against "
                                   f"{s1[0].refs_ms['torch eager'] * 1e3:.0f} us)", "ok": q >= 5.0})
    refs = ["torch", "torch.compile", "torch.add (one op)", "torch eager", "ours eager", "torch net, graph"]
    lines = ["| sampler (Euler, 10 steps) | ours graph us | " + " | ".join(f"{k} us" for k in refs[3:]) + " |",
             "|---|---|" + "---|" * 3]
    for r in rows:
        if r.case.startswith("sampler"):
            lines.append(f"| {r.shape} | {r.ours_ms * 1e3:.0f} | "
                         + " | ".join(f"{r.refs_ms[k] * 1e3:.0f}" for k in refs[3:]) + " |")
    return rows, refs, checks, "\n".join(lines), {}


SUITES = {"flow": flow}
PEERS: dict[str, tuple[str, ...]] = {"flow": ()}
