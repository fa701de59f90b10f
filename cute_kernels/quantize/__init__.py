"""Catalogue entries of the FP8 e4m3 quantizers that feed the FP8 GEMM:
`quantize.1x128` (activations: one scale per row per 128 columns) and `quantize.128x128`
(weights: one scale per 128 x 128 block). Kernel: `cute_kernels.quantize.kernels.BlockQuantize`.

Signature: input dtype, alignment (128-bit loads need K a multiple of 16 and 16-byte aligned row
strides and base: then every 16-element piece of a block-row is whole; else the scalar variant),
index width, power-of-two (UE8M0) scales. Config: threads per CTA (weights: 512, two passes of 64
block-rows, 32 elements held per thread in 64 registers; 256 threads took 128), and for activations
the passes (block-rows per thread in flight). Sizes stay symbolic; the scale tensor takes any strides.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from cute_kernels import dtypes
from cute_kernels.catalog import SIG_COMMON, KernelSpec, Param
from cute_kernels.fake import fake_stream, index_sym
from cute_kernels.lazy import cute, cutlass

ALIGN_ELEMS = 16  # aligned variant: K and the row strides of x and q multiples of 16 elements


@dataclass(frozen=True, eq=False)
class QuantSpec(KernelSpec):
    """`name` is quantize.1x128 or quantize.128x128."""

    @property
    def block_rows(self) -> int:
        return 1 if self.name.endswith("1x128") else 128

    def check(self, p):
        if self.block_rows == 128 and 128 % (p["threads"] // 8):
            raise ValueError(f"{self.name}: threads // 8 must divide 128, got threads={p['threads']}")

    def build(self, p):
        from cute_kernels.quantize.kernels import BlockQuantize

        dt = dtypes.cutlass_of(p["dtype"])
        vec = dtypes.vec_of(p["dtype"], p["aligned"])
        i64 = p["index64"]
        kernel = BlockQuantize(dt, vec, i64, self.block_rows, p["ue8m0"], p["threads"], p["passes"])
        div = ALIGN_ELEMS if p["aligned"] else 1
        m, k = index_sym(i64), index_sym(i64, div)

        def mat(t, align):
            return cute.runtime.make_fake_tensor(t, (m, k), stride=(index_sym(i64, div), 1), assumed_align=align)

        x = mat(dt, 16 if p["aligned"] else dt.width // 8)
        q = mat(cutlass.Float8E4M3FN, 16 if p["aligned"] else 1)
        scales = cute.runtime.make_fake_tensor(cutlass.Float32, (index_sym(i64), index_sym(i64)),
                                               stride=(index_sym(i64), index_sym(i64)), assumed_align=4)
        return kernel, (x, q, scales, cutlass.Int32(1), fake_stream())

    def representative(self):
        """Aligned variants (the scalar ones: tests/quantize/test_quantize_compile.py)."""
        return [self.resolve(), self.resolve({"dtype": "fp32", "ue8m0": True})]

    def sweep(self):
        return [self.resolve({"dtype": d, "aligned": a, "ue8m0": u})
                for d, a, u in itertools.product(dtypes.FLOAT_NAMES, (True, False), (False, True))]


def _spec(block: str, summary: str, op: str, threads: int) -> QuantSpec:
    return QuantSpec(
        name=f"quantize.{block}", family="quantize", lesson=13, summary=summary, ops=(op,), status="ready",
        params={
            **SIG_COMMON,
            "ue8m0": Param(False, (False, True), "signature", "power-of-two (UE8M0) scales"),
            "threads": Param(threads, (128, 256, 512), help="threads per CTA (8 per 128-column block-row)"),
            "passes": Param(2, (1, 2, 4), help="block-rows per thread in flight (1x128 only, the op runs 1 on the scalar "
                                               "variant; 128x128: 128 / groups)"),
        })


QUANT_1X128 = _spec("1x128", "FP8 e4m3 activation quantizer: a scale per row per 128 columns, in the GEMM's "
                             "TMA-aligned MN-major layout", "quantize_1x128", 256)
QUANT_128X128 = _spec("128x128", "FP8 e4m3 weight quantizer: a scale per 128 x 128 block, amax over the CTA",
                      "quantize_128x128", 512)
QUANT = [QUANT_1X128, QUANT_128X128]

SPECS = (QUANT_1X128, QUANT_128X128)
