"""CPU: shared-memory staging of the held rows (`staging="smem"`, collectives.rowwise): every staged
kernel compiles for sm_90a without spills, copies its rows with `cp.async.cg.shared.global` (128-bit,
one commit and one wait per tile), reads them back with 128-bit shared loads, asks ptxas for the
CTAs per SM shared memory allows (`.minnctapersm`), and takes far fewer registers than the
register plan of the same shape. The plans and specs refuse what staging cannot do."""

import re

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from cute_kernels.rowwise import STAGED_TENSORS, config_of, plan_of
from schedules.row_tiling import HeldRowPlan, RowTiling, plan_held_rows

# (kernel, staged plan as threads, threads_per_row, vpt, cluster_n): long-row shapes the tuner tries.
CASES = [
    ("rmsnorm.fwd", (128, 128, 8, 8)), ("rmsnorm.fwd", (256, 256, 4, 8)),
    ("layernorm.fwd", (128, 128, 8, 8)), ("layernorm.fwd", (256, 256, 4, 8)),
    ("softmax.fwd", (256, 256, 4, 8)), ("softmax.fwd", (128, 128, 8, 8)), ("log_softmax.fwd", (128, 128, 8, 8)),
    ("softmax.bwd", (128, 128, 8, 8)), ("log_softmax.bwd", (256, 256, 4, 8)),
    ("rmsnorm.bwd", (256, 256, 4, 8)), ("layernorm.bwd", (256, 256, 4, 8)),
]


def _params(name, shape, staging, **extra):
    t, tpr, vpt, cn = shape
    p = dict(threads=t, threads_per_row=tpr, vpt=vpt, cluster_n=cn, staging=staging, **extra)
    return catalog.get(name).resolve(p)


def _compile(name, p, tmp_path):
    report, files = compile_with_artifacts(catalog.get(name), p, str(tmp_path))
    assert not report.spills, report.format()
    return report, report.kernels[0].registers, files["ptx"].read_text()


@pytest.mark.parametrize("name,shape", CASES)
def test_staged_rows_use_cp_async_and_few_registers(name, shape, tmp_path):
    report, regs, ptx = _compile(name, _params(name, shape, "smem"), tmp_path / "smem")
    staged = STAGED_TENSORS[name]
    vpt = shape[2]
    # one 128-bit cp.async per held vector of each staged row (+ the weight/bias, copied once)
    assert ptx.count("cp.async.cg.shared.global") >= staged * vpt, report.format()
    assert "cp.async.commit_group" in ptx and "cp.async.wait_group" in ptx
    assert report.ptx_census["ld.global.v4 (128-bit)"] == 0  # rows come in through cp.async only
    assert report.ptx_census["st.global.v4 (128-bit)"] > 0
    assert len(re.findall(r"ld\.shared\.v4", ptx)) >= staged * vpt
    m = re.search(r"\.minnctapersm (\d+)", ptx)
    assert m and int(m.group(1)) >= 2
    assert report.dynamic_smem_bytes and report.dynamic_smem_bytes >= staged * shape[1] * vpt * 16
    if name.endswith(".fwd") or name.startswith(("softmax", "log_softmax")):
        _, regs_plan, _ = _compile(name, _params(name, shape, "regs"), tmp_path / "regs")
        # staging frees the held row's registers: fewer than the register plan (which itself fell
        # from 122 to ~70-110 once the exps stopped keeping x * log2e live, `online_softmax.exp_diff`)
        # where a thread holds 64 elements; at 32 the register plan can be the leaner one (softmax
        # t256 u4 c8: 77 against the staged 80 since the cluster wait moved after the first loads)
        assert regs <= 96 and (regs < regs_plan or vpt * 8 < 64), (regs, regs_plan)


def test_staged_options_compile(tmp_path):
    """RMSNorm forward with a residual and an fp32 weight (two 128-bit copies per weight vector),
    LayerNorm forward without weight/bias, RMSNorm forward with FP8 block scales, fp32 softmax."""
    for i, (name, extra) in enumerate([("rmsnorm.fwd", dict(residual=True, w_dtype="fp32")),
                                       ("layernorm.fwd", dict(weight=False, bias=False)),
                                       ("rmsnorm.fwd", dict(fp8_out="block128")),
                                       ("softmax.fwd", dict(dtype="fp32"))]):
        _, _, ptx = _compile(name, _params(name, (256, 256, 4, 4), "smem", **extra), tmp_path / str(i))
        assert "cp.async.cg.shared.global" in ptx


