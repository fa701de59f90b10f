"""CPU: FP8 attention's quantization side. The references (`cute_kernels.attention.fp8_reference`): the Hadamard
transform is orthogonal and its own inverse, the randomized rotation leaves Q K^T unchanged, the kernels' lane
decomposition of the butterflies is bitwise the reference's, quantization round-trips within e4m3's rounding with
the scales' shapes and block boundaries right; the accuracy study's bounds on the emulated FP8 forward (FA3's
outlier test); the ops' named errors and shapes in fake mode; the kernels compile for sm_90a with 128-bit loads,
64-bit e4m3 stores, shuffles, the quantizers' rounding and no local memory."""

import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from cute_kernels.attention import fp8_reference as R
from tests.helpers import check_census

E4M3 = torch.float8_e4m3fn


# --- the Hadamard transform --------------------------------------------------------------------------------------
@pytest.mark.parametrize("d", R.HADAMARD_DIMS)
def test_hadamard_is_the_orthogonal_sylvester_matrix(d):
    h = R.hadamard_matrix(d)
    torch.testing.assert_close(h @ h.T, torch.eye(d, dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(h @ h, torch.eye(d, dtype=torch.float64), rtol=0, atol=1e-12)  # symmetric: H H = I
    x = torch.randn(5, 3, d, dtype=torch.float64)
    torch.testing.assert_close(R.hadamard_fp32(x).double(), (x.float().double() @ h), rtol=0, atol=1e-5)
    torch.testing.assert_close(R.hadamard_fp32(R.hadamard_fp32(x)).double(), x.float().double(), rtol=0, atol=1e-5)
    s = R.default_signs(d)
    assert s.shape == (d,) and s.dtype == torch.float32 and set(s.tolist()) == {-1.0, 1.0}
    assert torch.equal(s, R.default_signs(d))  # seeded: the same vector every call
    torch.testing.assert_close(R.hadamard_fp32(x, s).double(), (x.float().double() * s.double()) @ h, rtol=0,
                               atol=1e-5)
    assert R.hadamard_scale(d).item() == pytest.approx(1 / math.sqrt(d), rel=1e-7)


@pytest.mark.parametrize("d", R.HADAMARD_DIMS)
def test_rotation_keeps_q_kt(d):
    g = torch.Generator().manual_seed(d)
    q, k = torch.randn(2, 64, 4, d, generator=g), torch.randn(2, 64, 4, d, generator=g)
    s = R.default_signs(d)
    qh, kh = R.hadamard_fp32(q, s), R.hadamard_fp32(k, s)
    ref = torch.einsum("bshd,bthd->bhst", q.double(), k.double())
    got = torch.einsum("bshd,bthd->bhst", qh.double(), kh.double())
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-4)


def _lanes_fwht(x: torch.Tensor, signs, dtype_bits: int) -> torch.Tensor:
    """The kernels' order (`fp8_quant.fwht`, `rotate`) in torch fp32: rows held by tpr lanes x e elements, strides
    inside a lane by (a + b, a - b), strides across lanes as +-1 * own + partner (the xor-shuffle partner), then
    the multiply by RN(1 / sqrt(D))."""
    from cute_kernels.attention.fp8_quant import row_geometry

    d = x.shape[-1]
    _, e, tpr = row_geometry(d, dtype_bits)
    v = x.float().reshape(-1, tpr, e)
    if signs is not None:
        v = v * signs.float().reshape(tpr, e)
    vals = [v[..., i] for i in range(e)]
    h = 1
    while h < e:
        for i in range(e):
            if not i & h:
                a, b = vals[i], vals[i + h]
                vals[i], vals[i + h] = a + b, a - b
        h *= 2
    lane = torch.arange(tpr)
    off = 1
    while off < tpr:
        sign = (1.0 - 2.0 * ((lane // off) % 2)).float()
        vals = [sign * t + t[:, lane ^ off] for t in vals]  # exact +-1 product, one rounding: the kernel's fma
        off *= 2
    return (torch.stack(vals, dim=-1).reshape(x.shape) * R.hadamard_scale(d))


@pytest.mark.parametrize("d", R.HADAMARD_DIMS)
@pytest.mark.parametrize("bits", [16, 32])
def test_lane_decomposition_is_bitwise_the_reference(d, bits):
    x = torch.randn(37, d) * torch.logspace(-3, 3, 37)[:, None]
    for signs in (None, R.default_signs(d)):
        assert torch.equal(_lanes_fwht(x, signs, bits), R.hadamard_fp32(x, signs))


def test_hadamard_reference_rounds_once():
    x = torch.randn(9, 128, dtype=torch.bfloat16)
    y = R.hadamard_reference(x, R.default_signs(128).to(torch.int8))
    assert y.dtype == torch.bfloat16 and torch.equal(y, R.hadamard_fp32(x, R.default_signs(128)).bfloat16())


# --- quantization ------------------------------------------------------------------------------------------------
def _roundtrip_ok(x32, x8, scale):
    """|x - x8 * scale| within e4m3's rounding: half an ulp (2^-4 relative) of a normal, 2^-10 x scale absolute
    below the normal range."""
    deq = R.dequantize(x8, scale)
    rows = R.scale_rows(scale.double(), x32.shape[1]).permute(0, 2, 1)[..., None]
    bound = torch.maximum(x32.double().abs() * 2.0**-4, rows * 2.0**-10) * (1 + 1e-6)
    assert ((deq - x32.double()).abs() <= bound).all()


@pytest.mark.parametrize("s", [1, 127, 128, 129, 300])
@pytest.mark.parametrize("granularity", R.GRANULARITIES)
@pytest.mark.parametrize("hadamard", [False, True])
def test_quantize_shapes_and_roundtrip(s, granularity, hadamard):
    g = torch.Generator().manual_seed(s)
    q = (torch.randn(2, s, 4, 64, generator=g) * 3).bfloat16()
    k, v = (torch.randn(2, s + 5, 2, 64, generator=g).bfloat16() for _ in range(2))
    q8, k8, v8, qs, ks, vs = R.quantize_attention_fp8_reference(q, k, v, granularity, hadamard)
    assert q8.dtype == k8.dtype == v8.dtype == E4M3 and q8.shape == q.shape and k8.shape == k.shape
    assert q8.is_contiguous() and v8.is_contiguous()
    shape = (lambda t: (2, t.shape[2])) if granularity == "head" else (lambda t: (2, t.shape[2], -(-t.shape[1] // 128)))
    assert qs.shape == shape(q) and ks.shape == shape(k) and vs.shape == shape(v) and qs.dtype == torch.float32
    signs = R.default_signs(64)
    for x, x8, sc, rot in ((q, q8, qs, hadamard), (k, k8, ks, hadamard), (v, v8, vs, False)):
        x32 = R.hadamard_fp32(x, signs) if rot else x.float()
        _roundtrip_ok(x32, x8, sc)
        # every block's (head's) largest element maps to e4m3's largest value
        top = R.block_amax(x8.float())
        top = top.amax(dim=2) if granularity == "head" else top
        assert (top == 448).all()
    v8_plain = R.quantize_attention_fp8_reference(q, k, v, granularity, False)[2]
    assert torch.equal(v8.view(torch.uint8), v8_plain.view(torch.uint8))  # v is never rotated


def test_block_boundaries_and_zero_blocks():
    x = torch.randn(1, 300, 2, 128)
    x[:, 128:256, 0] *= 100  # block 1 of head 0 only
    x[:, :128, 1] = 0  # an all-zero block
    x8, s = R.quantize_fp8_reference(x, "block")
    assert s.shape == (1, 2, 3)
    assert s[0, 0, 1] > 50 * s[0, 0, 0] and s[0, 0, 1] > 50 * s[0, 0, 2]
    assert s[0, 1, 0] == torch.tensor(1e-4) / torch.tensor(448.0) and (x8[:, :128, 1].float() == 0).all()
    assert torch.isfinite(s).all()
    last = x[:, 256:, 0].abs().amax()
    assert s[0, 0, 2] == last / torch.tensor(448.0)  # the 44-row last block's own amax
    xh8, sh = R.quantize_fp8_reference(x, "head")
    assert torch.equal(sh, s.amax(dim=2))  # the head's scale is its largest block scale (max commutes with it)


def test_nan_is_ignored_by_the_scale():
    x = torch.randn(1, 130, 1, 64)
    x[0, 3, 0, 5] = float("nan")
    x8, s = R.quantize_fp8_reference(x, "block")
    assert torch.isfinite(s).all() and torch.isnan(x8[0, 3, 0, 5].float())


# --- the emulated FP8 forward --------------------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True])
def test_emulation_without_p_rounding_is_attention_of_the_dequantized(causal):
    q, k, v = R.attention_inputs(2, 200, 4, 64, outliers=True, hk=2, seed=3)
    ops = R.quantize_attention_fp8_reference(q, k, v, "block", True)
    got = R.fp8_attention_reference(*ops, causal=causal, round_p=False)
    q8, k8, v8, qs, ks, vs = ops
    ref = R.attention_reference(R.dequantize(q8, qs), R.dequantize(k8, ks), R.dequantize(v8, vs), causal)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)
    rounded = R.fp8_attention_reference(*ops, causal=causal)
    # P in e4m3 (3 mantissa bits, 2^-4 relative half-ulp) costs a few percent of O's RMS over 200 keys
    assert 0 < R.rmse(rounded, ref) < 0.04 * R.rmse(ref, torch.zeros_like(ref))


def test_emulation_causal_rows_without_keys_are_zero():
    q, k, v = R.attention_inputs(1, 6, 2, 64, outliers=False)
    k, v = k[:, :3], v[:, :3]
    o = R.fp8_attention_reference(*R.quantize_attention_fp8_reference(q, k, v, "head"), causal=True)
    assert (o[:, :3] == 0).all() and torch.isfinite(o).all() and (o[:, 3:] != 0).any()


# --- the accuracy study (FA3's outlier test; perf/lab/fp8_attention_accuracy.py prints the table) ----------------------
BOUND = 1.2e-2  # the issue's bound on block FP8 + Hadamard with outliers, and 0.5x per-head FP8's RMSE


def test_accuracy_at_1024():
    """B 1, H 4, S 1024, D 128. Both settings: every FP8 variant within the absolute bound, bf16 far below. With
    outliers the rotation roughly halves the q/k part of the error, but v (never rotated) keeps its own part at
    every S: block + Hadamard is 0.57x per-head FP8 here, 0.40x at S = 8192 (next test). The issue's 0.5x holds
    from about S = 4096 up (FA3's 9.1e-3 against 2.4e-2 matches our S = 8192); at 1024 this pins 0.65x."""
    t = R.accuracy_table(1, 4, 1024, 128)
    plain, outl = t[False], t[True]
    assert all(plain[m] < BOUND for m in ("fp8 per-head", "fp8 block", "fp8 block + hadamard"))
    assert plain["bf16 (torch)"] < 5e-4 and outl["bf16 (torch)"] < 5e-4
    assert outl["fp8 block + hadamard"] <= BOUND < outl["fp8 per-head"]
    assert plain["fp8 block + hadamard"] < 4e-3 and plain["fp8 block + hadamard"] < 1.05 * plain["fp8 per-head"]
    assert outl["fp8 block + hadamard"] < outl["fp8 block"] < outl["fp8 per-head"]
    assert outl["fp8 block + hadamard"] < 0.65 * outl["fp8 per-head"]


def test_accuracy_bounds_at_8192():
    """The issue's bounds, at a length where FA3's numbers reproduce: B 1, H 1, S 8192, D 128, outliers."""
    q, k, v = R.attention_inputs(1, 8192, 1, 128, outliers=True)
    ref = R.attention_reference(q, k, v)
    head = R.rmse(R.fp8_attention_reference(*R.quantize_attention_fp8_reference(q, k, v, "head")), ref)
    rot = R.rmse(R.fp8_attention_reference(*R.quantize_attention_fp8_reference(q, k, v, "block", True)), ref)
    assert rot <= BOUND and rot <= 0.5 * head, (rot, head)


# --- the ops in fake mode -----------------------------------------------------------------------------------------
def _t(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="cuda")


def test_fake_shapes():
    with FakeTensorMode():
        q, k = _t(2, 300, 8, 128), _t(2, 260, 2, 128)
        out = torch.ops.cute_kernels.quantize_attention_fp8(q, k, k, "block", True, None)
        assert [tuple(t.shape) for t in out] == [(2, 300, 8, 128), (2, 260, 2, 128), (2, 260, 2, 128), (2, 8, 3),
                                                 (2, 2, 3), (2, 2, 3)]
        assert [t.dtype for t in out] == [E4M3] * 3 + [torch.float32] * 3
        strided = torch.empty_strided((2, 300, 8, 128), (300 * 8 * 256, 8 * 256, 256, 1), dtype=torch.bfloat16,
                                      device="cuda")  # rows of a wider (.., 256) tensor
        out = torch.ops.cute_kernels.quantize_attention_fp8(strided, k, k)
        assert [tuple(t.shape) for t in out[3:]] == [(2, 8), (2, 2), (2, 2)] and out[0].is_contiguous()
        y = torch.ops.cute_kernels.hadamard(torch.empty_strided((3, 4, 256), (5 * 256, 256, 1), device="cuda"),
                                            _t(256, dtype=torch.int8))
        assert y.shape == (3, 4, 256) and y.dtype == torch.float32 and y.is_contiguous()


@pytest.mark.parametrize("call,exc,match", [
    (lambda: torch.ops.cute_kernels.hadamard(_t(4, 96)), ValueError, r"x.shape\[-1\] .* must be one of"),
    (lambda: torch.ops.cute_kernels.hadamard(_t(4, 64, dtype=torch.int32)), TypeError, "x has dtype int32"),
    (lambda: torch.ops.cute_kernels.hadamard(_t(4, 64), _t(32)), ValueError, r"signs must have shape \(64,\)"),
    (lambda: torch.ops.cute_kernels.hadamard(_t(4, 64), _t(64, dtype=torch.int32)), TypeError, "signs has dtype"),
    (lambda: torch.ops.cute_kernels.hadamard(_t(4, 64), torch.ones(64)), ValueError, "signs is on cpu"),
    (lambda: torch.ops.cute_kernels.quantize_attention_fp8(_t(1, 8, 2, 80), _t(1, 8, 2, 80), _t(1, 8, 2, 80)),
     ValueError, "head dim"),
    (lambda: torch.ops.cute_kernels.quantize_attention_fp8(_t(1, 8, 3, 64), _t(1, 8, 2, 64), _t(1, 8, 2, 64)),
     ValueError, "multiple of key/value heads"),
    (lambda: torch.ops.cute_kernels.quantize_attention_fp8(_t(1, 8, 2, 64, dtype=torch.float32), _t(1, 8, 2, 64),
                                                           _t(1, 8, 2, 64)), TypeError, "q has dtype float32"),
    (lambda: torch.ops.cute_kernels.quantize_attention_fp8(_t(1, 8, 2, 64), _t(1, 8, 2, 64, dtype=torch.float16),
                                                           _t(1, 8, 2, 64)), TypeError, "k has dtype"),
    (lambda: torch.ops.cute_kernels.quantize_attention_fp8(_t(8, 2, 64), _t(8, 2, 64), _t(8, 2, 64)), ValueError,
     "q must be 4-D"),
    (lambda: torch.ops.cute_kernels.quantize_attention_fp8(_t(1, 8, 2, 64), _t(1, 8, 2, 64), _t(1, 9, 2, 64)),
     ValueError, "k .* and v .* must have the same shape"),
    (lambda: torch.ops.cute_kernels.quantize_attention_fp8(_t(1, 8, 2, 64), _t(2, 8, 2, 64), _t(2, 8, 2, 64)),
     ValueError, "batch sizes differ"),
    (lambda: torch.ops.cute_kernels.quantize_attention_fp8(_t(1, 8, 2, 64), _t(1, 8, 2, 64), _t(1, 8, 2, 64),
                                                           "tensor"), ValueError, "granularity must be one of"),
    (lambda: torch.ops.cute_kernels.quantize_attention_fp8(_t(1, 8, 2, 64), _t(1, 8, 2, 64), _t(1, 8, 2, 64),
                                                           "head", False, _t(64)), ValueError, "hadamard=False"),
    (lambda: torch.ops.cute_kernels.quantize_attention_fp8(_t(1, 8, 2, 64), _t(1, 8, 2, 64), _t(1, 8, 2, 64),
                                                           "block", True, _t(128)), ValueError, r"signs must have"),
    (lambda: torch.ops.cute_kernels.quantize_attention_fp8(torch.empty_strided((1, 8, 2, 64), (2048, 256, 128, 2), device="cuda",
                                                                               dtype=torch.bfloat16), _t(1, 8, 2, 64),
                                                           _t(1, 8, 2, 64)), ValueError, "contiguous last dim"),
])
def test_named_errors(call, exc, match):
    import cute_kernels as ck

    ck.load_ops()
    with FakeTensorMode(allow_non_fake_inputs=True), pytest.raises(exc, match=match):
        call()


def test_public_ops_refuse_cpu_tensors():
    import cute_kernels as ck

    with pytest.raises(ValueError, match="x must be on a CUDA device"):
        ck.hadamard(torch.randn(3, 64))
    x = torch.randn(1, 8, 2, 64).bfloat16()
    with pytest.raises(ValueError, match="q must be on a CUDA device"):
        ck.quantize_attention_fp8(x, x, x)


def test_catalogue_entries():
    spec = catalog.get("fp8_attn_quant")
    assert spec.resolve()["threads"] == 512 and spec.ops == ("quantize_attention_fp8",)
    assert {p["mode"] for p in spec.sweep()} == {"block", "amax", "head"}
    with pytest.raises(ValueError, match="head_dim must be one of"):
        catalog.get("hadamard").resolve({"head_dim": 96})


# --- the kernels compile ------------------------------------------------------------------------------------------
COMPILE = [
    ("hadamard", {}),
    ("hadamard", {"dtype": "fp32", "head_dim": 256, "signed": False}),
    ("hadamard", {"dtype": "fp16", "head_dim": 64, "index64": True}),
    ("fp8_attn_quant", {}),
    ("fp8_attn_quant", {"mode": "amax", "head_dim": 64}),
    ("fp8_attn_quant", {"mode": "head", "hadamard": False, "head_dim": 256, "dtype": "fp16"}),
    ("fp8_attn_quant", {"mode": "block", "head_dim": 256}),
    ("fp8_attn_quant", {"head_dim": 256, "threads": 256, "cluster": 4, "elems": 16}),
    ("fp8_attn_quant", {"head_dim": 256, "threads": 256, "cluster": 4, "elems": 32}),
]


@pytest.mark.parametrize("case", COMPILE, ids=lambda c: c[0] + "".join(f",{k}={v}" for k, v in c[1].items()))
def test_kernels_compile(case, tmp_path):
    from cute_kernels.attention.fp8_quant import row_geometry
    from tests.quantize.test_quantize_compile import check_rounding

    name, over = case
    spec = catalog.get(name)
    p = spec.resolve(over)
    report, files = compile_with_artifacts(spec, p, str(tmp_path))
    check_census(name, over, report, files)  # 128-bit loads, no spills, registers
    ptx, text = report.ptx_census, files["ptx"].read_text()
    assert ptx["ld/st.local"] == 0 and ptx["ld.global.v4 (128-bit)"] > 0
    bits = {"bf16": 16, "fp16": 16, "fp32": 32}[p["dtype"]]
    _, e, tpr = row_geometry(p["head_dim"], bits, p.get("elems", 0))
    stages = int(math.log2(tpr))
    if name == "hadamard":
        assert ptx["shfl.sync"] == p["unroll"] * e * stages  # one shuffle per held element per cross-lane stage
        assert ptx["st.global.v4 (128-bit)"] == p["unroll"] * e * bits // 128
        assert text.count("0f%08X" % torch.tensor(1 / math.sqrt(p["head_dim"])).view(torch.int32).item()) > 0
        return
    rows = p["threads"] // tpr
    passes = 128 // p["cluster"] // rows
    if p["hadamard"]:
        assert ptx["shfl.sync"] >= passes * e * stages
    assert "bar.sync" in text  # the CTA-wide amax
    if p["mode"] != "amax":
        check_rounding(text)  # collectives.quantize's scale, reciprocal and e4m3 conversion
        # the held row pieces' e4m3 bytes: one 8-byte store a piece (e = 8), 16-byte ones from e = 16
        store, count = ("st.global.v2.b32", 1) if e == 8 else ("st.global.v4.b32", e // 16)
        assert text.count(store) == passes * count
    else:
        assert "cvt.rn.satfinite.e4m3x2.f32" not in text and "st.global.v2" not in text
