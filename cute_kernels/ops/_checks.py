"""Input validation shared by the torch ops. Every error names the argument and what was wrong.

Checks run in both the real and the fake (meta) implementation, so a bad call fails the same way in
eager mode and while `torch.compile` traces.
"""

from __future__ import annotations

import torch

from cute_kernels import dtypes

FLOAT_DTYPES = dtypes.FLOAT_TORCH


def check_tensor(name: str, t, *, allowed=FLOAT_DTYPES, min_ndim: int = 0) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cuda":
        raise ValueError(f"{name} must be on a CUDA device, got device '{t.device}'")
    if t.dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        raise TypeError(f"{name} has dtype {str(t.dtype).replace('torch.', '')}; supported: {names}")
    if t.dim() < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s), got shape {tuple(t.shape)}")


def check_like(name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    """`t` must match `ref` in dtype, device and shape (no broadcasting, no type promotion)."""
    check_tensor(name, t)
    if t.dtype != ref.dtype:
        raise TypeError(f"{name} has dtype {t.dtype} but {ref_name} has {ref.dtype}; cast one of them first")
    if t.device != ref.device:
        raise ValueError(f"{name} is on {t.device} but {ref_name} is on {ref.device}")
    if t.shape != ref.shape:
        raise ValueError(
            f"{name} has shape {tuple(t.shape)} but {ref_name} has {tuple(ref.shape)} (broadcasting is not supported)"
        )


def check_out_dtype(name: str, dtype) -> None:
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be one of bfloat16, float16, float32 or None, got {dtype}")


def aligned16(*ts: torch.Tensor) -> bool:
    return all(t.data_ptr() % 16 == 0 for t in ts)


def register_fake_and_guard(qualname: str, fake_fn) -> None:
    """Register `fake_fn` as the op's fake impl, and as its CPU impl so that a CPU tensor gets the
    checks' named error (fake_fn validates first) instead of the dispatcher's missing-kernel error."""
    torch.library.register_fake(qualname)(fake_fn)
    torch.library.impl(qualname, "CPU")(fake_fn)