def test_staging_is_part_of_the_config_and_key():
    spec = catalog.get("softmax.fwd")
    a, b = _params("softmax.fwd", (256, 256, 4, 8), "regs"), _params("softmax.fwd", (256, 256, 4, 8), "smem")
    assert spec.key(a) != spec.key(b) and "staging=smem" in spec.key(b).config
    plan = plan_of(b)
    assert plan.staging == "smem" and config_of(plan) == {k: b[k] for k in config_of(plan)}
    assert plan_of(a).staging == "regs"


def test_refusals():
    with pytest.raises(ValueError, match="aligned"):
        _params("softmax.fwd", (256, 256, 4, 1), "smem", aligned=False)
    with pytest.raises(ValueError, match="not built"):
        _params("cross_entropy.bwd", (256, 256, 4, 1), "smem")
    # 1024 threads x 64 vectors x 16 B x 2 tensors = 2 MiB: over the 227 KB a CTA may have
    with pytest.raises(ValueError, match=r"t1024r1024u64 c1 smem"):
        _params("softmax.bwd", (1024, 1024, 64, 1), "smem")
    with pytest.raises(ValueError, match="staging"):
        HeldRowPlan(RowTiling(128, 128, 4), 1, 2, "tmem")


def test_planner_capability():
    """plan_held_rows builds staged plans on request; scalar rows stay in registers. The production
    table stages 16-bit rows of the forwards from 8k-16k to 256k (fp32 and scalar rows take
    the entry's register settings), the norm backwards' 16-bit rows at 64k (RMSNorm's at 4k-8k (session 19) and
    from 32k), LayerNorm
    forward's at 1k (several rows a CTA), and past the
    register plans the softmax backward's (128k-256k) and the LayerNorm backward's (64k-128k)."""
    p = plan_held_rows(65536, 8, target_elems=64, max_elems=64, min_threads=128, max_tpr=128, staging="smem")
    assert p.staging == "smem" and p.capacity(8) >= 65536
    assert p.ctas_per_sm > plan_held_rows(65536, 8, target_elems=64, max_elems=64, min_threads=128,
                                          max_tpr=128).ctas_per_sm
    assert plan_held_rows(4099, 1, staging="smem").staging == "regs"
    with pytest.raises(ValueError, match="shared memory"):
        plan_held_rows(1 << 20, 8, target_elems=1024, max_elems=1024, min_threads=1024, max_tpr=1024,
                       max_cluster=1, staging="smem")
    from schedules.row_tiling import HELD_TUNED, plan_for_rows

    staged = {(fam, most) for fam, entries in HELD_TUNED.items() for most, st in entries if "staging" in st}
    assert staged == {("fwd", 131072), ("rms_bwd", 8192), ("rms_fwd", 65536), ("rms_fwd", 131072), ("ln_fwd", 65536),
                      ("ln_fwd", 131072), ("ln_bwd", 65536),
                      # the 16k-32k band (session 10's sweep): RMSNorm and LayerNorm forwards from 8k
                      # (RMSNorm 16k: a one-tile register plan since session 21)
                      ("ln_fwd", 16384), ("ln_fwd", 32768),
                      # past the tuned plans (`_LONG_FWD`): the norm forwards past 256k; softmax forward 128k-256k
                      # re-reading a staged row (`_STAGED_FWD`)
                      ("rms_fwd", None), ("ln_fwd", None), ("bwd", None), ("fwd", 262144),
                      ("rms_fwd", 262144), ("ln_fwd", 262144),  # session 14: clusters of 16 at 128k-256k
                      ("bwd", 32768),  # the softmax backward at 16k-32k: one staged row of 16 vectors a thread
                      ("rms_bwd", None), ("ln_bwd", None),  # the norm backwards past 128k: clusters of 16
                      # session 11: softmax fwd 16k, RMSNorm bwd 32k (and LayerNorm fwd 1k, one-tile since session 21)
                      ("fwd", 16384), ("rms_bwd", 32768),
                      ("rms_bwd", 131072),  # session 15: RMSNorm bwd 128k staged, double-buffered (64k: registers)
                      ("ln_bwd", 131072), ("ln_bwd", 262144), ("rms_bwd", 262144),  # session 17: held x and dy, refilled
                      # session 20: log-softmax fwd 8k (its own family, the softmax's entries elsewhere; LayerNorm
                      # fwd 8k's staged plan one-tile since session 21)
                      ("lsm_fwd", 8192), ("lsm_fwd", 16384), ("lsm_fwd", 131072),
                      ("lsm_fwd", 262144),
                      # session 20 at the buckets' middles: softmax bwd 4097-6144 and 8193-12288, LayerNorm fwd 12288
                      ("bwd", 6144), ("bwd", 12288), ("ln_fwd", 12288),
                      ("bwd", 16384)}  # session 21: softmax bwd 12289-16384 staged in clusters of 2
    for fam in ("rms_fwd", "ln_fwd", "bwd"):
        assert plan_for_rows(fam, 262144, 8).staging == "smem"
        with pytest.raises(ValueError):  # fp32 rows keep the register settings: 128k at most
            plan_for_rows(fam, 262144, 4)
    assert all(plan_for_rows("bwd", n, 8).staging == "smem" for n in (16384, 16385, 32768, 131072))
    # ... and (session 20) at 4097-6144 and 8193-12288 (session 21: to 16384), beside the register plans at 8k
    assert [plan_for_rows("bwd", n, 8).staging for n in (4096, 4097, 6144, 6145, 8192, 8193, 12288, 12289)] == \
        ["regs", "smem", "smem", "regs", "regs", "smem", "smem", "smem"]
    # session 17: staged, x and dy held and refilled; the register plan of session 15 for other vectors
    assert plan_for_rows("ln_bwd", 131072, 8).hold and plan_for_rows("ln_bwd", 131072, 4).staging == "regs"
    assert plan_for_rows("rms_bwd", 65536, 8).staging == "regs"  # session 15: accumulators in registers
    assert plan_for_rows("ln_bwd", 32768, 8).staging == "regs"
    assert plan_for_rows("rms_bwd", 32768, 8).staging == "smem"  # session 11: one staged row, prefetching
    for fam in ("rms_bwd", "ln_bwd"):  # the norm backwards at 64k on the one-wave grid (LayerNorm's staged)
        p = plan_for_rows(fam, 65536, 8)
        assert p.staging == ("smem" if fam == "ln_bwd" else "regs") and p.resident_grid
        assert plan_for_rows(fam, 65536, 4).staging == "regs"
    assert plan_for_rows("ln_fwd", 1024, 8).one_tile and plan_for_rows("ln_fwd", 1025, 8).staging == "regs"
    # staged from 8k + 1 (session 20: LayerNorm and log-softmax from 4k + 1; session 21, the one-tile plans: RMSNorm
    # from 16k + 1, LayerNorm from 8k + 1, log-softmax from 6144 + 1)
    for fam, first in (("fwd", 8193), ("rms_fwd", 16385), ("ln_fwd", 8193), ("lsm_fwd", 6145)):
        assert plan_for_rows(fam, first - 1, 8).staging == "regs"
        for n in (first, 32768, 65536, 100000, 131072, 262144):
            assert plan_for_rows(fam, n, 8).staging == "smem"
            if n <= 131072:
                assert plan_for_rows(fam, n, 4).staging == plan_for_rows(fam, n, 1).staging == "regs"
    # held rows where the sweeps measured them faster: softmax and LayerNorm 16k-32k, and (session 14, on 16 CTAs)
    # at 256k
    assert plan_for_rows("fwd", 32768, 8).hold and plan_for_rows("fwd", 262144, 8).hold
    assert plan_for_rows("fwd", 262144, 8).cluster_n == plan_for_rows("ln_fwd", 262144, 8).cluster_n == 16
    assert plan_for_rows("ln_fwd", 16384, 8).hold and plan_for_rows("ln_fwd", 262144, 8).hold


