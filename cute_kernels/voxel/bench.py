"""The benchmark suite of the voxel family (lesson 16): voxelization (hard, dynamic) and the voxel scatter (mean, max,
sum) at 300k points (10 nuScenes sweeps) and 2M, on a nuScenes-like cloud (a ground plane, dense clusters, scattered
points, some out of range) over nuScenes' range (102.4 m x 102.4 m x 8 m) and 0.1 x 0.1 x 0.2 m voxels (a 1024 x 1024
x 40 grid), against the torch reference (`cute_kernels.voxel.reference`) and torch.compile of it.

Bytes, as the issue counts them: dynamic reads the points (N C 4) and writes the coordinates (N 12); hard reads the
points and writes every row of its outputs (the kernel writes the padding rows too: max_voxels x max_points x C x 4,
the coordinates and counts); the scatter reads the features (N F size) and coordinates (N 12) and writes the voxels'
features and coordinates (V (F size + 12)) and each point's voxel (N 4). Conventions as every suite
(`cute_kernels.bench`).
"""

from __future__ import annotations

import torch

from cute_kernels.bench import harness as H

VOXEL_SIZE = (0.1, 0.1, 0.2)
POINT_RANGE = (-51.2, -51.2, -5.0, 51.2, 51.2, 3.0)
MAX_POINTS, MAX_VOXELS = 10, 90000  # CenterPoint's nuScenes settings (training)


def lidar_cloud(n: int, channels: int = 5, seed: int = 0) -> torch.Tensor:
    """A nuScenes-like cloud on the GPU: half on a ground plane (denser near the sensor), a quarter in dense clusters
    (cars, walls), a quarter scattered, 3 % outside the range; channels past x, y, z uniform (intensity, time)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    pts = torch.rand(n, channels, generator=g, device="cuda")
    ground = n // 2
    r = 60.0 * torch.rand(ground, generator=g, device="cuda") ** 2
    a = 6.2831853 * torch.rand(ground, generator=g, device="cuda")
    pts[:ground, 0], pts[:ground, 1] = r * torch.cos(a), r * torch.sin(a)
    pts[:ground, 2] = -1.8 + 0.05 * torch.randn(ground, generator=g, device="cuda")
    cl = n // 4
    centres = (torch.rand(200, 3, generator=g, device="cuda") - 0.5) * torch.tensor([90.0, 90.0, 2.0], device="cuda")
    pick = torch.randint(0, 200, (cl,), generator=g, device="cuda")
    pts[ground : ground + cl, :3] = centres[pick] + 0.6 * torch.randn(cl, 3, generator=g, device="cuda")
    rest = pts[ground + cl :, :3]
    rest.copy_(
        (torch.rand(rest.shape, generator=g, device="cuda") - 0.5) * torch.tensor([110.0, 110.0, 9.0], device="cuda")
    )
    return pts


def _maybe(refs: dict, fn) -> None:
    """The torch.compile column where torch.compile takes the reference (its data-dependent shapes break the graph,
    and some torch versions refuse them): timed when it runs, left out (n/a) when it raises."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 (any compile failure: the column is n/a)
        H.progress(f"    torch.compile of the reference failed: {type(e).__name__}")
        return
    refs["torch.compile"] = H.do_bench(fn)["median_ms"]


