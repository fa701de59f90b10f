"""GPU: the cross-entropy forward's pass-wise fold (`online_softmax.fold` of a pass's vectors: one max,
one rescale; the target gathered after the scan) under the default plan (`ops.softmax.CE_FWD_PLAN`)
and every setting `perf.tune_rows --kernels cross_entropy.fwd` times, against fp64 torch. Outputs are
poisoned with NaN before each launch (the launch is `ops.softmax._ce_rows`, which writes into the
tensors it is given); edge shapes (0, 1, 769 rows; 1, 7, 769, 4097 columns), ignore_index (the
default and a class index), int32 targets, a row stride that is not a multiple of the vector, -inf
prefixes (the first passes of a row empty), the maximum in each vector position of a pass."""

import importlib

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import randn

pytestmark = pytest.mark.gpu


def _ops():
    import cute_kernels  # noqa: F401  (registers torch.ops.cute_kernels)

    return importlib.import_module("cute_kernels.rowwise.ops")  # the package re-exports a `softmax` function


def _settings():
    from perf.tune_rows import ce_candidates

    return [None] + ce_candidates()


def _run(x, t, ignore_index=-100, setting=None):
    """loss, lse of `x` under `setting` (None: the default), into NaN-poisoned outputs."""
    S = _ops()
    loss = torch.full((x.shape[0],), float("nan"), device=x.device)
    lse = torch.full((x.shape[0],), float("nan"), device=x.device)
    if x.shape[0]:
        from cute_kernels.torch_ops import rows_of

        S._ce_rows(rows_of(x), t.to(torch.int64).contiguous(), loss, lse, ignore_index, **(setting or {}))
    return loss, lse


def _check(x, t, loss, lse, ignore_index=-100):
    n = x.shape[1]
    ref_lse = torch.logsumexp(x.double(), dim=-1)
    assert torch.allclose(lse.double(), ref_lse, rtol=2e-6, atol=2e-6 * n ** 0.5), (lse, ref_lse)
    keep = t != ignore_index
    ok = keep & (t >= 0) & (t < n)
    ref = F.cross_entropy(x.double()[ok], t[ok].long(), reduction="none")
    assert torch.allclose(loss[ok].double(), ref, rtol=1e-5, atol=1e-5 * n ** 0.5)
    assert (loss[~keep] == 0).all()
    assert torch.isnan(loss[keep & ~ok]).all()


@pytest.mark.parametrize("setting", _settings(), ids=lambda s: "default" if s is None else
                         f"t{s['threads']}u{s['unroll']}v{s['vectors_per_thread']}")
@pytest.mark.parametrize("m,n", [(769, 4096), (1, 4096), (96, 65536), (300, 769), (33, 4097)])
def test_settings_match_fp64(setting, m, n):
    x = randn(m, n, dtype=torch.bfloat16) * 4
    t = torch.randint(0, n, (m,), device="cuda")
    if m > 3:
        t[1] = -100  # ignored
        t[2] = n + 5  # out of range: NaN
        t[3] = n - 1  # the last class (the tail when n % 8)
        x[0, -1] = 40.0  # the row's maximum in the last vector
    loss, lse = _run(x, t, setting=setting)
    _check(x, t, loss, lse)
    again, _ = _run(x, t, setting=setting)
    assert torch.equal(torch.nan_to_num(again, 7.0), torch.nan_to_num(loss, 7.0))  # deterministic


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("m,n", [(0, 4096), (1, 1), (1, 7), (769, 769), (769, 4096), (5, 1 << 20)])
def test_default_plan_edge_shapes(dtype, m, n):
    x = randn(m, n, dtype=dtype) * 3
    t = torch.randint(0, n, (m,), device="cuda", dtype=torch.int32)  # int32 targets: widened by the op
    loss, lse = torch.ops.cute_kernels.cross_entropy(x, t, -100)
    assert loss.shape == (m,) and lse.shape == (m,)
    if m:
        _check(x, t.long(), loss, lse)
        poisoned, plse = _run(x, t.long())
        assert torch.equal(poisoned, loss) and torch.equal(plse, lse)


def test_max_in_every_position_of_a_pass():
    """A 4k bf16 row is one pass of 8 vectors per thread: put each row's maximum at a different
    element of a different vector, so every (vector, lane) of the pass's max tree is exercised."""
    m, n = 512, 4096
    x = randn(m, n, dtype=torch.bfloat16)
    cols = (torch.arange(m, device="cuda") * 8 + torch.arange(m, device="cuda") % 8) % n
    x[torch.arange(m, device="cuda"), cols] = 25.0
    t = cols.clone()
    loss, lse = _run(x, t)
    _check(x, t, loss, lse)


def test_empty_leading_passes_and_custom_ignore_index():
    """-inf over the first passes (the state stays (-inf, 0) until a finite logit arrives, then the
    rescale of an empty state is exp(-inf) * 0 = 0); ignore_index a real class index."""
    m, n = 6, 65536
    x = randn(m, n, dtype=torch.bfloat16)
    x[0, : n // 2] = -float("inf")
    x[1, : n - 3] = -float("inf")  # finite only in the last three elements
    x[2] = -float("inf")
    x[2, 5] = 1.5  # one finite logit: loss 0 exactly at its class
    t = torch.tensor([n - 1, n - 2, 5, 7, 7, 0], device="cuda")
    loss, lse = _run(x, t, ignore_index=7)
    assert loss[2].item() == 0.0 and lse[2].item() == 1.5
    assert loss[3].item() == 0.0 and loss[4].item() == 0.0  # ignored (class 7)
    keep = torch.tensor([0, 1, 5], device="cuda")
    ref = F.cross_entropy(x.double()[keep], t[keep], reduction="none")
    assert torch.allclose(loss[keep].double(), ref, rtol=1e-5, atol=1e-3)
    assert torch.allclose(lse[keep].double(), torch.logsumexp(x.double()[keep], -1), rtol=2e-6, atol=1e-3)


def test_row_stride_not_a_vector_multiple():
    """Rows of a wider tensor whose stride is odd: the scalar variant (no 128-bit loads)."""
    base = randn(300, 4099, dtype=torch.bfloat16) * 2
    x = base[:, :4096]
    t = torch.randint(0, 4096, (300,), device="cuda")
    loss = _ops().cross_entropy(x, t, reduction="none")
    _check(x, t, loss, torch.logsumexp(x.double(), -1).float())
