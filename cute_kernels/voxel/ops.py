"""Torch ops of the voxel family: voxelization and the voxel scatter (lesson 16).

    v = ck.voxelize(points, voxel_size, point_range, max_points=35, max_voxels=20000)   # HardVoxels
    coords = ck.voxelize(points, voxel_size, point_range, mode="dynamic")                # (N, 3) int32 (z, y, x)
    s = ck.voxel_scatter(features, coords, reduce="mean")                                # VoxelScatter
    v, s = ck.voxel_trim(v), ck.voxel_trim(s)                                            # valid rows (syncs)

The rules are `cute_kernels.voxel.reference`'s (mmcv's): in range iff min <= p < max, coordinate floor((p - min) /
size) in fp32, grid round((max - min) / size), (z, y, x) int32. Outputs whose size depends on the data are sized for
the worst case (max_voxels rows; N rows for the scatter) with the count in a device tensor (`voxel_num`), so nothing
waits on the host: the ops run under torch.compile and inside a CUDA graph; `voxel_trim` reads the count and slices.
Every result is the same bits on every run (integer atomics only, for the scatter's bounding box; no float atomics).

Registered ops: `cute_kernels::voxelize_hard`, `::voxelize_dynamic`, `::voxel_scatter` (autograd in the features:
mean / sum spread each voxel's gradient over its points, max sends it to the arg-max point, the lowest index on
ties) and `::voxel_scatter_backward`. CPU tensors take the reference (`voxelize`, `voxel_scatter` only).
"""

from __future__ import annotations

import torch

from cute_kernels import dtypes
from cute_kernels.torch_ops import call, check_tensor, placeholder, register_op
from cute_kernels.voxel import reference as R
from cute_kernels.voxel.reference import HardVoxels, VoxelScatter
from schedules.hardware import num_sms

CTAS_PER_SM = 8  # the grid-stride kernels' cap (the writer, the box, the segmented reduction)
MAX_DIGIT_BITS = 9  # a radix pass's bits (2^9 counters a warp in shared memory)


def _default(spec, name):
    return spec.params[name].default


def _tile(spec) -> int:
    """Items a sort tile of the catalogue's default config: warps x rounds x 32."""
    return _default(spec, "warps") * _default(spec, "rounds") * 32


INT_MIN = -(2**31)


def _ctas(device) -> int:
    return CTAS_PER_SM * num_sms(device.index or 0)


