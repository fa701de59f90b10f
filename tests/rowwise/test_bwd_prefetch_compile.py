"""CPU: software pipelining across row tiles in the row-wise kernels (`HeldRowPlan.prefetch`).

Staged plans (staging="smem") of the backward kernels double-buffer the rows: the next tile's cp.async group is
committed before `cp.async.wait_group 1` waits for this tile's, and the staging shared memory doubles.
Register plans hold the next tile's vectors in a second register set: one more 128-bit load per
held vector (the prologue's copy of the loop's loads) and no spills at 16 elements per thread.
The norm forwards prefetch on held rows only (`hold`): their one buffer refilled once read (session 15).
The option is a config parameter (part of the cache key), off by default, and refused by the kernels that do
not implement it."""

import dataclasses
import re

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from cute_kernels.rowwise import PREFETCH_KERNELS, ROWWISE, config_of, plan_for_kernel, plan_of
from schedules.row_tiling import HELD_TUNED, HeldRowPlan, RowTiling, plan_held_rows


def _params(name, shape, staging="regs", prefetch=True, **extra):
    t, tpr, vpt, cn = shape
    p = dict(threads=t, threads_per_row=tpr, vpt=vpt, cluster_n=cn, staging=staging, prefetch=prefetch, **extra)
    return catalog.get(name).resolve(p)


def _compile(name, p, tmp_path):
    report, files = compile_with_artifacts(catalog.get(name), p, str(tmp_path))
    assert not report.spills, report.format()
    return report, files["ptx"].read_text()


# (kernel, plan shape as threads, threads_per_row, vpt, cluster_n, extra signature)
STAGED = [
    ("rmsnorm.bwd", (128, 128, 4, 1), {}),
    ("layernorm.bwd", (256, 256, 4, 8), dict(residual=True)),
    ("softmax.bwd", (128, 128, 8, 8), {}),
    ("log_softmax.bwd", (256, 256, 4, 8), {}),
]


@pytest.mark.parametrize("name,shape,extra", STAGED, ids=[f"{n}-{'x'.join(map(str, s))}" for n, s, _ in STAGED])
def test_staged_prefetch_double_buffers(name, shape, extra, tmp_path):
    p = _params(name, shape, "smem", **extra)
    report, ptx = _compile(name, p, tmp_path)
    vpt = shape[2]
    # the prologue's copies of the first tile and the loop's of the next: 2 rows x vpt each
    assert ptx.count("cp.async.cg.shared.global") >= 2 * 2 * vpt, report.format()
    waits = [int(w) for w in re.findall(r"cp\.async\.wait_group\s+(\d+)", ptx)]
    assert 1 in waits, waits  # the tile loop leaves the next tile's group in flight
    if name.startswith(("softmax", "log_softmax")):
        assert waits == [1], waits  # nothing else is staged
    else:
        assert waits == [0, 1], waits  # the weight, copied once before the loop
    assert ptx.count("cp.async.commit_group") >= 2
    # rows come in through cp.async only (the residual gradient is loaded per tile)
    assert report.ptx_census["ld.global.v4 (128-bit)"] == (vpt if extra.get("residual") else 0)
    plain = dict(p, prefetch=False)
    spec = catalog.get(name)
    assert spec.dynamic_smem_bytes(p) > spec.dynamic_smem_bytes(plain)
    assert report.dynamic_smem_bytes == spec.dynamic_smem_bytes(p)
    m = re.search(r"\.minnctapersm (\d+)", ptx)
    assert m and int(m.group(1)) >= 1


# 16 elements per thread (2 bf16 vectors): the second register set fits without spills
REGS = [
    ("rmsnorm.bwd", (128, 128, 2, 8), {}),
    ("layernorm.bwd", (128, 128, 2, 8), {}),
    ("softmax.bwd", (128, 128, 2, 2), {}),
    ("rmsnorm.bwd", (256, 64, 2, 1), dict(residual=True)),
]


@pytest.mark.parametrize("name,shape,extra", REGS, ids=[f"{n}-{'x'.join(map(str, s))}" for n, s, _ in REGS])
def test_register_prefetch_second_set(name, shape, extra, tmp_path):
    report, ptx = _compile(name, _params(name, shape, **extra), tmp_path / "pf")
    base, _ = _compile(name, _params(name, shape, prefetch=False, **extra), tmp_path / "plain")
    vpt = shape[2]
    loads, loads0 = (r.ptx_census["ld.global.v4 (128-bit)"] for r in (report, base))
    assert loads == loads0 + 2 * vpt, (loads, loads0)  # the first tile's x/y and dy, before the loop
    regs, regs0 = report.kernels[0].registers, base.kernels[0].registers
    assert regs <= 128 and regs <= regs0 + 48, (regs, regs0)
    assert "cp.async" not in ptx


