"""GPU: the Hopper GEMM against an fp32 reference, at most 2x cuBLAS's bf16 error + 1e-4 (relative
Frobenius), for both schedules, all four operand majors, batched, odd shapes and the fused epilogue."""

import dataclasses

import pytest
import torch

from tests.helpers import randn, rel_err

pytestmark = pytest.mark.gpu

ck = pytest.importorskip("cute_kernels")
from cute_kernels.gemm.ops import _gemm_cuda  # noqa: E402
from schedules.gemm import GemmSchedule, default_schedule  # noqa: E402

SCHEDULES = {
    "cooperative": GemmSchedule(kind="cooperative", tile_m=128, tile_n=256, cluster_m=2),
    "pingpong": GemmSchedule(kind="pingpong", tile_m=128, tile_n=128, cluster_m=2),
    "pingpong_128x192": GemmSchedule(kind="pingpong", tile_m=128, tile_n=192, cluster_m=2),
    "coop_1x2": GemmSchedule(kind="cooperative", tile_m=128, tile_n=128, cluster_m=1, cluster_n=2),
    "nonpersistent": GemmSchedule(kind="cooperative", tile_m=128, tile_n=256, cluster_m=1, persistent=False),
}


def _operand(rows, cols, major, dtype, batch=None):
    """(batch,) rows x cols with unit stride on `major` ('row': last dim, 'col': first)."""
    shape = (batch, rows, cols) if batch else (rows, cols)
    if major == "row":
        return randn(*shape, dtype=dtype)
    return randn(*shape[:-2], cols, rows, dtype=dtype).transpose(-1, -2)


def _check(out, a, b, bias=None, activation=None, out_dtype=None, alpha=1.0, beta=0.0, c=None):
    """act(alpha * a @ b + beta * c + bias) against fp64, at most 2x cuBLAS's bf16 error + 1e-4."""
    ref = alpha * (a.double() @ b.double())
    cublas = alpha * (a @ b).double()
    if c is not None:
        ref = ref + beta * c.double()
        cublas = cublas + beta * c.double()
    if bias is not None:
        ref = ref + bias.double()
        cublas = cublas + bias.double()
    act = {None: lambda x: x, "relu": torch.relu, "gelu": torch.nn.functional.gelu,
           "silu": torch.nn.functional.silu}[activation]
    ref, cublas = act(ref), act(cublas)
    assert out.shape == ref.shape and out.dtype == (out_dtype or a.dtype)
    assert torch.isfinite(out).all(), "unwritten (NaN) or overflowed elements"
    bound = 2 * rel_err(cublas, ref) + 1e-4
    err = rel_err(out, ref)
    assert err <= bound, f"rel err {err:.2e} > {bound:.2e}"


