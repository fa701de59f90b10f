"""GPU: the FP8 GEMMs (dense, grouped contiguous, grouped masked) checked element by element on
exact-arithmetic operands (tests/fp8_gemm/exact.py: integer e4m3 values, power-of-two scales varying
per row / N-block / K-block), so any scale taken from the wrong row, pipeline stage or N-block,
a lost K tail block or a wrong expert fails loudly (DeepGEMM's global metric can miss a wrong
partial block). Every schedule, M / N / K tails, M = 1, empty experts, masked_m 0; outputs
poisoned with NaN (unwritten elements fail)."""

import pytest
import torch

from tests.fp8_gemm import exact as fx

pytestmark = pytest.mark.gpu

ck = pytest.importorskip("cute_kernels")
from cute_kernels.fp8_gemm.ops import (  # noqa: E402  # noqa: E402
    _contiguous_cuda,
    _fp8_gemm_cuda,
    _masked_cuda,
    contiguous_layout,
    tma_aligned_scales,
)
from schedules.fp8_gemm import fp8_schedule  # noqa: E402

DENSE = {"coop128x128": fp8_schedule("cooperative", 128, 128), "pingpong64x128": fp8_schedule("pingpong", 64, 128),
         "coop128x64": fp8_schedule("cooperative", 128, 64), "pingpong64x64": fp8_schedule("pingpong", 64, 64),
         "coop_1x2": fp8_schedule("cooperative", 128, 128, cluster_m=1, cluster_n=2),
         "nonpersistent": fp8_schedule("cooperative", 128, 128, cluster_m=1, persistent=False),
         # wide tiles (a tile spanning two B-scale blocks), cooperative and ping-pong
         "coop128x192": fp8_schedule("cooperative", 128, 192), "pingpong64x192": fp8_schedule("pingpong", 64, 192),
         "pingpong64x160": fp8_schedule("pingpong", 64, 160)}
CONTIGUOUS = {"coop_1x2": fp8_schedule(cluster_m=1, cluster_n=2), "coop_128x64": fp8_schedule(tile_n=64, cluster_m=1)}
MASKED = {"coop_2x1": fp8_schedule(), "pingpong64x128": fp8_schedule("pingpong", 64, 128),
          "pingpong64x64": fp8_schedule("pingpong", 64, 64)}


def _poison(nbytes):
    """Make the caching allocator hand the next allocation a block full of NaN: drop the cached
    blocks, then allocate and free one NaN block at least that large."""
    torch.cuda.empty_cache()
    torch.full((nbytes // 2 + 4096,), float("nan"), dtype=torch.bfloat16, device="cuda")
    torch.cuda.synchronize()


@pytest.mark.parametrize("sched", list(DENSE))
def test_dense_schedules(sched):
    m, n, k = 769, 2112, 1040  # partial M tile, N-block 17 half full, K tail of 16 in a 9th block
    a, sa, b, sb = fx.operands(m, n, k, device="cuda", seed=11)
    sa = tma_aligned_scales(sa)
    _poison(m * (n + 8) * 2)
    out = _fp8_gemm_cuda(a, sa, b, sb, schedule=DENSE[sched])
    fx.check(out, *fx.reference(a, sa, b, sb), sched)


@pytest.mark.parametrize("m,n,k", [(1, 200, 300), (130, 64, 16), (64, 320, 4100), (200, 1, 129)])
def test_dense_odd_shapes(m, n, k):
    a, sa, b, sb = fx.operands(m, n, k, device="cuda", seed=m + n + k)
    sa = tma_aligned_scales(sa)
    _poison(m * (n + 8) * 2)
    out = ck.fp8_gemm(a, sa, b, sb)
    fx.check(out, *fx.reference(a, sa, b, sb), f"{m}x{n}x{k}")


@pytest.mark.parametrize("sched", list(CONTIGUOUS))
def test_contiguous(sched):
    rows, n, k = [300, 0, 128, 1, 513], 320, 1040
    idx, _ = contiguous_layout(rows)
    idx = torch.cat([idx, torch.full((128,), -1, dtype=torch.int32)]).cuda()  # a whole padding tile
    e, m = len(rows), idx.numel()
    a, sa, _, _ = fx.operands(m, n, k, device="cuda", seed=5)
    _, _, b, sb = fx.operands(m, n, k, device="cuda", seed=6, batch=e)
    sa = tma_aligned_scales(sa)
    _poison(m * (n + 8) * 2)
    out = _contiguous_cuda(a, sa, b, sb, idx, torch.bfloat16, CONTIGUOUS[sched])
    for x in range(e):
        sel = (idx == x).nonzero().flatten()
        if sel.numel():
            fx.check(out[sel], *fx.reference(a[sel], sa[sel], b[x], sb[x]), f"{sched} expert {x}")


@pytest.mark.parametrize("sched", list(MASKED))
def test_masked(sched):
    masked_m, max_m, n, k = [0, 384, 1, 300, 65], 384, 320, 1040
    e = len(masked_m)
    a, sa, b, sb = fx.operands(max_m, n, k, device="cuda", seed=7, batch=e)
    sa = tma_aligned_scales(sa)
    mm = torch.tensor(masked_m, dtype=torch.int32, device="cuda")
    _poison(e * max_m * (n + 8) * 2)
    out = _masked_cuda(a, sa, b, sb, mm, None, torch.bfloat16, MASKED[sched])
    for x, rows in enumerate(masked_m):
        if rows:
            fx.check(out[x, :rows], *fx.reference(a[x, :rows], sa[x, :rows], b[x], sb[x]), f"{sched} expert {x}")
