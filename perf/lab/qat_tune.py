"""The QAT elementwise kernels (fake-quant forward with its mask, the STE backward) under a grid of grid-stride
schedules, against torch's fused ops, all columns in one interleaved run per case: picks `cute_kernels.qat.QAT_MAP`
(the fp32 per-tensor forward ran at 84-87 % of copy with the elementwise family's tuned shape, bf16 at 98 %).

    python3 -m perf.lab.qat_tune [--shapes 4096x8192,8192x8192] [--jobs 16] [--observer]

`--observer`: the fused observer (reduce pass + quantize pass, per tensor) under a grid of reduce plans
(`OBSERVER_PLAN`) instead. `--learnable`: the learnable backward per channel and per tensor under a grid of row plans
(`LEARNABLE_PLAN`).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import itertools

import torch

from cute_kernels.bench import harness as H
from schedules.grid_stride import GridStride

GRID = dict(threads=(128, 256), unroll=(1, 2, 4), ctas_per_sm=(0, 16), order=("cta",))
# the observer's reduce pass (`OBSERVER_PLAN`, `schedules.row_tiling.plan_rows` settings)
OBS_GRID = dict(threads=(256, 512), unroll=(4, 8), ctas_per_sm=(4, 8, 16))
# the learnable backward's rows (`LEARNABLE_PLAN`): it holds x and dy a vector each and writes dx
LEARN_GRID = dict(threads=(128, 256, 512), unroll=(2, 4, 8), ctas_per_sm=(2, 4, 8))


def configs():
    return [GridStride(t, u, c, o) for t, u, c, o in itertools.product(*GRID.values())]


def _items(dtypes):
    from cute_kernels.precompile import item

    out = []
    for s, dt in itertools.product(configs(), dtypes):
        sp = dict(threads=s.threads, unroll=s.unroll, ctas_per_sm=s.ctas_per_sm, order=s.order, dtype=dt,
                  index64=False)
        out.append(item("qat.fake_quant", dict(sp, qtype="int", zp="int", mode="scalar", mask=True, gated=False)))
        out.append(item("qat.ste_bwd", sp))
    return list(dict.fromkeys(out))


def study(shapes, dtypes=(torch.float32, torch.bfloat16), jobs=16):
    from cute_kernels import dtypes as D
    from cute_kernels.precompile import precompile

    ops = importlib.import_module("cute_kernels.qat.ops")
    C, A = torch.ops.cute_kernels, torch.ops.aten
    if jobs > 1:
        precompile(_items(tuple(D.name_of(d) for d in dtypes)), jobs)
    saved = ops.QAT_MAP, ops.QAT_QUANTIZE_MAP

    def use(s):  # the walk of the STE backward and of the fake-quant's ascending modes, and the per-tensor one's
        # (the same, reversed: `QAT_QUANTIZE_MAP`)
        ops.QAT_MAP, ops.QAT_QUANTIZE_MAP = s, dataclasses.replace(s, reverse=True)

    lines = ["| case | dtype | shape | torch us | default us | best us | best config | best x torch | default x torch |",
             "|---|---|---|---|---|---|---|---|---|"]
    try:
        for dt, (r, c) in itertools.product(dtypes, shapes):
            x, g = H.randn(r, c, dtype=dt, seed=1), H.randn(r, c, dtype=dt, seed=2)
            s0 = float(x.float().abs().amax()) / 127
            _, mask = C.fake_quant_scalar(x, s0, 0, -128, 127, "int", True)
            tmask = A.fake_quantize_per_tensor_affine_cachemask(x, s0, 0, -128, 127)[1]
            cases = {"fq.fwd.tensor": (lambda: C.fake_quant_scalar(x, s0, 0, -128, 127, "int", True),
                                       lambda: A.fake_quantize_per_tensor_affine_cachemask(x, s0, 0, -128, 127)),
                     "fq.bwd": (lambda: C.fake_quant_backward(g, mask),
                                lambda: A.fake_quantize_per_tensor_affine_cachemask_backward(g, tmask))}
            for case, (ours, ref) in cases.items():
                fns = {"torch": ref}
                for s in configs():
                    def run(s=s):
                        use(s)
                        return ours()
                    run()
                    fns[str(s)] = run
                ops.QAT_MAP, ops.QAT_QUANTIZE_MAP = saved
                fns["default"] = ours
                res = {k: v["median_ms"] for k, v in H.do_bench_interleaved(fns, rep_ms=40, max_reps=200).items()}
                t_ref, t_def = res.pop("torch"), res.pop("default")
                best = min(res, key=res.get)
                lines.append(f"| {case} | {D.name_of(dt)} | {r}x{c} | {t_ref*1e3:.1f} | {t_def*1e3:.1f} | "
                             f"{res[best]*1e3:.1f} | {best} | {t_ref/res[best]:.3f} | {t_ref/t_def:.3f} |")
                H.progress(lines[-1])
    finally:
        ops.QAT_MAP, ops.QAT_QUANTIZE_MAP = saved
    return "\n".join(lines)


HEADER = ["| case | dtype | shape | torch us | default us | best us | best plan | best x torch | default x torch |",
          "|---|---|---|---|---|---|---|---|---|"]


def plan_sweep(plan: dict, grid: dict, make_call, ref, case: str, dt, shape) -> str:
    """One row of a plan study: `make_call()` (a fresh callable per column, e.g. with its own observer state) timed
    with the module-level plan dict `plan` set to each point of `grid` (threads, unroll, ctas_per_sm) and to its
    current value ("default"), beside torch's `ref` (None: no torch column), in one interleaved run; `plan` is left as
    it was."""
    from cute_kernels import dtypes as D

    saved = dict(plan)

    def with_plan(p, call):
        def run():
            plan.clear()
            plan.update(p)
            return call()
        return run

    fns = {"torch": ref} if ref is not None else {}
    try:
        for t, u, cap in itertools.product(*grid.values()):
            fns[f"t{t}u{u}c{cap}"] = run = with_plan(dict(threads=t, unroll=u, ctas_per_sm=cap), make_call())
            run()
        fns["default"] = with_plan(saved, make_call())
        res = {k: v["median_ms"] for k, v in H.do_bench_interleaved(fns, rep_ms=40, max_reps=200).items()}
    finally:
        plan.clear()
        plan.update(saved)
    t_ref, t_def = res.pop("torch", float("nan")), res.pop("default")
    best = min(res, key=res.get)
    line = (f"| {case} | {D.name_of(dt)} | {shape[0]}x{shape[1]} | {t_ref*1e3:.1f} | {t_def*1e3:.1f} | "
            f"{res[best]*1e3:.1f} | {best} | {t_ref/res[best]:.3f} | {t_ref/t_def:.3f} |")
    H.progress(line)
    return line


def observer_study(shapes, dtypes=(torch.float32, torch.bfloat16)):
    """The fused moving-average observer + fake-quant, per tensor (`fake_quant_observed`: a reduce pass, then the
    quantize pass), under each reduce plan of OBS_GRID, against torch's fused op (fp32 only) and the current plan."""
    import cute_kernels as ck

    ops = importlib.import_module("cute_kernels.qat.ops")
    on = torch.ones(1, dtype=torch.long, device="cuda")
    lines = list(HEADER)

    def state():
        return [torch.full((1,), float("inf"), device="cuda"), torch.full((1,), float("-inf"), device="cuda"),
                torch.ones(1, device="cuda"), torch.zeros(1, dtype=torch.int32, device="cuda")]

    for dt, (r, c) in itertools.product(dtypes, shapes):
        x = H.randn(r, c, dtype=dt, seed=1).requires_grad_()
        ref = None
        if dt == torch.float32:
            ts = state()
            ref = lambda: torch._fused_moving_avg_obs_fq_helper(x, on, on, *ts, 0.01, -128, 127, 0,  # noqa: E731
                                                                False, False)

        def make_call():  # each column observes with a state of its own
            st = state()
            return lambda: ck.fake_quant_observed(x, on, on, *st, 0.01, -128, 127, 0, False, False)
        lines.append(plan_sweep(ops.OBSERVER_PLAN, OBS_GRID, make_call, ref, "observer.tensor", dt, (r, c)))
    return "\n".join(lines)