def _ptx_count(ptx: str, pat: str) -> int:
    return len(re.findall(pat, ptx))


@pytest.mark.parametrize("name", ["softmax.fwd", "log_softmax.fwd"])
def test_hold_reads_the_staged_row_once(name, tmp_path):
    """`hold=True`: the landed row is read from shared memory once (one 128-bit shared load per
    held vector, against one per vector and pass re-reading it), the softmax computes one exp per
    element (against two), and ptxas is asked for 3 CTAs of 256 threads per SM (80 registers)."""
    shape = (256, 256, 8, 4)
    p_hold = _params(name, shape, "smem", hold=True, cluster_sync="mbarrier")
    p_stage = _params(name, shape, "smem", cluster_sync="mbarrier")
    rep_h, files_h = compile_with_artifacts(catalog.get(name), p_hold, str(tmp_path / "hold"))
    rep_s, files_s = compile_with_artifacts(catalog.get(name), p_stage, str(tmp_path / "staged"))
    ph, ps = files_h["ptx"].read_text(), files_s["ptx"].read_text()
    assert _ptx_count(ph, r"cp\.async\.cg\.shared\.global") == 8
    # 8 row vectors + the reduction's 2 (its slots); the re-reading plan reads each vector per pass
    lh, ls = _ptx_count(ph, r"ld\.shared\.v4"), _ptx_count(ps, r"ld\.shared\.v4")
    assert lh <= 10 and ls - lh >= 8, (lh, ls)
    m = re.search(r"\.minnctapersm (\d+)", ph)
    assert m and int(m.group(1)) == 3
    assert rep_h.kernels[0].registers <= 80
    # softmax: ptxas keeps the tile loop's trip count in local memory at the 80-register cap (one store
    # before the loop, one load per tile); log-softmax (not a default: HELD_TUNED "lsm_fwd") spills 56 B
    assert rep_h.kernels[0].local_bytes <= (8 if name == "softmax.fwd" else 64), rep_h.format()
    if name == "softmax.fwd":
        ex_h, ex_s = _ptx_count(ph, r"ex2\.approx"), _ptx_count(ps, r"ex2\.approx")
        assert ex_s - ex_h >= 64, (ex_h, ex_s)  # the 64 recomputed exps are gone


