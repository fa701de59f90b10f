"""GPU: GEMV against fp64 references at dtype-aware bounds, poisoned outputs, edge shapes (0/1 rows, 769, 5125),
x's layouts and determinism, the register tiles of unaligned and strided inputs."""

import pytest
import torch

from tests.helpers import EPS, poison_empty, randn, rel_err

pytestmark = pytest.mark.gpu


DTYPES = [torch.bfloat16, torch.float16, torch.float32]


# --- GEMV ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k,cols", [(1, 1, 0), (1, 4096, 1), (769, 5125, 3), (4096, 4096, 8), (3, 16384, 0),
                                      (5125, 64, 8), (769, 5125, 0), (769, 5125, 5), (5125, 4097, 4),
                                      (1, 333, 8), (1023, 4099, 2), (5, 77, 7), (4099, 1000, 6)])
def test_gemv(dtype, n, k, cols):
    import cute_kernels as ck

    w = randn(n, k, dtype=dtype)
    x = randn(k, dtype=dtype) if cols == 0 else randn(cols, k, dtype=dtype).t()
    y = ck.gemv(w, x)
    ref = w.double() @ x.double()
    bound = EPS[dtype] * ref.abs() + 4 * k**0.5 * 2.0**-24 * (w.double().abs() @ x.double().abs()) + 1e-30
    assert y.shape == ref.shape and y.dtype == dtype
    assert not torch.isnan(y).any()
    assert ((y.double() - ref).abs() <= bound).all()


def test_gemv_layouts_and_determinism():
    import cute_kernels as ck

    w = randn(1000, 4100, dtype=torch.bfloat16)
    x = randn(4100, 5, dtype=torch.bfloat16)  # row-major (K, B): transposed into a buffer first
    ref = w.double() @ x.double()
    y = ck.gemv(w, x)
    assert ((y.double() - ref).abs() <= 2**-8 * ref.abs() + 1e-3 * ref.abs().max()).all()
    ws = randn(1000, 8192, dtype=torch.bfloat16)[:, 100:4200]  # row stride 8192, misaligned base
    y2 = ck.gemv(ws, x)
    ref2 = ws.double() @ x.double()
    assert ((y2.double() - ref2).abs() <= 2**-8 * ref2.abs() + 1e-3 * ref2.abs().max()).all()
    for _ in range(3):
        assert torch.equal(ck.gemv(w, x), y)
    assert ck.gemv(randn(0, 16), randn(16)).shape == (0,)


@pytest.mark.parametrize("cols", [1, 2, 3, 4, 5, 8])
def test_gemv_row_blocks_unaligned_and_strided(cols):
    """Every register-tile size (R = 1, 2, 4 rows per thread) on: N not a multiple of the tile
    (769, 5125) or below it (1, 5), odd K (the scalar tail), x whose columns are misaligned (the
    unvectorized path) or strided along K (copied first), and a W slice with a row stride."""
    import cute_kernels as ck

    def check(w, x):
        y = ck.gemv(w, x)
        ref = w.double() @ x.double()
        bound = EPS[w.dtype] * ref.abs() + 4 * w.shape[1] ** 0.5 * 2.0**-24 * (w.double().abs() @ x.double().abs())
        assert y.shape == ref.shape and not torch.isnan(y).any()
        assert ((y.double() - ref).abs() <= bound + 1e-30).all(), (tuple(w.shape), x.stride())
        assert torch.equal(ck.gemv(w, x), y)  # deterministic
        return y

    for n, k in [(769, 4097), (5125, 1031), (1, 4096), (5, 9)]:
        w = randn(n, k, dtype=torch.bfloat16)
        check(w, randn(cols, k, dtype=torch.bfloat16).t())  # aligned, contiguous columns
        check(w, randn(cols, k + 3, dtype=torch.bfloat16)[:, 1:k + 1].t())  # misaligned columns: vec = 1
        check(w, randn(cols, 2 * k, dtype=torch.bfloat16)[:, ::2].t())  # strided along K: copied
    check(randn(769, 8192, dtype=torch.float16)[:, 8:4104], randn(cols, 4096, dtype=torch.float16).t())
    check(randn(1000, 4100, dtype=torch.float32), randn(cols, 4100, dtype=torch.float32).t())
    assert (ck.gemv(torch.empty(4, 0, device="cuda"), torch.empty(0, device="cuda")) == 0).all()


@pytest.mark.parametrize("m", [1, 2, 5, 8, 9, 16])
def test_stream_skinny_gemm(m, monkeypatch):
    """The streaming kernel's dense mode: y = x W^T against fp32 at split counts 1 to 8, K off the 256-k stage, every
    output written; deterministic; and `gemm` routes x @ W.t() to it with STREAM on."""
    import cute_kernels as ck
    from cute_kernels.gemv import ops as gv

    poison_empty(monkeypatch)
    for n, k in ((1000, 4096), (6144, 1032), (4096, 14336 + 8), (28672, 512)):
        x, w = randn(m, k), randn(n, k)
        assert gv.stream_ok(x, w)
        y = gv.skinny(x, w)
        ref = x.float() @ w.float().t()
        assert torch.isfinite(y).all() and rel_err(y, ref) < 8e-3, (n, k)
        assert torch.equal(y, gv.skinny(x, w))
    monkeypatch.setattr(gv, "STREAM", True)
    x, w = randn(m, 4096), randn(6144, 4096)
    assert torch.equal(ck.gemm(x, w.t()), gv.skinny(x, w))


@pytest.mark.parametrize("m", [1, 5, 16])
def test_stream_gated_and_source(m, monkeypatch):
    """The dense streaming kernel's epilogue options: gated over a pack_gate_up weight (silu(gate) * up from the fp32
    sums) and a source c (y = alpha x W^T + beta c), unsplit and split K, every output written."""
    from cute_kernels.gemm.ops import pack_gate_up
    from cute_kernels.gemv import ops as gv

    poison_empty(monkeypatch)
    for n, k in ((28672, 4096), (4096, 14336), (1040, 512)):
        x = randn(m, k)
        wg, wu = randn(n // 2, k) * k ** -0.5, randn(n // 2, k) * k ** -0.5
        y = gv.skinny(x, pack_gate_up(wg, wu), gated=True)
        ref = torch.nn.functional.silu(x.float() @ wg.float().t()) * (x.float() @ wu.float().t())
        assert y.shape == (m, n // 2) and torch.isfinite(y).all() and rel_err(y, ref) < 8e-3, (n, k)
        w, c = randn(n, k) * k ** -0.5, randn(m, n)
        y = gv.skinny(x, w, c=c, alpha=0.5, beta=2.0)
        assert torch.isfinite(y).all() and rel_err(y, 0.5 * x.float() @ w.float().t() + 2.0 * c.float()) < 8e-3
