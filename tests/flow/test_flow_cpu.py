"""CPU: the flow family's rules and plumbing. The tableaux satisfy their order conditions and the fixed-grid loop
converges at each method's order; the DDIM / DDPM references reproduce the closed forms they come from; the time
embedding's layout; the sampler's loop (stage points, stage times, guidance) equals the reference loop when its
update is the reference's; named errors and fake shapes of the ops."""

import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cute_kernels.flow import reference as R
from cute_kernels.flow.sampler import TABLEAUX, FlowSampler, tableau

ORDER = {"euler": 1, "midpoint": 2, "heun2": 2, "heun3": 3, "rk4": 4}


@pytest.mark.parametrize("method", list(TABLEAUX))
def test_tableau_order_conditions(method):
    stages, b = TABLEAUX[method]
    c = [s[0] for s in stages]
    a = [list(s[1]) + [0.0] * (len(stages) - len(s[1])) for s in stages]
    assert len(b) == len(stages)
    for ci, ai in zip(c, a):  # consistency: c_i = sum_j a_ij
        assert math.isclose(ci, sum(ai), abs_tol=1e-15)
    p = ORDER[method]
    assert math.isclose(sum(b), 1.0)
    if p >= 2:
        assert math.isclose(sum(bi * ci for bi, ci in zip(b, c)), 1 / 2)
    if p >= 3:
        assert math.isclose(sum(bi * ci**2 for bi, ci in zip(b, c)), 1 / 3)
        assert math.isclose(sum(b[i] * a[i][j] * c[j] for i in range(len(b)) for j in range(len(b))), 1 / 6)
    if p >= 4:
        n = range(len(b))
        assert math.isclose(sum(bi * ci**3 for bi, ci in zip(b, c)), 1 / 4)
        assert math.isclose(sum(b[i] * c[i] * a[i][j] * c[j] for i in n for j in n), 1 / 8)
        assert math.isclose(sum(b[i] * a[i][j] * c[j] ** 2 for i in n for j in n), 1 / 12)
        assert math.isclose(sum(b[i] * a[i][j] * a[j][k] * c[k] for i in n for j in n for k in n), 1 / 24)


@pytest.mark.parametrize("method", list(TABLEAUX))
def test_fixed_grid_converges_at_its_order(method):
    """dx/dt = -x + sin(t) (time-dependent, so the stage times matter): halving the step divides the error by ~2^p."""
    x0 = torch.tensor([1.0, -0.5], dtype=torch.float64)
    exact = lambda t: (x0 + 0.5) * math.exp(-t) + 0.5 * (math.sin(t) - math.cos(t))  # noqa: E731

    def f(x, t):
        return -x + torch.sin(t)

    errs = [(R.odeint_fixed(f, x0, n, method, 0.0, 1.0) - exact(1.0)).abs().max().item() for n in (16, 32)]
    rate = math.log2(errs[0] / errs[1])
    assert abs(rate - ORDER[method]) < 0.3, (method, errs, rate)


def test_heun_alias():
    assert tableau("heun") == TABLEAUX["heun2"]
    with pytest.raises(ValueError, match="method must be one of"):
        tableau("dopri5")


def test_flow_update_reference_cfg():
    g = torch.Generator().manual_seed(0)
    x, u, c, k = (torch.randn(5, 3, generator=g, dtype=torch.float64) for _ in range(4))
    out = R.flow_update(x, [(u, c), (k, k)], [0.25, 0.75], 0.1, cfg_scale=2.0)
    torch.testing.assert_close(out, x + 0.1 * (0.25 * (u + 2.0 * (c - u)) + 0.75 * k))


def _consistent(a, seed=0):
    g = torch.Generator().manual_seed(seed)
    x0, eps = (torch.randn(4, 6, generator=g, dtype=torch.float64) for _ in range(2))
    return x0, eps, math.sqrt(a) * x0 + math.sqrt(1 - a) * eps


