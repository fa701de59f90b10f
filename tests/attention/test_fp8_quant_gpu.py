"""GPU: FP8 attention's quantization side against its torch references (`cute_kernels.attention.fp8_reference`).
`ck.hadamard` bitwise equal to `hadamard_reference` (the same fp32 operations in the same order) for every dtype and
D, with and without signs (float and int8), leading dims, strided and unaligned inputs, and its gradient;
`ck.quantize_attention_fp8` bitwise equal (e4m3 bytes and scales) to `quantize_attention_fp8_reference` run on the
GPU and on the CPU, both granularities, with and without the rotation, edge lengths (1, 127, 129, 1000), GQA,
strided (packed QKV, heads-first transposed) and unaligned inputs, NaN-poisoned outputs, torch.compile and CUDA-graph
capture; end to end, the emulated FP8 forward on the kernels' operands meets the accuracy study's bound."""

import pytest
import torch

from tests.helpers import poison_empty, randn

pytestmark = pytest.mark.gpu

ck = pytest.importorskip("cute_kernels")
from cute_kernels.attention import fp8_reference as R  # noqa: E402
from tests.quantize.test_quantize_gpu import _same  # noqa: E402  (equal bits, NaN matching NaN)


def _signs(d, kind):
    s = R.default_signs(d, "cuda")
    return {"none": None, "fp32": s, "bf16": s.bfloat16(), "int8": s.to(torch.int8)}[kind]


# --- hadamard ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("d", R.HADAMARD_DIMS)
@pytest.mark.parametrize("signs", ["none", "fp32", "int8"])
def test_hadamard_bitwise(dtype, d, signs):
    x = randn(3, 333, d, dtype=dtype) * 4
    s = _signs(d, signs)
    y = ck.hadamard(x, s)
    assert y.shape == x.shape and y.dtype == dtype and y.is_contiguous()
    _same(y, R.hadamard_reference(x, s))
    _same(y, R.hadamard_reference(x.cpu(), None if s is None else s.cpu()))


@pytest.mark.parametrize("rows", [1, 2, 31, 4097])
def test_hadamard_rows_and_layouts(rows):
    d = 128
    s = _signs(d, "bf16")
    x = randn(rows, d)
    _same(ck.hadamard(x, s), R.hadamard_reference(x, s))
    wide = randn(rows, 3 * d)
    _same(ck.hadamard(wide[:, d:2 * d], s), R.hadamard_reference(wide[:, d:2 * d], s))  # row-strided, in place
    flat = randn(rows * d + 1)
    odd = flat[1:].view(rows, d)  # base not 16-byte aligned: copied first
    _same(ck.hadamard(odd, s), R.hadamard_reference(odd, s))
    heads_first = randn(2, 4, rows, d).transpose(1, 2)  # leading dims that do not collapse: copied first
    _same(ck.hadamard(heads_first, s), R.hadamard_reference(heads_first, s))


def test_hadamard_is_its_own_inverse_and_differentiable():
    x = randn(64, 256, dtype=torch.float32)
    torch.testing.assert_close(ck.hadamard(ck.hadamard(x)), x, rtol=0, atol=1e-5)
    s = _signs(256, "fp32")
    xg = x.clone().requires_grad_()
    dy = randn(64, 256, dtype=torch.float32)
    ck.hadamard(xg, s).backward(dy)
    xr = x.clone().requires_grad_()
    R.hadamard_fp32(xr, s).backward(dy)
    torch.testing.assert_close(xg.grad, xr.grad, rtol=0, atol=1e-5)


def test_hadamard_poisoned_output(monkeypatch):
    x = randn(1000, 64)
    poison_empty(monkeypatch)
    y = ck.hadamard(x, _signs(64, "fp32"))
    assert torch.isfinite(y).all()
    _same(y, R.hadamard_reference(x, _signs(64, "fp32")))


# --- quantize_attention_fp8 --------------------------------------------------------------------------------------------
def _check(q, k, v, granularity, hadamard, signs=None):
    out = ck.quantize_attention_fp8(q, k, v, granularity, hadamard, signs)
    torch.cuda.synchronize()
    ref_gpu = R.quantize_attention_fp8_reference(q, k, v, granularity, hadamard, signs)
    ref_cpu = R.quantize_attention_fp8_reference(q.cpu(), k.cpu(), v.cpu(), granularity, hadamard,
                                                 None if signs is None else signs.cpu())
    for got, a, b in zip(out, ref_gpu, ref_cpu):
        assert got.shape == a.shape and got.is_contiguous()
        _same(got, a)
        _same(got, b)
    return out


@pytest.mark.parametrize("granularity", R.GRANULARITIES)
@pytest.mark.parametrize("hadamard", [False, True])
@pytest.mark.parametrize("s", [1, 127, 129, 1000])
@pytest.mark.parametrize("d", R.HADAMARD_DIMS)
def test_quantize_bitwise(granularity, hadamard, s, d):
    q = randn(2, s, 4, d) * 3
    k, v = randn(2, s + 3, 2, d), randn(2, s + 3, 2, d) * 0.01  # GQA, another length for K/V
    _check(q, k, v, granularity, hadamard)


@pytest.mark.parametrize("granularity", R.GRANULARITIES)
def test_quantize_fp16_signs_and_outliers(granularity):
    q, k, v = (t.cuda().half() for t in R.attention_inputs(1, 700, 8, 128, outliers=True, hk=2))
    s = _signs(128, "int8")
    _check(q, k, v, granularity, True, -s)
    _check(q, k, v, granularity, False)


