"""CPU test: the doc figure scripts of the row-wise, GEMV, transpose and SwiGLU/ArgMax pages run and
write their PNGs (drawn from the planners and layouts; see docs/figures/make_kernel_figures.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docs" / "figures" / "make_kernel_figures.py"
EXPECTED = ("rowwise_plans.png", "rowwise_cluster_exchange.png", "gemv_register_tile.png", "gemv_mma_chunk.png",
            "transpose_banks.png",
            "transpose_orders_tma.png", "argmax_two_level.png", "swiglu_fusion.png")


def test_kernel_figures_written(tmp_path):
    res = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    for name in EXPECTED:
        p = tmp_path / name
        assert p.is_file(), f"{name} not written; stdout: {res.stdout}"
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", name
        assert 5_000 < len(data) < 300 * 1024, f"{name}: {len(data)} bytes"


def test_pages_reference_figures():
    docs = ROOT / "docs" / "kernels"
    pages = {"rowwise.md": ("rowwise_plans.png", "rowwise_cluster_exchange.png"), "gemv.md": ("gemv_register_tile.png", "gemv_mma_chunk.png"),
             "transpose.md": ("transpose_banks.png", "transpose_orders_tma.png"),
             "swiglu.md": ("swiglu_fusion.png",), "argmax.md": ("argmax_two_level.png",)}
    for page, figs in pages.items():
        text = (docs / page).read_text()
        for f in figs:
            assert f"../figures/{f}" in text, f"{page} does not show {f}"
            assert (ROOT / "docs" / "figures" / f).is_file(), f
        assert "make_kernel_figures.py" in text, f"{page} does not say how to regenerate its figures"


LESSONS = ROOT / "docs" / "figures" / "make_lesson_figures.py"
LESSON_FIGURES = {"moe.md": ("moe_routing_layouts.png",), "flow.md": ("flow_sampler_timeline.png",),
                  "voxel.md": ("voxel_grid_order.png",), "qat.md": ("qat_grid_ste.png",)}


def test_lesson_figures_written(tmp_path):
    """Lessons 14-17: the script writes each page's pictures, and each page shows them and names the script."""
    res = subprocess.run([sys.executable, str(LESSONS), "--out", str(tmp_path)], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    for page, figs in LESSON_FIGURES.items():
        text = (ROOT / "docs" / "kernels" / page).read_text()
        assert "make_lesson_figures.py" in text, page
        for name in figs:
            data = (tmp_path / name).read_bytes()
            assert data[:8] == b"\x89PNG\r\n\x1a\n" and 5_000 < len(data) < 300 * 1024, name
            assert f"../figures/{name}" in text and (ROOT / "docs" / "figures" / name).is_file(), (page, name)