def test_prefetch_is_a_config_param_of_the_backward_kernels_only():
    spec = catalog.get("rmsnorm.bwd")
    a, b = _params("rmsnorm.bwd", (128, 128, 4, 1), prefetch=False), _params("rmsnorm.bwd", (128, 128, 4, 1))
    assert spec.key(a) != spec.key(b) and "prefetch=True" in spec.key(b).config
    assert spec.resolve()["prefetch"] is False
    plan = plan_of(b)
    assert plan.prefetch and config_of(plan) == {k: b[k] for k in config_of(plan)}
    assert "prefetch" not in config_of(plan_of(a)) and not plan_of(a).prefetch
    assert set(PREFETCH_KERNELS) == {s.name for s in ROWWISE if "prefetch" in s.params}
    for name in ("rmsnorm.fwd", "softmax.fwd", "cross_entropy.bwd"):  # (the norm forwards: only with hold)
        with pytest.raises(ValueError, match="prefetch"):
            catalog.get(name).resolve(dict(prefetch=True))


def test_kernels_without_the_pipeline_refuse_it():
    from cutlass import BFloat16

    from cute_kernels.rowwise.norms import NormFwd
    from cute_kernels.rowwise.softmax import SoftmaxBwd, SoftmaxFwd

    plan = HeldRowPlan(RowTiling(128, 128, 4), 1, 2, "regs", prefetch=True)
    with pytest.raises(ValueError, match="prefetch is built for held rows only"):  # (hold + prefetch: built)
        SoftmaxFwd(False, BFloat16, 8, False, plan)
    with pytest.raises(ValueError, match="prefetch is built for held rows only"):  # (hold + prefetch: built)
        NormFwd("rms", BFloat16, BFloat16, BFloat16, 8, False, plan, True, False, False)
    SoftmaxBwd(False, BFloat16, 8, False, plan)


def test_plans():
    """Two staging buffers per row; the plan's name says pf; the planner passes it through; the
    production table asks for it only where the H200 sweeps measured it faster (the norm backwards at 4k
    and 16k-64k, RMSNorm's at 8k (session 19), 16k-32k and 128k; the held norm forwards' refill, LayerNorm 32k-256k and RMSNorm
    256k; LayerNorm 8k's from session 20 to 21, a one-tile plan since)."""
    t = RowTiling(128, 128, 4)
    off, on = HeldRowPlan(t, 1, 2, "smem"), HeldRowPlan(t, 1, 2, "smem", prefetch=True)
    rows = (2, 2)
    assert on.stages == 2 and off.stages == 1
    assert on.row_smem_bytes(8, rows, (2,), 1) - off.row_smem_bytes(8, rows, (2,), 1) == 128 * 4 * 8 * 4
    assert str(on) == f"{off} pf" and on != off
    regs_on = HeldRowPlan(t, 1, 2, prefetch=True)
    assert regs_on.row_smem_bytes(8, rows, (), 1) == HeldRowPlan(t, 1, 2).row_smem_bytes(8, rows, (), 1)
    p = plan_held_rows(65536, 8, target_elems=64, max_elems=64, min_threads=128, max_tpr=128, staging="smem",
                       prefetch=True)
    q = plan_held_rows(65536, 8, target_elems=64, max_elems=64, min_threads=128, max_tpr=128, staging="smem")
    assert p.prefetch and p.ctas_per_sm <= q.ctas_per_sm
    asked = {(name, most) for name, fam in HELD_TUNED.items() for most, st in fam if st.get("prefetch")}
    assert asked == {("rms_bwd", 4096), ("rms_bwd", 8192), ("ln_bwd", 4096), ("ln_bwd", 16384), ("ln_bwd", 32768), ("ln_bwd", 65536),
                     ("rms_bwd", 16384), ("rms_bwd", 32768),
                     ("rms_bwd", 131072),
                     # session 16: the held forwards refilling their buffer (prefetch with hold)
                     ("ln_fwd", 12288), ("ln_fwd", 32768), ("ln_fwd", 65536), ("ln_fwd", 131072), ("ln_fwd", 262144),
                     ("rms_fwd", 262144),
                     # session 17: the LayerNorm backward holding x and dy, their one buffer refilled
                     ("ln_bwd", 131072), ("ln_bwd", 262144), ("rms_bwd", 262144)}, asked  # session 12: LayerNorm 64k; session 15: RMSNorm 128k
    assert plan_for_kernel("rmsnorm.bwd", 4096, 8) == HeldRowPlan(RowTiling(512, 512, 1), 1, 2, prefetch=True)


def test_tuner_candidates():
    """perf.tune_rows times prefetching plans for the backward kernels only, each beside its twin."""
    from perf.tune_rows import PREFETCH_MAX_ELEMS, _twin, candidates

    for n in (4096, 16384, 65536):
        c = candidates(n, bwd=True)
        pf = [p for p in c if p.prefetch]
        assert any(p.staging == "smem" for p in pf) and any(p.staging == "regs" for p in pf), n
        assert all(_twin(p) in c and not _twin(p).prefetch for p in pf)
        assert all(p.tiling.unroll * 8 <= PREFETCH_MAX_ELEMS for p in pf if p.staging == "regs")
        assert not any(p.prefetch for p in candidates(n, bwd=True, prefetch="without"))
        assert not any(p.prefetch for p in candidates(n))
        only = candidates(n, bwd=True, prefetch="only")
        assert set(only) <= set(c) and {p for p in only if p.prefetch} == set(pf)


