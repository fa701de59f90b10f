"""CPU: the grouped (MoE) FP8 GEMMs. The kernel variants compile for sm_90a and are the blockwise
GEMM plus a read of the grouping vector (e4m3 WGMMA, TMA loads, no local memory, more global loads
than the dense kernel: the expert per row block or the valid rows per expert); the dense kernel
has none of it; the schedule rules name their reasons; the masked walk's host mirror enumerates
exactly the tiles under masked_m; the ops validate shapes and dtypes with named errors in fake
mode; the torch references agree with a per-expert dense computation."""

import re

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import cute_kernels as ck
from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from cute_kernels.fp8_gemm.ops import (
    E4M3,
    contiguous_layout,
    fp8_gemm_grouped_contiguous_reference,
    fp8_gemm_grouped_masked_reference,
)
from cute_kernels.quantize.ops import (
    dequantize_1x128,
    dequantize_128x128,
    quantize_1x128_reference,
    quantize_128x128_reference,
)
from schedules.fp8_gemm import default_grouped_schedule, fp8_schedule, grouped_error
from schedules.gemm import cluster_tile, masked_tile_order

SPEC = catalog.get("fp8_gemm")
CONFIGS = {
    "contiguous_1x2": {"grouping": "contiguous", "cluster_m": 1, "cluster_n": 2},
    "contiguous_1x1": {"grouping": "contiguous", "cluster_m": 1},
    # the default from 1024 rows (session 15: the dense search's wide tile), B-scale rows staged as the op does
    "contiguous_128x192_1x2": {"grouping": "contiguous", "cluster_m": 1, "cluster_n": 2, "tile_n": 192, "sb_smem": True},
    "masked_coop_2x1": {"grouping": "masked"},
    "masked_pingpong": {"grouping": "masked", "schedule": "pingpong", "tile_m": 64},
}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    out = {}
    for name, over in {**CONFIGS, "dense": {}}.items():
        out[name] = compile_with_artifacts(SPEC, SPEC.resolve(over), str(tmp_path_factory.mktemp(name)))
    return out


def _global_loads(ptx):
    return len(re.findall(r"\bld\.global[.\w]*", ptx))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_census(artifacts, name):
    report, files = artifacts[name]
    ptx = files["ptx"].read_text()
    assert not report.spills, report.format()
    census = report.ptx_census
    assert census["ld/st.local"] == 0 and census["setmaxnreg"] >= 2
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k32\.f32\.e4m3\.e4m3", ptx)
    assert census["cp.async.bulk.tensor"] >= 4  # A, B, A scales, the store
    # The grouping vector is read on the device: 32-bit integer global loads beside the B scales'.
    assert re.search(r"ld\.global(?:\.nc)?\.(?:u32|s32|b32)", ptx), "no 32-bit integer load of the grouping vector"
    dense_ptx = artifacts["dense"][1]["ptx"].read_text()
    assert _global_loads(ptx) > _global_loads(dense_ptx)
    if report.sass_census is not None:
        assert "QGMMA" in files["sass"].read_text()
        assert report.sass_census["UTMALDG (TMA load)"] >= 3
        assert report.sass_census["UTMASTG (TMA store)"] > 0
        assert report.sass_census["LDL/STL (spills)"] == 0


def test_dense_has_no_grouping_code(artifacts):
    """grouping="none" is the dense kernel: its only global load is the B scale."""
    report, files = artifacts["dense"]
    assert report.ptx_census["ld.global (all)"] == 1
    assert not re.search(r"ld\.global(?:\.nc)?\.(?:u32|s32)", files["ptx"].read_text())


