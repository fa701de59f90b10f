"""CPU: the FlashAttention backward compiles for sm_90a with what its schedule is made of: the WGMMA sites of each
arrangement (kv_split rows: S^T, dP^T from smem, dV, dK with A from registers, dQ from smem; kv_split dim: every
operand from smem), TMA loads of Q / dO / K / V and of the LSE / D rows, the bulk reduce-add of dQ, setmaxnreg
24 / 240 (or 256 / 224 when one warpgroup computes dQ), dS stored by stmatrix, and no wgmma serialized by ptxas
(a wait for every group but the ones meant); the schedule rules and the defaults that follow the head dim; the
register-order fact the dS store rests on; the pre- and postprocess kernels."""

import re

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from schedules.attention_bwd import (
    AttentionBwdSchedule,
    candidates_bwd,
    default_bwd_schedule,
    m_block_range,
    varlen_tile_base,
    varlen_total_tiles,
)

VARIANTS = [
    ({"head_dim": 128}, 0),
    ({"head_dim": 128, "mask": "causal", "deterministic": True}, 0),
    ({"head_dim": 64, "mask": "band", "varlen": True}, 0),
    ({"head_dim": 96, "mask": "causal"}, 0),
    ({"head_dim": 64, "dq_split": "k", "mask": "causal"}, 0),
    ({"head_dim": 128, "early_stats": False, "dq_buffers": 2}, 0),
    ({"head_dim": 64, "tile_m": 128, "p_smem": True, "mask": "causal"}, 8),  # FA3's D = 64 tile: not serialized
    ({"head_dim": 192, "mask": "window"}, 0),
    ({"head_dim": 128, "softcap": True, "dtype": "fp16", "mask": "window"}, 64),  # 1 - tanh^2 held: a few spills
    ({"head_dim": 256, "mask": "causal"}, 0),
    ({"head_dim": 256, "varlen": True, "deterministic": True}, 0),
]


def _id(v):
    return ",".join(f"{k}={x}" for k, x in v[0].items())


@pytest.fixture(scope="module", params=VARIANTS, ids=[_id(v) for v in VARIANTS])
def compiled(request, tmp_path_factory):
    over, spill_limit = request.param
    spec = catalog.get("flash_attn_bwd")
    p = spec.resolve(over)
    report, files = compile_with_artifacts(spec, p, str(tmp_path_factory.mktemp("fab")))
    sass = files["sass"].read_text() if "sass" in files else None
    return p, spill_limit, report, files["ptx"].read_text(), sass


def test_backward_ingredients(compiled):
    p, spill_limit, report, ptx, sass = compiled
    spec = catalog.get("flash_attn_bwd")
    s = spec.schedule_of(p)
    d = p["head_dim"]
    census = report.ptx_census
    if s.kv_split == "rows":
        # S^T and dP^T: D / 16 each; dV, dK: tile_m / 16 each; dQ: tile_n / 16 (dq_split "one": the consumer is traced
        # once per role, the second without dQ; "k": over one warpgroup's 64 keys)
        body = 2 * d // 16 + 2 * s.tile_m // 16
        roles = 2 if s.dq_wgs(d) < s.consumer_wgs else 1
        dq_keys = 64 if s.split(d) == "k" else s.tile_n
        assert census["wgmma.mma_async"] == roles * body + dq_keys // 16, report.format()
    else:
        assert census["wgmma.mma_async"] == 2 * d // 16 + 3 * s.tile_m // 16, report.format()
    assert census["cp.async.bulk.tensor"] >= 6  # Q, dO, K, V, LSE, D
    assert "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32" in ptx
    assert re.search(rf"setmaxnreg\.dec\.sync\.aligned\.u32\s+{s.producer_regs}\b", ptx)
    assert re.search(rf"setmaxnreg\.inc\.sync\.aligned\.u32\s+{s.consumer_budget(d, True)}\b", ptx)
    assert "stmatrix" in ptx
    if p["deterministic"]:
        assert "ld.acquire.gpu" in ptx and "atom.global.release.add" in ptx
    if p["softcap"]:
        assert "tanh.approx.f32" in ptx
    if sass is not None and spill_limit is not None:
        assert report.sass_census["LDL/STL (spills)"] <= spill_limit, report.format()
        # ptxas serializes wgmma when it cannot prove an accumulator safe: every HGMMA then waits (gsb0 on each)
        hgmma = re.findall(r"HGMMA[^;]*;", sass)
        assert sum("gsb0" in h for h in hgmma) <= len(hgmma) // 4, "wgmma serialized"
        # the smem operand slices come from the warp-uniform warpgroup index: their descriptors stay in uniform
        # registers (a per-thread index moved them into vector registers, R2UR before every WGMMA: 50-100 of them)
        assert len(re.findall(r"\bR2UR\b", sass)) <= 32, "WGMMA descriptors built in vector registers"


