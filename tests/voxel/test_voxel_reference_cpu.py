"""CPU: the torch reference of voxelization and voxel scatter (`cute_kernels.voxel.reference`) against a plain Python
loop over the points written straight from the rules (fp32 arithmetic by numpy scalars), on hand-made clouds: points
exactly on voxel borders, on the range's min and max, out of range, NaN, a range that is not a whole number of
voxels, one point, no point, voxels and points past the limits, ties and NaN for max, and the backward."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from cute_kernels.voxel import reference as R

SIZE = (0.5, 0.5, 1.0)
RANGE = (-2.0, -1.0, -1.0, 2.0, 3.0, 1.0)  # grid 8 x 8 x 2


def _oracle_coord(p, size, rng):
    """(z, y, x) of one point by the rules, or None: fp32 subtraction and division, floor, round half up grid."""
    f = np.float32
    c = []
    for a in range(3):
        lo, hi, s = f(rng[a]), f(rng[a + 3]), f(size[a])
        g = math.floor(float(f(hi - lo) / s) + 0.5)
        v = f(p[a])
        if not (lo <= v < hi):
            return None
        k = math.floor(float(f(v - lo) / s))
        if k >= g:
            return None
        c.append(k)
    return (c[2], c[1], c[0])


def _oracle_hard(points, size, rng, max_points, max_voxels):
    order, members = [], {}
    for i, p in enumerate(points.tolist()):
        c = _oracle_coord(p, size, rng)
        if c is None:
            continue
        if c not in members:
            order.append(c)
            members[c] = []
        members[c].append(i)
    kept = order[:max_voxels]
    return kept, [members[c][:max_points] for c in kept]


def _check_hard(points, size=SIZE, rng=RANGE, max_points=3, max_voxels=50):
    out = R.voxelize(points, size, rng, max_points=max_points, max_voxels=max_voxels)
    kept, rows = _oracle_hard(points, size, rng, max_points, max_voxels)
    assert out.voxels.shape == (max_voxels, max_points, points.shape[1])
    assert int(out.voxel_num) == len(kept)
    want = torch.zeros_like(out.voxels)
    for v, idx in enumerate(rows):
        want[v, : len(idx)] = points[idx]
    assert torch.equal(out.voxels, want)
    coords = torch.zeros(max_voxels, 3, dtype=torch.int32)
    if kept:
        coords[: len(kept)] = torch.tensor(kept, dtype=torch.int32)
    assert torch.equal(out.coords, coords)
    num = torch.zeros(max_voxels, dtype=torch.int32)
    num[: len(rows)] = torch.tensor([len(r) for r in rows], dtype=torch.int32)
    assert torch.equal(out.num_points, num)
    return out


def _below(x: float) -> float:
    return float(np.nextafter(np.float32(x), np.float32(-np.inf)))


def _border_cloud():
    pts = [
        [-2.0, -1.0, -1.0, 1.0],  # the range's min corner: voxel (0, 0, 0)
        [2.0, 0.0, 0.0, 2.0],  # x on the max: out
        [_below(2.0), 0.0, 0.0, 2.5],  # x just below the max, but x - min rounds to 4.0: on the grid's end, out
        [1.9, _below(3.0), 0.5, 3.0],  # y the largest fp32 below the max: the last voxel along y
        [0.1, 0.1, _below(1.0), 3.5],  # z - min = 2 - 2^-24 rounds to 2.0: on the grid's end, out
        [-1.5, -0.5, 0.0, 4.0],  # exactly on voxel borders: the upper voxel
        [_below(-1.5), -0.5, 0.0, 5.0],  # just below a border: the lower voxel
        [0.0, 0.0, _below(-1.0), 6.0],  # z below the min: out
        [math.nan, 0.0, 0.0, 7.0],  # NaN: out
        [-1.5, -0.5, 0.0, 8.0],  # the border voxel again (second point)
        [-2.0, -1.0, -1.0, 9.0],  # the min corner again
        [-1.5, -0.5, 0.0, 10.0],  # third point of the border voxel
        [-1.5, -0.5, 0.0, 11.0],  # fourth: past max_points = 3, dropped
        [math.inf, 0.0, 0.0, 12.0],  # out
        [0.25, 0.75, 0.5, 13.0],
    ]
    return torch.tensor(pts, dtype=torch.float32)


def test_hard_on_borders_and_range_edges():
    out = _check_hard(_border_cloud())
    assert int(out.voxel_num) == 5
    assert out.coords[0].tolist() == [0, 0, 0] and out.num_points[0] == 2
    assert out.coords[1].tolist() == [1, 7, 7]  # just below the max along y
    assert out.num_points[2] == 3  # the border voxel keeps its first 3 of 4 points, in input order
    assert out.voxels[2, :, 3].tolist() == [4.0, 8.0, 10.0]
    assert out.voxels[1, 0, 3] == 3.0 and out.num_points[1] == 1


def test_dynamic_coords():
    pts = _border_cloud()
    c = R.voxelize(pts, SIZE, RANGE, mode="dynamic")
    assert c.dtype == torch.int32 and c.shape == (pts.shape[0], 3)
    for i, p in enumerate(pts.tolist()):
        want = _oracle_coord(p, SIZE, RANGE)
        assert c[i].tolist() == (list(want) if want else [-1, -1, -1]), i


def test_range_not_a_whole_number_of_voxels():
    """0.3 m voxels over 1 m: round(3.33) = 3 voxels, [0, 0.9); points in [0.9, 1) land on coordinate 3 = the grid's
    end and are out of range (mmcv's check); 0.35 m: round(2.86) = 3 voxels, all of [0, 1) inside."""
    pts = torch.tensor([[0.95, 0.1, 0.1], [0.85, 0.1, 0.1], [0.1, 0.1, 0.1]], dtype=torch.float32)
    c = R.voxelize(pts, (0.3, 0.3, 0.3), (0, 0, 0, 1, 1, 1), mode="dynamic")
    assert c.tolist() == [[-1, -1, -1], [0, 0, 2], [0, 0, 0]]
    c = R.voxelize(pts, (0.35, 0.35, 0.35), (0, 0, 0, 1, 1, 1), mode="dynamic")
    assert c.tolist() == [[0, 0, 2], [0, 0, 2], [0, 0, 0]]
    assert R.grid_of((0.3,) * 3, (0, 0, 0, 1, 1, 1))[0] == (3, 3, 3)


@pytest.mark.parametrize("n", [0, 1])
def test_empty_and_one_point(n):
    pts = torch.tensor([[0.1, 0.2, 0.3, 0.4]], dtype=torch.float32)[:n]
    out = _check_hard(pts)
    assert int(out.voxel_num) == n
    assert R.voxelize(pts, SIZE, RANGE, mode="dynamic").shape == (n, 3)


def test_all_out_of_range():
    pts = torch.tensor([[5.0, 0, 0], [0, -9.0, 0], [0, 0, 1.0]], dtype=torch.float32)
    out = _check_hard(pts)
    assert int(out.voxel_num) == 0 and not out.voxels.any()


def _random_cloud(n, seed, c=4):
    g = torch.Generator().manual_seed(seed)
    pts = (
        torch.rand(n, c, generator=g) * torch.tensor([5.0, 5.0, 2.6, 1.0])[:c]
        + torch.tensor([-2.5, -1.5, -1.3, 0.0])[:c]
    )
    pts[: n // 4, 2] = -0.5  # a ground plane: many points on one z
    pts[n // 4 : n // 2, :3] = torch.tensor([0.3, 0.3, 0.3]) + 0.01 * torch.randn(n // 2 - n // 4, 3, generator=g)
    snap = torch.rand(n, generator=g) < 0.2  # points snapped onto voxel borders
    pts[snap, 0] = torch.round(pts[snap, 0] * 2) / 2
    return pts


@pytest.mark.parametrize("max_points,max_voxels", [(3, 50), (1, 4), (100, 1000), (5, 1)])
def test_hard_random_against_oracle(max_points, max_voxels):
    _check_hard(_random_cloud(400, 1), max_points=max_points, max_voxels=max_voxels)


def _oracle_scatter(feats, coords, reduce):
    groups = {}
    for i, c in enumerate(coords.tolist()):
        if min(c) >= 0:
            groups.setdefault(tuple(c), []).append(i)
    keys = sorted(groups)
    out, arg = [], []
    for k in keys:
        rows = feats[groups[k]].double()
        if reduce == "sum":
            out.append(rows.sum(0))
        elif reduce == "mean":
            out.append(rows.mean(0))
        else:
            vals, a = [], []
            for f in range(feats.shape[1]):
                col = rows[:, f].tolist()
                j = next((j for j, x in enumerate(col) if math.isnan(x)), None)
                if j is None:
                    j = max(range(len(col)), key=lambda t: (col[t], -t))
                vals.append(col[j])
                a.append(groups[k][j])
            out.append(torch.tensor(vals, dtype=torch.float64))
            arg.append(a)
    return keys, groups, out, arg


@pytest.mark.parametrize("reduce", ["mean", "max", "sum"])
def test_scatter_against_oracle(reduce):
    g = torch.Generator().manual_seed(3)
    n, f = 300, 5
    coords = torch.randint(0, 4, (n, 3), generator=g, dtype=torch.int32)
    coords[::7] = -1
    coords[5, 1] = -1  # one negative entry ignores the row
    feats = torch.randint(-3, 4, (n, f), generator=g).float()  # small integers: many ties for max
    feats[10, 2] = math.nan
    res, argmax = R.voxel_scatter(feats, coords, reduce)
    keys, groups, out, arg = _oracle_scatter(feats, coords, reduce)
    v = len(keys)
    assert int(res.voxel_num) == v
    assert res.coords[:v].tolist() == [list(k) for k in keys]
    got = res.features[:v].double()
    want = torch.stack(out)
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-6, equal_nan=True)
    for j, k in enumerate(keys):
        assert res.num_points[j] == len(groups[k])
        for i in groups[k]:
            assert res.point2voxel[i] == j
    assert (res.point2voxel[::7] == -1).all() and res.point2voxel[5] == -1
    if reduce == "max":
        assert argmax[:v].tolist() == arg
    else:
        assert argmax is None


@pytest.mark.parametrize("reduce", ["mean", "max", "sum"])
def test_scatter_backward_against_autograd(reduce):
    """The gather backward against autograd through a per-voxel loop (max: the arg-max point only, lowest on ties)."""
    g = torch.Generator().manual_seed(4)
    n, f = 60, 3
    coords = torch.randint(0, 3, (n, 3), generator=g, dtype=torch.int32)
    coords[::9] = -1
    feats = torch.randint(-2, 3, (n, f), generator=g).double().requires_grad_()
    res, argmax = R.voxel_scatter(feats.detach().float(), coords, reduce)
    v = int(res.voxel_num)
    grad = torch.randn(n, f, generator=g, dtype=torch.float64)
    got = R.scatter_backward(grad.float(), res.point2voxel, res.num_points, argmax, reduce)
    keys, groups, _, arg = _oracle_scatter(feats.detach(), coords, reduce)
    total = 0
    for j, k in enumerate(keys):
        rows = feats[groups[k]]
        if reduce == "sum":
            y = rows.sum(0)
        elif reduce == "mean":
            y = rows.mean(0)
        else:
            y = torch.stack([feats[arg[j][c], c] for c in range(f)])
        total = total + (y * grad[j]).sum()
    (want,) = torch.autograd.grad(total, feats)
    assert v == len(keys)
    assert torch.allclose(got.double(), want, atol=1e-6)


def test_scatter_empty_and_all_ignored():
    for n in (0, 4):
        res, _ = R.voxel_scatter(torch.ones(n, 2), torch.full((n, 3), -1, dtype=torch.int32), "mean")
        assert int(res.voxel_num) == 0 and res.features.shape == (n, 2) and (res.point2voxel == -1).all()
        assert R.trim(res).features.shape == (0, 2)


def test_trim():
    out = R.voxelize(_border_cloud(), SIZE, RANGE, max_points=3, max_voxels=50)
    t = R.trim(out)
    assert t.voxels.shape == (5, 3, 4) and t.coords.shape == (5, 3) and t.num_points.shape == (5,)
    with pytest.raises(TypeError, match="trim takes"):
        R.trim([1, 2])


@pytest.mark.parametrize(
    "kwargs,err,match",
    [
        (dict(voxel_size=(0.5, 0.5)), ValueError, "voxel_size must be 3 finite"),
        (dict(voxel_size=(0.5, -1, 1)), ValueError, "voxel_size must be positive"),
        (dict(point_range=(0, 0, 0, 1, -1, 1)), ValueError, "max > min"),
        (dict(voxel_size=(1e-9, 1e-9, 1e-9)), ValueError, "voxels along x"),
        (dict(voxel_size=(1e-3, 1e-3, 1e-3), point_range=(0, 0, 0, 10000, 10000, 10)), ValueError, "more than"),
        (dict(max_points=0), ValueError, "max_points must be a positive int"),
        (dict(mode="soft"), ValueError, "mode must be one of"),
    ],
)
def test_named_errors(kwargs, err, match):
    args = dict(voxel_size=SIZE, point_range=RANGE, max_points=3, max_voxels=10, mode="hard")
    args.update(kwargs)
    with pytest.raises(err, match=match):
        R.voxelize(torch.zeros(4, 3), **args)


def test_named_errors_of_inputs():
    with pytest.raises(TypeError, match="points has dtype float64"):
        R.voxelize(torch.zeros(4, 3, dtype=torch.float64), SIZE, RANGE)
    with pytest.raises(ValueError, match="points must be"):
        R.voxelize(torch.zeros(4, 2), SIZE, RANGE)
    with pytest.raises(TypeError, match="coords has dtype float32"):
        R.voxel_scatter(torch.zeros(4, 2), torch.zeros(4, 3), "mean")
    with pytest.raises(ValueError, match="coords must be"):
        R.voxel_scatter(torch.zeros(4, 2), torch.zeros(5, 3, dtype=torch.int32), "mean")
    with pytest.raises(ValueError, match="reduce must be one of"):
        R.voxel_scatter(torch.zeros(4, 2), torch.zeros(4, 3, dtype=torch.int32), "min")