def test_schedule_rules_name_the_reason():
    with pytest.raises(ValueError, match="cluster_m = 1"):
        SPEC.resolve({"grouping": "contiguous"})
    with pytest.raises(ValueError, match="cooperative"):
        SPEC.resolve({"grouping": "contiguous", "schedule": "pingpong", "tile_m": 64, "cluster_m": 1})
    with pytest.raises(ValueError, match="grouping"):
        SPEC.resolve({"grouping": "ragged"})
    assert grouped_error(fp8_schedule(cluster_m=2), "masked") is None
    assert grouped_error(fp8_schedule("pingpong", 64, 128), "masked") is None
    s = default_grouped_schedule("contiguous", 32768, 4096, 7168)
    assert grouped_error(s, "contiguous") is None and (s.cluster_m, s.cluster_n) == (1, 2)
    assert (s.kind, s.tile_n) == ("cooperative", 192)  # session 15: the dense op's wide tile, 1.03-1.05x 128x128
    for m, n in ((1024, 768), (300, 2112), (4096, 7168), (128, 64)):  # the dense search's ping-pong picks: never
        t = default_grouped_schedule("contiguous", m, n, 7168)
        assert grouped_error(t, "contiguous") is None and t.kind == "cooperative", t
    assert default_grouped_schedule("contiguous", 256, 64, 128).cluster_n == 1
    for m, e in ((1024, 1), (256, 4), (16, 8)):
        assert grouped_error(default_grouped_schedule("masked", m, 4096, 7168, e), "masked") is None
    assert default_grouped_schedule("masked", 16, 4096, 7168, 8).tile_m == 64


@pytest.mark.parametrize("masked_m", [[1024], [256, 256, 256, 256], [0, 5, 0, 300, 4096, 129], [0, 0]])
@pytest.mark.parametrize("sched", [fp8_schedule(), fp8_schedule(cluster_m=1, cluster_n=2),
                                   fp8_schedule("pingpong", 64, 128, raster_group=2)])
