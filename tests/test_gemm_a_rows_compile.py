"""CPU: the bf16 GEMM's short A box (`GemmSchedule.a_rows`, session 17). With a_rows < tile_m A's TMA box is the
first a_rows rows of each stage: the stage's full barrier expects a_rows x tile_k A bytes (plus B's), A's copy lands
at the same stage stride as the full box (the short ring has a_step = tile_m / a_rows times the stages, stage i at
a_step * i; checked bitwise on the GPU), and the rest of the kernel, WGMMAs included, counts as the full-box
kernel's. Invalid boxes are refused by
the schedule and the catalogue with the reason."""

import re

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts
from cute_kernels.specs_gemm import params_for
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
