"""Voxelization and voxel scatter in plain torch: the rules the kernels implement, the reference their tests compare
against, and the ops' CPU fallback.

The rules (mmcv's, written out):
- a point (x, y, z, ...) is in range iff min <= p < max on all three axes of `point_range` (x_min, y_min, z_min,
  x_max, y_max, z_max);
- its voxel coordinate is floor((p - min) / size) per axis, in fp32 (one IEEE subtraction, one IEEE division);
- the grid is round((max - min) / size) voxels per axis (fp32 quotient, rounded half away from zero as C's `round`);
  a coordinate that still lands on or past the grid's end (a range that is not a whole number of voxels, or a
  quotient rounded up onto the grid's end just below max) is out of range, as in mmcv's kernels;
- coordinates are reported as (z, y, x) int32; the linear voxel index is (z gy + y) gx + x.

Hard mode: voxels are numbered in order of their first in-range point; each keeps its first `max_points` points in
input order; voxels past `max_voxels` are dropped with their points; rows no voxel fills are zero. The outputs are
sized for the worst case and the count is a device tensor (`HardVoxels.voxel_num`). Dynamic mode: each point's
(z, y, x), (-1, -1, -1) when out of range.

Scatter: the points of each voxel reduced (mean, max or sum, fp32 accumulation, one rounding to the features'
dtype); voxels in ascending linear-index order (torch.unique's sorted order, as mmcv's DynamicScatter); rows whose
coordinates have a negative entry are ignored. max keeps, per voxel and feature, the lowest point index attaining the
maximum (a NaN is the maximum, its first occurrence the arg-max), where max's gradient goes.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

MODES = ("hard", "dynamic")
REDUCES = ("mean", "max", "sum")
AXIS_LIMIT = 2**24  # voxels an axis: below this the fp32 quotient compares exactly with the integer grid
KEY_LIMIT = 2**31 - 1  # voxels in the grid: linear indices and the sort's "out of range" key fit int32


class HardVoxels(NamedTuple):
    voxels: torch.Tensor  # (max_voxels, max_points, C) points' dtype; rows past each voxel's points zero
    coords: torch.Tensor  # (max_voxels, 3) int32 (z, y, x); zero past the count
    num_points: torch.Tensor  # (max_voxels,) int32; zero past the count
    voxel_num: torch.Tensor  # (1,) int32: voxels kept, min(voxels, max_voxels), on the device


class VoxelScatter(NamedTuple):
    features: torch.Tensor  # (N, F) features' dtype: voxel v's reduction in row v < voxel_num (later rows unspecified)
    coords: torch.Tensor  # (N, 3) int32 (z, y, x) of voxel v in row v < voxel_num, ascending linear index
    point2voxel: torch.Tensor  # (N,) int32: each point's voxel row, -1 for an ignored point
    num_points: torch.Tensor  # (N,) int32: points of voxel v in row v < voxel_num
    voxel_num: torch.Tensor  # (1,) int32: distinct voxels, on the device


def _floats(name: str, value, n: int) -> tuple[float, ...]:
    try:
        vals = tuple(float(v) for v in (value.tolist() if isinstance(value, torch.Tensor) else value))
    except TypeError:
        raise TypeError(f"{name} must be a sequence of {n} numbers, got {type(value).__name__}") from None
    if len(vals) != n or not all(math.isfinite(v) for v in vals):
        raise ValueError(f"{name} must be {n} finite numbers, got {vals}")
    return vals


def grid_of(voxel_size, point_range) -> tuple[tuple[int, int, int], tuple[float, ...], tuple[float, ...]]:
    """((gx, gy, gz), voxel_size, point_range) after the named checks: sizes > 0, max > min, every axis at least
    one voxel and below `AXIS_LIMIT`, the grid below `KEY_LIMIT` voxels. The grid is round((max - min) / size) of the
    fp32 values, half away from zero."""
    size = _floats("voxel_size", voxel_size, 3)
    rng = _floats("point_range", point_range, 6)
    if not all(s > 0 for s in size):
        raise ValueError(f"voxel_size must be positive on every axis, got {size}")
    if not all(rng[i + 3] > rng[i] for i in range(3)):
        raise ValueError(f"point_range must be (x_min, y_min, z_min, x_max, y_max, z_max) with max > min, got {rng}")
    f32 = np.float32  # fp32 arithmetic on the host, no tensors: the fake implementations call this while tracing
    q = [(f32(rng[a + 3]) - f32(rng[a])) / f32(size[a]) for a in range(3)]
    grid = tuple(int(math.floor(float(v) + 0.5)) for v in q)
    for axis, g in zip("xyz", grid):
        if not 1 <= g < AXIS_LIMIT:
            raise ValueError(
                f"the grid has {g} voxels along {axis} (round((max - min) / size)); 1 to {AXIS_LIMIT - 1} are supported"
            )
    if grid[0] * grid[1] * grid[2] > KEY_LIMIT:
        raise ValueError(f"the grid {grid[0]} x {grid[1]} x {grid[2]} has more than {KEY_LIMIT} voxels")
    return grid, size, rng


def check_points(points) -> None:
    if not isinstance(points, torch.Tensor):
        raise TypeError(f"points must be a torch.Tensor, got {type(points).__name__}")
    if points.dtype != torch.float32:
        raise TypeError(f"points has dtype {str(points.dtype).replace('torch.', '')}; supported: float32")
    if points.dim() != 2 or points.shape[1] < 3:
        raise ValueError(f"points must be (N, C >= 3) with x, y, z first, got shape {tuple(points.shape)}")
    if points.numel() >= 2**31:
        raise ValueError(f"points has {points.numel()} elements; fewer than 2^31 are supported")


def check_limits(max_points, max_voxels, channels: int) -> tuple[int, int]:
    for name, v in (("max_points", max_points), ("max_voxels", max_voxels)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if max_voxels * max_points * channels >= 2**31:
        raise ValueError(
            f"max_voxels x max_points x C = {max_voxels} x {max_points} x {channels} must stay below 2^31 elements"
        )
    return max_points, max_voxels


def point_coords(points: torch.Tensor, voxel_size, point_range) -> torch.Tensor:
    """Each point's (z, y, x) voxel coordinate as int32, (-1, -1, -1) when out of range (dynamic voxelization)."""
    grid, size, rng = grid_of(voxel_size, point_range)
    xyz = points[:, :3].float()
    dev = points.device
    lo = torch.tensor(rng[:3], dtype=torch.float32, device=dev)
    hi = torch.tensor(rng[3:], dtype=torch.float32, device=dev)
    q = (xyz - lo) / torch.tensor(size, dtype=torch.float32, device=dev)
    c = torch.floor(q)
    g = torch.tensor(grid, dtype=torch.float32, device=dev)
    ok = ((xyz >= lo) & (xyz < hi) & (c < g)).all(1, keepdim=True)
    coords = torch.where(ok, c, torch.full_like(c, -1.0)).to(torch.int32)
    return coords.flip(1).contiguous()  # (x, y, z) -> (z, y, x)


