"""Benchmark suite `rowwise` (lessons 4-7): RMSNorm, LayerNorm, softmax, log-softmax, cross-entropy,
forward and backward, bf16, rows x N for N from 1k to 256k with the input at 256 MiB.

Columns: ours, torch eager, torch.compile, QuACK (where it has the op: rmsnorm, layernorm forward,
softmax, cross_entropy). Bytes per case are the floor's: every (M, N) tensor the op must read or
write once (weights, per-row statistics and the weight-gradient partials are left out: < 1%).
Backward cases time `torch.autograd.grad` of a retained graph (ours: the backward kernel, plus the
small sum over per-CTA weight-gradient partials); the norms' weight and bias require grad (training), so every
column computes dweight / dbias. torch.compile is specialized to each shape (`harness.compiled`: the default went
dynamic after the first shape of the sweep). Ceiling: the copy bandwidth measured in the run.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cute_kernels.bench import harness as H

MiB = 1 << 20
# 8k included: the first run with it found every kernel's weakest row there (66-86 % of copy)
N_ALL = (1024, 4096, 8192, 16384, 32768, 65536, 131072, 262144)
N_QUICK = (4096, 65536)
# (case, tensors moved per element)
CASES = {
    "rmsnorm.fwd": 2, "rmsnorm.bwd": 3, "layernorm.fwd": 2, "layernorm.bwd": 3,
    "softmax.fwd": 2, "softmax.bwd": 3, "log_softmax.fwd": 2, "cross_entropy.fwd": 1, "cross_entropy.bwd": 2,
}


def _fns(case, n, dtype):
    """{column: (make_inputs() -> state, call(state))} for one case."""
    import cute_kernels as ck

    fam, direction = case.split(".")
    w = H.randn(n, dtype=dtype, seed=11)
    b = H.randn(n, dtype=dtype, seed=12)
    if direction == "bwd" and fam in ("rmsnorm", "layernorm"):
        # training: the weight and bias are parameters, so every column computes their gradients too (with only x
        # requiring grad, torch and torch.compile skip dweight / dbias, ours does not)
        w.requires_grad_()
        b.requires_grad_()
    eager = {
        "rmsnorm": (lambda x: ck.rms_norm(x, w, 1e-6), lambda x: F.rms_norm(x, (n,), w, 1e-6)),
        "layernorm": (lambda x: ck.layer_norm(x, w, b, 1e-5), lambda x: F.layer_norm(x, (n,), w, b, 1e-5)),
        "softmax": (ck.softmax, lambda x: torch.softmax(x, -1)),
        "log_softmax": (ck.log_softmax, lambda x: torch.log_softmax(x, -1)),
    }
    if fam == "cross_entropy":
        ours = lambda x, t: ck.cross_entropy(x, t, reduction="none")  # noqa: E731
        ref = lambda x, t: F.cross_entropy(x.float(), t, reduction="none")  # noqa: E731
        cols = {"ours": ours, "torch": ref, "torch.compile": H.compiled(ref)}
        try:
            from quack.cross_entropy import cross_entropy as qce

            cols["quack"] = lambda x, t: qce(x, t, reduction="none")
        except ImportError:
            pass
    else:
        ours, ref = eager[fam]
        cols = {"ours": ours, "torch": ref, "torch.compile": H.compiled(ref)}
        try:
            if fam == "rmsnorm":
                from quack.rmsnorm import rmsnorm as qrms

                cols["quack"] = lambda x: qrms(x, w, eps=1e-6)
            elif fam == "layernorm" and direction == "fwd":
                from quack.rmsnorm import layernorm_fwd

                w32, b32 = w.float(), b.float()  # QuACK's LayerNorm takes fp32 weight and bias
                cols["quack"] = lambda x: layernorm_fwd(x, w32, b32, 1e-5)
            elif fam == "softmax":
                from quack.softmax import softmax as qsm

                cols["quack"] = qsm
        except ImportError:
            pass
    return cols


def _call(case, f, x, t, dy):
    """The timed call of one column: the forward, or the backward of a retained graph."""
    fam, direction = case.split(".")
    args = (x, t) if fam == "cross_entropy" else (x,)
    if direction == "fwd":
        def fwd():
            with torch.no_grad():
                return f(*args)
        return fwd
    xg = x.detach().requires_grad_()
    y = f(xg, t) if fam == "cross_entropy" else f(xg)
    y = y[0] if isinstance(y, tuple) else y
    g = dy if fam != "cross_entropy" else torch.ones_like(y)
    # x and the parameters the graph reached (a norm's weight and bias: `_fns`)
    wrt = [xg] + [p for p in _params(y) if p is not xg]
    return lambda: torch.autograd.grad(y, wrt, g, retain_graph=True)


def _calls(case, n, dtype, x, t, dy) -> dict:
    """{column: its timed call} for one case and shape, each run once (compiled, and a column that cannot run this
    shape, e.g. a row too long for it, left out with a note)."""
    calls = {}
    for col, f in _fns(case, n, dtype).items():
        try:
            calls[col] = _call(case, f, x, t, dy)
            calls[col]()
        except Exception as e:
            calls.pop(col, None)
            H.progress(f"    {col}: skipped ({type(e).__name__}: {str(e)[:120]})")
    return calls


def _params(y) -> list:
    """The leaf tensors requiring grad that `y`'s graph reaches (a norm's weight and bias)."""
    out, seen, stack = [], set(), [y.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        if hasattr(fn, "variable"):
            out.append(fn.variable)
        stack.extend(nxt for nxt, _ in fn.next_functions)
    return out


def rowwise(shapes=None, dtypes=(torch.bfloat16,), cases=tuple(CASES), quick=False, ceilings=None):
    copy_bw = ceilings["copy"]
    try:  # torch.compile's backward donates saved buffers, which a retained graph cannot re-run
        import torch._functorch.config as functorch_config

        functorch_config.donated_buffer = False
    except (ImportError, AttributeError):
        pass
    if shapes is None:
        ns = N_QUICK if quick else N_ALL
        shapes = [(max(1, (256 * MiB // 2) // n), n) for n in ns]
    rows = []
    refs = ["torch", "torch.compile", "quack"]
    for case in cases:
        fam, direction = case.split(".")
        for dt in dtypes:
            for m, n in shapes:
                H.progress(f"  {case} {dt} {m}x{n}")
                x = H.randn(m, n, dtype=dt, seed=21)
                t = torch.randint(0, n, (m,), device="cuda") if fam == "cross_entropy" else None
                dy = H.randn(m, n, dtype=dt, seed=22) if direction == "bwd" else None
                nbytes = CASES[case] * x.numel() * x.element_size()
                calls = _calls(case, n, dt, x, t, dy)
                # all columns in the same interleaved rounds: no column gets a separate run's clocks
                times = {c: r["median_ms"] for c, r in H.do_bench_interleaved(calls).items()} if calls else {}
                if "ours" not in times:
                    continue
                ours = times.pop("ours")
                rows.append(H.Row(case, str(dt).replace("torch.", ""), f"{m}x{n}", nbytes, 0, ours, times,
                                  "copy", copy_bw))
                del x, dy, t
                torch.cuda.empty_cache()
    checks = []
    big = [r for r in rows if r.bytes >= 256 * MiB]
    fwd = [r for r in big if r.case.endswith(".fwd")]
    bwd = [r for r in big if r.case.endswith(".bwd")]
    if fwd:
        worst = min(fwd, key=lambda r: r.pct_ceiling)
        checks.append({"target": "forward >= 95% of copy bandwidth (>= 256 MiB moved)",
                       "measured": f"min {worst.pct_ceiling:.1f}% ({worst.case} {worst.shape})",
                       "ok": worst.pct_ceiling >= 95.0})
    if bwd:
        worst = min(bwd, key=lambda r: r.pct_ceiling)
        checks.append({"target": "backward >= 85% of copy bandwidth (>= 256 MiB moved)",
                       "measured": f"min {worst.pct_ceiling:.1f}% ({worst.case} {worst.shape})",
                       "ok": worst.pct_ceiling >= 85.0})
    for ref, target in (("quack", 0.98), ("torch.compile", 0.97)):
        have = [r for r in rows if ref in r.refs_ms]
        if have:
            worst = min(have, key=lambda r: r.ratio(ref))
            checks.append({"target": f">= {target}x {ref} on every shape",
                           "measured": f"min {worst.ratio(ref):.3f}x ({worst.case} {worst.shape})",
                           "ok": worst.ratio(ref) >= target})
    return rows, refs, checks, "", {}


SUITES = {"rowwise": rowwise}
PEERS = {"rowwise": ("quack",)}
