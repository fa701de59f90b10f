"""The torch-facing ops. Importing this registers the `cute_kernels::*` custom ops."""

from cute_kernels.ops.elementwise import add, axpby, copy
from cute_kernels.ops.gemm import gemm
from cute_kernels.ops.reduction import sum

__all__ = ["add", "axpby", "copy", "gemm", "sum"]

# Lessons 3, 8, 9, 11, 12: GEMV, transposes, SiLU/SwiGLU, ArgMax.
from cute_kernels.ops.argmax import argmax  # noqa: E402
from cute_kernels.ops.gemv import gemv  # noqa: E402
from cute_kernels.ops.swiglu import silu, swiglu  # noqa: E402
from cute_kernels.ops.transpose import transpose  # noqa: E402

__all__ += ["argmax", "gemv", "silu", "swiglu", "transpose"]

# Lessons 4-7: row-wise ops (norms, softmax, cross-entropy).
from cute_kernels.ops.norms import layer_norm, rms_norm  # noqa: E402
from cute_kernels.ops.softmax import cross_entropy, log_softmax, softmax  # noqa: E402

__all__ += ["cross_entropy", "layer_norm", "log_softmax", "rms_norm", "softmax"]

# Lesson 13: FP8 block-scaled GEMM and its quantizers.
from cute_kernels.ops.fp8_gemm import fp8_gemm, quantize_1x128, quantize_128x128  # noqa: E402

__all__ += ["fp8_gemm", "quantize_1x128", "quantize_128x128"]
from cute_kernels.ops.fp8_gemm_grouped import fp8_gemm_grouped_contiguous, fp8_gemm_grouped_masked  # noqa: E402

__all__ += ["fp8_gemm_grouped_contiguous", "fp8_gemm_grouped_masked"]

# Issue 6: FlashAttention forward (Hopper, FA3 schedule).
from cute_kernels.ops.flash_attn import flash_attn, flash_attn_varlen  # noqa: E402

__all__ += ["flash_attn", "flash_attn_varlen"]
