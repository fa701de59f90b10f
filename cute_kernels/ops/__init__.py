"""The torch-facing ops. Importing this registers the `cute_kernels::*` custom ops."""

from cute_kernels.ops.elementwise import add, axpby, copy
from cute_kernels.ops.reduction import sum

__all__ = ["add", "axpby", "copy", "sum"]
