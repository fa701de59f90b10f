"""GPU: the FP8 GEMM's pipeline variants (docs/kernels/fp8_gemm.md, "The options"): 6 stages with
3 epilogue buffers, 2x2 clusters (A and B multicast, the grid capped by the co-resident clusters),
both, 128x192 with 5 stages and the wide tiles with sb_smem. Same math per output element as the
schedule they vary (same K-blocks, same promotion order): bitwise equal to it, and DeepGEMM's metric
< 1e-3 against the fp32 reference with poisoned outputs."""

import pytest
import torch

from tests.fp8_gemm.test_fp8_gemm_gpu import _check, _inputs, _poison_allocator

pytestmark = pytest.mark.gpu

ck = pytest.importorskip("cute_kernels")
from cute_kernels.fp8_gemm.ops import _fp8_gemm_cuda  # noqa: E402
from schedules.fp8_gemm import DEEP_EPI_STAGES, default_fp8_schedule, fp8_schedule  # noqa: E402
from schedules.hardware import max_active_clusters, num_sms  # noqa: E402

ISSUE_NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
BASE = fp8_schedule()
VARIANTS = {  # name: (variant, the schedule it must equal bit for bit)
    "deep": (fp8_schedule(epi_stages=DEEP_EPI_STAGES), BASE),
    "c2x2": (fp8_schedule(cluster_n=2), BASE),
    "c2x2_deep": (fp8_schedule(cluster_n=2, epi_stages=DEEP_EPI_STAGES), BASE),
    "c2x2_nonpersistent": (fp8_schedule(cluster_n=2, persistent=False), BASE),  # the grid capped too: tiles loop
    "wide192_deep": (fp8_schedule("cooperative", 128, 192, epi_stages=2), fp8_schedule("cooperative", 128, 192)),
}
ODD = [(1, 128, 128), (5125, 96, 200), (33, 17, 9), (300, 2112, 7168), (128, 256, 16), (769, 2112, 1040),
       (256, 384, 65664)]


def _run(a, sa, b, sb, sched, dtype=torch.bfloat16, **opts):
    _poison_allocator(a.shape[0] * b.shape[0] * 2)
    out = _fp8_gemm_cuda(a, sa, b, sb, dtype, schedule=sched, **opts)
    _check(out, a, sa, b, sb, dtype)
    return out


@pytest.mark.parametrize("sb_smem", [True, False])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_variants_equal_their_base(name, sb_smem):
    """769 x 2112 x 1040: partial M and N tiles (a cluster CTA past N), 8 K-blocks + 16 (zero-filled)."""
    var, base = VARIANTS[name]
    a, sa, b, sb = _inputs(769, 2112, 1040)
    out = _run(a, sa, b, sb, var, sb_smem=sb_smem)
    assert torch.equal(out, _fp8_gemm_cuda(a, sa, b, sb, schedule=base, sb_smem=sb_smem))


@pytest.mark.parametrize("m,n,k", ODD)
@pytest.mark.parametrize("name", ["deep", "c2x2_deep"])
def test_variants_odd_shapes(name, m, n, k):
    """M = 1 (a whole cluster row past M), N = 17 / 96 (a cluster column past N), K = 9 / 16 / 200
    (one partial K-block), K = 65664 (past the sb_smem row: runs without it)."""
    var, base = VARIANTS[name]
    a, sa, b, sb = _inputs(m, n, k)
    out = _run(a, sa, b, sb, var)
    assert torch.equal(out, _fp8_gemm_cuda(a, sa, b, sb, schedule=base))


@pytest.mark.parametrize("n,k", ISSUE_NK)
def test_issue_shapes_large_m(n, k):
    """The bench's columns at M = 4096, each bitwise equal to the default (or, for the wave model's
    wide pick, now the op's default, to the same tile without sb_smem) and within the metric. The
    options are variants of the 128x128 search's tile."""
    a, sa, b, sb = _inputs(4096, n, k)
    d = default_fp8_schedule(4096, n, k, wide=False)
    out = _fp8_gemm_cuda(a, sa, b, sb, schedule=d)
    for var in (fp8_schedule(epi_stages=DEEP_EPI_STAGES), fp8_schedule(cluster_n=2),
                fp8_schedule(cluster_n=2, epi_stages=DEEP_EPI_STAGES)):
        assert (var.tile_m, var.tile_n, var.kind) == (d.tile_m, d.tile_n, d.kind)
        assert torch.equal(_run(a, sa, b, sb, var), out), var
    wide = default_fp8_schedule(4096, n, k)
    assert wide == default_fp8_schedule(4096, n, k, wide=True)
    assert torch.equal(_run(a, sa, b, sb, wide), _fp8_gemm_cuda(a, sa, b, sb, schedule=wide, sb_smem=False))
    assert torch.equal(ck.fp8_gemm(a, sa, b, sb), _fp8_gemm_cuda(a, sa, b, sb, schedule=wide))


def test_fp16_and_promote_overlap_with_6_stages():
    a, sa, b, sb = _inputs(512, 1024, 2048, ue8m0=True)
    var, base = VARIANTS["c2x2_deep"]
    out = _run(a, sa, b, sb, var, torch.float16, promote_overlap=True)
    assert torch.equal(out, _fp8_gemm_cuda(a, sa, b, sb, torch.float16, schedule=base))


def test_cluster_occupancy():
    """The 2x2 grid cap: the occupancy API's co-resident 4-CTA clusters, at most sms / 4 (H200: 32
    expected, GPCs of 16-18 SMs), pairs at sms / 2."""
    sms = num_sms()
    four = max_active_clusters(4)
    print(f"max active clusters: size 4 {four}, size 2 {max_active_clusters(2)}, sms {sms}")
    assert 1 <= four <= sms // 4
    assert 1 <= max_active_clusters(2) <= sms // 2
