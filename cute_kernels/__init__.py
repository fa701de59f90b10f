"""cute-kernels: Hopper (sm_90a) kernels in CUTLASS's CuTe Python DSL.

Three layers: `schedules` (when and where work runs), `collectives` (how a tile is computed) and
this package (what is computed: kernels, torch ops, the compile cache, the CLI).

    import cute_kernels as ck
    ck.add(x, y); ck.axpby(2.0, x, -1.0, y); ck.sum(x, dim=-1)
"""

from cute_kernels import target  # noqa: F401  (sets the DSL's arch before cutlass is imported)
from cute_kernels.ops import add, axpby, copy, gemm, sum  # noqa: E402

__version__ = "0.1.0"
__all__ = ["add", "axpby", "copy", "gemm", "sum", "__version__"]

# Lessons 3, 8, 9, 11, 12: GEMV, transposes, SiLU/SwiGLU, ArgMax.
from cute_kernels.ops import argmax, gemv, silu, swiglu, transpose  # noqa: E402

__all__ += ["argmax", "gemv", "silu", "swiglu", "transpose"]

from cute_kernels.ops import cross_entropy, layer_norm, log_softmax, rms_norm, softmax  # noqa: E402

__all__ += ["cross_entropy", "layer_norm", "log_softmax", "rms_norm", "softmax"]

from cute_kernels.ops import fp8_gemm, quantize_1x128, quantize_128x128  # noqa: E402

__all__ += ["fp8_gemm", "quantize_1x128", "quantize_128x128"]

from cute_kernels.ops import fp8_gemm_grouped_contiguous, fp8_gemm_grouped_masked  # noqa: E402

__all__ += ["fp8_gemm_grouped_contiguous", "fp8_gemm_grouped_masked"]

from cute_kernels.ops import flash_attn, flash_attn_varlen  # noqa: E402

__all__ += ["flash_attn", "flash_attn_varlen"]
