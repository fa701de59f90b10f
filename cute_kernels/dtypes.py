"""Names and conversions between torch dtypes, cutlass numeric types and short key names.

The names need neither torch nor cutlass; each conversion imports the one it returns."""

from __future__ import annotations

FLOAT_NAMES = ("bf16", "fp16", "fp32")
_TORCH = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
_CUTLASS = {"bf16": "BFloat16", "fp16": "Float16", "fp32": "Float32"}
_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def _check(name: str) -> str:
    if name not in _TORCH:
        raise ValueError(f"dtype must be one of {FLOAT_NAMES}, got {name!r}")
    return name


_NAME_OF_TORCH: dict = {}


def name_of(dtype) -> str:
    """The short name of a torch floating dtype (bf16, fp16, fp32); KeyError for any other."""
    if not _NAME_OF_TORCH:
        import torch

        _NAME_OF_TORCH.update({getattr(torch, t): n for n, t in _TORCH.items()})
    return _NAME_OF_TORCH[dtype]


def torch_of(name: str):
    import torch

    return getattr(torch, _TORCH[_check(name)])


def cutlass_of(name: str):
    from cute_kernels.lazy import cutlass

    return getattr(cutlass, _CUTLASS[_check(name)])


def elem_bytes(name: str) -> int:
    return _BYTES[_check(name)]


def vec_of(name: str, aligned: bool = True) -> int:
    """Elements per 16-byte access (1 when the operands are not 16-byte aligned)."""
    return 16 // elem_bytes(name) if aligned else 1


def __getattr__(attr):
    if attr == "FLOAT_TORCH":  # (bfloat16, float16, float32): torch loaded on first use
        return tuple(torch_of(n) for n in FLOAT_NAMES)
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
