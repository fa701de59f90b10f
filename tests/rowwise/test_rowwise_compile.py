"""CPU: the row-wise kernels (lessons 4-7) compile for sm_90a under the plans the ops pick: no
spills, registers within the CTA's budget, 128-bit accesses on aligned rows, scalar accesses on odd
rows, the cluster stage (DSMEM stores + cluster barrier) only where a row spans a cluster."""

import re

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from cute_kernels.rowwise import ROWWISE, plan_for_kernel, tuning_of
from schedules.row_tiling import max_held_row

NAMES = [s.name for s in ROWWISE]


def _params(name, n, dtype="bf16", aligned=True, **extra):
    """The parameters the ops compile for rows of `n` (`ops._rowwise.kernel_params`: the plan, fitted to the
    signature `extra`)."""
    import torch

    from cute_kernels.rowwise.launch import kernel_params

    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    return catalog.get(name).resolve(kernel_params(name, tdt, n, aligned, **extra))


def _compile(name, p, tmp_path, loop_spill=False):
    report, files = compile_with_artifacts(catalog.get(name), p, str(tmp_path))
    k = report.kernels[0]
    assert k.registers and k.registers <= 65536 // p["threads"] and k.registers <= 255, report.format()
    # the softmax forward holding a staged row (`HeldRowPlan.hold`, 80 registers at 3 CTAs/SM) and `loop_spill`
    # plans: ptxas keeps one value of the tile loop in local memory (one store before the loop, a reload and a
    # store per row tile)
    assert k.local_bytes <= (8 if p.get("hold") or loop_spill else 0), report.format()
    return report, files["ptx"].read_text()


@pytest.mark.parametrize("name", NAMES)
def test_aligned_rows_use_128bit_accesses(name, tmp_path):
    report, ptx = _compile(name, _params(name, 4096), tmp_path)
    c = report.ptx_census
    assert c["ld.global.v4 (128-bit)"] > 0
    if name != "cross_entropy.fwd":  # writes one loss per row, no row output
        assert c["st.global.v4 (128-bit)"] > 0
    assert "barrier.cluster" not in ptx and "mapa" not in ptx


def skipped_partial_loads(ptx: str) -> int:
    """How many `ld.shared` right after a `bar.sync` (before the next shuffle/barrier) a branch can
    skip. The CTA stage of `group_reduce` must load a warp partial in every lane: when only lanes
    < warps_per_row loaded (the rest padded with 0), the butterfly over warps_per_row lanes left the
    other lanes with 0 (the first H200 run: RMSNorm rstd = rsqrt(eps), errors ~1e4)."""
    skipped, after_bar, branch = 0, False, False
    for line in ptx.splitlines():
        op = line.strip()
        if op.startswith("bar.sync"):
            after_bar, branch = True, False
        elif after_bar and op.startswith(("shfl.sync", "barrier.", "ret")):
            after_bar = False
        elif after_bar and " bra" in f" {op}":
            branch = True
        elif after_bar and op.startswith("ld.shared"):
            skipped += branch
            after_bar = False
    return skipped


@pytest.mark.parametrize("name", ["rmsnorm.fwd", "layernorm.fwd", "softmax.fwd", "log_softmax.bwd"])
def test_every_lane_loads_a_warp_partial(name, tmp_path):
    p = _params(name, 4096)
    assert p["threads_per_row"] > 32  # the CTA stage of the reduction exists
    _, ptx = _compile(name, p, tmp_path)
    assert "ld.shared" in ptx and skipped_partial_loads(ptx) == 0


@pytest.mark.parametrize("name", NAMES)
def test_odd_rows_use_the_scalar_variant(name, tmp_path):
    report, _ = _compile(name, _params(name, 769, aligned=False), tmp_path)
    assert report.ptx_census["ld.global.v4 (128-bit)"] == 0
    assert report.ptx_census["ld.global (all)"] > 0


@pytest.mark.parametrize("name", ["rmsnorm.fwd", "layernorm.bwd", "softmax.fwd"])
def test_long_rows_reduce_across_a_cluster(name, tmp_path):
    n = 65536 if name == "layernorm.bwd" else 131072
    p = _params(name, n)
    assert p["cluster_n"] > 1
    report, ptx = _compile(name, p, tmp_path)
    assert re.search(r"st(\.async)?\.shared::cluster", ptx) and "mapa.shared::cluster" in ptx
    assert "barrier.cluster.arrive" in ptx and "barrier.cluster.wait" in ptx
    if p.get("staging") == "smem":  # the forwards' default at 32k-128k (HELD_TUNED): 16-byte cp.async
        assert "cp.async.cg.shared.global" in ptx and ", 16;" in ptx
    else:
        assert report.ptx_census["ld.global.v4 (128-bit)"] > 0


