"""Row-wise ops on the GPU (lessons 4-7): RMSNorm, LayerNorm, softmax, log-softmax, cross-entropy,
forward and backward, against fp32/fp64 references.

Error bound (issue 3): in bf16/fp16 our max abs error against the fp64 reference is at most twice
torch's own implementation in the same dtype, plus 1e-3 * max|ref|. Outputs are poisoned: every
float `torch.empty` the ops make while a test runs is filled with NaN, so an unwritten element
fails.

Order: `test_smoke` first (2 x 4096 bf16, one case per op, forward and backward), so a broken op
shows by name before the sweeps. Shapes (`FWD_CASES`, `BWD_CASES`): every dtype at N = 7 (scalar,
one thread), 4096 (128-bit vectors, row groups wider than a warp), 5125 (scalar, 256 threads per
row); bf16 also at N = 1, 769, 65536 (a cluster), and 262144 once per op (an 8-CTA cluster, or
the named error for ops that do not hold it); fp32 at 65536 (a cluster of 4-element vectors);
0, 1 and 769 rows. Strided and non-contiguous inputs; autograd against torch autograd of the fp64
reference.

Speed: a module fixture compiles every kernel the tests use ahead, in parallel processes
(`cute_kernels.precompile`), into the disk cache; the tests then load them (~2 ms each). Set
CK_TEST_PRECOMPILE=0 to skip that (each kernel then compiles in the test, ~1.5 s each)."""

import os
import warnings

import pytest
import torch
import torch.nn.functional as F

import cute_kernels as ck
from cute_kernels.rowwise.launch import kernel_params, max_row_length
from tests.helpers import poison_empty, randn

pytestmark = pytest.mark.gpu

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
DTYPES = [BF16, FP16, FP32]


def _cases(every, bf16_only, fp32_only=()):
    return ([(d, m, n) for d in DTYPES for m, n in every] + [(BF16, m, n) for m, n in bf16_only]
            + [(FP32, m, n) for m, n in fp32_only])


FWD_CASES = _cases(((1, 7), (769, 4096), (769, 5125)),
                   ((0, 4096), (1, 1), (769, 769), (64, 65536), (8, 262144)), ((16, 65536),))
BWD_CASES = _cases(((769, 4096),), ((0, 64), (1, 7), (769, 769), (300, 5125), (64, 65536), (8, 131072), (4, 262144)),
                   ((300, 5125), (16, 65536)))


def _ids(cases):
    return [f"{str(d).split('.')[-1]}-{m}x{n}" for d, m, n in cases]


# --- compile ahead -----------------------------------------------------------------------------------
def _supported(name, n, dtype):
    return n <= max_row_length(name, dtype)


