"""The compile target. The project builds for Hopper (sm_90a) whether or not a GPU is present.

`CUTE_DSL_ARCH` is read by the DSL when it is first imported, so every top-level package of the
project sets its default before importing `cutlass`; `--gpu-arch` is also passed to each compile.
"""

from __future__ import annotations

import os

DEFAULT_ARCH = "sm_90a"
os.environ.setdefault("CUTE_DSL_ARCH", DEFAULT_ARCH)

SUPPORTED_ARCHS = ("sm_90a",)


def current_arch() -> str:
    return os.environ.get("CUTE_DSL_ARCH", DEFAULT_ARCH)


def check_arch(arch: str) -> str:
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(
            f"arch must be one of {SUPPORTED_ARCHS} (the kernels use Hopper-only instructions), got {arch!r}"
        )
    return arch
