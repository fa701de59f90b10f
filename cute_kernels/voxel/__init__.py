"""Voxel family (lesson 16): point-cloud voxelization (hard and dynamic) and the voxel scatter (mean / max / sum of
each voxel's point features), deterministic, with every data-dependent count kept on the device.

Files: this catalogue entry, `kernels.py` (the three pipelines and the segmented reduction), `sort.py` (the stable
radix sort and the in-order numbering they share), `ops.py` (the torch ops), `reference.py` (the rules in torch: the
tests' reference and the CPU fallback), `bench.py` (the suite).
"""

from __future__ import annotations

from dataclasses import dataclass

from cute_kernels import dtypes
from cute_kernels.catalog import KernelSpec, Param
from cute_kernels.fake import fake_stream, fake_tensor, index_sym
from cute_kernels.lazy import cutlass

STATE_SLOTS = 8  # (sort.STATE_SLOTS: passes skipped, the out-of-range key, the overflow flag)


def _vec(p) -> int:
    """Elements a lane moves at once: one 16-byte vector of the rows' type where aligned, else one."""
    if not p["aligned"]:
        return 1
    return 128 // dtypes.cutlass_of(p["dtype"]).width if "dtype" in p else 4


def _sym(div=1):
    return index_sym(False, div)


def _i32(*shape, stride=None):
    """A fake int32 tensor: shape entries None are symbolic; stride row-major (last dim unit) unless given."""
    shape = tuple(_sym() if s is None else s for s in shape)
    if stride is None:
        stride = (_sym(), 1) if len(shape) == 2 else (1,)
    return fake_tensor(cutlass.Int32, shape, stride, 4)