def _aligned(n, dtype):
    return n % (16 // dtype.itemsize) == 0


def _norm_sig(kind, dtype, weight=True, bias=True, residual=False, w_dtype=None):
    sig = dict(weight=weight, residual=residual, w_dtype=ck_dtype(w_dtype or dtype))
    if kind == "layernorm":
        sig["bias"] = bias
    return sig


def ck_dtype(dtype):
    from cute_kernels import dtypes

    return dtypes.name_of(dtype)


def _kernels_used():
    """(kernel name, params) of every kernel this module launches (a missing one only costs time)."""
    from cute_kernels.precompile import item

    need = []

    def add(name, dtype, n, aligned=None, **sig):
        if _supported(name, n, dtype):
            aligned = _aligned(n, dtype) if aligned is None else aligned
            need.append(item(name, kernel_params(name, dtype, n, aligned, **sig)))

    for dtype, m, n in FWD_CASES + [(BF16, 2, 4096)]:
        if m == 0:
            continue
        for kind in ("rmsnorm", "layernorm"):
            add(f"{kind}.fwd", dtype, n, **_norm_sig(kind, dtype))
            if (m, n) == (769, 4096):
                add(f"{kind}.fwd", dtype, n, **_norm_sig(kind, dtype, weight=False, bias=False))
        for name in ("softmax.fwd", "log_softmax.fwd", "cross_entropy.bwd"):  # CE fwd: not a held row
            add(name, dtype, n)
    for dtype, m, n in BWD_CASES + [(BF16, 2, 4096)]:
        if m == 0:
            continue
        for kind in ("rmsnorm", "layernorm"):
            if _supported(f"{kind}.bwd", n, dtype):  # else the test skips
                add(f"{kind}.fwd", dtype, n, **_norm_sig(kind, dtype))
                add(f"{kind}.bwd", dtype, n, **_norm_sig(kind, dtype))
        for fam in ("softmax", "log_softmax"):
            if _supported(f"{fam}.bwd", n, dtype):
                add(f"{fam}.fwd", dtype, n)
                add(f"{fam}.bwd", dtype, n)
    for dtype in (BF16, FP32):  # test_fused_residual
        add("rmsnorm.fwd", dtype, 4096, **_norm_sig("rmsnorm", dtype, residual=True, w_dtype=FP32))
        add("layernorm.fwd", dtype, 4096, **_norm_sig("layernorm", dtype, bias=False, residual=True, w_dtype=FP32))
    for name in ("rmsnorm.fwd", "rmsnorm.bwd"):  # test_norm_backward_with_residual
        add(name, BF16, 2048, **_norm_sig("rmsnorm", BF16, residual=True))
    add("log_softmax.fwd", FP16, 512)  # test_strided_and_noncontiguous_inputs
    add("layernorm.fwd", BF16, 4096, aligned=False, **_norm_sig("layernorm", BF16, weight=False, bias=False))
    add("softmax.fwd", BF16, 1000)
    for name in ("layernorm.fwd", "layernorm.bwd"):  # test_deterministic_weight_gradient
        add(name, BF16, 1024, **_norm_sig("layernorm", BF16, bias=False))
    add("softmax.fwd", FP32, 1000)  # test_softmax_masked_rows
    return list(dict.fromkeys(need))


@pytest.fixture(scope="module", autouse=True)
def compiled_ahead():
    if os.environ.get("CK_TEST_PRECOMPILE", "1") == "0":
        return
    from cute_kernels.precompile import precompile

    items = _kernels_used()
    try:
        count, _, secs = precompile(items, jobs=min(16, os.cpu_count() or 1))
        print(f"\nrow-wise GPU tests: {count} kernels compiled ahead in {secs:.1f} s")
    except Exception as e:  # the test that needs the kernel then fails by name, compiling it itself
        warnings.warn(f"row-wise GPU tests: compiling ahead failed ({type(e).__name__}: {e})", RuntimeWarning)


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    poison_empty(monkeypatch)


def check(out, ref, torch_out, what=""):
    """|out - ref| <= 2 * max|torch_out - ref| + 1e-3 * max|ref| + one ulp of out's dtype at |ref| (ref in
    fp64), no NaN where ref is finite. The ulp: a 16-bit output rounds an fp32 result once, which on a
    short row can exceed what torch's own error happened to be (softmax backward of a 1x7 bf16 row:
    1.47e-3 against a bound of 1.32e-3 without it)."""
    ulp = torch.finfo(out.dtype).eps if out.dtype.is_floating_point else 0.0
    out, ref, torch_out = out.double(), ref.double(), torch_out.double()
    assert out.shape == ref.shape, (what, out.shape, ref.shape)
    if ref.numel() == 0:
        return
    fin = torch.isfinite(ref)
    if not fin.any():  # e.g. a mean over no rows: NaN in both
        assert not torch.isfinite(out).any(), f"{what}: finite where the reference is not"
        return
    assert torch.isfinite(out[fin]).all(), f"{what}: non-finite outputs (unwritten or overflow)"
    e = (out - ref)[fin].abs()
    terr = (torch_out - ref)[fin].abs().max().item()
    bound = 2 * terr + 1e-3 * ref[fin].abs().max().item()
    worst = (e - ulp * ref[fin].abs()).argmax()
    err = e[worst].item()
    assert err <= bound + ulp * ref[fin].abs()[worst].item(), (
        f"{what}: max err {err:.3e} > bound {bound:.3e} + one ulp of {ref[fin].abs()[worst].item():.3e} "
        f"(torch's own: {terr:.3e})")


# --- smoke: one small case per op, first ------------------------------------------------------------
SMOKE = ["rms_norm", "layer_norm", "softmax", "log_softmax", "cross_entropy",
         "rms_norm_backward", "layer_norm_backward", "softmax_backward", "log_softmax_backward",
         "cross_entropy_backward"]


@pytest.mark.parametrize("op", SMOKE)
def test_smoke(op):
    """2 rows x 4096 bf16 (128 threads per row: the warp, CTA stages of the reduction)."""
    m, n = 2, 4096
    if op == "rms_norm":
        _check_rms_forward(BF16, m, n, no_weight=True)
    elif op == "layer_norm":
        _check_ln_forward(BF16, m, n, no_affine=True)
    elif op in ("softmax", "log_softmax"):
        _check_softmax_forward(op == "log_softmax", BF16, m, n)
    elif op == "cross_entropy":
        _check_cross_entropy(BF16, m, n, backward=False)
    elif op in ("rms_norm_backward", "layer_norm_backward"):
        _check_norm_backward("rms" if op.startswith("rms") else "layer", BF16, m, n)
    elif op in ("softmax_backward", "log_softmax_backward"):
        _check_softmax_backward(op.startswith("log"), BF16, m, n)
    else:
        _check_cross_entropy(BF16, m, n, backward=True)


# --- RMSNorm / LayerNorm -----------------------------------------------------------------------------
def _rms_ref(x, w, eps):
    xf = x.double()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return y * w.double() if w is not None else y


def _ln_ref(x, w, b, eps):
    return F.layer_norm(x.double(), x.shape[-1:], w.double() if w is not None else None,
                        b.double() if b is not None else None, eps)


def _check_rms_forward(dtype, m, n, no_weight):
    x, w = randn(m, n, dtype=dtype), randn(n, dtype=dtype)
    if not _supported("rmsnorm.fwd", n, dtype) and m > 0:
        with pytest.raises(ValueError, match="x: rows of"):
            ck.rms_norm(x, w)
        return
    check(ck.rms_norm(x, w, 1e-6), _rms_ref(x, w, 1e-6), F.rms_norm(x, (n,), w, 1e-6), "rms_norm")
    if no_weight:
        check(ck.rms_norm(x), _rms_ref(x, None, 1e-6), F.rms_norm(x, (n,), None, 1e-6), "rms_norm, no weight")


def _check_ln_forward(dtype, m, n, no_affine):
    x, w, b = randn(m, n, dtype=dtype), randn(n, dtype=dtype), randn(n, dtype=dtype)
    x = x + 3.0  # a mean far from 0: one-pass sum(x^2) - mean^2 would cancel
    if not _supported("layernorm.fwd", n, dtype) and m > 0:
        with pytest.raises(ValueError, match="x: rows of"):
            ck.layer_norm(x, w, b)
        return
    check(ck.layer_norm(x, w, b, 1e-5), _ln_ref(x, w, b, 1e-5), F.layer_norm(x, (n,), w, b, 1e-5), "layer_norm")
    if no_affine:
        check(ck.layer_norm(x), _ln_ref(x, None, None, 1e-5), F.layer_norm(x, (n,)), "layer_norm, no affine")


@pytest.mark.parametrize("dtype,m,n", FWD_CASES, ids=_ids(FWD_CASES))
def test_rms_norm_forward(dtype, m, n):
    _check_rms_forward(dtype, m, n, no_weight=(m, n) == (769, 4096))


@pytest.mark.parametrize("dtype,m,n", FWD_CASES, ids=_ids(FWD_CASES))
def test_layer_norm_forward(dtype, m, n):
    _check_ln_forward(dtype, m, n, no_affine=(m, n) == (769, 4096))


LONG16 = [(8, 131080), (6, 200000), (4, 262144)]


@pytest.mark.parametrize("m,n", [(1027, 1024), (3, 1000), (4098, 1016)], ids=["1027x1024", "3x1000", "4098x1016"])
def test_layer_norm_staged_rows_per_cta(m, n):
    """LayerNorm forward's 1k plan of several rows a CTA (four rows of 32 threads; staged and held until session 21,
    since then one CTA a row tile, capped at 6 CTAs an SM; RMSNorm's 1k plan of eight rows likewise one-tile): row
    counts that leave the last CTA's groups partly empty, with and without the affine parameters."""
    _check_ln_forward(BF16, m, n, no_affine=True)
    _check_rms_forward(BF16, m, n, no_weight=True)


@pytest.mark.parametrize("m,n", LONG16, ids=[f"{m}x{n}" for m, n in LONG16])
def test_cluster16_forwards(m, n):
    """Session 14's 16-CTA forward plans (RMSNorm from 128k, LayerNorm / softmax / log-softmax past 128k) on
    padded rows (131080, 200000: the last CTAs of a cluster hold part of a slice or none of it), with and
    without the affine parameters (rows staged alone: `NormFwd`'s register floor)."""
    _check_rms_forward(BF16, m, n, no_weight=True)
    _check_ln_forward(BF16, m, n, no_affine=True)
    for log in (False, True):
        _check_softmax_forward(log, BF16, m, n)


@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("dtype", [BF16, FP32])
def test_fused_residual(kind, dtype):
    m, n = 769, 4096
    x, r, w = randn(m, n, dtype=dtype), randn(m, n, dtype=dtype), randn(n, dtype=FP32)
    if kind == "rms":
        y, s = ck.rms_norm(x, w, 1e-6, residual=r)
    else:
        y, s = ck.layer_norm(x, w, None, 1e-5, residual=r)
    s_torch = x + r
    assert torch.equal(s, s_torch), "residual sum must equal x + residual rounded to x's dtype"
    ref = _rms_ref(s_torch, w, 1e-6) if kind == "rms" else _ln_ref(s_torch, w, None, 1e-5)
    tout = (F.rms_norm(s_torch.float(), (n,), w, 1e-6) if kind == "rms" else
            F.layer_norm(s_torch.float(), (n,), w, None, 1e-5)).to(dtype)
    check(y, ref, tout, f"{kind} + residual")


def _grads(fn, inputs, dy):
    for t in inputs:
        if t is not None:
            t.grad = None
    out = fn(*inputs)
    out = out[0] if isinstance(out, tuple) else out
    out.backward(dy)
    return [t.grad if t is not None else None for t in inputs]


def _check_norm_backward(kind, dtype, m, n, w_dtype=None):
    """`w_dtype`: the weight's (and bias') dtype when not x's (torch's own then runs on them cast to x's)."""
    name = ("rmsnorm" if kind == "rms" else "layernorm") + ".bwd"
    if not _supported(name, n, dtype):
        pytest.skip(f"{name} holds rows up to {max_row_length(name, dtype)}")
    x = randn(m, n, dtype=dtype).requires_grad_()
    w = randn(n, dtype=w_dtype or dtype).requires_grad_()
    b = randn(n, dtype=w_dtype or dtype).requires_grad_() if kind == "layer" else None
    dy = randn(m, n, dtype=dtype)
    if w_dtype not in (None, dtype):
        ours = _grads(lambda x, w, b: ck.rms_norm(x, w, 1e-6) if kind == "rms" else ck.layer_norm(x, w, b, 1e-5),
                      [x, w, b], dy)
        xr, wr, br = (None if t is None else t.detach().double().requires_grad_() for t in (x, w, b))
        x, w, b = (None if t is None else t.detach().to(dtype).requires_grad_() for t in (x, w, b))
        theirs = _grads(lambda x, w, b: F.rms_norm(x, (n,), w, 1e-6) if kind == "rms"
                        else F.layer_norm(x, (n,), w, b, 1e-5), [x, w, b], dy)
        ref = _grads(lambda x, w, b: _rms_ref(x, w, 1e-6) if kind == "rms" else _ln_ref(x, w, b, 1e-5),
                     [xr, wr, br], dy.double())
        for o, t, r, what in zip(ours, theirs, ref, ("dx", "dweight", "dbias")):
            if o is not None:
                check(o, r, t, f"{kind} {what} (weight {w_dtype})")
        return
    if kind == "rms":
        ours = _grads(lambda x, w: ck.rms_norm(x, w, 1e-6), [x, w], dy)
        theirs = _grads(lambda x, w: F.rms_norm(x, (n,), w, 1e-6), [x, w], dy)
        xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
        ref = _grads(lambda x, w: _rms_ref(x, w, 1e-6), [xr, wr], dy.double())
    else:
        ours = _grads(lambda x, w, b: ck.layer_norm(x, w, b, 1e-5), [x, w, b], dy)
        theirs = _grads(lambda x, w, b: F.layer_norm(x, (n,), w, b, 1e-5), [x, w, b], dy)
        xr, wr, br = (t.detach().double().requires_grad_() for t in (x, w, b))
        ref = _grads(lambda x, w, b: _ln_ref(x, w, b, 1e-5), [xr, wr, br], dy.double())
    for o, t, r, what in zip(ours, theirs, ref, ("dx", "dweight", "dbias")):
        check(o, r, t, f"{kind} {what}")


@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("dtype,m,n", BWD_CASES, ids=_ids(BWD_CASES))
def test_norm_backward(kind, dtype, m, n):
    _check_norm_backward(kind, dtype, m, n)


# Session 15's plans (LayerNorm 128k held, RMSNorm 128k staged + double-buffered, RMSNorm 64k register accumulators;
# rows past the resident clusters, so each cluster walks several): bf16 weights, fp32 weights, and RMSNorm without
# a weight. (Their register accumulators need no shared slots with one row group a CTA: the partial rows are
# written from the registers, `schedules.row_tiling.bwd_smem_accumulators`.)
S15 = [("rms", 70, 65536), ("rms", 37, 131072), ("layer", 37, 131072)]


@pytest.mark.parametrize("kind,m,n", S15, ids=[f"{k}-{m}x{n}" for k, m, n in S15])
def test_norm_backward_plans_of_session15(kind, m, n):
    _check_norm_backward(kind, BF16, m, n)
    _check_norm_backward(kind, BF16, m, n, w_dtype=FP32)
    if kind == "rms":
        x, dy = randn(m, n).requires_grad_(), randn(m, n)
        (dx,) = _grads(lambda x: ck.rms_norm(x, None, 1e-6), [x], dy)
        xr = x.detach().double().requires_grad_()
        xt = x.detach().clone().requires_grad_()
        check(dx, _grads(lambda x: _rms_ref(x, None, 1e-6), [xr], dy.double())[0],
              _grads(lambda x: F.rms_norm(x, (n,), None, 1e-6), [xt], dy)[0], "rms dx (no weight)")


@pytest.mark.parametrize("n", [16384, 65536, 131072, 262144])
@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_norm_forward_fp32_weight(kind, n):
    """fp32 weight and bias beside bf16 rows on the staged plans (16k-256k): a vector of the staged parameter is 32
    bytes, two cp.async (session 16 found one, half of each staged weight never written; the forward's staged
    fp32 weights had no GPU test)."""
    m = 37
    x = randn(m, n) + (3.0 if kind == "layer" else 0.0)
    w, b = randn(n, dtype=FP32), randn(n, dtype=FP32)
    xb, wb, bb = x, w.to(BF16), b.to(BF16)  # torch's own in bf16 (weights rounded)
    if kind == "rms":
        check(ck.rms_norm(x, w, 1e-6), _rms_ref(x, w, 1e-6), F.rms_norm(xb, (n,), wb, 1e-6), "rms_norm fp32 w")
    else:
        check(ck.layer_norm(x, w, b, 1e-5), _ln_ref(x, w, b, 1e-5), F.layer_norm(xb, (n,), wb, bb, 1e-5),
              "layer_norm fp32 w")


@pytest.mark.parametrize("kind,m,n", [("rms", 40, 32768), ("layer", 6, 262144)], ids=["rms-32k", "layer-256k"])
def test_norm_backward_fp32_weight_fitted(kind, m, n):
    """Staged plans an fp32 weight overflows (the op raised on these before session 15): RMSNorm 32k runs its
    register plan, LayerNorm 256k its staged plan with the accumulators in registers (`ops._rowwise.fitted`)."""
    _check_norm_backward(kind, BF16, m, n, w_dtype=FP32)


R17 = [(FP32, 20, 131072), (BF16, 20, 131071), (FP16, 9, 100003)]


@pytest.mark.parametrize("dtype,m,n", R17, ids=_ids(R17))
def test_layer_norm_backward_128k_register_plan(dtype, m, n):
    """LayerNorm bwd past 64k for fp32 rows and rows not a multiple of the vector: its 128k register plan (the
    default of sessions 15-16, now the `regs` settings of the refilled staged default) holds them; the op raised
    there before session 17."""
    _check_norm_backward("layer", dtype, m, n)


@pytest.mark.parametrize("dtype,m,n", R17, ids=_ids(R17))
def test_layer_norm_forward_128k_register_plan_in_clusters_of_16(dtype, m, n):
    """LayerNorm fwd's register plan for fp32 rows and rows not a multiple of the vector at 64k-128k: 16 values a
    thread in clusters of 16 (the default since session 22, when this test first passed on the H200). The plan
    before it, 32 values in clusters of 8, spilled 496 B on scalar rows (x, weight and bias held)."""
    from cute_kernels.rowwise import launch as R

    assert R.plan_for("layernorm.fwd", dtype, n, dtype == FP32).cluster_n == 16
    _check_ln_forward(dtype, m, n, no_affine=True)


def test_layer_norm_backward_256k_without_bias():
    """The refilled 256k plan without a bias: one accumulator, kept in shared memory beside the held rows."""
    m, n = 70, 262144
    x, w, dy = randn(m, n).requires_grad_(), randn(n).requires_grad_(), randn(m, n)
    ours = _grads(lambda x, w: ck.layer_norm(x, w, None, 1e-5), [x, w], dy)
    xt, wt = (t.detach().clone().requires_grad_() for t in (x, w))
    theirs = _grads(lambda x, w: F.layer_norm(x, (n,), w, None, 1e-5), [xt, wt], dy)
    xr, wr = (t.detach().double().requires_grad_() for t in (x, w))
    ref = _grads(lambda x, w: _ln_ref(x, w, None, 1e-5), [xr, wr], dy.double())
    for o, t, r, what in zip(ours, theirs, ref, ("dx", "dweight")):
        check(o, r, t, f"layer {what} (no bias)")


def test_norm_backward_with_residual():
    m, n = 257, 2048
    x, r = randn(m, n).requires_grad_(), randn(m, n).requires_grad_()
    w = randn(n).requires_grad_()
    y, s = ck.rms_norm(x, w, 1e-6, residual=r)
    dy, ds = randn(m, n), randn(m, n)
    torch.autograd.backward([y, s], [dy, ds])
    xr, rr, wr = (t.detach().double().requires_grad_() for t in (x, r, w))
    sr = xr + rr
    torch.autograd.backward([_rms_ref(sr, wr, 1e-6), sr], [dy.double(), ds.double()])
    xt, rt, wt = (t.detach().clone().requires_grad_() for t in (x, r, w))
    st = xt + rt
    torch.autograd.backward([F.rms_norm(st, (n,), wt, 1e-6), st], [dy, ds])
    check(x.grad, xr.grad, xt.grad, "dx")
    check(r.grad, rr.grad, rt.grad, "dresidual")
    check(w.grad, wr.grad, wt.grad, "dweight")


# --- softmax / log-softmax ---------------------------------------------------------------------------
def _check_softmax_forward(log, dtype, m, n):
    x = randn(m, n, dtype=dtype) * 4
    ours = ck.log_softmax(x) if log else ck.softmax(x)
    ref = torch.log_softmax(x.double(), -1) if log else torch.softmax(x.double(), -1)
    theirs = torch.log_softmax(x, -1) if log else torch.softmax(x, -1)
    check(ours, ref, theirs, "log_softmax" if log else "softmax")


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype,m,n", FWD_CASES, ids=_ids(FWD_CASES))
def test_softmax_forward(log, dtype, m, n):
    _check_softmax_forward(log, dtype, m, n)


def test_softmax_masked_rows():
    """-inf logits (masks) give 0 probability; a row that is entirely -inf gives NaN, as torch."""
    x = randn(4, 1000, dtype=FP32)
    x[0, 10:] = float("-inf")
    x[1] = float("-inf")
    y = ck.softmax(x)
    ref = torch.softmax(x, -1)
    assert torch.allclose(y[0], ref[0], atol=1e-6) and (y[0, 10:] == 0).all()
    assert torch.isnan(y[1]).all() and torch.isnan(ref[1]).all()


def _check_softmax_backward(log, dtype, m, n):
    name = ("log_softmax" if log else "softmax") + ".bwd"
    if not _supported(name, n, dtype):
        pytest.skip(f"{name} holds rows up to {max_row_length(name, dtype)}")
    x = (randn(m, n, dtype=dtype) * 2).requires_grad_()
    dy = randn(m, n, dtype=dtype)
    f_ours = ck.log_softmax if log else ck.softmax
    f_torch = (lambda t: torch.log_softmax(t, -1)) if log else (lambda t: torch.softmax(t, -1))
    ours = _grads(f_ours, [x], dy)[0]
    theirs = _grads(f_torch, [x], dy)[0]
    xr = x.detach().double().requires_grad_()
    ref = _grads(f_torch, [xr], dy.double())[0]
    check(ours, ref, theirs, name)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype,m,n", BWD_CASES, ids=_ids(BWD_CASES))
def test_softmax_backward(log, dtype, m, n):
    _check_softmax_backward(log, dtype, m, n)


# --- cross-entropy -------------------------------------------------------------------------------------
def _check_cross_entropy(dtype, m, n, backward=True):
    x = (randn(m, n, dtype=dtype) * 3).requires_grad_()
    t = torch.randint(0, n, (m,), device="cuda")
    if m > 2:
        t[::7] = -100  # ignored rows
    for reduction in ("none", "mean", "sum"):
        ours = ck.cross_entropy(x, t, reduction=reduction)
        theirs = F.cross_entropy(x.float(), t, reduction=reduction)
        ref = F.cross_entropy(x.double(), t, reduction=reduction)
        check(ours, ref, theirs, f"cross_entropy {reduction}")
    if m == 0 or not backward:
        return
    dloss = randn(m, dtype=FP32)
    ours = _grads(lambda x: ck.cross_entropy(x, t, reduction="none"), [x], dloss)[0]
    theirs = _grads(lambda x: F.cross_entropy(x, t, reduction="none"), [x], dloss.to(dtype))[0]
    xr = x.detach().double().requires_grad_()
    ref = _grads(lambda x: F.cross_entropy(x, t, reduction="none"), [xr], dloss.double())[0]
    check(ours, ref, theirs, "cross_entropy dx")


@pytest.mark.parametrize("dtype,m,n", FWD_CASES, ids=_ids(FWD_CASES))
def test_cross_entropy_forward_backward(dtype, m, n):
    _check_cross_entropy(dtype, m, n)


# --- layouts, compile ---------------------------------------------------------------------------------
def test_strided_and_noncontiguous_inputs():
    base = randn(300, 4160)
    view = base[:, :4096]  # row stride 4160: read in place
    check(ck.softmax(view), torch.softmax(view.double(), -1), torch.softmax(view, -1), "strided softmax")
    w = randn(4096)
    check(ck.rms_norm(view, w), _rms_ref(view, w, 1e-6), F.rms_norm(view, (4096,), w, 1e-6), "strided rms_norm")
    t = randn(512, 300, dtype=torch.float16).t()  # last dim not unit-stride: copied first
    check(ck.log_softmax(t), torch.log_softmax(t.double(), -1), torch.log_softmax(t, -1), "transposed")
    odd = randn(10 * 4096 + 1, dtype=torch.bfloat16)[1:].view(10, 4096)  # misaligned base: scalar variant
    check(ck.layer_norm(odd), _ln_ref(odd, None, None, 1e-5), F.layer_norm(odd, (4096,)), "misaligned")
    b3 = randn(4, 6, 1000, dtype=torch.bfloat16)[:, ::2]  # 3-D strided: rows 2000 apart, read in place
    check(ck.softmax(b3), torch.softmax(b3.double(), -1), torch.softmax(b3, -1), "3-D strided")


def test_torch_compile_fullgraph():
    x = randn(64, 4096, dtype=torch.bfloat16)
    w = randn(4096, dtype=torch.bfloat16)
    t = torch.randint(0, 4096, (64,), device="cuda")

    def chain(x, reduction="mean"):
        return ck.cross_entropy(ck.softmax(ck.layer_norm(ck.rms_norm(x, w), w, w)), t, reduction=reduction)

    f = torch.compile(lambda x: (chain(x, "none"), chain(x)), fullgraph=True)
    rows, mean = f(x)
    assert torch.equal(rows, chain(x, "none"))  # our kernels, the same compiled or eager
    # the mean's sum is Inductor's own reduction (its order may differ from eager's in the last bit)
    torch.testing.assert_close(mean, chain(x), rtol=1e-6, atol=0)


def test_deterministic_weight_gradient():
    x = randn(4096, 1024).requires_grad_()
    w = randn(1024).requires_grad_()
    dy = randn(4096, 1024)
    g = _grads(lambda x, w: ck.layer_norm(x, w, None), [x, w], dy)[1].clone()
    for _ in range(3):
        assert torch.equal(_grads(lambda x, w: ck.layer_norm(x, w, None), [x, w], dy)[1], g)
