"""CPU: the FP8 GEMM's short A box (`GemmSchedule.a_rows`, session 18; decode M <= 32), as the bf16 GEMM's: A's TMA
box and its 1x128 scales' box cover the tile's first a_rows rows, views of the same stage rings (stage i at
a_step * i, a_step = tile_m / a_rows). The stage's full barrier expects a_rows x 128 A bytes + a_rows x 4 scale
bytes (plus B's), and the rest of the kernel counts as the whole box's: the same WGMMAs and TMA copies, no local
memory. Kernels without it compile to the PTX they had (compared by hand at session 18: the bf16 and FP8 defaults,
split-K, k_interleave, grouped). Grouped GEMMs refuse it."""

import re

import pytest

from cute_kernels import catalog
from cute_kernels.artifacts import compile_with_artifacts

SPEC = catalog.get("fp8_gemm")


def _expect_tx(ptx: str) -> set[int]:
    return {int(v) for v in re.findall(r"mov\.b32\s+%r\d+, (\d+);\s*\n\s*mbarrier\.arrive\.expect_tx", ptx)}


def _ptx(cfg, tmp_path):
    report, files = compile_with_artifacts(SPEC, SPEC.resolve(cfg), str(tmp_path))
    assert report.kernels[0].local_bytes == 0, report.format()
    return files["ptx"].read_text()


CASES = [  # (tile_n, cluster_n, a_rows, extra)
    (32, 1, 16, {}), (64, 2, 16, {}), (32, 1, 8, dict(k_interleave=True)), (32, 1, 32, dict(split_k=2)),
    (32, 1, 16, dict(promote_overlap=True, sb_ahead=True)),
]


@pytest.mark.parametrize("tile_n,cn,a_rows,extra", CASES, ids=[f"n{c[0]}-c{c[1]}-a{c[2]}-{'-'.join(c[3])}"
                                                              for c in CASES])
def test_short_boxes_compile(tile_n, cn, a_rows, extra, tmp_path):
    base = dict(schedule="pingpong", tile_m=64, tile_n=tile_n, cluster_m=1, cluster_n=cn, **extra)
    full = _ptx(base, tmp_path / "full")
    short = _ptx(dict(base, a_rows=a_rows), tmp_path / "short")
    assert _expect_tx(full) == {64 * 128 + tile_n * 128 + 64 * 4}
    assert _expect_tx(short) == {a_rows * 128 + tile_n * 128 + a_rows * 4}
    for pat in (r"wgmma\.mma_async", r"cp\.async\.bulk\.tensor", r"setmaxnreg"):
        assert len(re.findall(pat, short)) == len(re.findall(pat, full)), pat


def test_short_box_refused_for_grouped():
    with pytest.raises(ValueError, match="a_rows"):
        SPEC.resolve(dict(schedule="cooperative", tile_m=128, tile_n=128, cluster_m=1, cluster_n=1, a_rows=16,
                          grouping="contiguous"))
    with pytest.raises(ValueError, match="a_rows"):
        SPEC.resolve(dict(schedule="pingpong", tile_m=64, tile_n=64, cluster_m=1, cluster_n=2, a_rows=8))
