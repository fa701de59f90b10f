"""GPU: the FP8 GEMM's `sb_smem` option (B scales staged in shared memory once per tile) and the
wide tiles, cooperative 128x192 / 128x160 and ping-pong 64x192 / 64x160 (B-scale block chosen per 8-column group from the tile's
offset in its scale block), against the fp32 reference on the dequantized inputs (DeepGEMM's metric
< 1e-3) with poisoned outputs; sb_smem bitwise equal to the option off (same FMULs and FFMAs in
the same order) on every cooperative schedule, odd shapes and K-block counts."""

import pytest
import torch

from tests.fp8_gemm.test_fp8_gemm_gpu import _check, _inputs, _poison_allocator

pytestmark = pytest.mark.gpu

ck = pytest.importorskip("cute_kernels")
from cute_kernels.fp8_gemm.ops import _fp8_gemm_cuda  # noqa: E402
from schedules.fp8_gemm import default_fp8_schedule, fp8_schedule  # noqa: E402

ISSUE_NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
COOP = {
    "coop128x128": fp8_schedule("cooperative", 128, 128),
    "coop128x64": fp8_schedule("cooperative", 128, 64),
    "coop_1x2": fp8_schedule("cooperative", 128, 128, cluster_m=1, cluster_n=2),
    "nonpersistent": fp8_schedule("cooperative", 128, 128, cluster_m=1, persistent=False),
    "coop128x192": fp8_schedule("cooperative", 128, 192),
    "coop128x160": fp8_schedule("cooperative", 128, 160),
}
WIDE = {"coop128x192": COOP["coop128x192"], "coop128x160": COOP["coop128x160"],
        "coop128x192_1x1": fp8_schedule("cooperative", 128, 192, cluster_m=1),
        "pingpong64x192": fp8_schedule("pingpong", 64, 192), "pingpong64x160": fp8_schedule("pingpong", 64, 160)}
ODD = [(1, 128, 128), (5125, 96, 200), (33, 17, 9), (300, 2112, 7168), (128, 256, 16), (769, 2112, 1040)]


def _run(a, sa, b, sb, sched, dtype=torch.bfloat16, **opts):
    _poison_allocator(a.shape[0] * b.shape[0] * 2)
    out = _fp8_gemm_cuda(a, sa, b, sb, dtype, schedule=sched, **opts)
    _check(out, a, sa, b, sb, dtype)
    return out


# --- sb_smem ------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [128, 256, 384, 1040, 16, 7168])
@pytest.mark.parametrize("sched", list(COOP))
def test_sb_smem_schedules_and_k_blocks(sched, k):
    """1 K-block (only the peeled one), 2, 3, 9 (last partial), one partial block, 56; M and N
    partial tiles (N = 2112: a half scale block)."""
    s = COOP[sched]
    a, sa, b, sb = _inputs(769, 2112, k)
    out = _run(a, sa, b, sb, s, sb_smem=True)
    assert torch.equal(out, _fp8_gemm_cuda(a, sa, b, sb, schedule=s))


@pytest.mark.parametrize("n,k", ISSUE_NK)
def test_sb_smem_issue_shapes_large_m(n, k):
    a, sa, b, sb = _inputs(4096, n, k)
    s = default_fp8_schedule(4096, n, k)
    out = _run(a, sa, b, sb, s, sb_smem=True)
    assert torch.equal(out, ck.fp8_gemm(a, sa, b, sb))


@pytest.mark.parametrize("m,n,k", ODD)
def test_sb_smem_odd_shapes(m, n, k):
    s = COOP["coop128x128"]
    a, sa, b, sb = _inputs(m, n, k)
    out = _run(a, sa, b, sb, s, sb_smem=True)
    assert torch.equal(out, _fp8_gemm_cuda(a, sa, b, sb, schedule=s))


def test_sb_smem_with_promote_overlap_and_fp16():
    a, sa, b, sb = _inputs(512, 1024, 2048, ue8m0=True)
    s = COOP["coop128x128"]
    out = _run(a, sa, b, sb, s, torch.float16, sb_smem=True, promote_overlap=True)
    assert torch.equal(out, _fp8_gemm_cuda(a, sa, b, sb, torch.float16, schedule=s))


def test_sb_smem_long_k_and_fallback():
    """K = 65536 fills the 512-K-block row exactly; K = 65664 runs without sb_smem (same bits)."""
    for k in (65536, 65664):
        a, sa, b, sb = _inputs(256, 384, k)
        s = COOP["coop128x128"]
        out = _run(a, sa, b, sb, s, sb_smem=True)
        assert torch.equal(out, _fp8_gemm_cuda(a, sa, b, sb, schedule=s))


def test_sb_smem_refuses_pingpong():
    a, sa, b, sb = _inputs(64, 256, 256)
    with pytest.raises(ValueError, match="sb_smem=True needs schedule='cooperative'"):
        _fp8_gemm_cuda(a, sa, b, sb, schedule=fp8_schedule("pingpong", 64, 128), sb_smem=True)


# --- wide tiles ---------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [2112, 4096, 7168, 200, 320])
@pytest.mark.parametrize("m,k", [(4096, 7168), (769, 1040), (1, 200), (300, 16)])
@pytest.mark.parametrize("sched", list(WIDE))
def test_wide_tiles(sched, m, n, k):
    """N in {2112, 4096, 7168, 200, 320}: tiles starting at offset 0 and 64 (192) or 0/32/64/96
    (160) of their scale block, the last block partial; K not a multiple of 128 (1040, 200, 16)."""
    a, sa, b, sb = _inputs(m, n, k)
    _run(a, sa, b, sb, WIDE[sched])


@pytest.mark.parametrize("m,n,k", ODD)
@pytest.mark.parametrize("sched", ["coop128x192", "coop128x160", "pingpong64x192", "pingpong64x160"])
def test_wide_odd_shapes(sched, m, n, k):
    a, sa, b, sb = _inputs(m, n, k)
    _run(a, sa, b, sb, WIDE[sched])


@pytest.mark.parametrize("n,k", ISSUE_NK)
def test_wide_issue_shapes_large_m(n, k):
    a, sa, b, sb = _inputs(4096, n, k)
    out = _run(a, sa, b, sb, WIDE["coop128x192"])
    sbs = _run(a, sa, b, sb, WIDE["coop128x192"], sb_smem=True)
    assert torch.equal(out, sbs)


def test_wide_scale_block_per_column():
    """Each B-scale block gets a very different scale (powers of two): a column taking its
    neighbour block's scale would be off by 2^8, far outside the metric."""
    m, n, k = 256, 704, 512  # 704 = 3 tiles of 192 + 128; 5.5 scale blocks
    a, sa, b, _ = _inputs(m, n, k)
    nb, kb = -(-n // 128), -(-k // 128)
    sb = torch.pow(2.0, torch.arange(nb * kb, device="cuda", dtype=torch.float32).reshape(nb, kb) % 9 * 2 - 8)
    for sched in ("coop128x192", "coop128x160"):
        out = _run(a, sa, b, sb, WIDE[sched])
        assert torch.equal(out, _run(a, sa, b, sb, WIDE[sched], sb_smem=True))
    for sched in ("pingpong64x192", "pingpong64x160"):  # (sb_smem is cooperative-only)
        _run(a, sa, b, sb, WIDE[sched])


def test_wide_refuses_promote_overlap():
    a, sa, b, sb = _inputs(256, 384, 256)
    with pytest.raises(ValueError, match="promote_overlap=True cannot be combined with tile_n=192"):
        _fp8_gemm_cuda(a, sa, b, sb, schedule=WIDE["coop128x192"], promote_overlap=True)
