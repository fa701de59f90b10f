"""CPU: the voxel kernels' algorithm, step for step in Python (the GPU runs the same steps in `kernels.py` / `sort.py`),
against the torch reference: the tile-by-tile stable radix passes with their skip rule and ping-pong rows, the heads
numbering with its end marker, the first-point numbering, the hard writer, and the segmented reduction's runs with
their flush rules and in-order fix-up. What this cannot check is the DSL's translation of the steps; the GPU tests
(`test_voxel_gpu.py`) do."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from cute_kernels.voxel import reference as R
from cute_kernels.voxel.ops import radix_plan

W, RD = 2, 2  # warps and rounds of a tile: small tiles, many of them
TILE = W * RD * 32


def radix_sort(keys0, passes, bits):
    """`RadixSort.run`: hist per tile, column scan, skip when one digit holds every item, scatter by (tile, warp,
    round, lane) order; returns (keys, vals, state) with the result in row source_row(state, passes)."""
    n = len(keys0)
    keys = np.zeros((2, n), np.int64)
    vals = np.zeros((2, n), np.int64)
    keys[0], vals[0] = keys0, np.arange(n)
    state = np.zeros(8, np.int64)
    tiles = -(-n // TILE)
    for p in range(passes):
        src = int(p - state[:p].sum()) % 2
        dig = (keys[src] >> (p * bits)) & ((1 << bits) - 1)
        counts = np.zeros((1 << bits, tiles), np.int64)
        for c in range(n):
            counts[dig[c], c // TILE] += 1
        totals = counts.sum(1)
        excl = np.cumsum(counts, 1) - counts
        if (totals == n).any():
            state[p] = 1
            continue
        dbase = np.cumsum(totals) - totals
        for t in range(tiles):
            base = dbase + excl[:, t]
            for c in range(t * TILE, min((t + 1) * TILE, n)):  # warps, rounds, lanes: item order
                d = dig[c]
                keys[1 - src, base[d]], vals[1 - src, base[d]] = keys[src, c], vals[src, c]
                base[d] += 1
    fin = int(passes - state[:passes].sum()) % 2
    return keys[fin], vals[fin]


def heads(keys, vals, sentinel, run=None):
    """`Numbering` "heads": seg of each valid position, seg_start with the end marker, flags (hard), runseg."""
    n = len(keys)
    seg_start = np.full(n + 1, -7, np.int64)
    flags = np.zeros(n, np.int64)
    runseg = {}
    seen = 0
    for c in range(n):
        k, kb = keys[c], keys[c - 1] if c > 0 else sentinel
        valid = k != sentinel
        head = valid and (c == 0 or kb != k)
        seen += head
        seg = seen - 1
        if head:
            seg_start[seg] = c
            flags[vals[c]] = seg + 1
        if valid and run and c % run == 0:
            runseg[c // run] = seg
        if k == sentinel and (c == 0 or kb != sentinel):
            seg_start[seg + 1] = c
        if valid and c == n - 1:
            seg_start[seg + 1] = n
    return seen, seg_start, flags, runseg


def hard_model(points, size, rng, max_points, max_voxels):
    grid, _, _ = R.grid_of(size, rng)
    total = grid[0] * grid[1] * grid[2]
    coords = R.point_coords(points, size, rng)
    key = R.linear_index(coords, grid).numpy()
    key = np.where(key < 0, total, key)
    passes, bits = radix_plan(total)
    keys, vals = radix_sort(key, passes, bits)
    v, seg_start, flags, _ = heads(keys, vals, total)
    seg_of_vid = np.full(max_voxels, -7, np.int64)
    vid = 0
    for i in range(len(flags)):  # "firsts": flagged points in point order
        if flags[i]:
            if vid < max_voxels:
                seg_of_vid[vid] = flags[i] - 1
            vid += 1
    assert vid == v
    kept = min(v, max_voxels)
    c = points.shape[1]
    voxels = torch.full((max_voxels, max_points, c), math.nan)
    out_coords = torch.full((max_voxels, 3), -7, dtype=torch.int32)
    num = torch.full((max_voxels,), -7, dtype=torch.int32)
    for u in range(max_voxels * max_points):  # the writer: every row once
        vv, r = divmod(u, max_points)
        row = torch.zeros(c)
        npts = 0
        start = 0
        if vv < kept:
            s = seg_of_vid[vv]
            start = seg_start[s]
            npts = min(seg_start[s + 1] - start, max_points)
            if r < npts:
                row = points[vals[start + r]]
        voxels[vv, r] = row
        if r == 0:
            num[vv] = npts
            k = keys[start]
            out_coords[vv] = torch.tensor(
                [k // (grid[0] * grid[1]), (k // grid[0]) % grid[1], k % grid[0]] if vv < kept else [0, 0, 0]
            )
    return R.HardVoxels(voxels, out_coords, num, torch.tensor([kept], dtype=torch.int32))


def segment_reduce(feats, keys, vals, seg_start, v, runseg, run, reduce):
    """`SegmentReduce`: the runs kernel (flush rules) and the fix-up kernel, one feature column at a time."""
    n_valid = seg_start[v]
    runs = -(-n_valid // run)
    nf = feats.shape[1]
    out = np.full((max(v, 1), nf), np.nan, np.float32)
    arg = np.full((max(v, 1), nf), -7, np.int64)
    pf, pl = {}, {}
    f32 = np.float32

    def reset():
        return (f32(-np.inf), -1) if reduce == "max" else (f32(0.0), -1)

    def take(acc, x, i):
        best, a = acc
        if reduce != "max":
            return (f32(best + x), a)
        wins = (a < 0) or x > best or (np.isnan(x) and not np.isnan(best))
        return (x, i) if wins else acc

    def final(acc, count):
        return f32(acc[0] / f32(count)) if reduce == "mean" else acc[0]

    for f in range(nf):
        for r in range(runs):
            a, b = r * run, min((r + 1) * run, n_valid)
            seg = runseg[r]
            head, end = seg_start[seg], seg_start[seg + 1]
            started = head == a
            acc = reset()

            def flush(seg, count, started, ended):
                if started and ended:
                    out[seg, f], arg[seg, f] = final(acc, count), acc[1]
                elif started:
                    pl[r, f] = acc
                else:
                    pf[r, f] = acc

            for p in range(a, b):
                if p == end:
                    flush(seg, end - head, started, True)
                    seg, head = seg + 1, end
                    end = seg_start[seg + 1]
                    started = True
                    acc = reset()
                acc = take(acc, f32(feats[vals[p], f]), vals[p])
            flush(seg, end - head, started, end == b)
        for r in range(runs):  # the fix-up
            nxt = (r + 1) * run
            if nxt < n_valid:
                seg = runseg[r + 1]
                head = seg_start[seg]
                if head < nxt and head >= r * run:
                    end = seg_start[seg + 1]
                    acc = take(reset(), *pl[r, f])
                    for q in range(r + 1, (end - 1) // run + 1):
                        acc = take(acc, *pf[q, f])
                    out[seg, f], arg[seg, f] = final(acc, end - head), acc[1]
    return out[:v], arg[:v]


def scatter_model(feats, coords, reduce, run):
    c = coords.long()
    ok = (c >= 0).all(1)
    if ok.any():
        lo, hi = c[ok].min(0).values, c[ok].max(0).values
        span = (hi - lo + 1).tolist()
    else:
        lo, span = torch.zeros(3, dtype=torch.long), [0, 0, 0]
    size = span[0] * span[1] * span[2]
    lin = ((c[:, 0] - lo[0]) * span[1] + (c[:, 1] - lo[1])) * span[2] + (c[:, 2] - lo[2])
    key = torch.where(ok, lin, size).numpy()
    keys, vals = radix_sort(key, 4, 8)
    v, seg_start, _, runseg = heads(keys, vals, size, run)
    out, arg = segment_reduce(feats.numpy(), keys, vals, seg_start, v, runseg, run, reduce)
    return v, out, arg, keys, vals, seg_start


def _cloud(n, seed):
    g = torch.Generator().manual_seed(seed)
    pts = torch.rand(n, 4, generator=g) * torch.tensor([4.4, 4.4, 2.2, 1.0]) - torch.tensor([0.2, 0.2, 0.1, 0.0])
    pts[: n // 3, 2] = 0.5  # a ground plane
    pts[n // 3 : n // 2, :3] = torch.tensor([1.0, 1.0, 1.0])  # one dense voxel
    pts[n // 2 : n // 2 + 20, :3] = torch.tensor([0.4, 0.6, 1.0])  # voxel borders exactly
    return pts


@pytest.mark.parametrize("n,max_points,max_voxels", [(1, 3, 5), (700, 4, 50), (700, 300, 2000), (300, 1, 1)])
def test_hard_steps_match_the_reference(n, max_points, max_voxels):
    size, rng = (0.2, 0.2, 0.5), (0.0, 0.0, 0.0, 4.0, 4.0, 2.0)
    pts = _cloud(n, n)
    got = hard_model(pts, size, rng, max_points, max_voxels)
    want = R.voxelize_hard(pts, size, rng, max_points, max_voxels)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_hard_steps_all_out_of_range():
    pts = torch.full((50, 4), 9.0)
    got = hard_model(pts, (0.2, 0.2, 0.5), (0.0, 0.0, 0.0, 4.0, 4.0, 2.0), 3, 10)
    assert int(got.voxel_num) == 0 and not got.voxels.any() and not got.num_points.any()


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
@pytest.mark.parametrize("n,run,spread", [(1, 8, 4), (257, 8, 3), (600, 16, 1), (600, 8, 40), (300, 4, 2)])
def test_scatter_steps_match_the_reference(reduce, n, run, spread):
    """Small runs so that segments cross many of them (spread 1: every point in a handful of voxels)."""
    g = torch.Generator().manual_seed(n + run)
    coords = torch.randint(0, spread, (n, 3), generator=g, dtype=torch.int32) + torch.tensor(
        [5, 0, 2], dtype=torch.int32
    )
    coords[::5] = -1
    feats = torch.randint(-4, 5, (n, 3), generator=g).float()  # ties for max
    if n > 10:
        feats[7, 1] = math.nan
    v, out, arg, *_ = scatter_model(feats, coords, reduce, run)
    res, want_arg = R.voxel_scatter(feats, coords, reduce)
    assert v == int(res.voxel_num)
    assert np.allclose(out, res.features[:v].numpy(), rtol=1e-5, atol=1e-5, equal_nan=True)
    if reduce == "max":
        assert (arg == want_arg[:v].numpy()).all()


def test_scatter_steps_every_point_ignored():
    v, out, *_ = scatter_model(torch.ones(40, 2), torch.full((40, 3), -1, dtype=torch.int32), "mean", 8)
    assert v == 0 and out.shape == (0, 2)


def test_radix_skip_keeps_the_order():
    """Passes whose digit is the same for every key are skipped; the stable order survives (equal keys in index
    order), whichever row the result lands in."""
    rng = np.random.default_rng(0)
    for keys in (np.zeros(300, np.int64), rng.integers(0, 2**20, 500) << 8, rng.integers(0, 7, 400)):
        k, v = radix_sort(keys, 4, 8)
        order = np.argsort(keys, kind="stable")
        assert (v == order).all() and (k == keys[order]).all()
