"""Names and conversions between torch dtypes, cutlass numeric types and short key names."""

from __future__ import annotations

import cutlass
import torch

_BY_NAME = {
    "bf16": (torch.bfloat16, cutlass.BFloat16),
    "fp16": (torch.float16, cutlass.Float16),
    "fp32": (torch.float32, cutlass.Float32),
}
_NAME_OF_TORCH = {t: n for n, (t, _) in _BY_NAME.items()}

FLOAT_NAMES = tuple(_BY_NAME)
FLOAT_TORCH = tuple(t for t, _ in _BY_NAME.values())


def name_of(dtype: torch.dtype) -> str:
    return _NAME_OF_TORCH[dtype]


def torch_of(name: str) -> torch.dtype:
    return _by(name)[0]


def cutlass_of(name: str):
    return _by(name)[1]


def _by(name: str):
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"dtype must be one of {FLOAT_NAMES}, got {name!r}") from None


def elem_bytes(name: str) -> int:
    return cutlass_of(name).width // 8


def vec_of(name: str, aligned: bool = True) -> int:
    """Elements per 16-byte access (1 when the operands are not 16-byte aligned)."""
    return 16 // elem_bytes(name) if aligned else 1
