"""Writing a matplotlib figure as a palette PNG: plots, tables of bars and layout pictures need at most a few hundred
colours, and the palette makes the file several times smaller than RGBA (result and docs figures travel with every
device call, whose whole payload is capped)."""

from __future__ import annotations

from pathlib import Path


def save_png(fig, path, dpi: int = 110, colors: int = 256) -> Path:
    """`fig` written to `path` at `dpi` and closed; quantized to `colors` colours (nearest, no dither) when Pillow
    is there (it comes with matplotlib)."""
    import matplotlib.pyplot as plt

    path = Path(path)
    fig.savefig(str(path), dpi=dpi)
    plt.close(fig)
    try:
        from PIL import Image

        with Image.open(path) as im:
            small = im.convert("RGB").quantize(colors=colors, method=Image.Quantize.MEDIANCUT,
                                               dither=Image.Dither.NONE)
        small.save(path, optimize=True)
    except ImportError:  # pragma: no cover
        pass
    return path