def linear_index(coords: torch.Tensor, grid) -> torch.Tensor:
    """(z gy + y) gx + x of (z, y, x) coordinates, int64; -1 for a row with a negative entry."""
    gx, gy, _ = grid
    c = coords.long()
    key = (c[:, 0] * gy + c[:, 1]) * gx + c[:, 2]
    return torch.where((c >= 0).all(1), key, -1)


def voxelize_hard(points: torch.Tensor, voxel_size, point_range, max_points: int, max_voxels: int) -> HardVoxels:
    """Hard voxelization by the rules of the module doc (data-dependent torch ops: this synchronizes)."""
    check_points(points)
    check_limits(max_points, max_voxels, points.shape[1])
    grid, _, _ = grid_of(voxel_size, point_range)
    n, c = points.shape
    dev = points.device
    coords = point_coords(points, voxel_size, point_range)
    key = linear_index(coords, grid)
    voxels = torch.zeros(max_voxels, max_points, c, dtype=points.dtype, device=dev)
    out_coords = torch.zeros(max_voxels, 3, dtype=torch.int32, device=dev)
    num = torch.zeros(max_voxels, dtype=torch.int32, device=dev)
    ok = key >= 0
    idx = torch.arange(n, device=dev)[ok]
    if idx.numel() == 0:
        return HardVoxels(voxels, out_coords, num, torch.zeros(1, dtype=torch.int32, device=dev))
    uniq, inv = torch.unique(key[ok], return_inverse=True)
    first = torch.full((uniq.numel(),), n, dtype=torch.long, device=dev).scatter_reduce(0, inv, idx, "amin")
    vid_of = torch.empty_like(first)
    vid_of[torch.argsort(first)] = torch.arange(uniq.numel(), device=dev)  # numbered by first point
    vid = vid_of[inv]
    order = torch.sort(vid, stable=True).indices  # points by voxel, input order inside each
    counts = torch.bincount(vid, minlength=uniq.numel())
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.empty_like(vid)
    rank[order] = torch.arange(vid.numel(), device=dev) - starts[vid[order]]
    keep = (vid < max_voxels) & (rank < max_points)
    voxels[vid[keep], rank[keep]] = points[idx[keep]]
    kept = min(uniq.numel(), max_voxels)
    firsts = first[torch.argsort(first)][:kept]
    out_coords[:kept] = coords[firsts]
    num[:kept] = counts[:kept].clamp(max=max_points).to(torch.int32)
    return HardVoxels(voxels, out_coords, num, torch.full((1,), kept, dtype=torch.int32, device=dev))