def test_hold_refusals():
    with pytest.raises(ValueError, match="staging='smem'"):
        HeldRowPlan(RowTiling(256, 256, 8), 4, 2, "regs", hold=True)
    with pytest.raises(ValueError, match="at most 128 elements"):  # the softmax forward: 128 (session 18)
        _params("softmax.fwd", (256, 256, 32, 1), "smem", hold=True)
    with pytest.raises(ValueError, match="at most 64 elements"):  # LayerNorm: 64
        _params("layernorm.fwd", (256, 256, 16, 2), "smem", hold=True)
    with pytest.raises(ValueError):  # only the staged forwards (HOLD_KERNELS) have the parameter
        _params("softmax.bwd", (256, 256, 8, 4), "smem", hold=True)
    p = plan_of(_params("softmax.fwd", (256, 256, 8, 4), "smem", hold=True))
    assert p.hold and str(p).endswith("hold") and config_of(p)["hold"] is True
    assert "hold" not in config_of(plan_of(_params("softmax.fwd", (256, 256, 8, 4), "smem")))
    assert not plan_held_rows(4099, 1, staging="smem", hold=True).hold  # scalar rows stay in registers


def test_tuner_hold_twins():
    """perf.tune_rows --hold: a hold twin for each staged softmax-forward plan of <= 128 elements
    per thread (LayerNorm: 64), next to its re-reading twin; 128 elements ask for 168 registers."""
    from perf.tune_rows import _hold_twin, _holdable, _twin, staged_candidates

    c = staged_candidates(65536)
    tw = [_hold_twin(p) for p in c if _holdable(p, "softmax.fwd")]
    assert tw and all(p.hold and p.tiling.unroll * 8 <= 128 for p in tw)
    assert any(p.tiling.unroll * 8 == 128 for p in tw)
    assert all(_twin(p) in c for p in tw)
    assert {p.ctas_per_sm for p in tw if p.tiling.threads == 256 and p.tiling.unroll == 8} == {3}
    assert {p.ctas_per_sm for p in tw if p.tiling.threads == 128 and p.tiling.unroll == 16} == {3}
    assert all(p.tiling.unroll * 8 <= 64 for p in c if _holdable(p, "layernorm.fwd"))


