"""GPU: voxelize (hard, dynamic) and voxel_scatter against the torch reference (`cute_kernels.voxel.reference`) run on
the same GPU: random and nuScenes-like clouds (ground plane, dense clusters), points exactly on voxel borders and on
the range's max, NaN, all out of range, one point, empty input, limits that drop voxels and points; outputs
NaN-poisoned so that any row left unwritten fails; bit-identical reruns; non-contiguous and misaligned inputs (the
scalar variants); autograd; torch.compile; CUDA-graph capture."""

import math

import pytest
import torch

from cute_kernels.voxel import reference as R
from tests.helpers import poison_empty

pytestmark = pytest.mark.gpu

ck = pytest.importorskip("cute_kernels")

SIZE = (0.2, 0.2, 0.5)
RANGE = (-2.0, -2.0, -1.0, 2.0, 2.0, 1.0)  # a 20 x 20 x 4 grid
NUSC_SIZE, NUSC_RANGE = (0.1, 0.1, 0.2), (-51.2, -51.2, -5.0, 51.2, 51.2, 3.0)


def _cloud(n, c=4, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    pts = torch.rand(n, c, generator=g, device="cuda") * 4.6 - 2.3
    if n >= 8:
        pts[: n // 4, 2] = -0.5  # a ground plane
        pts[n // 4 : n // 3, :3] = torch.tensor([0.3, 0.3, 0.3], device="cuda")  # one dense voxel
        k = n // 3
        pts[k : k + n // 10, 0] = torch.round(pts[k : k + n // 10, 0] * 5) / 5  # x on voxel borders
        pts[k : k + 3, :3] = torch.tensor([2.0, 0.0, 0.0], device="cuda")  # x on the range's max: out
        pts[k + 3, 0] = math.nan
    return pts


def _nusc(n, c=5, seed=0):
    from cute_kernels.voxel.bench import lidar_cloud

    return lidar_cloud(n, c, seed)


def _same(got, want):
    for a, b in zip(got, want):
        assert a.shape == b.shape and torch.equal(a, b)


@pytest.mark.parametrize("n", [0, 1, 7, 1000, 4097, 100_003])
@pytest.mark.parametrize("c", [3, 4, 5])
def test_dynamic_against_reference(n, c, monkeypatch):
    poison_empty(monkeypatch)
    pts = _cloud(n, c, seed=n)
    got = ck.voxelize(pts, SIZE, RANGE, mode="dynamic")
    assert torch.equal(got, R.point_coords(pts, SIZE, RANGE))


@pytest.mark.parametrize(
    "n,max_points,max_voxels",
    [(1, 5, 10), (7, 2, 3), (1000, 5, 2000), (4097, 3, 100), (100_003, 35, 1600), (100_003, 1, 1), (30_000, 200, 50)],
)
@pytest.mark.parametrize("c", [4, 5])
def test_hard_against_reference(n, max_points, max_voxels, c, monkeypatch):
    poison_empty(monkeypatch)
    pts = _cloud(n, c, seed=n + c)
    got = ck.voxelize(pts, SIZE, RANGE, max_points, max_voxels)
    _same(got, R.voxelize_hard(pts, SIZE, RANGE, max_points, max_voxels))
    assert torch.isfinite(got.voxels).all()


def test_hard_empty_and_all_out_of_range():
    for pts in (torch.zeros(0, 4, device="cuda"), torch.full((5000, 4), 7.0, device="cuda")):
        got = ck.voxelize(pts, SIZE, RANGE, 4, 30)
        assert int(got.voxel_num) == 0 and not got.voxels.any() and not got.coords.any() and not got.num_points.any()
        assert ck.voxelize(pts, SIZE, RANGE, mode="dynamic").shape == (pts.shape[0], 3)


@pytest.mark.parametrize("n", [300_000, 2_000_000])
def test_nuscenes_like(n):
    pts = _nusc(n)
    _same(ck.voxelize(pts, NUSC_SIZE, NUSC_RANGE, 10, 90000), R.voxelize_hard(pts, NUSC_SIZE, NUSC_RANGE, 10, 90000))
    coords = ck.voxelize(pts, NUSC_SIZE, NUSC_RANGE, mode="dynamic")
    assert torch.equal(coords, R.point_coords(pts, NUSC_SIZE, NUSC_RANGE))
    feats = torch.randn(n, 64, device="cuda")
    _check_scatter(feats, coords, "max")
    _check_scatter(feats, coords, "mean")


def test_inputs_in_awkward_layouts():
    """A column slice (rows not 16-byte vectors: the scalar variants), a transposed copy, a misaligned base."""
    base = _cloud(3000, 8, seed=5)
    for pts in (base[:, :5], base.t().contiguous().t(), base.view(-1)[1 : 1 + 3000 * 4].view(3000, 4)):
        _same(ck.voxelize(pts, SIZE, RANGE, 6, 500), R.voxelize_hard(pts.contiguous(), SIZE, RANGE, 6, 500))
        assert torch.equal(ck.voxelize(pts, SIZE, RANGE, mode="dynamic"), R.point_coords(pts, SIZE, RANGE))
    feats = torch.randn(3000, 9, device="cuda")[:, 1:]
    coords = ck.voxelize(base[:, :4].contiguous(), SIZE, RANGE, mode="dynamic")
    _check_scatter(feats, coords, "sum")
    _check_scatter(feats, coords.long(), "max")


def test_deterministic():
    pts = _nusc(300_000, 4, seed=3)
    a = ck.voxelize(pts, NUSC_SIZE, NUSC_RANGE, 10, 30000)
    b = ck.voxelize(pts, NUSC_SIZE, NUSC_RANGE, 10, 30000)
    _same(a, b)
    coords = ck.voxelize(pts, NUSC_SIZE, NUSC_RANGE, mode="dynamic")
    feats = torch.randn(pts.shape[0], 32, device="cuda")
    for reduce in ("mean", "max", "sum"):
        x, y = ck.voxel_scatter(feats, coords, reduce), ck.voxel_scatter(feats, coords, reduce)
        v = int(x.voxel_num)
        assert torch.equal(x.features[:v], y.features[:v]) and torch.equal(x.point2voxel, y.point2voxel)


def _check_scatter(feats, coords, reduce):
    got = ck.voxel_scatter(feats, coords, reduce)
    want, want_arg = R.voxel_scatter(feats, coords, reduce)
    v = int(want.voxel_num)
    assert int(got.voxel_num) == v
    assert torch.equal(got.coords[:v], want.coords[:v]) and torch.equal(got.point2voxel, want.point2voxel)
    assert torch.equal(got.num_points[:v], want.num_points[:v])
    g, w = got.features[:v].float(), want.features[:v].float()
    if reduce == "max":
        assert torch.equal(g.isnan(), w.isnan()) and torch.equal(g[~g.isnan()], w[~w.isnan()])
    else:
        # fp32 sums in another order (runs of 128 points, then the runs in order; torch's index_add in atomic order):
        # bounded by the magnitudes summed times the points' count times fp32's epsilon; 2^-13 of the magnitudes
        # covers voxels of thousands of points; plus one rounding of a 16-bit output
        mag = R.voxel_scatter(feats.float().abs(), coords, reduce)[0].features[:v]
        ulp16 = 0.0 if feats.dtype == torch.float32 else (2.0**-8 if feats.dtype == torch.bfloat16 else 2.0**-11)
        tol = 2.0**-13 * mag + ulp16 * w.abs() + 1e-30
        ok = ((g - w).abs() <= tol) | (g.isnan() & w.isnan())
        assert ok.all(), (g[~ok][:5], w[~ok][:5])
    return got, want_arg


@pytest.mark.parametrize("reduce", ["mean", "max", "sum"])
@pytest.mark.parametrize("f", [1, 3, 4, 64, 130])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_scatter_against_reference(reduce, f, dtype, monkeypatch):
    poison_empty(monkeypatch)
    pts = _cloud(20_000, 4, seed=f)
    coords = ck.voxelize(pts, SIZE, RANGE, mode="dynamic")
    feats = torch.randint(-8, 9, (pts.shape[0], f), device="cuda").to(dtype)  # ties for max
    feats[5, 0] = math.nan
    _check_scatter(feats, coords, reduce)


@pytest.mark.parametrize("n", [1, 2, 129, 100_000])
def test_scatter_one_dense_voxel(n):
    """Every point in one voxel: the segment crosses every run, the fix-up combines them in order."""
    coords = torch.tensor([[3, 1, 2]], dtype=torch.int32, device="cuda").expand(n, 3).contiguous()
    feats = torch.randn(n, 16, device="cuda")
    for reduce in ("mean", "max", "sum"):
        _check_scatter(feats, coords, reduce)


def test_scatter_edges():
    f = torch.randn(10, 4, device="cuda")
    s = ck.voxel_scatter(f, torch.full((10, 3), -1, dtype=torch.int32, device="cuda"), "mean")
    assert int(s.voxel_num) == 0 and (s.point2voxel == -1).all()
    s = ck.voxel_scatter(f[:0], torch.zeros(0, 3, dtype=torch.int32, device="cuda"), "max")
    assert int(s.voxel_num) == 0 and s.features.shape == (0, 4)
    big = torch.tensor([[0, 0, 0], [2**30, 2**30, 2**30]], dtype=torch.int32, device="cuda")
    s = ck.voxel_scatter(torch.randn(2, 4, device="cuda"), big, "sum")
    assert int(s.voxel_num) == -1  # the bounding box overflows int32 keys
    with pytest.raises(ValueError, match="bounding box"):
        ck.voxel_trim(s)


@pytest.mark.parametrize("reduce", ["mean", "max", "sum"])
def test_scatter_autograd(reduce):
    pts = _cloud(5000, 4, seed=9)
    coords = ck.voxelize(pts, SIZE, RANGE, mode="dynamic")
    feats = torch.randint(-3, 4, (5000, 8), device="cuda").float().requires_grad_()
    s = ck.voxel_scatter(feats, coords, reduce)
    v = int(s.voxel_num)
    g = torch.randn(v, 8, device="cuda")
    (s.features[:v] * g).sum().backward()
    res, arg = R.voxel_scatter(feats.detach(), coords, reduce)
    gpad = torch.zeros(5000, 8, device="cuda")
    gpad[:v] = g
    want = R.scatter_backward(gpad, res.point2voxel, res.num_points, arg, reduce)
    assert torch.allclose(feats.grad, want, rtol=1e-6, atol=1e-6)


def test_torch_compile():
    pts = _cloud(3000, 4, seed=11)
    feats = torch.randn(3000, 8, device="cuda", requires_grad=True)

    def fn(p, f):
        v = ck.voxelize(p, SIZE, RANGE, 5, 400)
        c = ck.voxelize(p, SIZE, RANGE, mode="dynamic")
        s = ck.voxel_scatter(f, c, "mean")
        return v.voxels.sum() + s.features[:10].sum(), v.voxel_num, s.voxel_num

    out, n1, n2 = torch.compile(fn, fullgraph=True)(pts, feats)
    ref, m1, m2 = fn(pts, feats)
    assert torch.equal(n1, m1) and torch.equal(n2, m2) and torch.allclose(out, ref)
    out.backward()
    assert feats.grad is not None and torch.isfinite(feats.grad).all()


def test_graph_capture():
    pts = _cloud(4000, 4, seed=12)
    feats = torch.randn(4000, 16, device="cuda")

    def step():
        v = ck.voxelize(pts, SIZE, RANGE, 5, 400)
        s = ck.voxel_scatter(feats, ck.voxelize(pts, SIZE, RANGE, mode="dynamic"), "max")
        return v, s

    step()  # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        v, s = step()
    pts.copy_(_cloud(4000, 4, seed=13))
    g.replay()
    torch.cuda.synchronize()
    _same(v, R.voxelize_hard(pts, SIZE, RANGE, 5, 400))
    n = int(s.voxel_num)
    want, _ = R.voxel_scatter(feats, R.point_coords(pts, SIZE, RANGE), "max")
    assert n == int(want.voxel_num) and torch.equal(s.features[:n], want.features[:n])