def test_the_default_prefetches_only_where_measured():
    """The production plans prefetch only where the H200 sweeps measured it faster: the LayerNorm backward at 4k
    and 16k-128k (128k held and refilled, session 17), the RMSNorm backward at 4k, 16k-32k and 128k (bf16, aligned rows). A CPU
    test (it sat in the GPU file, where CI never ran it, and failed first on the device in session 11)."""
    import torch

    from cute_kernels.rowwise import launch as R

    for name in ("rmsnorm.bwd", "layernorm.bwd", "softmax.bwd", "log_softmax.bwd"):
        for n in (1024, 4096, 16384, 32768, 65536, 131072):
            want = (name == "layernorm.bwd" and n in (4096, 16384, 32768, 65536, 131072)
                    or name == "rmsnorm.bwd" and n in (4096, 16384, 32768, 131072))
            assert R.plan_for(name, torch.bfloat16, n, True).prefetch == want, (name, n)


# The norm and softmax forwards on held rows (`hold` + `prefetch`, session 15): one staging buffer, refilled with the next
# tile's row once this tile's is read out of it. (kernel, threads, threads_per_row, vpt, cluster_n, signature)
FWD_HELD = [
    ("rmsnorm.fwd", (256, 256, 8, 16), {}),
    ("layernorm.fwd", (256, 256, 8, 16), dict(cluster_sync="mbarrier")),
    ("layernorm.fwd", (256, 256, 4, 8), dict(cluster_sync="mbarrier", residual=True)),
    ("rmsnorm.fwd", (128, 128, 8, 8), dict(cluster_sync="mbarrier", w_dtype="fp32")),
    ("softmax.fwd", (256, 256, 8, 16), dict(cluster_sync="mbarrier")),
    ("log_softmax.fwd", (256, 256, 8, 8), {}),
]


@pytest.mark.parametrize("name,shape,extra", FWD_HELD, ids=[f"{n}-{'x'.join(map(str, s))}-{len(e)}"
                                                            for n, s, e in FWD_HELD])
def test_forward_prefetch_refills_the_held_buffer(name, shape, extra, tmp_path):
    """No spills but a tile loop's scalar; the held plan's shared memory (one buffer); the loop's refill: a second
    set of copies of the row(s) after the prologue's, the tile's wait leaving nothing in flight (0)."""
    base = dict(threads=shape[0], threads_per_row=shape[1], vpt=shape[2], cluster_n=shape[3], staging="smem",
                hold=True, **extra)
    spec = catalog.get(name)
    p = spec.resolve({**base, "prefetch": True})
    plain = spec.resolve(base)

    def build(params, where):
        report, files = compile_with_artifacts(spec, params, str(where))
        return report, files["ptx"].read_text()

    report, ptx = build(p, tmp_path)
    report0, ptx0 = build(plain, tmp_path / "plain")
    # at most 8 B of local memory either way: the softmax's held plans at their 80-register floor keep one or two
    # of the tile loop's scalars there (a reload per tile; with the refill's row index, 16-CTA softmax: 8 B)
    assert report0.kernels[0].local_bytes <= 8 and report.kernels[0].local_bytes <= 8, report.format()
    assert spec.dynamic_smem_bytes(p) == spec.dynamic_smem_bytes(plain) == report.dynamic_smem_bytes
    rows = 2 if extra.get("residual") else 1
    copies = ptx.count("cp.async.cg.shared.global")
    assert copies - ptx0.count("cp.async.cg.shared.global") == rows * shape[2], (copies, rows)
    assert set(int(w) for w in re.findall(r"cp\.async\.wait_group\s+(\d+)", ptx)) == {0}


def test_forward_prefetch_needs_hold():
    spec = catalog.get("rmsnorm.fwd")
    with pytest.raises(ValueError, match="prefetch needs hold"):
        spec.check(spec.resolve(dict(threads=256, threads_per_row=256, vpt=8, cluster_n=16, staging="smem",
                                     prefetch=True)))
    held = HeldRowPlan(RowTiling(256, 256, 8), 16, 2, "smem", prefetch=True, hold=True)
    assert held.stages == 1 and str(held).endswith("hold pf")
    assert held.row_smem_bytes(8, (2,), (2,)) == dataclasses.replace(held, prefetch=False).row_smem_bytes(8, (2,), (2,))
    from perf.tune_rows import _twin  # `--fwd-prefetch only`: each refilling plan timed beside the same without

    rg = dataclasses.replace(held, resident_grid=True)
    assert _twin(rg) == dataclasses.replace(rg, prefetch=False)