@pytest.mark.parametrize("name,dtype", [("softmax.fwd", "fp32"), ("rmsnorm.bwd", "fp32"), ("layernorm.fwd", "fp16")])
def test_other_dtypes(name, dtype, tmp_path):
    p = _params(name, 8192, dtype=dtype)
    report, ptx = _compile(name, p, tmp_path)
    if p.get("staging") == "smem":  # LayerNorm fwd 8k since session 20: 16-byte cp.async
        assert "cp.async.cg.shared.global" in ptx and ", 16;" in ptx
    else:
        assert report.ptx_census["ld.global.v4 (128-bit)"] > 0


def test_norm_options_compile(tmp_path):
    """RMSNorm with a residual and an fp32 weight; LayerNorm without weight/bias."""
    _compile("rmsnorm.fwd", _params("rmsnorm.fwd", 4096, residual=True, w_dtype="fp32"), tmp_path / "a")
    _compile("rmsnorm.bwd", _params("rmsnorm.bwd", 4096, residual=True), tmp_path / "b")
    _compile("layernorm.fwd", _params("layernorm.fwd", 4096, weight=False, bias=False), tmp_path / "c")


def test_plans_cover_the_required_row_lengths():
    """Rows the ops hold in one CTA or a cluster (issue 3: N to 256k): 16-byte vectors (bf16) 256k for
    every op (the norm backwards past 128k in clusters of 16); scalar rows (N not a multiple of the
    vector) 256k for the softmax forwards and cross-entropy, 128k for the others (the LayerNorm backward's since
    session 17: its 128k register plan, kept for what the staged one does not take). Past that the op names x and
    the limit (`ops._rowwise.plan_for`)."""
    for name in NAMES:
        fam, direction = name.split(".")
        scalar = 262144 if fam == "cross_entropy" or (fam in ("softmax", "log_softmax") and direction == "fwd") \
            else 131072
        vector = 262144  # the norm backwards past 128k in non-portable clusters of 16 (`_LONG_NORM_BWD_16`)
        for aligned in (True, False):
            vec, most = (8, vector) if aligned else (1, scalar)
            for n in (1, 7, 769, 1024, 4096, 5125, 16384, 65536, most):
                plan = plan_for_kernel(name, n, vec)
                # clusters of 16: the norm backwards past 128k, the 16-bit forwards from 128k (session 14), the
                # LayerNorm forward's scalar rows past 64k (16 values a thread, session 22)
                big = name.endswith("norm.bwd") or (direction == "fwd" and n > 65536
                                                    and (vec == 8 or name == "layernorm.fwd"))
                assert plan.capacity(vec) >= n and plan.cluster_n <= (16 if big else 8)
            assert max_held_row(tuning_of(name), vec) == most, name


def test_rows_past_the_limit_name_x():
    import torch

    from cute_kernels.rowwise.launch import plan_for

    with pytest.raises(ValueError, match=r"x: rows of 524288 elements .* layernorm.bwd .* at most 262144 for bfloat16"):
        plan_for("layernorm.bwd", torch.bfloat16, 524288, True)


@pytest.mark.parametrize("name,n,dtype", [("rmsnorm.fwd", 262144, "bf16"), ("layernorm.fwd", 262144, "fp16"),
                                          ("rmsnorm.bwd", 131072, "bf16"), ("softmax.bwd", 262144, "bf16"),
                                          ("rmsnorm.bwd", 262144, "bf16"), ("layernorm.bwd", 262144, "bf16"),
                                          ("log_softmax.bwd", 262144, "fp16")])
def test_long_staged_rows_compile(name, n, dtype, tmp_path):
    """Rows past the register plans, staged in shared memory (the 16-CTA forwards of session 14, RMSNorm bwd 128k
    of session 15, the softmax backward's staged plan): 16-byte cp.async, a cluster of 8 (16: the norms past 128k), no spills."""
    p = _params(name, n, dtype=dtype)
    assert p["staging"] == "smem" and p["cluster_n"] == (16 if ".fwd" in name or n > 131072 and name.endswith("norm.bwd")
                                                         else 8)
    _, ptx = _compile(name, p, tmp_path)
    assert "cp.async.cg.shared.global" in ptx and ", 16;" in ptx


