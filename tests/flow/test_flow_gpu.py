"""GPU: the flow ops against their fp64 references (every element written, edge sizes, awkward layouts, mixed
dtypes, guidance, chained terms), autograd of the update, torch.compile and CUDA-graph capture, the time embedding,
and the sampler: each method against the reference loop and torchdiffeq, one graph replay equal to the eager loop,
a velocity function that cannot be captured, and the example policy against its plain-torch twin."""


import pytest
import torch

from cute_kernels.flow import reference as R
from tests.helpers import EPS, poison_empty, randn

pytestmark = pytest.mark.gpu


def _bound(ref, dtype, ulps=1.0):
    """One rounding to `dtype` plus fp32 arithmetic: |err| <= ulps * eps(dtype) * |ref| + a floor."""
    return ulps * max(EPS[dtype], 2.0**-22) * ref.abs() + 1e-6


def _check(out, ref, dtype, ulps=1.0):
    assert out.dtype == dtype and out.shape == ref.shape
    assert torch.isfinite(out).all(), "unwritten (NaN) elements"
    err = (out.double() - ref).abs()
    bad = err > _bound(ref, dtype, ulps)
    assert not bad.any(), f"{bad.sum().item()} elements off, max err {err.max().item():.3g}"


@pytest.mark.parametrize("n", [1, 7, 769, 5125, 2**20 + 3])
@pytest.mark.parametrize("xdt,kdt", [(torch.float32, torch.float32), (torch.float32, torch.bfloat16),
                                     (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32)])
@pytest.mark.parametrize("terms,cfg", [(1, None), (2, None), (4, None), (5, None), (1, 3.0), (4, 1.5)])
def test_update(monkeypatch, n, xdt, kdt, terms, cfg):
    import cute_kernels as ck

    poison_empty(monkeypatch)
    x = randn(n, dtype=xdt)
    ks = [randn(n, dtype=kdt) for _ in range(terms * (2 if cfg else 1))]
    kk = ks if cfg is None else [tuple(ks[2 * i:2 * i + 2]) for i in range(terms)]
    co = [0.125, 0.375, -0.5, 0.125, 2.0][:terms]
    out = ck.flow_update(x, kk, co, 0.1, cfg)
    kd = [k.double() for k in ks]
    ref = R.flow_update(x.double(), kd if cfg is None else [tuple(kd[2 * i:2 * i + 2]) for i in range(terms)], co, 0.1,
                        cfg)
    _check(out, ref, xdt)  # past four terms too: the passes share an fp32 partial sum, one rounding


def test_update_layouts_and_zero_terms():
    import cute_kernels as ck

    x = randn(64, 48, dtype=torch.float32)
    k = randn(48, 64, dtype=torch.bfloat16).t()  # transposed
    k2 = randn(64 * 48 + 1, dtype=torch.bfloat16)[1:].view(64, 48)  # 2-byte offset: not 16-byte aligned
    out = ck.flow_update(x, [k, k2, k], [0.5, 0.25, 0.0], 0.2)
    _check(out, R.flow_update(x.double(), [k.double(), k2.double()], [0.5, 0.25], 0.2), torch.float32)
    assert torch.equal(ck.flow_update(x, [k], [0.0], 0.1), x)
    assert ck.flow_update(torch.empty(0, 3, device="cuda"), [torch.empty(0, 3, device="cuda")], [1.0], 0.1).shape == (0, 3)