def test_masked_walk_covers_exactly_the_valid_tiles(masked_m, sched):
    max_m, n = 1024, 384
    tiles_m, tiles_n = -(-max_m // sched.tile_m), -(-n // sched.tile_n)
    order = masked_tile_order(masked_m, tiles_m, tiles_n, sched)
    assert len(order) == len(set(order))
    covered = {(cm * sched.cluster_m + a, cn * sched.cluster_n + b, e) for cm, cn, e in order
               for a in range(sched.cluster_m) for b in range(sched.cluster_n)}
    need = {(m, nn, e) for e, rows in enumerate(masked_m) for m in range(tiles_m) for nn in range(tiles_n)
            if m * sched.tile_m < min(rows, max_m)}
    assert need <= covered
    # Nothing beyond the rows' last cluster row (a cluster's second CTA may pass masked_m, no more).
    assert all(cm * sched.cluster_m * sched.tile_m < min(masked_m[e], max_m) for cm, _, e in order)
    # Inside an expert the order is the dense raster over its cluster rows.
    for e in range(len(masked_m)):
        mine = [(cm, cn) for cm, cn, ee in order if ee == e]
        rows = len({cm for cm, _ in mine})
        assert mine == [cluster_tile(t, rows, -(-tiles_n // sched.cluster_n), sched.raster_group)[:2]
                        for t in range(len(mine))]


def test_contiguous_layout():
    idx, spans = contiguous_layout([3, 0, 130], align=128)
    assert idx.dtype == torch.int32 and idx.numel() == 128 + 256
    assert spans == [(0, 3), (128, 0), (128, 130)]
    assert (idx[:3] == 0).all() and (idx[3:128] == -1).all() and (idx[128:258] == 2).all() and (idx[258:] == -1).all()


def _weights(e, n, k):
    qs = [quantize_128x128_reference(torch.randn(n, k)) for _ in range(e)]
    return torch.stack([q for q, _ in qs]), torch.stack([s for _, s in qs])


def test_references_match_per_expert_gemms():
    torch.manual_seed(0)
    e, n, k = 3, 200, 300
    b, sb = _weights(e, n, k)
    idx, spans = contiguous_layout([5, 0, 130], align=128)
    a, sa = quantize_1x128_reference(torch.randn(idx.numel(), k))
    ref = fp8_gemm_grouped_contiguous_reference(a, sa, b, sb, idx)
    x = dequantize_1x128(a, sa)
    for ex, (r0, rows) in enumerate(spans):
        w = dequantize_128x128(b[ex], sb[ex])
        torch.testing.assert_close(ref[r0:r0 + rows], x[r0:r0 + rows] @ w.t())
    assert (ref[idx < 0] == 0).all()
    max_m = 64
    am, sam = quantize_1x128_reference(torch.randn(e * max_m, k))
    am, sam = am.view(e, max_m, k), sam.view(e, max_m, -1)  # rows quantize independently of experts
    ref = fp8_gemm_grouped_masked_reference(am, sam, b, sb, torch.tensor([64, 0, 7], dtype=torch.int32))
    assert ref.shape == (e, max_m, n) and (ref[1] == 0).all() and (ref[2, 7:] == 0).all()
    torch.testing.assert_close(ref[0], dequantize_1x128(am[0], sam[0]) @ dequantize_128x128(b[0], sb[0]).t())


def _fake(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="cuda")


def test_fake_mode_contiguous():
    with FakeTensorMode():
        m, e, n, k = 384, 4, 2112, 300
        a, sa = _fake(m, k, dtype=E4M3), _fake(m, 3)
        b, sb = _fake(e, n, k, dtype=E4M3), _fake(e, 17, 3)
        idx = _fake(m, dtype=torch.int32)
        op = torch.ops.cute_kernels.fp8_gemm_grouped_contiguous
        out = op(a, sa, b, sb, idx)
        assert out.shape == (m, n) and out.dtype == torch.bfloat16
        assert op(a, sa, b, sb, idx, torch.float16).dtype == torch.float16
        with pytest.raises(ValueError, match=r"b must be 3-D \(E, N, K\)"):
            op(a, sa, _fake(n, k, dtype=E4M3), sb, idx)
        with pytest.raises(ValueError, match=r"sb must have shape \(4, 17, 3\)"):
            op(a, sa, b, _fake(17, 3), idx)
        with pytest.raises(ValueError, match=r"sa must have shape \(384, 3\)"):
            op(a, _fake(m, 2), b, sb, idx)
        with pytest.raises(TypeError, match="m_indices has dtype torch.int64"):
            op(a, sa, b, sb, _fake(m, dtype=torch.int64))
        with pytest.raises(ValueError, match=r"m_indices must have shape \(384,\)"):
            op(a, sa, b, sb, _fake(m - 1, dtype=torch.int32))
        with pytest.raises(ValueError, match="K differs"):
            op(a, sa, _fake(e, n, 256, dtype=E4M3), sb, idx)
        with pytest.raises(TypeError, match="b has dtype"):
            op(a, sa, _fake(e, n, k, dtype=torch.bfloat16), sb, idx)
        with pytest.raises(TypeError, match="out_dtype"):
            op(a, sa, b, sb, idx, torch.float32)


def test_fake_mode_masked():
    with FakeTensorMode():
        e, max_m, n, k = 4, 256, 4096, 7168
        a, sa = _fake(e, max_m, k, dtype=E4M3), _fake(e, max_m, 56)
        b, sb = _fake(e, n, k, dtype=E4M3), _fake(e, 32, 56)
        mm = _fake(e, dtype=torch.int32)
        op = torch.ops.cute_kernels.fp8_gemm_grouped_masked
        out = op(a, sa, b, sb, mm)
        assert out.shape == (e, max_m, n) and out.dtype == torch.bfloat16
        assert op(a, sa, b, sb, mm, 64).shape == (e, max_m, n)
        with pytest.raises(ValueError, match=r"a must be 3-D \(E, max_m, K\)"):
            op(_fake(max_m, k, dtype=E4M3), sa, b, sb, mm)
        with pytest.raises(ValueError, match="a has 3 experts"):
            op(_fake(3, max_m, k, dtype=E4M3), sa, b, sb, mm)
        with pytest.raises(ValueError, match=r"sa must have shape \(4, 256, 56\)"):
            op(a, _fake(max_m, 56), b, sb, mm)
        with pytest.raises(ValueError, match=r"masked_m must have shape \(4,\)"):
            op(a, sa, b, sb, _fake(3, dtype=torch.int32))
        with pytest.raises(TypeError, match="masked_m has dtype"):
            op(a, sa, b, sb, _fake(e))
        with pytest.raises(ValueError, match="expected_m"):
            op(a, sa, b, sb, mm, -1)


def test_cpu_tensors_get_named_device_errors():
    with pytest.raises(ValueError, match="a must be on a CUDA device"):
        ck.fp8_gemm_grouped_contiguous(torch.zeros(4, 16, dtype=E4M3), torch.ones(4, 1),
                                       torch.zeros(1, 4, 16, dtype=E4M3), torch.ones(1, 1, 1),
                                       torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="a must be on a CUDA device"):
        ck.fp8_gemm_grouped_masked(torch.zeros(1, 4, 16, dtype=E4M3), torch.ones(1, 4, 1),
                                   torch.zeros(1, 4, 16, dtype=E4M3), torch.ones(1, 1, 1),
                                   torch.zeros(1, dtype=torch.int32))