def voxelize(
    points: torch.Tensor, voxel_size, point_range, max_points: int = 35, max_voxels: int = 20000, mode: str = "hard"
):
    """`cute_kernels.voxelize`'s semantics: a `HardVoxels` (hard) or the (N, 3) int32 coordinates (dynamic)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    check_points(points)
    if mode == "dynamic":
        return point_coords(points, voxel_size, point_range)
    return voxelize_hard(points, voxel_size, point_range, max_points, max_voxels)


def check_scatter(features, coords, reduce: str) -> None:
    if not isinstance(features, torch.Tensor):
        raise TypeError(f"features must be a torch.Tensor, got {type(features).__name__}")
    if features.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(
            f"features has dtype {str(features.dtype).replace('torch.', '')}; supported: float32, bfloat16, float16"
        )
    if features.dim() != 2 or features.shape[1] < 1:
        raise ValueError(f"features must be (N, F >= 1), got shape {tuple(features.shape)}")
    if not isinstance(coords, torch.Tensor):
        raise TypeError(f"coords must be a torch.Tensor, got {type(coords).__name__}")
    if coords.dtype not in (torch.int32, torch.int64):
        raise TypeError(
            f"coords has dtype {str(coords.dtype).replace('torch.', '')}; supported: int32, int64 "
            "(voxelize(..., mode='dynamic') gives int32)"
        )
    if coords.dim() != 2 or coords.shape[1] != 3 or coords.shape[0] != features.shape[0]:
        raise ValueError(
            f"coords must be (N, 3) (z, y, x) with N = features.shape[0] = {features.shape[0]}, got "
            f"shape {tuple(coords.shape)}"
        )
    if coords.device != features.device:
        raise ValueError(f"coords is on {coords.device} but features is on {features.device}")
    if reduce not in REDUCES:
        raise ValueError(f"reduce must be one of {REDUCES}, got {reduce!r}")
    if features.numel() >= 2**31:
        raise ValueError(f"features has {features.numel()} elements; fewer than 2^31 are supported")


def voxel_scatter(features: torch.Tensor, coords: torch.Tensor, reduce: str = "mean"):
    """(VoxelScatter, argmax): the reduction of the module doc, outputs sized N rows with the count on the device;
    argmax (N, F) int32 for max (the point each voxel feature came from), else None."""
    check_scatter(features, coords, reduce)
    n, f = features.shape
    dev = features.device
    valid = (coords >= 0).all(1)
    idx = torch.arange(n, device=dev)[valid]
    out = torch.zeros(n, f, dtype=features.dtype, device=dev)
    out_coords = torch.zeros(n, 3, dtype=torch.int32, device=dev)
    p2v = torch.full((n,), -1, dtype=torch.int32, device=dev)
    num = torch.zeros(n, dtype=torch.int32, device=dev)
    argmax = torch.full((n, f), -1, dtype=torch.int32, device=dev) if reduce == "max" else None
    if idx.numel() == 0:
        return VoxelScatter(out, out_coords, p2v, num, torch.zeros(1, dtype=torch.int32, device=dev)), argmax
    uniq, inv = torch.unique(coords[valid].long(), dim=0, return_inverse=True)  # lexicographic (z, y, x)
    v = uniq.shape[0]
    p2v[idx] = inv.to(torch.int32)
    counts = torch.bincount(inv, minlength=v)
    x = features[idx].float()
    if reduce in ("sum", "mean"):
        acc = torch.zeros(v, f, dtype=torch.float32, device=dev).index_add_(0, inv, x)
        if reduce == "mean":
            acc = acc / counts.unsqueeze(1).float()
    else:
        nan = torch.isnan(x)
        ninf = torch.full((v, f), -math.inf, dtype=torch.float32, device=dev)
        best = ninf.scatter_reduce(0, inv.unsqueeze(1).expand(-1, f), x.masked_fill(nan, -math.inf), "amax")
        has_nan = torch.zeros(v, f, dtype=torch.uint8, device=dev).scatter_reduce(  # (CUDA's has no bool variant)
            0, inv.unsqueeze(1).expand(-1, f), nan.to(torch.uint8), "amax"
        ).bool()
        acc = torch.where(has_nan, math.nan, best)
        hit = (x == acc[inv]) | (nan & has_nan[inv])
        cand = torch.where(hit, idx.unsqueeze(1), n)
        arg = torch.full((v, f), n, dtype=torch.long, device=dev).scatter_reduce(
            0, inv.unsqueeze(1).expand(-1, f), cand, "amin"
        )
        argmax[:v] = arg.to(torch.int32)
    out[:v] = acc.to(features.dtype)
    out_coords[:v] = uniq.to(torch.int32)
    num[:v] = counts.to(torch.int32)
    return VoxelScatter(out, out_coords, p2v, num, torch.full((1,), v, dtype=torch.int32, device=dev)), argmax


def scatter_backward(
    grad: torch.Tensor,
    point2voxel: torch.Tensor,
    num_points: torch.Tensor,
    argmax,
    reduce: str,
    n_features: int | None = None,
) -> torch.Tensor:
    """d(features) of `voxel_scatter` from d(voxel features) `grad` (rows, F): sum copies each voxel's gradient to
    its points, mean divides it by the voxel's point count, max sends it to the arg-max point only; ignored points
    get zero. Fixed-size gathers (no host synchronization): also the op's backward."""
    n = point2voxel.shape[0]
    f = grad.shape[1] if n_features is None else n_features
    if n == 0:
        return torch.zeros(0, f, dtype=grad.dtype, device=grad.device)
    m = point2voxel.long()
    ok = (m >= 0).unsqueeze(1)
    mc = m.clamp(min=0)
    g = grad[mc].float()
    if reduce == "mean":
        g = g / num_points[mc].clamp(min=1).unsqueeze(1).float()
    elif reduce == "max":
        me = torch.arange(n, device=grad.device, dtype=torch.int32).unsqueeze(1)
        ok = ok & (argmax[mc] == me)
    return torch.where(ok, g, 0.0).to(grad.dtype)


def trim(result):
    """The valid rows of a `HardVoxels` or `VoxelScatter` (reads the count: synchronizes with the device); other
    values (dynamic mode's coordinates) are returned as they are."""
    if isinstance(result, HardVoxels):
        n = int(result.voxel_num.reshape(-1)[0])
        return HardVoxels(result.voxels[:n], result.coords[:n], result.num_points[:n], result.voxel_num)
    if isinstance(result, VoxelScatter):
        n = int(result.voxel_num.reshape(-1)[0])
        if n < 0:
            raise ValueError(
                "voxel_scatter: the coordinates' bounding box holds more than 2^31 - 1 voxels (the "
                "sort keys are int32); shift or split the coordinates"
            )
        return VoxelScatter(
            result.features[:n], result.coords[:n], result.point2voxel, result.num_points[:n], result.voxel_num
        )
    if isinstance(result, torch.Tensor):
        return result
    raise TypeError(f"trim takes a HardVoxels, a VoxelScatter or a tensor, got {type(result).__name__}")