@pytest.mark.parametrize("name,shape", [("rmsnorm.fwd", (256, 256, 8, 4)), ("rmsnorm.fwd", (128, 128, 8, 8)),
                                        ("layernorm.fwd", (256, 256, 4, 8))])
def test_norm_hold_compiles_clean(name, shape, tmp_path):
    """Norm forwards holding the landed row: x read from shared memory once (the re-reading plan
    reads it per pass), no spills: the later passes widen the held 16-bit vectors with other
    instructions (`vector_io.widen_again`), so no fp32 copy of the row stays live across a reduction
    (with the same conversion the compiler merged them: RMSNorm spilled 248 B at 80 registers)."""
    p_hold = _params(name, shape, "smem", hold=True, cluster_sync="mbarrier")
    p_stage = _params(name, shape, "smem", cluster_sync="mbarrier")
    rep_h, regs_h, ph = _compile(name, p_hold, tmp_path / "hold")
    _, _, ps = _compile(name, p_stage, tmp_path / "staged")
    vpt = shape[2]
    lh, ls = _ptx_count(ph, r"ld\.shared\.v4"), _ptx_count(ps, r"ld\.shared\.v4")
    assert ls - lh >= vpt, (lh, ls)
    assert regs_h <= 80, rep_h.format()


@pytest.mark.parametrize("name", ["rmsnorm.fwd", "layernorm.fwd", "softmax.fwd", "log_softmax.fwd"])
def test_small_staged_forwards_compile(name, tmp_path):
    """`perf.tune_rows.small_staged_candidates`: forwards of 1k rows staged with four rows per
    128-thread CTA (t128 r32 u4) and two per 256 (t256 r64... as listed): no spills, cp.async
    rows, registers far under the held plan's (LayerNorm: 48 against 128), ptxas asked for more CTAs per
    SM than the held plans' 4 (norms 8, softmax 5: its kernel's own register floor)."""
    from perf.tune_rows import small_staged_candidates

    plans = small_staged_candidates(1024)
    assert [str(p) for p in plans][:2] == ["t128r32u4 c1 smem", "t256r32u4 c1 smem"]
    t = plans[0].tiling
    report, regs, ptx = _compile(name, _params(name, (t.threads, t.threads_per_row, t.unroll, 1), "smem"), tmp_path)
    assert "cp.async.cg.shared.global" in ptx and regs <= 64, report.format()
    m = re.search(r"\.minnctapersm (\d+)", ptx)
    assert m and int(m.group(1)) >= (5 if "softmax" in name else 8)


def test_tuner_stages_the_4k_16k_band():
    """`perf.tune_rows.candidates` offers one staged row a CTA past 4k (session 19: the 8k row, the suite's weakest,
    had been swept on register plans only); up to 4k, the short-row set."""
    from perf.tune_rows import STAGED_FROM, candidates

    assert STAGED_FROM == 4097
    # (session 20: each with the vectors that cover the row, as `plan_held_rows`: 6144 on 256 threads, 3)
    for n, u in ((6144, (3, 6, 3)), (8192, (4, 8, 4))):
        staged = [str(p) for p in candidates(n) if p.staging == "smem"]
        assert staged == [f"t128r128u{u[0]} c2 smem", f"t128r128u{u[1]} c1 smem", f"t256r256u{u[2]} c1 smem"], \
            (n, staged)
        assert {str(p) for p in candidates(n, bwd=True, prefetch="without") if p.staging == "smem"} == set(staged)
    # up to 4k the several-rows-a-CTA set (`small_staged_candidates`: 4k rows one or two a CTA, at most 32 elements)
    assert [str(p) for p in candidates(4096) if p.staging == "smem"] == ["t128r128u4 c1 smem", "t256r128u4 c1 smem"]