@pytest.mark.parametrize("name,over", [("flash_attn_bwd_pre", {"head_dim": 128}),
                                       ("flash_attn_bwd_pre", {"head_dim": 128, "dlse": True, "deterministic": True}),
                                       ("flash_attn_bwd_pre", {"head_dim": 96, "varlen": True, "dlse": True,
                                                               "deterministic": True}),
                                       ("flash_attn_bwd_post", {"head_dim": 64}),
                                       ("flash_attn_bwd_post", {"head_dim": 96}),  # 3 row vectors a thread
                                       ("flash_attn_bwd_post", {"head_dim": 256, "varlen": True})])
def test_side_kernels(name, over, tmp_path):
    spec = catalog.get(name)
    p = spec.resolve(over)
    report, files = compile_with_artifacts(spec, p, str(tmp_path))
    assert not report.spills, report.format()
    ptx = files["ptx"].read_text()
    if name.endswith("pre"):
        assert "shfl.sync.bfly" in ptx and "ld.global.v4" in ptx  # 8 threads a row, 16-byte loads
        # the dLSE read and the semaphore zeroed only where asked (d128 unrolls 4 rows a thread: LSE alone 4 scalar
        # loads, with dLSE 8; 8 scalar stores of LSE2 and D, a ninth the semaphore)
        scalar_ld, scalar_st = len(re.findall(r"ld\.global\.b32", ptx)), len(re.findall(r"st\.global\.b32", ptx))
        if over["head_dim"] == 128 and not over.get("varlen"):
            assert (scalar_ld, scalar_st) == ((8, 9) if over.get("dlse") else (4, 8))
    else:
        assert "ld.global.v4" in ptx  # the accumulator's MMA order read back 16 bytes at a time
        assert "stmatrix" in ptx and "st.global.v4" in ptx  # dQ through smem, 16-byte row stores


def test_defaults_follow_head_dim():
    spec = catalog.get("flash_attn_bwd")
    assert spec.resolve({"head_dim": 64})["tile_m"] == 64 and spec.resolve({"head_dim": 64, "tile_m": 128})["dq_split"] == ""
    assert spec.resolve({"head_dim": 128})["tile_m"] == 64
    p = spec.resolve({"head_dim": 256})
    assert (p["tile_m"], p["tile_n"], p["kv_split"], p["stages"]) == (64, 64, "dim", 1)
    assert spec.resolve({"head_dim": 192})["stages"] == 2
    for d in (64, 96, 128, 192, 256):
        s = default_bwd_schedule(d)
        assert s.fits(d), (d, s)
        assert candidates_bwd(d)[0] == s and all(c.fits(d) for c in candidates_bwd(d))


def test_schedule_rules():
    with pytest.raises(ValueError, match="kv_split 'rows'"):
        AttentionBwdSchedule().check(256)
    with pytest.raises(ValueError, match="tile_m must be"):
        AttentionBwdSchedule(tile_m=96)
    with pytest.raises(ValueError, match="64 x 64"):
        AttentionBwdSchedule(kv_split="dim")
    with pytest.raises(ValueError, match="shared memory"):
        AttentionBwdSchedule(tile_m=64, tile_n=64, kv_split="dim", stages=2).check(256)
    s = AttentionBwdSchedule(tile_m=64, tile_n=128, dq_split="one")
    assert s.consumer_budget(96, True) == 256 and s.consumer_budget(96, False) == 224
    assert AttentionBwdSchedule().split(128) == "n" and AttentionBwdSchedule(tile_m=128).split(64) == "m"
    assert AttentionBwdSchedule().split(96) == "one" and AttentionBwdSchedule(dq_split="k").split(64) == "k"
    assert AttentionBwdSchedule(dq_split="k").dq_chunks(64) == 1 and AttentionBwdSchedule().dq_chunks(128) == 2
    with pytest.raises(ValueError, match="dq_split 'k'"):
        AttentionBwdSchedule(dq_split="k").check(128)