def voxel(shapes=None, quick=False, ceilings=None):
    import cute_kernels as ck
    from cute_kernels.voxel import reference as R

    shapes = shapes or ([(300_000, 5)] if quick else [(300_000, 5), (2_000_000, 5), (2_000_000, 4)])
    copy_bw = ceilings["copy"]
    rows = []

    def hard_ref(p):
        return R.voxelize_hard(p, VOXEL_SIZE, POINT_RANGE, MAX_POINTS, MAX_VOXELS)

    def dyn_ref(p):
        return R.point_coords(p, VOXEL_SIZE, POINT_RANGE)

    dyn_compiled = H.compiled(dyn_ref)
    hard_compiled = H.compiled(hard_ref)
    scatter_compiled = H.compiled(R.voxel_scatter)
    for size in shapes:
        n, c = size[0], (size[1] if len(size) > 1 else 5)
        pts = lidar_cloud(n, c)
        shape = f"N{n} C{c}"
        H.progress(f"  voxelize dynamic {shape}")
        t = H.do_bench(lambda: ck.voxelize(pts, VOXEL_SIZE, POINT_RANGE, mode="dynamic"))["median_ms"]
        refs = {
            "torch": H.do_bench(lambda: dyn_ref(pts))["median_ms"],
            "torch.compile": H.do_bench(lambda: dyn_compiled(pts))["median_ms"],
        }
        rows.append(H.Row("voxelize.dynamic", "fp32", shape, n * c * 4 + n * 12, 0, t, refs, "copy", copy_bw))
        H.progress(f"  voxelize hard {shape}")
        t = H.do_bench(lambda: ck.voxelize(pts, VOXEL_SIZE, POINT_RANGE, MAX_POINTS, MAX_VOXELS))["median_ms"]
        refs = {"torch": H.do_bench(lambda: hard_ref(pts))["median_ms"]}
        _maybe(refs, lambda: hard_compiled(pts))
        hard_bytes = n * c * 4 + MAX_VOXELS * (MAX_POINTS * c * 4 + 16)
        rows.append(
            H.Row(
                "voxelize.hard",
                "fp32",
                shape,
                hard_bytes,
                0,
                t,
                refs,
                "copy",
                copy_bw,
                note=f"max_points {MAX_POINTS}, max_voxels {MAX_VOXELS}; the reference synchronizes",
            )
        )
        coords = ck.voxelize(pts, VOXEL_SIZE, POINT_RANGE, mode="dynamic")
        feats = H.randn(n, 64, dtype=torch.float32, seed=3)
        v = int(ck.voxel_scatter(feats, coords, "sum").voxel_num)
        for reduce in ("mean", "max", "sum"):
            H.progress(f"  voxel_scatter {reduce} {shape} F64 ({v} voxels)")
            t = H.do_bench(lambda: ck.voxel_scatter(feats, coords, reduce))["median_ms"]
            refs = {"torch": H.do_bench(lambda: R.voxel_scatter(feats, coords, reduce))["median_ms"]}
            _maybe(refs, lambda: scatter_compiled(feats, coords, reduce))
            nbytes = n * (64 * 4 + 12 + 4) + v * (64 * 4 + 12)
            rows.append(
                H.Row(f"voxel_scatter.{reduce}", "fp32", f"{shape} F64 V{v}", nbytes, 0, t, refs, "copy", copy_bw)
            )
    checks = []
    small = [r for r in rows if r.shape.startswith("N300000 ")]
    if small:
        w = min(small, key=lambda r: r.ratio("torch"))
        checks.append(
            {
                "target": ">= 10x the torch reference at 300k points",
                "measured": f"min {w.ratio('torch'):.1f}x ({w.case} {w.shape})",
                "ok": w.ratio("torch") >= 10.0,
            }
        )
    big = lambda r: r.shape.startswith("N2000000 ")  # noqa: E731
    w = H.worst(rows, lambda r: big(r) and r.case.startswith("voxelize"))
    if w:
        checks.append(
            {
                "target": "voxelize >= 50 % of copy bandwidth at 2M points",
                "measured": f"min {w.pct_ceiling:.1f}% ({w.case} {w.shape})",
                "ok": w.pct_ceiling >= 50.0,
            }
        )
    w = H.worst(rows, lambda r: big(r) and r.case.startswith("voxel_scatter"))
    if w:
        checks.append(
            {
                "target": "voxel_scatter >= 80 % of copy bandwidth at 2M points",
                "measured": f"min {w.pct_ceiling:.1f}% ({w.case} {w.shape})",
                "ok": w.pct_ceiling >= 80.0,
            }
        )
    return rows, ["torch", "torch.compile"], checks, "", {}


SUITES = {"voxel": voxel}
PEERS: dict[str, tuple[str, ...]] = {"voxel": ()}
