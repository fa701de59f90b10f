"""What the figure scripts share: writing a figure as a palette PNG, and their command line (`--out`, `--only`)."""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

from cute_kernels.figures import save_png  # noqa: E402  (the scripts put the project root on sys.path first)

DPI = 110


def save(fig, out: Path, name: str, colors: int = 128) -> Path:
    """`fig` written to out/name and closed, a palette PNG of `colors` colours (flat fills need few)."""
    return save_png(fig, out / name, dpi=DPI, colors=colors)


def cli(figures, description: str, default_out: Path, argv=None) -> list[Path]:
    """Draw `figures` (functions of the output folder returning the path written) into --out, or the ones --only
    names; print each file's size."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", type=Path, default=default_out, help="directory for the PNGs (default: docs/figures)")
    ap.add_argument("--only", default="", help="comma-separated figure functions to draw (default: all)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    only = {s for s in args.only.split(",") if s}
    written = [f(args.out) for f in figures if not only or f.__name__ in only]
    for p in written:
        print(f"{p}  {p.stat().st_size / 1024:.0f} KiB")
    return written