@pytest.mark.parametrize("sq,sk,left,right", [(1000, 1000, -1, 0), (300, 1000, -1, 0), (1000, 300, -1, 0),
                                              (777, 777, 64, 32), (500, 900, 100, -1), (129, 64, -1, -1)])
def test_m_block_range_is_the_transpose(sq, sk, left, right):
    """The query blocks a key block walks are exactly those with a visible (query, key) pair in it."""
    from collectives.attention_mask import MaskKind, visible

    kind = MaskKind(left=left >= 0, right=right >= 0)
    tm, tn = 64, 128
    for n in range((sk + tn - 1) // tn):
        lo, hi = m_block_range(n, tm, tn, sq, sk, left, right, kind)
        need = [m for m in range((sq + tm - 1) // tm)
                if any(visible(i, j, sq, sk, left, right) for i in range(m * tm, min(sq, m * tm + tm))
                       for j in range(n * tn, min(sk, n * tn + tn)))]
        got = list(range(lo, hi))
        assert set(need) <= set(got), (n, need, got)
        assert not need or (got[0] == need[0] and got[-1] == need[-1]), (n, need, got)


def test_varlen_tiles_do_not_overlap():
    lens = [0, 1, 63, 64, 65, 300, 0, 128]
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    for tm in (64, 128):
        ends = []
        for b, n in enumerate(lens):
            base = varlen_tile_base(cu[b], b, tm)
            ends.append((base, base + (n + tm - 1) // tm))
        for (a0, a1), (b0, b1) in zip(ends, ends[1:]):
            assert a1 <= b0
        assert ends[-1][1] <= varlen_total_tiles(cu[-1], len(lens), tm)


def _toolkit_ptxas():
    import shutil
    import subprocess

    exe = shutil.which("ptxas")
    if exe is None:
        return None
    ver = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    return exe if "release 13." in ver else None


@pytest.mark.skipif(_toolkit_ptxas() is None, reason="needs a CUDA 13 ptxas for its advisories (perf/ptxas_check.py)")
@pytest.mark.parametrize("over", [{"head_dim": 64}, {"head_dim": 96, "mask": "causal"}, {"head_dim": 128},
                                  {"head_dim": 192}, {"head_dim": 256, "mask": "band"}])
def test_ptxas_keeps_setmaxnreg_and_wgmma_async(over):
    """ptxas's own advisories for the default schedules: setmaxnreg honoured (no C7508, which min_blocks_per_mp=1
    prevents) and no WGMMA serialized (C7512: registers; C7514: pipelining across calls or branches)."""
    from perf.ptxas_check import check

    report = check("flash_attn_bwd", over)
    assert "C7508" not in report and "C7512" not in report and "C7514" not in report, report


@pytest.mark.parametrize("tm,tn", [(64, 128), (128, 128), (64, 64)])
def test_deterministic_order_sees_the_same_blocks(tm, tn):
    """Deterministic mode's invariant: the key blocks that walk query block m (`m_block_range` per key block) are
    exactly `n_block_range(m)`, the range the dQ writer counts its turn in; a block the count expects but that never
    comes would hang the semaphore wait."""
    from collectives.attention_mask import MaskKind, n_block_range

    for sq, sk in [(1000, 1000), (300, 1000), (1000, 300), (777, 777), (129, 64), (1, 129), (513, 64), (211, 300)]:
        for left, right in [(-1, 0), (-1, -1), (64, 32), (100, 37), (64, 0), (0, 0), (5, -1), (-1, 5), (1000, 0)]:
            kind = MaskKind(left=left >= 0, right=right >= 0)
            nb, mb = (sk + tn - 1) // tn, (sq + tm - 1) // tm
            ranges = [range(*m_block_range(n, tm, tn, sq, sk, left, right, kind)) for n in range(nb)]
            for m in range(mb):
                lo, hi = n_block_range(m, tm, tn, sq, sk, left, right, kind)
                assert [n for n in range(nb) if m in ranges[n]] == list(range(lo, max(lo, hi))), (sq, sk, left, right, m)