@pytest.mark.parametrize("name,n", [("rmsnorm.fwd", 16384), ("rmsnorm.fwd", 32768), ("layernorm.fwd", 16384),
                                    ("layernorm.fwd", 32768), ("softmax.fwd", 32768), ("softmax.fwd", 262144),
                                    ("layernorm.bwd", 16384), ("layernorm.bwd", 32768), ("softmax.bwd", 32768),
                                    ("log_softmax.bwd", 131072)])
def test_band_plans_compile(name, n, tmp_path):
    """The 16k-32k band and the softmax forward at 256k under the plans of session 10's sweep
    (staged, mbarrier-synced clusters, held rows; LayerNorm backward prefetching in clusters of 2-8;
    the softmax backwards staged from 16k):
    within the register budget, no spills (a held row's loop count aside, as `_compile` allows)."""
    p = _params(name, n)
    _, ptx = _compile(name, p, tmp_path)
    if p["cluster_n"] > 1:  # (the softmax backward at 32k: one CTA a row)
        assert "mbarrier" in ptx or "barrier.cluster" in ptx


C16 = [("rmsnorm.fwd", 131072, {}), ("rmsnorm.fwd", 262144, {}), ("rmsnorm.fwd", 262144, {"residual": True}),
       ("rmsnorm.fwd", 262144, {"w_dtype": "fp32"}), ("rmsnorm.fwd", 262144, {"fp8_out": "per_token"}),
       ("rmsnorm.fwd", 131072, {"fp8_out": "block128", "residual": True}), ("rmsnorm.fwd", 262144, {"dtype": "fp16"}),
       ("layernorm.fwd", 262144, {}), ("layernorm.fwd", 262144, {"residual": True}),
       ("layernorm.fwd", 262144, {"fp8_out": "block128"}), ("layernorm.fwd", 262144, {"weight": False, "bias": False}),
       ("rmsnorm.fwd", 262144, {"weight": False}), ("rmsnorm.fwd", 262144, {"fp8_out": "block128", "residual": True}),
       ("rmsnorm.fwd", 131072, {"fp8_out": "per_token", "residual": True}),
       ("layernorm.fwd", 262144, {"fp8_out": "per_token", "residual": True}), ("layernorm.fwd", 131072, {"weight": False, "bias": False}),
       ("softmax.fwd", 262144, {}), ("softmax.fwd", 262144, {"dtype": "fp16"}), ("log_softmax.fwd", 262144, {})]


@pytest.mark.parametrize("name,n,extra", C16, ids=[f"{a}-{b}-{'-'.join(f'{k}={v}' for k, v in c.items())}"
                                                    for a, b, c in C16])
def test_cluster16_forward_plans_compile(name, n, extra, tmp_path):
    """The 16-CTA forward plans of session 14 (RMSNorm 128k-256k, LayerNorm / softmax / log-softmax 256k) under
    every signature that shares them (fused residual, fp32 weight, FP8 outputs, fp16, no affine): within the
    register budget of their CTAs per SM, no spills (the register floors of `NormFwd` for the fused FP8 output
    beside a residual and for rows staged without a weight)."""
    dtype = extra.pop("dtype", "bf16")
    p = _params(name, n, dtype=dtype, **extra)
    if n == 262144 or name == "rmsnorm.fwd":  # (LayerNorm 128k: the 8-CTA plan, its no-affine variant spilled)
        assert p["cluster_n"] == 16 and p["staging"] == "smem"
        # mbarrier-synced but RMSNorm at 256k (the barrier twin measured faster there)
        assert p["cluster_sync"] == ("barrier" if (name, n) == ("rmsnorm.fwd", 262144) else "mbarrier")
    _compile(name, p, tmp_path)