def learnable_study(shapes, dtypes=(torch.float32, torch.bfloat16)):
    """The learnable backward (dx and the scale / zero-point sums), per channel (axis 0) and per tensor (fp32: torch's
    per-tensor op takes fp32 only), under each row plan of LEARN_GRID, against torch's op and the current plan."""
    ops = importlib.import_module("cute_kernels.qat.ops")
    C, A = torch.ops.cute_kernels, torch.ops.aten
    lines = list(HEADER)
    for dt, (r, c) in itertools.product(dtypes, shapes):
        x, g = H.randn(r, c, dtype=dt, seed=1), H.randn(r, c, dtype=dt, seed=2)
        s0 = float(x.float().abs().amax()) / 127
        sc = torch.full((r,), s0, device="cuda") * (1 + torch.rand(r, device="cuda"))
        zc = torch.zeros(r, device="cuda")
        st, zt = torch.tensor([s0], device="cuda"), torch.tensor([0.3], device="cuda")
        cases = {"learnable.bwd.channel": (
            lambda: C.fake_quant_learnable_backward(g, x, sc, zc, -128, 127, 0, None, 1.0),
            lambda: A._fake_quantize_learnable_per_channel_affine_backward(g, x, sc, zc, 0, -128, 127, 1.0))}
        if dt == torch.float32:
            cases["learnable.bwd.tensor"] = (
                lambda: C.fake_quant_learnable_backward(g, x, st, zt, -128, 127, None, None, 1.0),
                lambda: A._fake_quantize_learnable_per_tensor_affine_backward(g, x, st, zt, -128, 127, 1.0))
        for case, (ours, ref) in cases.items():
            try:
                ref()
            except RuntimeError:  # (older torch: no bf16 learnable per-channel backward)
                ref = None
            lines.append(plan_sweep(ops.LEARNABLE_PLAN, LEARN_GRID, lambda ours=ours: ours, ref, case, dt, (r, c)))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4096x8192,8192x8192")
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("--observer", action="store_true", help="the fused observer's reduce plans instead")
    ap.add_argument("--learnable", action="store_true", help="the learnable backward's row plans instead")
    a = ap.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    if a.observer:
        print(observer_study(shapes))
    elif a.learnable:
        print(learnable_study(shapes))
    else:
        print(study(shapes, jobs=a.jobs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
