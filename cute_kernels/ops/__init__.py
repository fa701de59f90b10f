"""The torch-facing ops. Importing this registers the `cute_kernels::*` custom ops."""

from cute_kernels.ops.elementwise import add, axpby, copy
from cute_kernels.ops.reduction import sum

__all__ = ["add", "axpby", "copy", "sum"]

# Lessons 3, 8, 9, 11, 12: GEMV, transposes, SiLU/SwiGLU, ArgMax.
from cute_kernels.ops.argmax import argmax  # noqa: E402
from cute_kernels.ops.gemv import gemv  # noqa: E402
from cute_kernels.ops.swiglu import silu, swiglu  # noqa: E402
from cute_kernels.ops.transpose import transpose  # noqa: E402

__all__ += ["argmax", "gemv", "silu", "swiglu", "transpose"]
