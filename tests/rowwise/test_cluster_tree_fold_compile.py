"""CPU: the cluster's partials folded by a butterfly (`HeldRowPlan.cluster_fold="tree"`, session 18;
`collectives.reduce.cluster_reduce`). After the exchange each lane of a row loads ONE slot (its lane mod cluster_n)
instead of all cluster_n, and log2(cluster_n) shuffle stages replace the cluster_n - 1 dependent folds: a 16-CTA
softmax forward row runs 4 state merges of two exps each per thread, not 15. The plan, catalogue and cache key carry
the choice; the serial fold's code is what it was (its PTX and SASS unchanged by the option's existence: compared
by hand at session 18, 1112 SASS instructions at softmax fwd 256k either way)."""

import re

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from cute_kernels.rowwise import config_of, plan_of
from schedules.row_tiling import HeldRowPlan, RowTiling, plan_for_rows

# (kernel, (threads, threads_per_row, vpt, cluster_n, staging, sync), extra params): a clustered plan of each
# row-wise kernel family, both syncs, the welford triple and the 16-CTA softmax forward of 256k
CASES = [
    ("softmax.fwd", (256, 256, 8, 16, "smem", "mbarrier"), dict(hold=True)),
    ("log_softmax.fwd", (256, 256, 8, 4, "smem", "barrier"), {}),
    ("softmax.bwd", (512, 512, 4, 4, "regs", "mbarrier"), {}),
    ("rmsnorm.fwd", (128, 128, 8, 8, "smem", "mbarrier"), {}),
    ("layernorm.fwd", (256, 256, 8, 4, "smem", "mbarrier"), dict(welford=True)),
    ("rmsnorm.bwd", (512, 512, 2, 8, "regs", "mbarrier"), {}),
    ("layernorm.bwd", (512, 512, 2, 8, "regs", "barrier"), {}),
]


def _params(name, shape, fold, **extra):
    t, tpr, vpt, cn, staging, sync = shape
    return catalog.get(name).resolve(dict(threads=t, threads_per_row=tpr, vpt=vpt, cluster_n=cn, staging=staging,
                                          cluster_sync=sync, cluster_fold=fold, **extra))


def _compile(name, p, tmp_path):
    report, files = compile_with_artifacts(catalog.get(name), p, str(tmp_path))
    assert not report.spills, report.format()
    return files["ptx"].read_text(), files["sass"].read_text() if "sass" in files else None


def _sass_count(sass: str, pat: str = "") -> int:
    return len([ln for ln in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", ln) and pat in ln])


@pytest.mark.parametrize("name,shape,extra", CASES, ids=[f"{n}-c{s[3]}-{s[5]}" for n, s, _ in CASES])
def test_tree_fold_compiles_shorter(name, shape, extra, tmp_path):
    ptx_t, sass_t = _compile(name, _params(name, shape, "tree", **extra), tmp_path / "tree")
    ptx_s, sass_s = _compile(name, _params(name, shape, "serial", **extra), tmp_path / "serial")
    # the serial fold loads every slot of the row's cluster and folds them in a chain; the tree one slot per lane,
    # then log2(cluster_n) shuffle stages (a chain of 2 at 4 CTAs instead of 3: not always fewer instructions, a
    # shuffle per stage and value, but a shorter dependent path; at 16 CTAs both)
    stages = shape[3].bit_length() - 1
    widths = {"layernorm.fwd": 3, "softmax.fwd": 2, "log_softmax.fwd": 2, "layernorm.bwd": 2}
    assert ptx_t.count("shfl.sync.bfly") - ptx_s.count("shfl.sync.bfly") >= stages * widths.get(name, 1)
    if sass_t is not None and sass_s is not None and shape[3] == 16:
        assert _sass_count(sass_t) < _sass_count(sass_s)
        if name == "softmax.fwd":  # 15 merges -> 4 at 16 CTAs: 22 fewer exps (measured: 111 -> 89)
            assert _sass_count(sass_s, "MUFU.EX2") - _sass_count(sass_t, "MUFU.EX2") >= 16


def test_plan_and_catalogue_carry_the_fold():
    t = RowTiling(256, 256, 8)
    p = HeldRowPlan(t, 16, 2, "smem", cluster_sync="mbarrier", hold=True, cluster_fold="tree")
    assert str(p).endswith("tf") and " tf" in str(p)
    assert config_of(p)["cluster_fold"] == "tree" and plan_of({**config_of(p), "welford": False}) == p
    assert "cluster_fold" not in config_of(HeldRowPlan(t, 16, 2, "smem"))
    assert " tf" not in str(HeldRowPlan(t, 1, 2, cluster_fold="tree"))  # no cluster: nothing to fold
    with pytest.raises(ValueError, match="threads_per_row"):
        HeldRowPlan(RowTiling(256, 8, 8), 16, 2, cluster_fold="tree")  # 16 partials, 8 lanes a row
    with pytest.raises(ValueError, match="cluster_fold"):
        HeldRowPlan(t, 4, 2, cluster_fold="pairwise")
    with pytest.raises(ValueError):  # the streaming cross-entropy backward has no cluster to fold
        catalog.get("cross_entropy.bwd").resolve(dict(cluster_fold="tree"))
    # the defaults keep the rank-order fold but where session 19's sweep measured the butterfly faster: the softmax
    # and RMSNorm forwards at 256k (1.024-1.046x; within 1.1 % at 64k-128k)
    for fam in ("fwd", "bwd", "rms_fwd", "ln_fwd", "rms_bwd", "ln_bwd"):
        for n in (32768, 65536, 262144):
            tree = fam in ("fwd", "rms_fwd") and n == 262144
            assert plan_for_rows(fam, n, 8).cluster_fold == ("tree" if tree else "serial"), (fam, n)


def test_tuner_fold_twins():
    """perf.tune_rows --cluster-fold: a tree twin of each clustered plan; its "x off" twin is the serial one."""
    import dataclasses

    from perf.tune_rows import _twin

    p = HeldRowPlan(RowTiling(256, 256, 8), 16, 2, "smem", cluster_sync="mbarrier", hold=True, prefetch=True,
                    resident_grid=True)
    tree = dataclasses.replace(p, cluster_fold="tree")
    assert _twin(tree) == p and _twin(tree, bwd=True) == p
