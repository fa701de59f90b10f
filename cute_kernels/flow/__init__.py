"""Flow family (lesson 15): the steps of flow-matching and diffusion samplers. The solver update (every stage point and
final combination of Euler, midpoint, Heun and RK4, with classifier-free guidance), the DDIM / DDPM step, the
sinusoidal time embedding, and a sampler that captures the whole N-step loop in one CUDA graph.

Files: this catalogue entry, `kernels.py`, `ops.py`, `sampler.py` (tableaux, `sample_flow`, `FlowSampler`),
`policy.py` (an example velocity network for a robot's action chunk, ours and its plain-torch twin), `bench.py`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from cute_kernels import dtypes
from cute_kernels.catalog import SIG_COMMON, KernelSpec, Param
from cute_kernels.fake import fake_stream, fake_tensor, index_sym
from cute_kernels.lazy import cutlass
from schedules.grid_stride import TUNED, GridStride

# The catalogue's default schedule: the elementwise add's tuned one (the ops pick by size, `grid_stride.pick("add")`).
FLOW_TUNED = TUNED["add"]

_GRID_PARAMS = {
    "threads": Param(FLOW_TUNED.threads, (128, 256, 512), help="threads per CTA"),
    "unroll": Param(FLOW_TUNED.unroll, (1, 2, 4, 8), help="vectors in flight per thread"),
    "ctas_per_sm": Param(FLOW_TUNED.ctas_per_sm, (0, 1, 2, 4, 8, 16), help="grid cap: CTAs per SM (0: none)"),
    "order": Param(FLOW_TUNED.order, ("grid", "cta"), help="items of a pass: a grid apart, or CTA-contiguous"),
}


def vec_for(names, aligned: bool) -> int:
    """Elements per vector of a map over tensors of the dtype names `names`: a 128-bit access of the widest."""
    return min(dtypes.vec_of(n, aligned) for n in names)


def _flat(dt, p, align):
    return fake_tensor(dt, (index_sym(p["index64"]),), (1,), align)


@dataclass(frozen=True, eq=False)
class FlowUpdateSpec(KernelSpec):
    def build(self, p):
        from cute_kernels.flow.kernels import FlowUpdate

        xt, kt = dtypes.cutlass_of(p["dtype"]), dtypes.cutlass_of(p["k_dtype"])
        vec = vec_for((p["dtype"], p["k_dtype"]), p["aligned"])
        kernel = FlowUpdate(p["terms"], p["cfg"], xt, kt, vec, p["index64"], self.schedule_of(p))
        x, out = (_flat(xt, p, 16 if p["aligned"] else xt.width // 8) for _ in range(2))
        ks = [_flat(kt, p, 16 if p["aligned"] else kt.width // 8) for _ in range(8)]
        f = cutlass.Float32
        return kernel, (x, *ks, out, f(1.0), f(1.0), f(1.0), f(1.0), f(1.0), f(1.0), cutlass.Int32(1), fake_stream())

    def representative(self):
        return [self.resolve(), self.resolve({"terms": 4, "cfg": True, "dtype": "fp32", "k_dtype": "bf16"})]

    def sweep(self):
        return [self.resolve({"terms": t, "cfg": c, "dtype": d, "k_dtype": k, "aligned": a, "index64": i})
                for t, c, d, k, a, i in itertools.product((1, 2, 3, 4), (False, True), dtypes.FLOAT_NAMES,
                                                         dtypes.FLOAT_NAMES, (True, False), (False, True))]


FLOW_UPDATE = FlowUpdateSpec(
    name="flow.update", family="flow", lesson=15, ops=("flow_update",), status="ready", schedule=GridStride,
    summary="x + dt * sum_i c_i k_i (1-4 terms, each optionally a guidance pair u + s (c - u)), fp32 math: every "
            "stage point and final combination of a fixed-grid Runge-Kutta step in one pass",
    params={
        **SIG_COMMON,
        "k_dtype": Param("bf16", dtypes.FLOAT_NAMES, "signature", "the k tensors' element type (x's may differ)"),
        "terms": Param(1, (1, 2, 3, 4), "signature", "k terms summed"),
        "cfg": Param(False, (False, True), "signature", "each term a classifier-free-guidance pair (u, c)"),
        **_GRID_PARAMS,
    },
)


@dataclass(frozen=True, eq=False)
class DiffusionStepSpec(KernelSpec):
    def build(self, p):
        from cute_kernels.flow.kernels import DiffusionStep

        dt = dtypes.cutlass_of(p["dtype"])
        vec = dtypes.vec_of(p["dtype"], p["aligned"])
        kernel = DiffusionStep(p["kind"], p["prediction"], p["clip"], p["noisy"], p["batched"], dt, vec,
                               p["index64"], self.schedule_of(p))
        align = 16 if p["aligned"] else dt.width // 8
        x, m, noise, out = (_flat(dt, p, align) for _ in range(4))
        alphas = [fake_tensor(cutlass.Float32, (index_sym(False),), (1,), 4) for _ in range(2)]
        per_row = (cutlass.Int64 if p["index64"] else cutlass.Int32)(1)
        f = cutlass.Float32
        return kernel, (x, m, noise, out, *alphas, per_row, f(0.0), f(1.0), cutlass.Int32(1), fake_stream())

    def representative(self):
        return [self.resolve(), self.resolve({"kind": "ddpm", "clip": True, "noisy": True, "batched": True}),
                self.resolve({"prediction": "v_prediction", "noisy": True, "dtype": "fp32"})]

    def sweep(self):
        return [self.resolve({"kind": k, "prediction": pr, "clip": c, "noisy": n, "batched": b, "dtype": d})
                for k, pr, c, n, b, d in itertools.product(("ddim", "ddpm"), ("epsilon", "sample", "v_prediction"),
                                                          (False, True), (False, True), (False, True),
                                                          dtypes.FLOAT_NAMES)]


DIFFUSION_STEP = DiffusionStepSpec(
    name="flow.diffusion_step", family="flow", lesson=15, ops=("ddim_step", "ddpm_step"), status="ready",
    schedule=GridStride,
    summary="x_{t-1} of DDIM / DDPM from x_t, the network's output and the noise, alphas read from the device",
    params={
        **SIG_COMMON,
        "kind": Param("ddim", ("ddim", "ddpm"), "signature", "the scheduler"),
        "prediction": Param("epsilon", ("epsilon", "sample", "v_prediction"), "signature", "what the network predicts"),
        "clip": Param(False, (False, True), "signature", "clamp the predicted sample to [-r, r]"),
        "noisy": Param(False, (False, True), "signature", "add a noise tensor"),
        "batched": Param(False, (False, True), "signature", "one alpha per batch row (else one for all)"),
        **_GRID_PARAMS,
    },
)


@dataclass(frozen=True, eq=False)
class TimestepEmbeddingSpec(KernelSpec):
    def build(self, p):
        from cute_kernels.flow.kernels import TimestepEmbedding

        ot = dtypes.cutlass_of(p["out_dtype"])
        kernel = TimestepEmbedding(p["flip"], ot, p["threads"])
        t = fake_tensor(cutlass.Float32, (index_sym(False),), (1,), 4)
        out = fake_tensor(ot, (index_sym(False), index_sym(False)), (index_sym(False), 1), ot.width // 8)
        f = cutlass.Float32
        return kernel, (t, out, f(9.2), f(1.0), f(1.0), cutlass.Int32(1), fake_stream())

    def sweep(self):
        return [self.resolve({"flip": f, "out_dtype": d}) for f in (False, True) for d in dtypes.FLOAT_NAMES]


TIMESTEP_EMBEDDING = TimestepEmbeddingSpec(
    name="flow.timestep_embedding", family="flow", lesson=15, ops=("timestep_embedding",), status="ready",
    summary="(B, dim) sinusoidal embedding of B times (diffusers' get_timestep_embedding), accurate exp / sin / cos",
    params={
        "out_dtype": Param("fp32", dtypes.FLOAT_NAMES, "signature", "output element type"),
        "flip": Param(False, (False, True), "signature", "cos before sin"),
        "threads": Param(256, (128, 256), help="threads per CTA (an output element each)"),
    },
)

SPECS = (FLOW_UPDATE, DIFFUSION_STEP, TIMESTEP_EMBEDDING)