@pytest.mark.parametrize("granularity", R.GRANULARITIES)
def test_quantize_strided_and_unaligned(granularity):
    b, s, h, d = 2, 300, 4, 128
    qkv = randn(b, s, 3, h, d)  # a packed projection: q, k, v read in place
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    _check(q, k, v, granularity, True)
    bhsd = randn(b, h, s, d).transpose(1, 2)  # heads-first storage
    _check(bhsd, bhsd, bhsd, granularity, True)
    flat = randn(b * s * h * d + 1)
    odd = flat[1:].view(b, s, h, d)  # not 16-byte aligned: copied first
    _check(odd, k, v, granularity, True)
    one = randn(1, 1, 1, d)  # size-1 dims: their strides are never used
    _check(one, one, one, granularity, True)


def test_quantize_zero_blocks_and_nan():
    q = randn(1, 300, 2, 64)
    q[:, :128] = 0
    q[0, 200, 1, 7] = float("nan")
    for gran in R.GRANULARITIES:
        q8, _, _, qs, _, _ = _check(q, q, q, gran, False)
        assert torch.isfinite(qs).all()


def test_quantize_poisoned_outputs(monkeypatch):
    q, k, v = randn(2, 1000, 4, 128), randn(2, 1000, 2, 128), randn(2, 1000, 2, 128)
    refs = {g: R.quantize_attention_fp8_reference(q, k, v, g, True) for g in R.GRANULARITIES}
    poison_empty(monkeypatch)
    for g in R.GRANULARITIES:
        out = ck.quantize_attention_fp8(q, k, v, g, True)
        for got, want in zip(out, refs[g]):
            assert not torch.isnan(got.float()).any()
            _same(got, want)


def test_quantize_torch_compile_and_cuda_graph():
    q, k, v = randn(1, 513, 8, 128), randn(1, 513, 2, 128), randn(1, 513, 2, 128)
    for g in R.GRANULARITIES:
        ref = R.quantize_attention_fp8_reference(q, k, v, g, True)
        fn = torch.compile(lambda a, b, c, g=g: ck.quantize_attention_fp8(a, b, c, g, True), fullgraph=True)
        for got, want in zip(fn(q, k, v), ref):
            _same(got, want)
        ck.quantize_attention_fp8(q, k, v, g, True)  # warm-up: compiled kernels, default signs on the device
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = ck.quantize_attention_fp8(q, k, v, g, True)
        q.copy_(randn(1, 513, 8, 128))
        graph.replay()
        torch.cuda.synchronize()
        for got, want in zip(out, R.quantize_attention_fp8_reference(q, k, v, g, True)):
            _same(got, want)
    y_fn = torch.compile(lambda x: ck.hadamard(x, None), fullgraph=True)
    _same(y_fn(q), R.hadamard_reference(q))


def test_empty_and_single_row():
    q = randn(2, 0, 4, 64)
    out = ck.quantize_attention_fp8(q, q[:, :, :2], q[:, :, :2], "head")
    assert out[3].shape == (2, 4) and torch.isfinite(out[3]).all()
    assert ck.quantize_attention_fp8(q, q[:, :, :2], q[:, :, :2], "block")[3].shape == (2, 4, 0)
    assert ck.hadamard(randn(0, 64)).shape == (0, 64)


def test_end_to_end_accuracy_on_the_kernels_operands():
    """The emulated FP8 forward on the kernels' operands: the accuracy study's numbers (bitwise the same operands)."""
    q, k, v = (t.cuda() for t in R.attention_inputs(1, 1024, 4, 128, outliers=True))
    ref = R.attention_reference(q, k, v)
    rot = R.rmse(R.fp8_attention_reference(*ck.quantize_attention_fp8(q, k, v, "block", True)), ref)
    head = R.rmse(R.fp8_attention_reference(*ck.quantize_attention_fp8(q, k, v, "head")), ref)
    assert rot <= 1.2e-2 and rot < 0.65 * head


@pytest.mark.parametrize("mode", ["block", "amax"])
@pytest.mark.parametrize("d,threads,cluster,elems", [(256, 512, 2, 0), (256, 256, 4, 0), (128, 256, 2, 0),
                                                     (64, 512, 2, 0), (256, 256, 4, 16), (256, 256, 4, 32),
                                                     (128, 512, 1, 16)])
@pytest.mark.parametrize("s", [1, 129, 1000])
def test_quantize_cluster_bitwise(mode, d, threads, cluster, elems, s):
    """`cluster` > 1 (a 128-row block over several CTAs, its amax folded in distributed shared memory) and `elems`
    (more of a row a lane: butterfly stages in registers instead of shuffles) write the same bits as one CTA a block
    at the default geometry: e4m3 values and scales (block), block amaxes (amax)."""
    from cute_kernels.attention import FP8_ATTN_QUANT

    x = randn(2, s, 3, d) * 3
    x[0, s // 2, 1, : d // 2] = 40.0  # one block's outlier: the amax must come from the right CTA
    signs = R.default_signs(d, "cuda")
    nb = (s + 127) // 128
    outs = []
    for c, t, el in ((1, 512, 0), (cluster, threads, elems)):
        x8 = torch.full(x.shape, float("nan"), device="cuda").to(torch.float8_e4m3fn)
        sc = torch.full((2, 3, nb), float("nan"), device="cuda")
        FP8_ATTN_QUANT.compiled(dtype="bf16", head_dim=d, mode=mode, hadamard=True, index64=False, threads=t,
                                cluster=c, elems=el)(x, x8, sc, sc, signs)
        outs.append((x8, sc))
    _same(outs[0][1], outs[1][1])  # (asserts)
    if mode == "block":
        _same(outs[0][0].view(torch.uint8), outs[1][0].view(torch.uint8))