def radix_plan(total: int) -> tuple[int, int]:
    """(passes, digit bits) of a sort whose keys lie in [0, total]: the fewest passes of at most 9 bits, their bits
    evened out (27 bits: 3 x 9; 18: 2 x 9; 12: 2 x 6)."""
    bits = max(int(total).bit_length(), 1)
    passes = -(-bits // MAX_DIGIT_BITS)
    return passes, max(4, -(-bits // passes))


def _rows_vec(t: torch.Tensor, vec: int) -> bool:
    """Rows of whole 16-byte vectors: unit column stride, columns and row stride multiples of vec, 16-byte base."""
    return (
        t.shape[1] % vec == 0
        and t.stride(1) == 1
        and (t.stride(0) % vec == 0 or t.shape[0] <= 1)
        and t.data_ptr() % 16 == 0
    )


def _tidy_rows(t: torch.Tensor) -> torch.Tensor:
    """t (rows, cols) with unit column stride and rows that do not overlap (else a contiguous copy); a single row
    gets a row stride of whole 16-byte vectors (never used, but the vector variants check it)."""
    if t.stride(1) != 1 or (t.shape[0] > 1 and t.stride(0) < t.shape[1]):
        t = t.contiguous()
    if t.shape[0] == 1:
        t = t.as_strided(t.shape, (-(-t.shape[1] // 16) * 16, 1))
    return t


def _point_rows(points: torch.Tensor) -> tuple[torch.Tensor, int]:
    points = _tidy_rows(points)
    return points, 4 if _rows_vec(points, 4) else 1


def _range_args(voxel_size, point_range):
    grid, size, rng = R.grid_of(voxel_size, point_range)
    return grid, size, rng


# --- voxelize ------------------------------------------------------------------------------------------------------
def _check_points(points):
    check_tensor("points", points, allowed=(torch.float32,))
    R.check_points(points)


def _dynamic_fake(points, voxel_size, point_range):
    _check_points(points)
    _range_args(voxel_size, point_range)
    return torch.empty(points.shape[0], 3, dtype=torch.int32, device=points.device)


def _dynamic_cuda(points, voxel_size, point_range):
    from cute_kernels.voxel import VOXEL_DYNAMIC

    coords = _dynamic_fake(points, voxel_size, point_range)
    if points.shape[0] == 0:
        return coords
    grid, size, rng = _range_args(voxel_size, point_range)
    pts, vec = _point_rows(points)
    fn = VOXEL_DYNAMIC.compiled(aligned=vec > 1)
    fn(pts, coords, *rng, *size, *grid)
    return coords


def _hard_fake(points, voxel_size, point_range, max_points: int, max_voxels: int):
    _check_points(points)
    _range_args(voxel_size, point_range)
    R.check_limits(max_points, max_voxels, points.shape[1])
    c, dev, i32 = points.shape[1], points.device, torch.int32
    return (
        torch.empty(max_voxels, max_points, c, dtype=points.dtype, device=dev),
        torch.empty(max_voxels, 3, dtype=i32, device=dev),
        torch.empty(max_voxels, dtype=i32, device=dev),
        torch.empty(1, dtype=i32, device=dev),
    )


def _hard_cuda(points, voxel_size, point_range, max_points: int, max_voxels: int):
    from cute_kernels.voxel import VOXEL_HARD

    voxels, coords, num, count = _hard_fake(points, voxel_size, point_range, max_points, max_voxels)
    n, c = points.shape
    if n == 0:
        for t in (voxels, coords, num, count):
            t.zero_()
        return voxels, coords, num, count
    grid, size, rng = _range_args(voxel_size, point_range)
    passes, digit_bits = radix_plan(grid[0] * grid[1] * grid[2])
    pts, vec = _point_rows(points)
    dev, i32 = points.device, torch.int32
    tiles = -(-n // _tile(VOXEL_HARD))

    def new(*shape):
        return torch.empty(shape, dtype=i32, device=dev)

    fn = VOXEL_HARD.compiled(passes=passes, digit_bits=digit_bits, aligned=vec > 1)
    fn(
        pts,
        new(2, n),
        new(2, n),
        new(1 << digit_bits, tiles),
        new(1 << digit_bits),
        new(1, tiles),
        new(1),
        new(8),
        new(n + 1),
        new(n),
        new(max_voxels),
        voxels.view(max_voxels * max_points, c),
        coords,
        num,
        count,
        *rng,
        *size,
        *grid,
        max_points,
        _ctas(dev),
    )
    return voxels, coords, num, count


register_op(
    "cute_kernels::voxelize_dynamic",
    "(Tensor points, float[] voxel_size, float[] point_range) -> Tensor",
    _dynamic_cuda,
    _dynamic_fake,
)
register_op(
    "cute_kernels::voxelize_hard",
    "(Tensor points, float[] voxel_size, float[] point_range, int max_points, "
    "int max_voxels) -> (Tensor, Tensor, Tensor, Tensor)",
    _hard_cuda,
    _hard_fake,
)


def voxelize(
    points: torch.Tensor, voxel_size, point_range, max_points: int = 35, max_voxels: int = 20000, mode: str = "hard"
):
    """Voxelize a point cloud (mmcv's rules, `cute_kernels.voxel.reference`): points (N, C >= 3) fp32 with x, y, z
    first; voxel_size (vx, vy, vz); point_range (x_min, y_min, z_min, x_max, y_max, z_max).

    mode "hard": a `HardVoxels` (voxels (max_voxels, max_points, C), coords (max_voxels, 3) (z, y, x) int32,
    num_points (max_voxels,) int32, voxel_num (1,) int32 on the device): voxels numbered in order of their first
    in-range point, each keeping its first max_points points in input order, voxels past max_voxels dropped, rows
    past the count zero. mode "dynamic": (N, 3) int32 (z, y, x) of each point, (-1, -1, -1) out of range.
    Deterministic, no host synchronization (`voxel_trim` slices to the count). CPU tensors: the torch reference."""
    if mode not in R.MODES:
        raise ValueError(f"mode must be one of {R.MODES}, got {mode!r}")
    if isinstance(points, torch.Tensor) and points.device.type == "cpu":
        return R.voxelize(points, voxel_size, point_range, max_points, max_voxels, mode)
    vs = [float(v) for v in R._floats("voxel_size", voxel_size, 3)]
    pr = [float(v) for v in R._floats("point_range", point_range, 6)]
    if mode == "dynamic":
        return call("cute_kernels::voxelize_dynamic", points, vs, pr)
    R.check_limits(
        max_points, max_voxels, points.shape[1] if isinstance(points, torch.Tensor) and points.dim() == 2 else 3
    )
    return HardVoxels(*call("cute_kernels::voxelize_hard", points, vs, pr, int(max_points), int(max_voxels)))


# --- voxel scatter -------------------------------------------------------------------------------------------------
def _check_scatter(features, coords, reduce):
    check_tensor("features", features)
    R.check_scatter(features, coords, reduce)


def _scatter_fake(features, coords, reduce: str):
    _check_scatter(features, coords, reduce)
    n, f = features.shape
    dev, i32 = features.device, torch.int32
    arg = torch.empty(n, f, dtype=i32, device=dev) if reduce == "max" else torch.empty(0, dtype=i32, device=dev)
    return (
        torch.empty(n, f, dtype=features.dtype, device=dev),
        torch.empty(n, 3, dtype=i32, device=dev),
        torch.empty(n, dtype=i32, device=dev),
        torch.empty(n, dtype=i32, device=dev),
        torch.empty(1, dtype=i32, device=dev),
        arg,
    )


def scatter_plan(features: torch.Tensor) -> tuple[int, int]:
    """(vec, group): one 16-byte vector of features a lane when the rows allow it, and the lanes a run that cover a
    row (a power of two up to 32)."""
    vec = 16 // features.element_size()
    if not _rows_vec(features, vec):
        vec = 1
    lanes = -(-features.shape[1] // vec)
    return vec, min(32, 1 << max(lanes - 1, 0).bit_length())


def _scatter_cuda(features, coords, reduce: str):
    from cute_kernels.voxel import VOXEL_SCATTER

    out, coords_out, p2v, num, count, arg = _scatter_fake(features, coords, reduce)
    n, f = features.shape
    if n == 0:
        count.zero_()
        return out, coords_out, p2v, num, count, arg
    dev, i32 = features.device, torch.int32
    features = _tidy_rows(features)
    c32 = coords.to(i32).contiguous()
    vec, group = scatter_plan(features)
    tiles = -(-n // _tile(VOXEL_SCATTER))
    runs = -(-n // _default(VOXEL_SCATTER, "run"))
    radix = 1 << _default(VOXEL_SCATTER, "digit_bits")
    is_max = reduce == "max"

    def new(*shape, dtype=i32):
        return torch.empty(shape, dtype=dtype, device=dev)

    keys, vals = new(2, n), new(2, n)
    state, seg_start = new(8), new(n + 1)
    box = torch.full((6,), INT_MIN, dtype=i32, device=dev)
    part = new(runs, f, dtype=torch.float32), new(runs, f, dtype=torch.float32)
    part_arg = (new(runs, f), new(runs, f)) if is_max else (placeholder(dev, (1, 1)),) * 2
    fn = VOXEL_SCATTER.compiled(reduce=reduce, dtype=dtypes.name_of(features.dtype), aligned=vec > 1, group=group)
    fn(
        features,
        c32,
        keys,
        vals,
        new(radix, tiles),
        new(radix),
        new(1, tiles),
        count,
        state,
        box,
        seg_start,
        new(runs),
        out,
        arg if is_max else placeholder(dev, (1, 1)),
        coords_out,
        p2v,
        *part,
        *part_arg,
        _ctas(dev),
    )
    torch.sub(seg_start[1:], seg_start[:-1], out=num)  # (rows past the count: unspecified)
    count.copy_(torch.where(state[7:8] != 0, -1, count))  # the keys overflowed int32: voxel_trim raises
    return out, coords_out, p2v, num, count, arg


def _scatter_bwd_fake(grad, point2voxel, num_points, argmax, reduce: str):
    return torch.empty(point2voxel.shape[0], grad.shape[1], dtype=grad.dtype, device=grad.device)


def _scatter_bwd_cuda(grad, point2voxel, num_points, argmax, reduce: str):
    return R.scatter_backward(grad, point2voxel, num_points, argmax, reduce)


def _scatter_setup(ctx, inputs, output):
    _, _, reduce = inputs
    out, coords_out, p2v, num, count, arg = output
    ctx.mark_non_differentiable(coords_out, p2v, num, count, arg)
    ctx.reduce = reduce
    ctx.save_for_backward(p2v, num, arg)


def _scatter_backward(ctx, g, *_):
    p2v, num, arg = ctx.saved_tensors
    if g is None:
        return None, None, None
    return call("cute_kernels::voxel_scatter_backward", g, p2v, num, arg, ctx.reduce), None, None


register_op(
    "cute_kernels::voxel_scatter_backward",
    "(Tensor grad, Tensor point2voxel, Tensor num_points, Tensor argmax, str reduce) -> Tensor",
    _scatter_bwd_cuda,
    _scatter_bwd_fake,
)
register_op(
    "cute_kernels::voxel_scatter",
    "(Tensor features, Tensor coords, str reduce) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
    _scatter_cuda,
    _scatter_fake,
    _scatter_backward,
    _scatter_setup,
)


def voxel_scatter(features: torch.Tensor, coords: torch.Tensor, reduce: str = "mean") -> VoxelScatter:
    """Reduce each voxel's point features: features (N, F) fp32 / bf16 / fp16, coords (N, 3) (z, y, x) int32 (from
    `voxelize(..., mode="dynamic")`; a row with a negative entry is ignored), reduce "mean" | "max" | "sum" (fp32
    accumulation, one rounding). A `VoxelScatter`: features (N, F) and coords (N, 3) with voxel v in row v < voxel_num
    in ascending linear-index order (torch.unique's, as mmcv's DynamicScatter), point2voxel (N,) (-1 ignored),
    num_points (N,), voxel_num (1,) on the device (-1 when the coordinates' bounding box holds 2^31 voxels or more;
    `voxel_trim` raises then). Differentiable in the features. CPU tensors: the torch reference."""
    if isinstance(features, torch.Tensor) and features.device.type == "cpu":
        return R.voxel_scatter(features, coords, reduce)[0]
    return VoxelScatter(*call("cute_kernels::voxel_scatter", features, coords, reduce)[:5])


def voxel_trim(result):
    """The valid rows of `voxelize`'s `HardVoxels` or `voxel_scatter`'s `VoxelScatter` (reads the device count: one
    host synchronization, outside any graph); dynamic coordinates come back as they are."""
    return R.trim(result)