@pytest.mark.parametrize("prediction", ["epsilon", "sample", "v_prediction"])
def test_ddim_moves_along_the_forward_process(prediction):
    """With the true x0 / eps (as each prediction type encodes them), eta = 0 lands on sqrt(a') x0 + sqrt(1 - a') eps."""
    a, ap = 0.3, 0.6
    x0, eps, x = _consistent(a)
    m = {"epsilon": eps, "sample": x0, "v_prediction": math.sqrt(a) * eps - math.sqrt(1 - a) * x0}[prediction]
    out = R.ddim_step(x, m, torch.tensor(a), torch.tensor(ap), prediction_type=prediction)
    torch.testing.assert_close(out, math.sqrt(ap) * x0 + math.sqrt(1 - ap) * eps)


def test_ddim_eta_one_matches_ddpm_variance():
    """eta = 1 gives DDPM's posterior standard deviation as sigma."""
    a, ap = 0.3, 0.6
    x0, eps, x = _consistent(a, 1)
    z = torch.ones_like(x)
    var = (1 - ap) / (1 - a) * (1 - a / ap)
    noisy = R.ddim_step(x, eps, torch.tensor(a), torch.tensor(ap), eta=1.0, noise=z)
    clean = R.ddim_step(x, eps, torch.tensor(a), torch.tensor(ap), eta=1.0, noise=torch.zeros_like(x))
    torch.testing.assert_close(noisy - clean, torch.full_like(x, math.sqrt(var)))
    ddpm = R.ddpm_step(x, eps, torch.tensor(a), torch.tensor(ap), noise=z) - R.ddpm_step(x, eps, torch.tensor(a),
                                                                                        torch.tensor(ap))
    torch.testing.assert_close(ddpm, torch.full_like(x, math.sqrt(var)))


def test_ddpm_posterior_mean():
    """DDPM's mean is the posterior q(x_{t-1} | x_t, x0) mean: with the true eps it equals the closed form written
    through x0 and eps."""
    a, ap = 0.3, 0.6
    x0, eps, x = _consistent(a, 2)
    beta = 1 - a / ap
    mean = (math.sqrt(ap) * beta * x0 + math.sqrt(1 - beta) * (1 - ap) * x) / (1 - a)
    torch.testing.assert_close(R.ddpm_step(x, eps, torch.tensor(a), torch.tensor(ap)), mean)
    # the last step (alpha_prev = 1) returns the predicted x0
    torch.testing.assert_close(R.ddpm_step(x, eps, torch.tensor(a), torch.tensor(1.0)), x0)


def test_per_row_alphas_and_clip():
    a = torch.tensor([0.2, 0.5], dtype=torch.float64)
    x0, eps, _ = _consistent(0.5)
    x = x0[:2]
    out = R.ddim_step(x, eps[:2], a, torch.ones(2, dtype=torch.float64), clip_sample=0.5)
    for r in range(2):
        row = R.ddim_step(x[r:r + 1], eps[r:r + 1], a[r], torch.tensor(1.0, dtype=torch.float64), clip_sample=0.5)
        torch.testing.assert_close(out[r:r + 1], row)
    assert out.abs().max() <= 0.5


def test_timestep_embedding_layout():
    t = torch.tensor([0.0, 1.0, 500.0])
    e = R.timestep_embedding(t, 7, flip_sin_to_cos=True, downscale_freq_shift=0.0)
    assert e.shape == (3, 7) and torch.all(e[:, 6] == 0)
    half = 3
    f = torch.exp(-math.log(10000.0) * torch.arange(half) / half)
    torch.testing.assert_close(e[:, :3], torch.cos(t[:, None] * f))
    torch.testing.assert_close(e[:, 3:6], torch.sin(t[:, None] * f))
    e0 = R.timestep_embedding(torch.zeros(2), 8)
    assert torch.equal(e0[:, :4], torch.zeros(2, 4)) and torch.equal(e0[:, 4:], torch.ones(2, 4))


@pytest.mark.parametrize("method,cfg", [("euler", None), ("midpoint", None), ("heun3", 1.5), ("rk4", None),
                                        ("rk4", 2.0)])
