"""GPU: the bf16 GEMM's pipeline options (docs/kernels/gemm.md, "How it got here": the pipeline options): `wg_epilogue`
(each cooperative consumer warpgroup stores its own rows), 2x2 clusters (A and B multicast, the grid
capped by the co-resident 4-CTA clusters), `epi_stages=2` (a 5th stage at 128x192) and their
combinations. Each computes every output element with the same WGMMAs in the same K order as the
schedule it varies: bitwise equal to it, and within the fp64 reference's bound with poisoned outputs."""

import dataclasses

import pytest
import torch

from tests.gemm.test_gemm_gpu import _check, _operand, _poison_allocator
from tests.helpers import randn

pytestmark = pytest.mark.gpu

ck = pytest.importorskip("cute_kernels")
from cute_kernels.gemm.ops import _gemm_cuda  # noqa: E402
from schedules.gemm import GemmSchedule, default_schedule, pipeline_variants  # noqa: E402
from schedules.hardware import max_active_clusters, num_sms  # noqa: E402

BASE = GemmSchedule()  # cooperative 128x256, 2x1
W192 = GemmSchedule(tile_n=192)
VARIANTS = {  # name: (variant, the schedule it must equal bit for bit)
    "wg_epilogue": (dataclasses.replace(BASE, wg_epilogue=True), BASE),
    "c2x2": (dataclasses.replace(BASE, cluster_n=2), BASE),
    "c2x2_wg_epilogue": (dataclasses.replace(BASE, cluster_n=2, wg_epilogue=True), BASE),
    "c2x2_nonpersistent": (dataclasses.replace(BASE, cluster_n=2, persistent=False), BASE),
    "w192_5_stages": (dataclasses.replace(W192, epi_stages=2), W192),
    "w192_wg_epilogue": (dataclasses.replace(W192, wg_epilogue=True), W192),
    "w192_wg_epilogue_e2": (dataclasses.replace(W192, wg_epilogue=True, epi_stages=2), W192),
    "coop128_wg_epilogue_1x2": (GemmSchedule(tile_n=128, cluster_m=1, cluster_n=2, wg_epilogue=True),
                                GemmSchedule(tile_n=128, cluster_m=1, cluster_n=2)),
    "pingpong_c2x2": (GemmSchedule(kind="pingpong", tile_m=64, tile_n=128, cluster_n=2),
                      GemmSchedule(kind="pingpong", tile_m=64, tile_n=128)),
}
ODD = [(1, 256, 64), (769, 2112, 16), (5125, 96, 200), (33, 17, 9), (200, 300, 1032), (2048, 2048, 2048)]


def _run(a, b, sched, **kw):
    _poison_allocator(a.shape[-2] * b.shape[-1] * 2 * (a.shape[0] if a.dim() == 3 else 1))
    out = _gemm_cuda(a, b, schedule=sched, **kw)
    _check(out, a, b, kw.get("bias"), kw.get("activation"))
    return out


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("a_major,b_major", [("row", "row"), ("col", "col")])
def test_variants_equal_their_base(name, a_major, b_major):
    """769 x 2112 x 1032: partial M and N tiles (cluster CTAs past M and N), a partial K-block."""
    var, base = VARIANTS[name]
    a = _operand(769, 1032, a_major, torch.bfloat16)
    b = _operand(1032, 2112, b_major, torch.bfloat16)
    out = _run(a, b, var)
    assert torch.equal(out, _gemm_cuda(a, b, schedule=base))


@pytest.mark.parametrize("m,n,k", ODD)
@pytest.mark.parametrize("name", ["wg_epilogue", "c2x2_wg_epilogue", "w192_5_stages"])
def test_variants_odd_shapes(name, m, n, k):
    """M = 1 (a whole cluster row past M), N = 17 / 96 (cluster columns past N), K = 9 / 16 / 200."""
    var, base = VARIANTS[name]
    a, b = randn(m, k), randn(k, n)
    out = _run(a, b, var)
    assert torch.equal(out, _gemm_cuda(a, b, schedule=base))


@pytest.mark.parametrize("activation", ["gelu", "silu"])
@pytest.mark.parametrize("name", ["wg_epilogue", "c2x2_wg_epilogue"])
def test_fused_epilogue_and_batches(name, activation):
    """bias + activation on each warpgroup's rows; a batch of 3 (the walk's third mode) in fp16."""
    var, base = VARIANTS[name]
    a, b = randn(3, 300, 520), randn(520, 1000)
    bias = randn(1000)
    out = _run(a, b, var, bias=bias, activation=activation)
    assert torch.equal(out, _gemm_cuda(a, b, bias, activation, schedule=base))
    a16, b16 = randn(3, 300, 520, dtype=torch.float16), randn(3, 520, 1000, dtype=torch.float16)
    assert torch.equal(_gemm_cuda(a16, b16, schedule=var), _gemm_cuda(a16, b16, schedule=base))


@pytest.mark.parametrize("m,n,k", [(4096, 4096, 4096), (4096, 2112, 7168), (128, 7168, 2048)])
def test_bench_columns(m, n, k):
    """The bench's option columns at its shapes, each bitwise equal to the default."""
    a, b = randn(m, k), randn(k, n)
    out = ck.gemm(a, b)
    _check(out, a, b)
    variants = pipeline_variants(default_schedule(m, n, k), m, n)
    assert variants
    for name, sched in variants.items():
        assert torch.equal(_run(a, b, sched), out), name


def test_cluster_occupancy():
    """The 2x2 grid cap: the occupancy API's co-resident 4-CTA clusters (H200: 32 expected)."""
    four = max_active_clusters(4)
    print(f"max active clusters: size 4 {four}, size 2 {max_active_clusters(2)}, sms {num_sms()}")
    assert 1 <= four <= num_sms() // 4