BWD15 = [("layernorm.bwd", 131072, {"w_dtype": "fp32"}), ("rmsnorm.bwd", 131072, {"w_dtype": "fp32"}), ("rmsnorm.bwd", 65536, {}),
         ("rmsnorm.bwd", 65536, {"residual": True}), ("rmsnorm.bwd", 65536, {"w_dtype": "fp32", "dtype": "fp16"}),
         ("rmsnorm.bwd", 65536, {"weight": False}),
         # LayerNorm 32k (session 12's plan at the 2 CTAs an SM it was measured with: 64 registers)
         ("layernorm.bwd", 32768, {}), ("layernorm.bwd", 32768, {"residual": True}),
         ("layernorm.bwd", 32768, {"w_dtype": "fp32", "bias": False}),
         # 64-bit indexing (rows x N past 2^31 elements)
         ("layernorm.bwd", 131072, {"index64": True}), ("rmsnorm.bwd", 131072, {"index64": True}),
         ("rmsnorm.bwd", 65536, {"index64": True})]


@pytest.mark.parametrize("name,n,extra", BWD15, ids=[f"{a}-{b}-{'-'.join(f'{k}={v}' for k, v in c.items())}"
                                                      for a, b, c in BWD15])
def test_norm_backward_plans_of_session15_compile(name, n, extra, tmp_path):
    """Session 15's norm-backward plans (LayerNorm 128k: 32 elements a thread held in clusters of 8, one CTA an SM;
    RMSNorm 128k the same staged and double-buffered with register accumulators; RMSNorm 64k 16 elements a thread,
    register accumulators capped at 2 CTAs an SM; LayerNorm 32k's cap corrected to 2) under every signature that
    shares them: within the register
    budget of their CTAs per SM, no spills but LayerNorm's and RMSNorm 64k's without weight: ptxas keeps one 4-byte
    value of the row-tile loop in local memory (a store before the loop, a reload and a store per row tile; the H200
    sweep timed LayerNorm so, 1.19x the staged plan). With 64-bit indexing LayerNorm 128k and RMSNorm 64k spilled
    48-64 B: their entries' `i64` plans (the staged plans before them) run there, without spills."""
    dtype = extra.pop("dtype", "bf16")
    p = _params(name, n, dtype=dtype, **extra)
    if extra.get("index64") and (name, n) in (("layernorm.bwd", 131072), ("rmsnorm.bwd", 65536)):
        assert p["staging"] == "smem" and p["threads"] == 256
        _compile(name, p, tmp_path)
        return
    assert (p["threads"], p["cluster_n"]) == (512, 8)
    # (LayerNorm 128k's register plan runs since session 17 beside an fp32 weight only: test_layernorm_bwd_refill_*)
    # RMSNorm 128k staged, also beside an fp32 weight (192 KiB a CTA: its register accumulators take no shared slots)
    staged = (name, n) == ("rmsnorm.bwd", 131072)
    assert p["staging"] == ("smem" if staged else "regs")
    if (name, n) == ("layernorm.bwd", 32768):
        assert p["ctas_per_sm"] == 2 and p["acc_regs"]
    report, _ = _compile(name, p, tmp_path, loop_spill=name == "layernorm.bwd" or "weight" in extra)
    if report.sass_census:  # (nvdisasm present) the one value: a store before the loop, a reload + store in it
        assert report.sass_census["LDL/STL (spills)"] <= (3 if name == "layernorm.bwd" or "weight" in extra else 0), \
            report.format()
    if p.get("acc_regs"):
        assert report.kernels[0].registers <= 65536 // (p["threads"] * p["ctas_per_sm"])


@pytest.mark.parametrize("name,n,extra,want", [
    ("rmsnorm.bwd", 32768, {"w_dtype": "fp32"}, "regs"),  # the staged plan would take 256 KiB: the register plan
    ("layernorm.bwd", 262144, {"w_dtype": "fp32"}, "accr"),  # no register plan holds 256k: accumulators in registers
    ("layernorm.bwd", 262144, {"w_dtype": "fp32", "residual": True}, "accr"),
    ("rmsnorm.bwd", 131072, {"w_dtype": "fp32"}, "unheld")])
