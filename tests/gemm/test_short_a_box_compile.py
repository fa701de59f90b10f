"""CPU: the bf16 GEMM's short A box (`GemmSchedule.a_rows`, session 17). With a_rows < tile_m A's TMA box is the
first a_rows rows of each stage: the stage's full barrier expects a_rows x tile_k A bytes (plus B's), A's copy lands
at the same stage stride as the full box (the short ring has a_step = tile_m / a_rows times the stages, stage i at
a_step * i; checked bitwise on the GPU), and the rest of the kernel, WGMMAs included, counts as the full-box
kernel's. Invalid boxes are refused by
the schedule and the catalogue with the reason."""

import dataclasses
import re

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from cute_kernels.gemm import params_for
from schedules.gemm import GemmSchedule

SPEC = catalog.get("gemm")


def _ptx(sched, tmp_path, **sig):
    report, files = compile_with_artifacts(SPEC, SPEC.resolve(params_for(sched, **sig)), str(tmp_path))
    assert report.kernels[0].local_bytes == 0, report.format()
    return report, files["ptx"].read_text()


def _expect_tx(ptx: str) -> set[int]:
    return {int(v) for v in re.findall(r"mov\.b32\s+%r\d+, (\d+);\s*\n\s*mbarrier\.arrive\.expect_tx", ptx)}


@pytest.mark.parametrize("a_rows,tile_n,cn,stages", [(32, 64, 2, 12), (16, 32, 2, 16), (8, 32, 1, 0)], ids=str)
def test_short_a_box_compiles(a_rows, tile_n, cn, stages, tmp_path):
    full = GemmSchedule(kind="pingpong", tile_m=64, tile_n=tile_n, cluster_m=1, cluster_n=cn, stages=stages)
    short = GemmSchedule(kind="pingpong", tile_m=64, tile_n=tile_n, cluster_m=1, cluster_n=cn, stages=stages,
                         a_rows=a_rows)
    rep_f, ptx_f = _ptx(full, tmp_path / "full")
    rep_s, ptx_s = _ptx(short, tmp_path / "short")
    assert _expect_tx(ptx_f) == {(64 + tile_n) * 64 * 2}
    assert _expect_tx(ptx_s) == {(a_rows + tile_n) * 64 * 2}
    count = lambda p, pat: len(re.findall(pat, p))  # noqa: E731
    for pat in (r"wgmma\.mma_async", r"cp\.async\.bulk\.tensor", r"setmaxnreg"):
        assert count(ptx_s, pat) == count(ptx_f, pat), pat
    assert str(short).endswith(f"_a{a_rows}") or f"_a{a_rows}_" in str(short)


def test_short_a_box_refused():
    with pytest.raises(ValueError, match="a_rows"):
        GemmSchedule(kind="pingpong", tile_m=64, tile_n=64, cluster_m=1, cluster_n=2, a_rows=8)  # 4-row slices
    with pytest.raises(ValueError, match="a_rows"):
        GemmSchedule(kind="pingpong", tile_m=64, tile_n=64, cluster_m=1, cluster_n=1, a_rows=64)
    s = GemmSchedule(kind="pingpong", tile_m=64, tile_n=64, cluster_m=1, cluster_n=1, a_rows=16)
    with pytest.raises(ValueError, match="K-major"):
        SPEC.resolve(params_for(s, a_major="m"))
    with pytest.raises(ValueError, match="128-byte"):
        SPEC.resolve(params_for(GemmSchedule(kind="pingpong", tile_m=64, tile_n=64, tile_k=128, cluster_m=1,
                                             cluster_n=1, a_rows=16)))


def test_small_m_default_cuts_a_box():
    """The default schedule at M <= 32 (session 18): A's box of the smallest a_rows holding M (`shortened`), then
    narrowed to 64x32 while that grid stays one wave (32x4096: 128 tiles; 8x7168 would take 224 and stays 64x64).
    From 33 rows, split-K schedules and other tiles: the whole box, as before."""
    from schedules.gemm import default_schedule, on_one_wave

    for m in (1, 5, 8, 16, 17, 32):
        for n, k in ((4096, 4096), (7168, 2048), (8192, 8192), (520, 1000)):
            d = default_schedule(m, n, k)
            if d.split_k > 1:
                assert not d.a_rows
                continue
            assert d.a_rows >= m and d.a_rows % (8 * d.cluster_n) == 0 and d.a_rows // 2 < max(m, 8 * d.cluster_n)
            assert not d.k_interleave
            assert (d.tile_n == 32) == on_one_wave(dataclasses.replace(d, tile_n=32), m, n), (m, n, d)
    assert str(default_schedule(32, 4096, 4096)).startswith("pingpong_64x32x64_c1x2_s16_a32")
    assert str(default_schedule(8, 7168, 2048)).startswith("pingpong_64x64x64_c1x2_s12_a16")
    for m in (33, 64, 128, 4096):
        assert not default_schedule(m, 4096, 4096).a_rows


def test_default_short_box_falls_back_for_m_major_a():
    """The op keeps the default's short box only for a K-major A; an M-major one runs the same schedule with the
    whole box (one cached schedule object: `_compiled` keys on it), while an explicit short-box schedule is refused."""
    from schedules.gemm import default_schedule
    from schedules.gemm import full_a_box as _full_a_box

    d = default_schedule(16, 4096, 4096)
    full = _full_a_box(d)
    assert full is _full_a_box(d) and full.a_rows == 0 and dataclasses.replace(full, a_rows=d.a_rows) == d
