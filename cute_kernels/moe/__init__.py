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

@dataclass(frozen=True, eq=False)
class RouteSpec(KernelSpec):
    def check(self, p):
        super().check(p)
        if p["top_k"] > p["experts"]:
            raise ValueError(f"{self.name}: top_k {p['top_k']} > experts {p['experts']}")
        g = p["groups"]
        if g and (p["experts"] % g or not 1 <= p["topk_groups"] <= g):
            raise ValueError(f"{self.name}: groups {g} must divide experts {p['experts']} and topk_groups lie in "
                             f"[1, {g}]")

    def build(self, p):
        from cute_kernels.moe.kernels import MoeRoute

        dt = dtypes.cutlass_of(p["logits"])

        def sym(div=1):
            return index_sym(False, div)

        e, k = p["experts"], p["top_k"]
        logits = fake_tensor(dt, (sym(), e), (sym(), 1), dt.width // 8)
        bias = fake_tensor(cutlass.Float32, (e,), (1,), 4)
        ids = fake_tensor(cutlass.Int32, (sym(), k), (sym(), 1), 4)
        weights = fake_tensor(cutlass.Float32, (sym(), k), (sym(), 1), 4)
        kernel = MoeRoute(e, k, p["scoring"], p["groups"], p["topk_groups"], p["bias"], p["renormalize"])
        return kernel, (logits, bias, ids, weights, cutlass.Float32(1.0), cutlass.Int32(1), fake_stream())

    def representative(self):
        return [self.resolve(), self.resolve({"scoring": "sigmoid", "experts": 256, "top_k": 8, "groups": 8,
                                              "topk_groups": 4, "bias": True})]


MOE_ROUTE = RouteSpec(
    name="moe.route",
    family="moe",
    lesson=14,
    summary="MoE routing, a warp a token: softmax / sigmoid scores, the correction bias, group-limited selection, "
            "top-k by warp arg-max rounds (ties to the lower expert), renormalized and scaled weights",
    ops=("moe_route",),
    status="ready",
    params={
        "logits": Param("fp32", ("fp32", "bf16"), "signature", "the logits' dtype"),
        "experts": Param(64, tuple(range(1, 257)), "signature", "experts E (a warp holds E / 32 a lane)"),
        "top_k": Param(6, tuple(range(1, 17)), "signature", "experts a token"),
        "scoring": Param("softmax", ("softmax", "sigmoid"), "signature", "scores from the logits"),
        "groups": Param(0, tuple(range(0, 33)), "signature", "expert groups (0: no group limit)"),
        "topk_groups": Param(1, tuple(range(1, 33)), "signature", "groups kept (with groups)"),
        "bias": Param(False, (True, False), "signature", "the selection's correction bias"),
        "renormalize": Param(True, (True, False), "signature", "weights renormalized to sum 1"),
    },
)

@dataclass(frozen=True, eq=False)
class LayoutsSpec(KernelSpec):
    def build(self, p):
        from cute_kernels.moe.kernels import MoeLayouts

        e = p["experts"]

        def sym(div=1):
            return index_sym(False, div)

        def flat(n=None):
            return fake_tensor(cutlass.Int32, (n if n is not None else sym(),), (1,), 4)

        chunk_counts = fake_tensor(cutlass.Int32, (sym(), e), (sym(), 1), 4)
        kernel = MoeLayouts(e, p["warps"], p["rounds"])
        return kernel, (flat(), chunk_counts, flat(e), flat(e + 1), flat(e + 1), flat(e), flat(), flat(), flat(),
                        flat(), flat(), flat(1), cutlass.Int32(1), fake_stream())

    def static_extents(self, p):
        return {p["experts"] + 1, 1}  # the offsets' and starts' E + 1 entries, the one drop count

    def representative(self):
        return [self.resolve(), self.resolve({"experts": 8, "warps": 2, "rounds": 2})]


MOE_LAYOUTS = LayoutsSpec(
    name="moe.layouts",
    family="moe",
    lesson=14,
    summary="both grouped-GEMM layouts of an expert assignment: a counting sort by expert that keeps copy order "
            "(per-warp counts by match.any, a chunk scan, placement), no atomics but the drop count",
    ops=("moe_route",),
    status="ready",
    params={
        "experts": Param(64, tuple(range(1, 1025)), "signature", "experts E"),
        "warps": Param(4, (1, 2, 4, 8), help="warps a CTA (a chunk is warps x rounds x 32 copies)"),
        "rounds": Param(8, (1, 2, 4, 8, 16, 32), help="32-copy rounds a warp walks in order"),
    },
)

SPECS = (MOE_TOKEN_ROWS, MOE_ROUTE, MOE_LAYOUTS)
