"""MoE family (lesson 14): routing, dispatch into the grouped GEMMs' layouts, combine back, and expert parallelism.

Files: this catalogue entry, `kernels.py` (dispatch / combine), `ops.py` (the torch ops), `reference.py` (the
semantics in torch: routing, both layouts, dispatch, combine), `ep.py` (expert parallelism over torch.distributed).
"""

from __future__ import annotations

from dataclasses import dataclass

from cute_kernels import dtypes
from cute_kernels.catalog import KernelSpec, Param
from cute_kernels.fake import fake_stream, fake_tensor, index_sym
from cute_kernels.lazy import cutlass


@dataclass(frozen=True, eq=False)
class TokenRowsSpec(KernelSpec):
    def check(self, p):
        super().check(p)
        if p["weighted"] and p["direction"] != "dispatch":
            raise ValueError(f"{self.name}: weighted is dispatch's option (combine always weighs)")
        if p["quantize"] and (p["direction"] != "dispatch" or p["weighted"]):
            raise ValueError(f"{self.name}: quantize is the unweighted dispatch's option")

    def build(self, p):
        from cute_kernels.moe.kernels import TokenRows

        dt = dtypes.cutlass_of(p["dtype"])

        def sym(div=1):
            return index_sym(False, div)

        def rows_of(t=dt, div=8):
            return fake_tensor(t, (sym(), sym(div)), (sym(div), 1), 16)

        k = p["top_k"]
        rows = fake_tensor(cutlass.Int32, (sym(), k), (sym(), sym()), 4)
        weights = fake_tensor(cutlass.Float32, (sym(), k), (sym(), sym()), 4)
        scales = fake_tensor(cutlass.Float32, (sym(), sym()), (sym(), sym()), 4)
        dst = rows_of(cutlass.Float8E4M3FN, 128) if p["quantize"] else rows_of()
        kernel = TokenRows(p["direction"], dt, k, p["weighted"], p["quantize"], p["threads"])
        return kernel, (rows_of(), dst, rows, weights, scales, cutlass.Int32(1), fake_stream())

    def representative(self):
        return [self.resolve(), self.resolve({"direction": "combine"}),
                self.resolve({"direction": "dispatch", "weighted": True, "top_k": 2, "dtype": "fp16"}),
                self.resolve({"quantize": True})]


MOE_TOKEN_ROWS = TokenRowsSpec(
    name="moe.token_rows",
    family="moe",
    lesson=14,
    summary="MoE dispatch (a token's row stored into its k layout rows) and combine (its k rows weighted and summed "
            "in slot order, fp32): a CTA a token, 16-byte vectors",
    ops=("moe_dispatch", "moe_combine"),
    status="ready",
    params={
        "direction": Param("dispatch", ("dispatch", "combine"), "signature", "token row -> layout rows, or back"),
        "dtype": Param("bf16", ("bf16", "fp16"), "signature", "element type of the rows"),
        "top_k": Param(8, tuple(range(1, 17)), "signature", "slots a token"),
        "weighted": Param(False, (True, False), "signature", "dispatch: w[t, s] x[t] (combine's gradient)"),
        "quantize": Param(False, (True, False), "signature", "dispatch: e4m3 rows with 1x128 scales (the FP8 GEMM's "
                          "input, quantize_1x128's bits)"),
        "threads": Param(128, (64, 128, 256), help="threads per CTA"),
    },
)

SPECS = (MOE_TOKEN_ROWS,)