def _poison_allocator(nbytes):
    """Leave NaNs in the caching allocator's free blocks so an unwritten output shows up."""
    torch.full((nbytes // 2 + 4096,), float("nan"), dtype=torch.bfloat16, device="cuda")
    torch.cuda.synchronize()


@pytest.mark.parametrize("sched", list(SCHEDULES))
@pytest.mark.parametrize("a_major,b_major", [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")])
def test_majors_and_schedules(sched, a_major, b_major):
    m, n, k = 769, 2112, 1032
    a = _operand(m, k, a_major, torch.bfloat16)
    b = _operand(k, n, b_major, torch.bfloat16)
    _poison_allocator(m * n * 2)
    _check(_gemm_cuda(a, b, schedule=SCHEDULES[sched]), a, b)


@pytest.mark.parametrize("m,n,k", [(1, 256, 64), (769, 2112, 16), (256, 128, 4096), (5125, 96, 200), (64, 4096, 4096),
                                   (2048, 2048, 2048)])
@pytest.mark.parametrize("sched", ["cooperative", "pingpong"])
def test_shapes(m, n, k, sched):
    a, b = randn(m, k), randn(k, n)
    _poison_allocator(m * n * 2)
    _check(_gemm_cuda(a, b, schedule=SCHEDULES[sched]), a, b)


@pytest.mark.parametrize("m,n,k", [(769, 2112, 7), (33, 17, 9), (128, 100, 64)])
def test_layouts_tma_cannot_read(m, n, k):
    """Odd K (row stride not 16-byte aligned) and N not a multiple of 8: copied / padded by the op."""
    a, b = randn(m, k), randn(k, n)
    _check(ck.gemm(a, b), a, b)


def test_default_schedule_and_fp16():
    a, b = randn(1000, 1024, dtype=torch.float16), randn(1024, 3000, dtype=torch.float16)
    _check(ck.gemm(a, b), a, b)


@pytest.mark.parametrize("sched", ["cooperative", "pingpong", "pingpong_128x192"])
def test_batched(sched):
    a, b = randn(3, 300, 256), _operand(256, 520, "col", torch.bfloat16, batch=3)
    out = _gemm_cuda(a, b, schedule=SCHEDULES[sched])
    for i in range(3):
        _check(out[i], a[i], b[i])


def test_broadcast_batch():
    a, b = randn(4, 100, 128), randn(128, 64)
    out = ck.gemm(a, b)
    assert out.shape == (4, 100, 64)
    _check(out.reshape(400, 64), a.reshape(400, 128), b)
    a2, b2 = randn(100, 128), randn(2, 128, 64)
    out2 = ck.gemm(a2, b2)
    for i in range(2):
        _check(out2[i], a2, b2[i])


@pytest.mark.parametrize("activation", [None, "relu", "gelu", "silu"])
@pytest.mark.parametrize("sched", ["cooperative", "pingpong", "pingpong_128x192"])
def test_fused_bias_activation(activation, sched):
    m, n, k = 777, 1000, 512
    a, b, bias = randn(m, k), randn(k, n), randn(n)
    out = _gemm_cuda(a, b, bias, activation, schedule=SCHEDULES[sched])
    _check(out, a, b, bias, activation)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("sched", list(SCHEDULES))
def test_out_dtype(sched, out_dtype):
    """bf16 operands, an fp32 / fp16 output (the epilogue's conversion and, for fp32, its wider smem tile: 4
    stages still fit at ping-pong 128x192), with the bias and an activation, N not a multiple of the tile."""
    m, n, k = 700, 1000, 320
    a, b, bias = randn(m, k), randn(k, n), randn(n)
    _poison_allocator(m * n * 4)
    out = _gemm_cuda(a, b, bias, "silu", out_dtype=out_dtype, schedule=SCHEDULES[sched])
    _check(out, a, b, bias, "silu", out_dtype=out_dtype)


def test_default_schedule_pingpong_128x192():
    """The model's ping-pong 128x192 pick (8192^3: session 14) through the op's default path, odd edges."""
    from schedules.gemm import default_schedule

    assert (default_schedule(8192, 8192, 8192).kind, default_schedule(8192, 8192, 8192).tile_n) == ("pingpong", 192)
    m, n, k = 1000, 3000, 1024
    assert default_schedule(m, n, k).tile_n == 192
    a, b = randn(m, k), randn(k, n)
    _poison_allocator(m * n * 2)
    _check(ck.gemm(a, b), a, b)


def test_k_zero_and_empty():
    a, b, bias = randn(5, 0), randn(0, 7), randn(7)
    torch.testing.assert_close(ck.gemm(a, b, bias, "relu"), torch.relu(bias).expand(5, 7))
    assert ck.gemm(randn(0, 16), randn(16, 8)).shape == (0, 8)


def test_autograd():
    a = randn(130, 96).requires_grad_()
    b = randn(96, 72).requires_grad_()
    bias = randn(72).requires_grad_()
    out = ck.gemm(a, b, bias, "gelu")
    g = randn(*out.shape)
    out.backward(g)
    a2, b2, bias2 = (t.detach().float().requires_grad_() for t in (a, b, bias))
    torch.nn.functional.gelu(a2 @ b2 + bias2).backward(g.float())
    for ours, ref in ((a.grad, a2.grad), (b.grad, b2.grad), (bias.grad, bias2.grad)):
        assert rel_err(ours, ref) < 2e-2


def test_torch_compile_fullgraph():
    a, b = randn(256, 128), randn(128, 192)

    @torch.compile(fullgraph=True)
    def f(x, y):
        return ck.gemm(x, y, activation="relu") * 2

    _check(f(a, b) / 2, a, b, activation="relu")


def test_errors():
    a = randn(16, 32)
    with pytest.raises(ValueError, match="inner dims"):
        ck.gemm(a, randn(16, 8))
    with pytest.raises(TypeError, match="b has dtype"):
        ck.gemm(a, randn(32, 8, dtype=torch.float32))
    with pytest.raises(ValueError, match="activation"):
        ck.gemm(a, randn(32, 8), activation="tanh")
    with pytest.raises(ValueError, match="bias"):
        ck.gemm(a, randn(32, 8), bias=randn(9))


@pytest.mark.parametrize("rung", ["smem", "register"])
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (769, 130, 77), (256, 256, 512)])
def test_simt_ladder(rung, m, n, k):
    from cute_kernels.gemm.ops import gemm_ladder

    a, b = randn(m, k), randn(k, n).t().contiguous().t()  # b column-major: copied by the op
    _poison_allocator(m * n * 2)
    _check(gemm_ladder(a, b, rung), a, b)


# --- split-K (schedule.split_k > 1): fp32 partials + a deterministic summing pass ---------------
SPLIT = {
    "pp64x64_k2": GemmSchedule(kind="pingpong", tile_m=64, tile_n=64, cluster_m=1, cluster_n=2, split_k=2),
    "pp64x128_k3": GemmSchedule(kind="pingpong", tile_m=64, tile_n=128, cluster_m=2, split_k=3),
    "coop128x128_k4": GemmSchedule(kind="cooperative", tile_m=128, tile_n=128, cluster_m=1, split_k=4),
}


@pytest.mark.parametrize("sched", list(SPLIT))
@pytest.mark.parametrize("m,n,k", [(64, 4096, 4096), (128, 7168, 2048), (96, 1000, 1000), (200, 100, 200),
                                   (1, 256, 4160), (769, 520, 777)])
def test_split_k_shapes(sched, m, n, k):
    """K not a multiple of splits x tile_k (1000, 200, 4160, 777: uneven ranges), N not a multiple of 8
    (100: padded output), M = 1 and M not a multiple of the tile."""
    a, b = randn(m, k), randn(k, n)
    _poison_allocator(m * n * 4 * 4)  # poisons the workspace's future blocks too
    _check(_gemm_cuda(a, b, schedule=SPLIT[sched]), a, b)


def test_split_k_default_schedule():
    from schedules.gemm import default_schedule

    assert default_schedule(64, 1024, 16384).split_k > 1
    a, b = randn(64, 16384), randn(16384, 1024)
    _check(ck.gemm(a, b), a, b)


def test_split_k_clamped_to_k_blocks():
    """K = 16 is one K-block: split_k = 4 runs as one split (no empty units), also K = 100 (2 blocks)."""
    from schedules.gemm import clamp_splits as _clamp_split

    s = SPLIT["coop128x128_k4"]
    assert _clamp_split(s, 16).split_k == 1 and _clamp_split(s, 100).split_k == 2
    for k in (16, 100):
        a, b = randn(300, k), randn(k, 512)
        _check(_gemm_cuda(a, b, schedule=s), a, b)


@pytest.mark.parametrize("activation", [None, "relu", "gelu", "silu"])
@pytest.mark.parametrize("sched", ["pp64x64_k2", "coop128x128_k4"])
def test_split_k_bias_activation(activation, sched):
    m, n, k = 130, 1000, 2048
    a, b, bias = randn(m, k), randn(k, n), randn(n)
    _check(_gemm_cuda(a, b, bias, activation, schedule=SPLIT[sched]), a, b, bias, activation)


def test_split_k_batched_majors_fp16():
    a = _operand(64, 1024, "col", torch.float16, batch=3)
    b = _operand(1024, 200, "col", torch.float16, batch=3)
    out = _gemm_cuda(a, b, schedule=SPLIT["pp64x128_k3"])
    for i in range(3):
        _check(out[i], a[i], b[i])


@pytest.mark.parametrize("sched", list(SPLIT))
def test_split_k_is_deterministic(sched):
    """No atomics: the partials are summed in split order, so two runs agree bit for bit."""
    a, b, bias = randn(128, 7168 // 2), randn(7168 // 2, 2048), randn(2048)
    first = _gemm_cuda(a, b, bias, "gelu", schedule=SPLIT[sched])
    for _ in range(3):
        _poison_allocator(128 * 2048 * 4 * 4)
        again = _gemm_cuda(a, b, bias, "gelu", schedule=SPLIT[sched])
        assert torch.equal(first.view(torch.int16), again.view(torch.int16))


# --- split-K in one launch (schedule.split_fixup): the last split of a tile sums and stores it -----------
@pytest.mark.parametrize("sched", list(SPLIT))
@pytest.mark.parametrize("m,n,k", [(64, 4096, 4096), (96, 1000, 1000), (1, 256, 4160), (769, 520, 777)])
def test_split_fixup_bitwise(sched, m, n, k):
    """Bitwise the two-launch split-K (the same partials summed in the same split order), outputs
    poisoned; launched twice (the arrival flags are left at zero for the next launch)."""
    s = SPLIT[sched]
    f = dataclasses.replace(s, split_fixup=True)
    a, b = randn(m, k), randn(k, n)
    _poison_allocator(m * n * 4 * 4)
    ref = _gemm_cuda(a, b, schedule=s)
    for _ in range(2):
        out = _gemm_cuda(a, b, schedule=f)
        assert torch.equal(out, ref)
    _check(out, a, b)


def test_split_fixup_fused_batched_and_streams():
    """Bias + activation through the last split's epilogue, a batch of 3, and two streams (one flag
    buffer each)."""
    s = dataclasses.replace(SPLIT["pp64x128_k3"], split_fixup=True)
    a, b = randn(3, 100, 2000), randn(3, 2000, 300)
    bias = randn(300)
    ref = _gemm_cuda(a, b, bias, "gelu", schedule=dataclasses.replace(s, split_fixup=False))
    assert torch.equal(_gemm_cuda(a, b, bias, "gelu", schedule=s), ref)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        out2 = _gemm_cuda(a, b, bias, "gelu", schedule=s)
    out1 = _gemm_cuda(a, b, bias, "gelu", schedule=s)
    torch.cuda.synchronize()
    assert torch.equal(out1, ref) and torch.equal(out2, ref)


@pytest.mark.parametrize("sched", list(SCHEDULES))
def test_alpha_beta_c(sched):
    """The epilogue's alpha * acc + beta * C (issue 4's fused epilogue), with the bias and GELU, C transposed
    (strided), N and M not multiples of the tile."""
    m, n, k = 769, 1000, 520
    a, b, bias = randn(m, k), randn(k, n), randn(n)
    c = randn(n, m).t()  # (m, n), column-major
    _poison_allocator(m * n * 2)
    out = _gemm_cuda(a, b, bias, "gelu", schedule=SCHEDULES[sched], alpha=0.5, beta=-1.5, c=c)
    _check(out, a, b, bias, "gelu", alpha=0.5, beta=-1.5, c=c)


def test_alpha_beta_c_batched_fp32_and_split():
    """Batched (a folded into one GEMM, and a batched b), an fp32 output with an fp32 C, alpha alone on a
    split-K schedule (the summing pass scales), and C on a split-K schedule (run unsplit: the split epilogues
    do not read C); K = 0 (act(beta * C + bias) without a launch)."""
    a, b, c = randn(3, 200, 256), randn(256, 136), randn(3, 200, 136)
    _check(_gemm_cuda(a, b, alpha=2.0, beta=0.25, c=c).reshape(600, 136), a.reshape(600, 256), b, alpha=2.0,
           beta=0.25, c=c.reshape(600, 136))
    b3 = randn(3, 256, 136)
    out = _gemm_cuda(a, b3, alpha=1.0, beta=1.0, c=c)
    for i in range(3):
        _check(out[i], a[i], b3[i], alpha=1.0, beta=1.0, c=c[i])
    a2, b2 = randn(300, 512), randn(512, 264)
    c32 = randn(300, 264, dtype=torch.float32)
    out = _gemm_cuda(a2, b2, out_dtype=torch.float32, alpha=0.75, beta=2.0, c=c32)
    _check(out, a2, b2, out_dtype=torch.float32, alpha=0.75, beta=2.0, c=c32)
    a3, b3s, c3 = randn(64, 4096), randn(4096, 1024), randn(64, 1024)
    for s in (SPLIT["pp64x64_k2"], dataclasses.replace(SPLIT["pp64x64_k2"], split_fixup=True)):
        _check(_gemm_cuda(a3, b3s, schedule=s, alpha=3.0), a3, b3s, alpha=3.0)
        _check(_gemm_cuda(a3, b3s, schedule=s, alpha=3.0, beta=0.5, c=c3), a3, b3s, alpha=3.0, beta=0.5, c=c3)
    bias0, c0 = randn(7), randn(5, 7)
    k0 = _gemm_cuda(randn(5, 0), randn(0, 7), bias0, "relu", beta=2.0, c=c0)
    torch.testing.assert_close(k0, torch.relu(2.0 * c0.float() + bias0.float()).to(k0.dtype))
    with pytest.raises(ValueError, match="c must have the output's shape"):
        _gemm_cuda(a2, b2, beta=1.0, c=randn(300, 263))


@pytest.mark.parametrize("m,n,k", [(64, 4096, 4096), (100, 1000, 1032), (1, 256, 64)])
def test_deep_ring_bitwise(m, n, k):
    """12 A/B stages of the small-M 64x64 ping-pong tile (`num_stages` stops at 8; the small-M default since
    session 15, `schedules.gemm.deepened`): the same WGMMAs in the same K order, so bitwise the 8-stage output."""
    s = GemmSchedule(kind="pingpong", tile_m=64, tile_n=64, cluster_m=1, cluster_n=1)
    a, b = randn(m, k), randn(k, n)
    _poison_allocator(m * n * 2)
    out = _gemm_cuda(a, b, schedule=dataclasses.replace(s, stages=12))
    assert out.equal(_gemm_cuda(a, b, schedule=s))
    _check(out, a, b)


def test_deep_default_ring_outputs():
    """The small-M default with its deep ring (`schedules.gemm.deepened`: 12 stages at 64x4096): bf16 output, fp32
    output (12 stages do not fit beside fp32 buffers: the op runs the automatic depth), alpha / beta * C, bias."""
    m, n, k = 64, 4096, 1024
    assert default_schedule(m, n, k).stages > 8
    a, b, bias = randn(m, k), randn(k, n), randn(n)
    _poison_allocator(m * n * 4)
    _check(_gemm_cuda(a, b, bias, "silu"), a, b, bias, "silu")
    _check(_gemm_cuda(a, b, out_dtype=torch.float32), a, b, out_dtype=torch.float32)
    c = randn(m, n)
    _check(_gemm_cuda(a, b, alpha=0.5, beta=2.0, c=c), a, b, alpha=0.5, beta=2.0, c=c)


@pytest.mark.parametrize("m,n,k", [(64, 4096, 1024), (37, 2048, 4096), (128, 2112, 4096), (48, 130, 64)])
def test_narrowed_default(m, n, k):
    """Small grids narrow the 64x64 ping-pong tile to 64x32 while the grid stays one wave (`schedules.gemm.narrowed`,
    session 16), with its deepest ring: correct, every element written, bitwise the same tile at the automatic depth;
    bias + activation and fp32 output (which falls back to the automatic depth) too."""
    d = default_schedule(m, n, k)
    assert (d.tile_m, d.tile_n) == (64, 32) and d.stages > 8, d
    a, b, bias = randn(m, k), randn(k, n), randn(n)
    _poison_allocator(m * n * 4)
    out = _gemm_cuda(a, b)
    _check(out, a, b)
    assert out.equal(_gemm_cuda(a, b, schedule=dataclasses.replace(d, stages=0)))
    _check(_gemm_cuda(a, b, bias, "gelu"), a, b, bias, "gelu")
    _check(_gemm_cuda(a, b, out_dtype=torch.float32), a, b, out_dtype=torch.float32)
