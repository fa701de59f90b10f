"""GPU: `gemm_swiglu` (SwiGLU in the GEMM's epilogue over interleaved gate / up columns) against fp64
silu(a @ gate) * (a @ up), at most 2x the error of the same computation in bf16 torch (cuBLAS products rounded to
bf16, then the activation) + 1e-4: every schedule kind with the gated epilogue, the small-M schedule of a decode
step, sizes off the tile, operand majors, a batch, split-K run unsplit, the fallback for a tile that cannot gate,
poisoned outputs, autograd and torch.compile."""

import pytest
import torch

from tests.helpers import poison_empty, randn, rel_err

pytestmark = pytest.mark.gpu

ck = pytest.importorskip("cute_kernels")
from cute_kernels.gemm.ops import _gemm_cuda, pack_gate_up  # noqa: E402
from schedules.gemm import GemmSchedule  # noqa: E402

SCHEDULES = {
    "default": None,
    "cooperative": GemmSchedule(kind="cooperative", tile_m=128, tile_n=256, cluster_m=2),
    "cooperative_wg_epilogue": GemmSchedule(kind="cooperative", tile_m=128, tile_n=256, cluster_m=2, wg_epilogue=True),
    "pingpong_128x192": GemmSchedule(kind="pingpong", tile_m=128, tile_n=192, cluster_m=2),
    "pingpong_64x128_a16": GemmSchedule(kind="pingpong", tile_m=64, tile_n=128, cluster_n=2, a_rows=16),
    "split_k (run unsplit)": GemmSchedule(kind="cooperative", tile_m=128, tile_n=128, split_k=3),
    "tile_n 96 (falls back)": GemmSchedule(kind="pingpong", tile_m=64, tile_n=96),
}


def _weights(k, i, seed=0):
    wg, wu = randn(i, k, seed=seed) * k ** -0.5, randn(i, k, seed=seed + 1) * k ** -0.5
    return wg, wu, pack_gate_up(wg, wu)


def _check(out, a, wg, wu):
    ref = torch.nn.functional.silu(a.double() @ wg.double().t()) * (a.double() @ wu.double().t())
    same_bf16 = (torch.nn.functional.silu((a @ wg.t()).float()) * (a @ wu.t()).float()).to(a.dtype)
    assert out.shape == ref.shape and out.dtype == a.dtype
    assert torch.isfinite(out).all(), "unwritten (NaN) or overflowed elements"
    bound = 2 * rel_err(same_bf16, ref) + 1e-4
    err = rel_err(out, ref)
    assert err <= bound, f"rel err {err:.2e} > {bound:.2e}"


@pytest.mark.parametrize("sched", list(SCHEDULES))
@pytest.mark.parametrize("m,k,i", [(769, 1032, 1056), (1, 4096, 2048), (16, 2048, 5632), (2048, 1024, 2816)])
def test_against_fp64(monkeypatch, sched, m, k, i):
    if SCHEDULES[sched] is not None and SCHEDULES[sched].a_rows and m > SCHEDULES[sched].a_rows:
        pytest.skip("the short A box is a schedule for M <= a_rows")
    poison_empty(monkeypatch)
    a = randn(m, k, seed=m + k)
    wg, wu, w = _weights(k, i)
    _check(_gemm_cuda(a, w.t(), activation="swiglu", schedule=SCHEDULES[sched]), a, wg, wu)


@pytest.mark.parametrize("a_major", ["row", "col"])
@pytest.mark.parametrize("b_major", ["row", "col"])
def test_majors(monkeypatch, a_major, b_major):
    poison_empty(monkeypatch)
    m, k, i = 300, 512, 384
    a = randn(m, k, seed=3) if a_major == "row" else randn(k, m, seed=3).t()
    wg, wu, w = _weights(k, i)
    b = w.t() if b_major == "col" else w.t().contiguous()
    _check(ck.gemm_swiglu(a, b), a, wg, wu)


def test_batched_and_edges():
    k, i = 256, 128
    wg, wu, w = _weights(k, i)
    a = randn(3, 70, k, seed=4)
    out = ck.gemm_swiglu(a, w.t())
    _check(out.reshape(-1, i), a.reshape(-1, k), wg, wu)
    assert ck.gemm_swiglu(randn(0, k), w.t()).shape == (0, i)
    z = ck.gemm_swiglu(randn(5, 0), torch.empty(0, 2 * i, dtype=torch.bfloat16, device="cuda"))
    assert z.shape == (5, i) and not z.any()


def test_bad_inputs_named():
    k, i = 64, 20
    with pytest.raises(ValueError, match="multiple of 16"):
        ck.gemm_swiglu(randn(4, k), randn(k, 2 * i))
    with pytest.raises(ValueError, match="inner dims"):
        ck.gemm_swiglu(randn(4, k + 1), randn(k, 32))
    with pytest.raises(ValueError, match="one shape"):
        pack_gate_up(randn(16, k), randn(8, k))


def test_autograd_and_compile():
    m, k, i = 96, 256, 128
    wg, wu, w = _weights(k, i)
    a = randn(m, k, seed=5).requires_grad_()
    b = w.t().detach().clone().requires_grad_()
    g = randn(m, i, seed=6)
    ck.gemm_swiglu(a, b).backward(g)
    a32, b32 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    y = a32 @ b32
    v = y.reshape(m, i // 8, 2, 8)
    ref = torch.nn.functional.silu(v[:, :, 0]) * v[:, :, 1]
    ref.reshape(m, i).backward(g.double())
    assert rel_err(a.grad, a32.grad) < 2e-2 and rel_err(b.grad, b32.grad) < 2e-2
    f = torch.compile(lambda x: ck.gemm_swiglu(x, w.t()), fullgraph=True)
    x = randn(m, k, seed=7)
    torch.testing.assert_close(f(x), ck.gemm_swiglu(x, w.t()), rtol=0, atol=0)