def test_staged_plans_fitted_to_an_fp32_weight(name, n, extra, want, tmp_path):
    """A staged backward plan whose shared memory an fp32 weight overflows (refused by the spec: the op raised on
    these valid inputs before session 15) runs its family's register plan for the length, else its accumulators in
    registers (`ops._rowwise.fitted`); the result compiles within the register budget."""
    plan = plan_for_kernel(name, n, 8)
    p = _params(name, n, **extra)
    if want == "regs":
        assert plan.staging == "smem" and p["staging"] == "regs"
    elif want == "accr":
        assert not plan.acc_regs and p["acc_regs"] and p["staging"] == "smem"
    else:  # (session 17: the held default gives way to the plan before it, its entry's `i64` plan)
        unheld = plan_for_kernel(name, n, 8, index64=True)
        assert plan.hold and not p.get("hold") and p["staging"] == unheld.staging
        assert p.get("acc_regs", False) == unheld.acc_regs
    if want == "accr":  # LayerNorm 256k: two fp32 accumulators of 32 a thread at 128 registers spill 112 B; a
        # fallback that runs (slower) where the op raised, for a signature no plan of this length fits otherwise
        report, _ = compile_with_artifacts(catalog.get(name), p, str(tmp_path))
        assert report.kernels[0].local_bytes <= 128, report.format()
        return
    _compile(name, p, tmp_path, loop_spill=True)


@pytest.mark.parametrize("name,n,extra", [
    ("rmsnorm.bwd", 131072, {}), ("layernorm.bwd", 262144, {"bias": True}),
    ("rmsnorm.fwd", 131072, {}), ("layernorm.fwd", 262144, {"bias": True})])
def test_staged_fp32_params_copied_whole(name, n, extra, tmp_path):
    """A staged fp32 weight (and bias) beside bf16 rows: each 8-element vector is 32 bytes, two 16-byte cp.async.
    Session 16's H200 run found one issued per vector (`cute.copy` with the 128-bit atom on the whole vector), the
    upper half of the staged weight never written: dx wrong by up to 15 at RMSNorm 128k / LayerNorm 256k. The
    fp32 kernel issues exactly vpt more copies per parameter than the bf16 one."""
    counts = {}
    wide = _params(name, n, w_dtype="fp32", **extra)
    for wd in ("bf16", "fp32"):
        # (the plan the fp32 weight runs, also for bf16: LayerNorm bwd 256k's held default gives way to it)
        p = catalog.get(name).resolve(dict(wide, w_dtype=wd))
        assert p["staging"] == "smem", p
        # (LayerNorm 256k beside an fp32 weight spills: test_staged_plans_fitted_to_an_fp32_weight)
        _, files = compile_with_artifacts(catalog.get(name), p, str(tmp_path / wd))
        counts[wd] = len(re.findall(r"cp\.async\.cg\.shared\.global", files["ptx"].read_text()))
    params = 1 + int(bool(extra.get("bias")) and name.endswith(".fwd"))  # (the backwards stage no bias)
    assert counts["fp32"] - counts["bf16"] == p["vpt"] * params, (counts, p)


@pytest.mark.parametrize("name,n", [("softmax.fwd", 4096), ("log_softmax.fwd", 4096), ("softmax.fwd", 1024)])
def test_short_softmax_forwards_keep_7_ctas_per_sm(name, n, tmp_path):
    """The 128-thread register plans of the softmax forwards at 1k-4k fit 7 CTAs an SM at <= 72 registers. The
    online-softmax merge's explicit fma written in the other order (session 16) took 74-76 registers (6 CTAs an SM),
    and the suites measured those forwards 3-6 % slower (perf/results/2026-11-30-h200-ae58b69/README.md)."""
    p = _params(name, n)
    assert p["threads"] == 128 and p["staging"] == "regs", p
    report, _ = _compile(name, p, tmp_path)
    assert report.kernels[0].registers <= 72, report.format()


@pytest.mark.parametrize("prefetch", [False, True], ids=["hold", "refill"])
@pytest.mark.parametrize("extra", [{}, {"residual": True}], ids=["plain", "dres"])
def test_layernorm_bwd_held_rows_compile(prefetch, extra, tmp_path):
    """`NormBwd` holding x and dy (session 16) on LayerNorm 256k's staged plan, re-read buffers replaced by the held
    16-bit rows: fewer shared loads, within the 128 registers of one 512-thread CTA an SM (at most one scalar of the
    tile loop in local memory, as the held forwards), one staging buffer a tensor when refilled."""
    import dataclasses

    from cute_kernels.rowwise import config_of

    landed = plan_for_kernel("layernorm.bwd", 262144, 8)  # (the refilled plan since session 17)
    assert landed.staging == "smem" and landed.hold and landed.prefetch and landed.stages == 1  # one buffer a tensor
    base = dataclasses.replace(landed, hold=False, prefetch=False)
    sig = dict(dtype="bf16", aligned=True, index64=False, weight=True, bias=True, w_dtype="bf16", residual=False)
    sig.update(extra)
    lds = {}
    for p in (base, dataclasses.replace(base, hold=True, prefetch=prefetch)):
        params = catalog.get("layernorm.bwd").resolve(dict(config_of(p), **sig))
        report, files = compile_with_artifacts(catalog.get("layernorm.bwd"), params, str(tmp_path / str(p.hold)))
        k = report.kernels[0]
        assert k.registers <= 128 and k.local_bytes <= 8, report.format()
        lds[p.hold] = len(re.findall(r"ld\.shared", files["ptx"].read_text()))
    assert lds[True] < lds[False], lds


