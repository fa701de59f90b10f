"""SwiGLU family (lessons 9, 11): SiLU and the fused gated activation silu(gate) * up, forward and backward;
the elementwise map with 1-3 inputs and 1-2 outputs (`collectives.vector_map`), grid-stride over 128-bit vectors.

Files: this catalogue entry, `kernels.py`, `ops.py`, `bench.py`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from cute_kernels import dtypes
from cute_kernels.catalog import SIG_COMMON, KernelSpec, Param
from cute_kernels.fake import fake_stream, fake_tensor, index_sym
from cute_kernels.lazy import cutlass
from schedules.grid_stride import GridStride

SWIGLU_TUNED = GridStride(threads=128, unroll=4, ctas_per_sm=0, order="cta")


@dataclass(frozen=True, eq=False)
class GatedSpec(KernelSpec):
    def build(self, p):
        from cute_kernels.swiglu.kernels import GatedActivation

        dt = dtypes.cutlass_of(p["dtype"])
        vec = dtypes.vec_of(p["dtype"], p["aligned"])
        sched = self.schedule_of(p)
        kernel = GatedActivation(self.name.split(".")[1], dt, vec, p["index64"], sched)
        n = index_sym(p["index64"])
        align = 16 if p["aligned"] else dt.width // 8
        outs = [fake_tensor(dt, (n,), (1,), align) for _ in range(2)]
        if p["strided"]:  # inputs (rows, cols) with a row stride of their own; cols and strides whole vectors
            ins = [fake_tensor(dt, (index_sym(p["index64"]), index_sym(p["index64"], vec)),
                               (index_sym(p["index64"], vec), 1), align) for _ in range(3)]
        else:
            ins = [fake_tensor(dt, (n,), (1,), align) for _ in range(3)]
        return kernel, (*ins, *outs, cutlass.Int32(1), fake_stream())

    def sweep(self):
        return [self.resolve({"dtype": d, "aligned": a, "index64": i, "strided": s})
                for d, a, i, s in itertools.product(dtypes.FLOAT_NAMES, (True, False), (False, True), (False, True))]


def _gated(op: str, summary: str) -> GatedSpec:
    t = SWIGLU_TUNED
    return GatedSpec(
        name=f"swiglu.{op}", family="swiglu", lesson=11, summary=summary, ops=("silu", "swiglu"), status="ready",
        schedule=GridStride,
        params={
            **SIG_COMMON,
            "strided": Param(False, (False, True), "signature",
                             "inputs are (rows, cols) matrices with a row stride (column slices, read in place)"),
            "threads": Param(t.threads, (128, 256, 512), help="threads per CTA"),
            "unroll": Param(t.unroll, (1, 2, 4, 8), help="128-bit vectors in flight per thread"),
            "ctas_per_sm": Param(t.ctas_per_sm, (0, 1, 2, 4, 8, 16), help="grid cap: CTAs per SM (0: none)"),
            "order": Param(t.order, ("grid", "cta"), help="items of a pass: a grid apart, or CTA-contiguous"),
        },
    )


SILU_FWD = _gated("silu_fwd", "y = x * sigmoid(x); fp32 math")
SILU_BWD = _gated("silu_bwd", "dx = dy * silu'(x)")
SWIGLU_FWD = _gated("swiglu_fwd", "out = silu(gate) * up, fused (3 tensors moved instead of 5)")
SWIGLU_BWD = _gated("swiglu_bwd", "dgate, dup from gate, up, dout in one pass (5 tensors)")


@dataclass(frozen=True, eq=False)
class SwigluQuantSpec(KernelSpec):
    def build(self, p):
        from cute_kernels.swiglu.kernels import SwigluQuant

        dt = dtypes.cutlass_of(p["dtype"])

        def sym(div=1):
            return index_sym(False, div)

        gate, up = (fake_tensor(dt, (sym(), sym(128)), (sym(8), 1), 16) for _ in range(2))
        q = fake_tensor(cutlass.Float8E4M3FN, (sym(), sym(128)), (sym(16), 1), 16)
        s = fake_tensor(cutlass.Float32, (sym(), sym()), (sym(), sym()), 4)
        return SwigluQuant(dt, p["threads"]), (gate, up, q, s, cutlass.Int32(1), fake_stream())


SWIGLU_QUANT = SwigluQuantSpec(
    name="swiglu.quantize", family="swiglu", lesson=13,
    summary="(e4m3, 1x128 scales) of silu(gate) * up from the fp32 product: the FP8 MLP's activation and the next "
            "GEMM's quantization in one pass",
    ops=("swiglu_quantize",), status="ready",
    params={
        "dtype": Param("bf16", ("bf16", "fp16"), "signature", "gate / up element type"),
        "threads": Param(128, (64, 128, 256), help="threads per CTA (a row each)"),
    },
)

SPECS = (SILU_FWD, SILU_BWD, SWIGLU_FWD, SWIGLU_BWD, SWIGLU_QUANT)