def _rows(dt, vec):
    """A fake (rows, cols) matrix with unit column stride; rows of whole `vec`-element vectors when vec > 1."""
    return fake_tensor(dt, (_sym(), _sym(vec)), (_sym(vec), 1), 16 if vec > 1 else dt.width // 8)


@dataclass(frozen=True, eq=False)
class DynamicSpec(KernelSpec):
    def build(self, p):
        from cute_kernels.voxel.kernels import DynamicCoords

        f, i = cutlass.Float32(0.0), cutlass.Int32(1)
        coords = fake_tensor(cutlass.Int32, (_sym(), 3), (3, 1), 4)
        return DynamicCoords(_vec(p), p["threads"]), (
            _rows(cutlass.Float32, _vec(p)),
            coords,
            *[f] * 9,
            i,
            i,
            i,
            fake_stream(),
        )

    def static_extents(self, p):
        return {3}

    def representative(self):
        return [self.resolve()]

    def sweep(self):
        return [self.resolve({"aligned": a}) for a in (True, False)]


VOXEL_DYNAMIC = DynamicSpec(
    name="voxel.dynamic",
    family="voxel",
    lesson=16,
    summary="dynamic voxelization: each point's (z, y, x) voxel or -1, a thread a point (one 16-byte load for rows of "
    "whole vectors)",
    ops=("voxelize",),
    status="ready",
    params={
        "aligned": Param(True, (True, False), "signature", "point rows of whole 16-byte vectors (C % 4 == 0)"),
        "threads": Param(256, (128, 256, 512), help="threads per CTA"),
    },
)


@dataclass(frozen=True, eq=False)
class HardSpec(KernelSpec):
    def build(self, p):
        from cute_kernels.voxel.kernels import HardVoxelize

        radix = 1 << p["digit_bits"]
        f, i = cutlass.Float32(0.0), cutlass.Int32(1)
        kernel = HardVoxelize(p["passes"], p["digit_bits"], _vec(p), p["warps"], p["rounds"])
        args = (
            _rows(cutlass.Float32, _vec(p)),
            _i32(2, None),
            _i32(2, None),
            _i32(radix, None),
            _i32(radix),
            _i32(1, None),
            _i32(1),
            _i32(STATE_SLOTS),
            _i32(None),
            _i32(None),
            _i32(None),
            _rows(cutlass.Float32, _vec(p)),
            fake_tensor(cutlass.Int32, (_sym(), 3), (3, 1), 4),
            _i32(None),
            _i32(1),
            *[f] * 9,
            i,
            i,
            i,
            i,
            i,
            fake_stream(),
        )
        return kernel, args

    def static_extents(self, p):
        return {1 << p["digit_bits"], STATE_SLOTS, 2, 1, 3}

    def representative(self):
        return [self.resolve()]

    def sweep(self):
        return [
            self.resolve({"passes": n, "digit_bits": d, "aligned": a})
            for n in (1, 2, 3, 4)
            for d in (8, 9)
            for a in (True, False)
        ]


VOXEL_HARD = HardSpec(
    name="voxel.hard",
    family="voxel",
    lesson=16,
    summary="hard voxelization: linear voxel keys, a stable LSD radix sort (match.any ranks, no atomics), segment heads "
    "and first points numbered by ballot scans, every voxel row written once",
    ops=("voxelize",),
    status="ready",
    params={
        "passes": Param(3, (1, 2, 3, 4), "signature", "radix passes (passes x digit_bits >= the grid size's bits)"),
        "digit_bits": Param(9, (4, 5, 6, 7, 8, 9), "signature", "bits a radix pass"),
        "aligned": Param(True, (True, False), "signature", "point rows of whole 16-byte vectors (C % 4 == 0)"),
        "warps": Param(8, (4, 8), help="warps a sort tile"),
        "rounds": Param(8, (4, 8, 16), help="32-item rounds a warp walks in order (a tile: warps x rounds x 32)"),
    },
)


@dataclass(frozen=True, eq=False)
class ScatterSpec(KernelSpec):
    def build(self, p):
        from cute_kernels.voxel.kernels import ScatterVoxels

        dt = dtypes.cutlass_of(p["dtype"])
        radix = 1 << p["digit_bits"]
        kernel = ScatterVoxels(p["reduce"], dt, _vec(p), p["group"], p["run"], p["digit_bits"], p["warps"], p["rounds"])
        coords3 = fake_tensor(cutlass.Int32, (_sym(), 3), (3, 1), 4)
        f32 = fake_tensor(cutlass.Float32, (_sym(), _sym()), (_sym(), 1), 4)
        args = (
            _rows(dt, _vec(p)),
            coords3,
            _i32(2, None),
            _i32(2, None),
            _i32(radix, None),
            _i32(radix),
            _i32(1, None),
            _i32(1),
            _i32(STATE_SLOTS),
            _i32(6),
            _i32(None),
            _i32(None),
            _rows(dt, _vec(p)),
            _i32(None, None),
            fake_tensor(cutlass.Int32, (_sym(), 3), (3, 1), 4),
            _i32(None),
            f32,
            fake_tensor(cutlass.Float32, (_sym(), _sym()), (_sym(), 1), 4),
            _i32(None, None),
            _i32(None, None),
            cutlass.Int32(1),
            fake_stream(),
        )
        return kernel, args

    def static_extents(self, p):
        return {1 << p["digit_bits"], STATE_SLOTS, 6, 2, 1, 3}

    def representative(self):
        return [self.resolve(), self.resolve({"reduce": "max", "dtype": "bf16", "group": 8})]

    def sweep(self):
        return [
            self.resolve({"reduce": r, "dtype": d, "aligned": a, "group": g})
            for r in ("mean", "max", "sum")
            for d in dtypes.FLOAT_NAMES
            for a in (True, False)
            for g in (4, 32)
        ]


VOXEL_SCATTER = ScatterSpec(
    name="voxel.scatter",
    family="voxel",
    lesson=16,
    summary="voxel scatter (mean / max / sum, arg-max for the backward): bounding-box keys, the stable radix sort, "
    "segment heads by ballot scans, a segmented reduction over fixed runs with an in-order fix-up",
    ops=("voxel_scatter",),
    status="ready",
    params={
        "reduce": Param("mean", ("mean", "max", "sum"), "signature", "the reduction"),
        "dtype": Param("fp32", dtypes.FLOAT_NAMES, "signature", "the features' type (fp32 accumulation)"),
        "aligned": Param(
            True,
            (True, False),
            "signature",
            "feature rows of whole 16-byte vectors: one a lane, else one feature a lane",
        ),
        "group": Param(16, (1, 2, 4, 8, 16, 32), "signature", "lanes a run (a slice of group x vector features)"),
        "run": Param(128, (64, 128, 256, 512), help="sorted positions a run of the segmented reduction"),
        "digit_bits": Param(8, (8,), help="bits a radix pass (the keys' 31 bits in 4 passes)"),
        "warps": Param(8, (4, 8), help="warps a sort tile"),
        "rounds": Param(8, (4, 8, 16), help="32-item rounds a warp walks in order"),
    },
)

SPECS = (VOXEL_DYNAMIC, VOXEL_HARD, VOXEL_SCATTER)