REFILL17 = [(name, n, extra) for name in ("layernorm.bwd", "rmsnorm.bwd") for n in (131072, 262144)
            for extra in ({}, {"residual": True}, {"bias": False}, {"weight": False, "bias": False}, {"dtype": "fp16"},
                          {"w_dtype": "fp32"}, {"w_dtype": "fp32", "residual": True}, {"index64": True},
                          {"index64": True, "residual": True})
            if name == "layernorm.bwd" or "bias" not in extra]


@pytest.mark.parametrize("name,n,extra", REFILL17, ids=[f"{a}-{b}-{'-'.join(f'{k}={v}' for k, v in c.items()) or 'plain'}"
                                                        for a, b, c in REFILL17])
def test_norm_bwd_refill_plans_compile(name, n, extra, tmp_path):
    """Session 17's norm backward defaults at 128k / 256k (x and dy held, their one buffer a tensor refilled with the
    next tile) under every signature that shares them: at most the held plans' one loop scalar in local memory.
    Beside an fp32 weight (its widened staged vectors take the held rows' registers: RMSNorm spilled 16-32 B) and with
    64-bit indexing (LayerNorm 256k spilled 40-48 B) the unheld plans before them run (`ops._rowwise.fitted`, the
    entries' `i64` plans); where an fp32 weight leaves LayerNorm's staged rows no room, 128k's register plan, 256k the
    staged plan with register accumulators (112 B spilled: the fallback that runs where the op raised before
    session 15; 64-bit: the 16 B that plan had). Without a bias LayerNorm's one accumulator stays in shared memory
    beside the held rows (in registers it spilled 72 B)."""
    extra = dict(extra)  # (the parametrized dict is shared across runs)
    dtype = extra.pop("dtype", "bf16")
    p = _params(name, n, dtype=dtype, **extra)
    held = "w_dtype" not in extra and "index64" not in extra
    assert bool(p.get("hold")) == held and (not held or p.get("prefetch")), p
    if extra.get("w_dtype") == "fp32" and name == "layernorm.bwd":
        assert p["staging"] == ("regs" if n == 131072 else "smem"), p
    report, _ = compile_with_artifacts(catalog.get(name), p, str(tmp_path))
    k = report.kernels[0]
    assert k.registers <= 65536 // p["threads"], report.format()
    spill = (112 if extra.get("w_dtype") == "fp32" and (name, n) == ("layernorm.bwd", 262144)
             else 16 if extra.get("index64") and n == 262144 else 8)
    assert k.local_bytes <= spill, report.format()


@pytest.mark.parametrize("name", ["softmax.fwd", "log_softmax.fwd"])
@pytest.mark.parametrize("dtype,index64", [("bf16", False), ("fp16", False), ("bf16", True)], ids=str)
def test_softmax_fwd_16k_plans_compile(name, dtype, index64, tmp_path):
    """Session 18's 16k softmax / log-softmax forward: one row of 128 threads x 128 elements held (the exps in fp32,
    168 registers, 3 CTAs an SM), bf16 without spills (fp16 log-softmax: the held plans' 8 B of the tile loop in
    local memory, `_compile`); with 64-bit indexing (softmax spilled 8 B) the re-reading plan before it (the
    entry's `i64`)."""
    p = _params(name, 16384, dtype=dtype, index64=index64)
    assert (p["threads"], p["vpt"], p["staging"]) == (128, 16, "smem")
    assert p.get("hold", False) is not index64
    report, _ = _compile(name, p, tmp_path)
    if dtype == "bf16":
        assert report.kernels[0].local_bytes == 0, report.format()