def test_update_autograd():
    import cute_kernels as ck

    x = randn(33, 8, dtype=torch.float32).requires_grad_()
    u, c = (randn(33, 8, dtype=torch.float32).requires_grad_() for _ in range(2))
    k = randn(33, 8, dtype=torch.float32).requires_grad_()
    g = randn(33, 8, dtype=torch.float32)
    out = ck.flow_update(x, [(u, c), (k, k.detach())], [0.5, 0.25], 0.1, cfg_scale=2.0)
    grads = torch.autograd.grad(out, (x, u, c, k), g)
    ref = R.flow_update(x, [(u, c), (k, k.detach())], [0.5, 0.25], 0.1, cfg_scale=2.0)
    for a, b in zip(grads, torch.autograd.grad(ref, (x, u, c, k), g)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_update_compile_and_graph():
    import cute_kernels as ck

    x, k1, k2 = (randn(4, 1000, dtype=torch.float32) for _ in range(3))
    f = torch.compile(lambda x, a, b: ck.flow_update(x, [a, b], [0.5, 0.5], 0.1) * 2, fullgraph=True)
    torch.testing.assert_close(f(x, k1, k2), 2 * ck.flow_update(x, [k1, k2], [0.5, 0.5], 0.1))
    ck.flow_update(x, [k1, k2], [0.5, 0.5], 0.1)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = ck.flow_update(x, [k1, k2], [0.5, 0.5], 0.1)
    x.add_(1.0)
    g.replay()
    torch.testing.assert_close(y, ck.flow_update(x, [k1, k2], [0.5, 0.5], 0.1))


@pytest.mark.parametrize("kind", ["ddim", "ddpm"])
@pytest.mark.parametrize("prediction", ["epsilon", "sample", "v_prediction"])
@pytest.mark.parametrize("clip", [None, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_diffusion_steps(monkeypatch, kind, prediction, clip, dtype):
    import cute_kernels as ck

    poison_empty(monkeypatch)
    shape = (3, 4, 17, 9)  # rows of 612 elements
    x, m, z = (randn(*shape, dtype=dtype) for _ in range(3))
    for at, ap in ((torch.tensor([0.3], device="cuda"), torch.tensor([0.55], device="cuda")),
                   (torch.tensor([0.2, 0.5, 0.9], device="cuda"), torch.tensor(0.95, device="cuda")),
                   (0.4, 1.0)):
        for noise in (None, z):
            if kind == "ddim":
                eta = 0.0 if noise is None else 0.7
                out = ck.ddim_step(x, m, at, ap, eta, noise, prediction, clip)
                ref = R.ddim_step(x.double(), m.double(), _d(at), _d(ap), eta, _n(noise), prediction, clip)
            else:
                out = ck.ddpm_step(x, m, at, ap, noise, prediction, clip)
                ref = R.ddpm_step(x.double(), m.double(), _d(at), _d(ap), _n(noise), prediction, clip)
            # fp32: the coefficients' own fp32 rounding (a few ulps of the inputs' scale) on top of the output's
            _check(out, ref, dtype, ulps=1.0 if dtype != torch.float32 else 64.0)


def _d(a):
    return a.double() if isinstance(a, torch.Tensor) else a


def _n(z):
    return None if z is None else z.double()


def test_diffusion_graph_replays_new_alphas():
    import cute_kernels as ck

    x, m = randn(2, 1000, dtype=torch.float32), randn(2, 1000, dtype=torch.float32)
    at, ap = torch.tensor([0.3], device="cuda"), torch.tensor([0.5], device="cuda")
    ck.ddim_step(x, m, at, ap)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = ck.ddim_step(x, m, at, ap)
    at.fill_(0.6)
    ap.fill_(0.8)
    g.replay()
    _check(y, R.ddim_step(x.double(), m.double(), 0.6, 0.8), torch.float32, ulps=64.0)


@pytest.mark.parametrize("dim,flip,shift,dtype", [(256, False, 1.0, torch.float32), (320, True, 0.0, torch.float32),
                                                   (7, False, 1.0, torch.float32), (1, False, 1.0, torch.float32),
                                                   (128, True, 0.0, torch.bfloat16)])
def test_timestep_embedding(monkeypatch, dim, flip, shift, dtype):
    import cute_kernels as ck

    poison_empty(monkeypatch)
    t = torch.cat([torch.rand(61, device="cuda") * 1000, torch.tensor([0.0, 1.0, 999.0], device="cuda")])
    out = ck.timestep_embedding(t, dim, flip_sin_to_cos=flip, downscale_freq_shift=shift, dtype=dtype)
    ref64 = R.timestep_embedding(t.double(), dim, flip_sin_to_cos=flip, downscale_freq_shift=shift)
    ref32 = R.timestep_embedding(t, dim, flip_sin_to_cos=flip, downscale_freq_shift=shift)
    assert out.shape == (64, dim) and out.dtype == dtype and torch.isfinite(out).all()
    # torch's own fp32 result is off fp64 by the argument's rounding (|arg| * 2^-23 and more); ours may be off by
    # twice that, and by one rounding to a 16-bit dtype
    tol = 2 * (ref32.double() - ref64).abs().max().item() + 1e-6 + EPS[dtype]
    assert (out.double() - ref64).abs().max().item() <= tol
    ti = torch.arange(8, device="cuda")  # integer times
    torch.testing.assert_close(ck.timestep_embedding(ti, 16), R.timestep_embedding(ti, 16), rtol=0, atol=2e-6)


def _velocity(x, t):
    return torch.cos(3 * t) * x + t * torch.sin(x)


@pytest.mark.parametrize("method", ["euler", "midpoint", "heun2", "heun3", "rk4"])
def test_sampler_methods(method):
    import cute_kernels as ck
    from cute_kernels.flow.sampler import FlowSampler

    x0 = randn(3, 50, 32, dtype=torch.float32)
    s = FlowSampler(_velocity, 8, method)
    out = s(x0)
    assert not s.graph_error, s.graph_error
    eager = FlowSampler(_velocity, 8, method, graph=False)(x0)
    assert torch.equal(out, eager)  # the replay runs the loop's very kernels
    ref = R.odeint_fixed(_velocity, x0.double(), 8, method)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    try:
        import torchdiffeq
    except ImportError:
        return
    grid = torch.linspace(0.0, 1.0, 9, device="cuda", dtype=torch.float64)
    try:
        td = torchdiffeq.odeint(lambda t, x: _velocity(x, t), x0.double(), grid, method=method)[-1]
    except ValueError:  # a method this torchdiffeq lacks
        pytest.skip(f"torchdiffeq has no {method}")
    torch.testing.assert_close(out.double(), td, rtol=1e-5, atol=1e-5)
    s2 = ck.sample_flow(_velocity, x0, 8, method)
    assert torch.equal(s2, out)


def test_sampler_cfg_and_fallback():
    from cute_kernels.flow.sampler import FlowSampler

    x0 = randn(2, 50, 32, dtype=torch.float32)

    def pair(x, t):
        return _velocity(x, t), 0.5 * x - t

    out = FlowSampler(pair, 6, "rk4", cfg_scale=2.5)(x0)
    ref = R.odeint_fixed(pair, x0.double(), 6, "rk4", cfg_scale=2.5)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)

    def syncing(x, t):
        return _velocity(x, t) * (1.0 if x.abs().max().item() < 1e30 else 0.0)  # a host sync: not capturable

    s = FlowSampler(syncing, 4, "euler")
    with pytest.warns(UserWarning, match="capture failed"):
        out = s(x0)
    assert s.graph_error
    torch.testing.assert_close(out.double(), R.odeint_fixed(_velocity, x0.double(), 4, "euler"), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("b", [1, 16])
def test_policy_against_torch_twin(b):
    from cute_kernels.flow.policy import ActionFlowNet, TorchActionFlowNet
    from cute_kernels.flow.sampler import FlowSampler

    net = ActionFlowNet()
    twin = TorchActionFlowNet(net)
    x = randn(b, 50, 32, dtype=torch.float32)
    t = torch.tensor(0.3, device="cuda")
    with torch.no_grad():
        v, vt = net(x, t), twin(x, t)
    assert v.shape == (b, 50, 32) and v.dtype == torch.float32
    assert (v - vt).norm() / vt.norm() < 2e-2  # bf16 network, roundings placed differently
    s = FlowSampler(net, 10, "euler")
    out = s(x)
    assert not s.graph_error, s.graph_error
    with torch.no_grad():
        ref = R.odeint_fixed(twin, x, 10, "euler")
    assert (out - ref).norm() / ref.norm() < 2e-2