def test_sampler_loop_is_the_reference_loop(monkeypatch, method, cfg):
    """The sampler's stage points, stage times and guidance pairs: its loop with the reference update equals the
    reference loop exactly (fp64 on CPU)."""
    from cute_kernels.flow import ops

    monkeypatch.setattr(ops, "flow_update", R.flow_update)
    seen = []

    def v(x, t):
        seen.append(float(t))
        base = torch.cos(3 * t) * x + t
        return (base, 0.5 * base + x) if cfg is not None else base

    s = FlowSampler(v, 5, method, cfg_scale=cfg, t0=0.2, t1=1.0, graph=False)
    s.time_dtype = torch.float64
    x0 = torch.tensor([[0.3, -1.2, 2.0]], dtype=torch.float64)
    got = s.loop(x0)
    times = list(seen)
    seen.clear()
    ref = R.odeint_fixed(v, x0, 5, method, 0.2, 1.0, cfg)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    assert times == pytest.approx(seen, abs=1e-12)


def _t(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="cuda")


def test_fake_shapes():
    from cute_kernels.flow.ops import _ddim_fake, _ddpm_fake, _embedding_fake, _flow_update_fake

    with FakeTensorMode(allow_non_fake_inputs=True):
        x = _t(2, 50, 32)
        assert _flow_update_fake(x, [_t(2, 50, 32, dtype=torch.bfloat16)], [1.0], 0.1).shape == (2, 50, 32)
        assert _flow_update_fake(x, [x, x, x, x], [1.0, 2.0], 0.1, 3.0).dtype == torch.float32
        assert _ddim_fake(x, x, _t(1), _t(2)).shape == (2, 50, 32)
        assert _ddpm_fake(x, x, _t(2), _t(1), x, "v_prediction", 1.0).shape == (2, 50, 32)
        assert _embedding_fake(_t(3), 9, dtype=torch.bfloat16).shape == (3, 9)


@pytest.mark.parametrize("call,exc,match", [
    (lambda f, t: f["update"](t(4), [t(4), t(4)], [1.0], 0.1), ValueError, "coeffs has 1 entries but ks has 2"),
    (lambda f, t: f["update"](t(4), [t(5)], [1.0], 0.1), ValueError, r"ks\[0\] has shape \(5,\)"),
    (lambda f, t: f["update"](t(4), [t(4), t(4, dtype=torch.float16)], [1.0, 1.0], 0.1), TypeError,
     r"ks\[1\] has dtype"),
    (lambda f, t: f["ddim"](t(4), t(4), t(1), t(1), 0.5), ValueError, "noise is required when eta > 0"),
    (lambda f, t: f["ddim"](t(4, 2), t(4, 2), t(3), t(1)), ValueError, "alpha_t must hold one value or one per"),
    (lambda f, t: f["ddpm"](t(4), t(4), t(1), t(1), None, "x0"), ValueError, "prediction_type must be one of"),
    (lambda f, t: f["ddpm"](t(4), t(4, dtype=torch.bfloat16), t(1), t(1)), ValueError, "model_output"),
    (lambda f, t: f["ddpm"](t(4), t(4), t(1), t(1), None, "epsilon", -1.0), ValueError, "clip_sample must be"),
    (lambda f, t: f["emb"](t(2, 2), 8), ValueError, "t must be 1-D"),
    (lambda f, t: f["emb"](t(2), 2), ValueError, "downscale_freq_shift"),
    (lambda f, t: f["emb"](t(2), 8, dtype=torch.int32), TypeError, "dtype must be"),
])
def test_named_errors(call, exc, match):
    from cute_kernels.flow import ops

    fns = {"update": ops._flow_update_fake, "ddim": ops._ddim_fake, "ddpm": ops._ddpm_fake,
           "emb": ops._embedding_fake}
    with FakeTensorMode(allow_non_fake_inputs=True), pytest.raises(exc, match=match):
        call(fns, _t)


def test_public_errors():
    import cute_kernels as ck

    with pytest.raises(ValueError, match="x must be on a CUDA device"):
        ck.flow_update(torch.zeros(3), [torch.zeros(3)], [1.0], 0.1)
    with pytest.raises(TypeError, match=r"ks\[0\] must be an \(uncond, cond\) pair"):
        ck.flow_update(torch.zeros(3), [torch.zeros(3)], [1.0], 0.1, cfg_scale=2.0)
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        FlowSampler(lambda x, t: x, 0)
    with pytest.raises(ValueError, match="x0 must be a CUDA tensor"):
        FlowSampler(lambda x, t: x, 2)(torch.zeros(3))
