"""The catalogue: every kernel of the curriculum, its parameters and how to compile it.

A kernel's parameters split into its *config* (schedule choices: threads, unroll, tiling) and its
*signature* (what the data is: dtypes, whether operands are 16-byte aligned, 32- or 64-bit
indexing). Both name the compiled artifact in the cache key; neither includes a size, which stays
symbolic. `representative()` is what the CPU test-suite compiles for every kernel, `sweep()` the
full set behind `-m sweep`.

Where a kernel's config is a schedule dataclass (`KernelSpec.schedule`: GEMM, FP8 GEMM, attention), the
dataclass is the config: its fields that the spec names are the config parameters (the field `kind` is the
parameter `schedule`), an op hands the schedule object itself to `compiled(schedule, **signature)`, and the
schedule's own checks are the rules. Parameters a caller leaves out take defaults that follow the ones given
(`KernelSpec.defaults`: ping-pong gets a tile that fits it); a combination the caller asked for that cannot be
built is refused with an error naming it, never rewritten.

Each family lives in `cute_kernels/<family>/` (its `__init__` holds the catalogue entries, `SPECS`) and is
registered by one line of `FAMILIES` below, which also names the torch ops its `ops.py` exports as
`cute_kernels.<op>`. Nothing here imports torch or cutlass: the metadata loads in a few milliseconds, and a
spec's `build` imports the DSL when a kernel is compiled.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

from cute_kernels import dtypes

# family (the package cute_kernels/<family>/): the public ops of its ops.py, exported as cute_kernels.<op>
FAMILIES: dict[str, tuple[str, ...]] = {
    "elementwise": ("copy", "add", "axpby"),
    "reduction": ("sum",),
    "gemv": ("gemv",),
    "rowwise": ("rms_norm", "layer_norm", "softmax", "log_softmax", "cross_entropy"),
    "transpose": ("transpose",),
    "swiglu": ("silu", "swiglu", "swiglu_quantize"),
    "gemm": ("gemm", "addmm", "gemm_swiglu", "pack_gate_up"),
    "argmax": ("argmax",),
    "quantize": ("quantize_1x128", "quantize_128x128"),
    "fp8_gemm": ("fp8_gemm", "fp8_gemm_grouped_contiguous", "fp8_gemm_grouped_contiguous_swiglu",
                 "fp8_gemm_grouped_masked"),
    "attention": ("flash_attn", "flash_attn_varlen", "flash_attn_with_kvcache", "merge_attention_states",
                  "merge_attention_states_many", "hadamard", "quantize_attention_fp8", "flash_attn_fp8"),
    "rope": ("rope", "rope_", "rope_kv_append", "rope_tables"),
    "w4a16": ("gemm_w4a16", "gemm_w4a16_swiglu", "pack_int4", "unpack_int4"),
    "moe": ("moe_route", "moe_dispatch", "moe_combine", "moe"),
    "qat": ("fake_quant", "fake_quant_learnable", "fake_quant_observed"),
    "voxel": ("voxelize", "voxel_scatter", "voxel_trim"),
    "flow": ("flow_update", "ddim_step", "ddpm_step", "timestep_embedding", "sample_flow"),
}
OP_FAMILY: dict[str, str] = {op: fam for fam, ops in FAMILIES.items() for op in ops}

_TRUE, _FALSE = ("1", "true", "True", "yes"), ("0", "false", "False", "no")


@dataclass(frozen=True)
class Param:
    default: Any
    choices: tuple = ()
    role: str = "config"  # "config" or "signature"
    help: str = ""

    def parse(self, text: str):
        if isinstance(self.default, bool):
            if text not in _TRUE + _FALSE:
                raise ValueError(f"must be true or false (1/0), got {text!r}")
            value = text in _TRUE
        else:
            try:
                value = type(self.default)(text)
            except ValueError:
                raise ValueError(f"must be {type(self.default).__name__}, got {text!r}") from None
        if self.choices and value not in self.choices:
            raise ValueError(f"must be one of {self.choices}, got {text!r}")
        return value


SIG_COMMON = {
    "dtype": Param("bf16", dtypes.FLOAT_NAMES, "signature", "element type"),
    "aligned": Param(True, (True, False), "signature", "operands 16-byte aligned (128-bit vectors)"),
    "index64": Param(False, (True, False), "signature", "64-bit indexing (>= 2^31 elements)"),
}


@dataclass(frozen=True, eq=False)
class KernelSpec:
    name: str
    family: str
    lesson: int
    summary: str
    ops: tuple[str, ...] = ()
    status: str = "planned"
    params: dict[str, Param] = field(default_factory=dict)
    # the schedule dataclass whose fields named in `params` are this kernel's config (None: plain parameters)
    schedule: type | None = None

    # --- parameters -----------------------------------------------------------------------------
    def resolve(self, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        """Every parameter: the ones given (text is parsed), then defaults that follow them; refused (ValueError
        naming the parameter) when a name, a value or the combination the caller asked for is invalid."""
        given = {}
        for k, v in (overrides or {}).items():
            if k not in self.params:
                close = difflib.get_close_matches(k, self.params, n=3)
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                raise ValueError(f"{self.name}: unknown parameter {k!r}{hint} (known: {', '.join(self.params)})")
            try:
                given[k] = self.params[k].parse(v) if isinstance(v, str) else v
            except ValueError as e:
                raise ValueError(f"{self.name}: parameter {k} {e}") from None
            if self.params[k].choices and given[k] not in self.params[k].choices:
                raise ValueError(f"{self.name}: parameter {k} must be one of {self.params[k].choices}, got {v!r}")
        p = self.defaults(given)
        p.update(given)
        self.check(p)
        return p

    def defaults(self, given: dict[str, Any]) -> dict[str, Any]:
        """The value of every parameter not in `given`, which it may follow (a kernel's schedule rules)."""
        return {k: v.default for k, v in self.params.items()}

    def check(self, p: dict[str, Any]) -> None:
        """Raise ValueError naming what cannot be built; never changes `p`."""
        if self.schedule is not None:
            self.schedule_of(p)  # the dataclass's own checks

    def key(self, p: dict[str, Any]):
        from cute_kernels.jit import CacheKey

        def frag(role):
            return ",".join(f"{k}={p[k]}" for k, v in self.params.items() if v.role == role)

        return CacheKey(self.name, frag("config"), frag("signature"))

    # --- the schedule as the config -------------------------------------------------------------
    def schedule_params(self) -> dict[str, str]:
        """{parameter: field} of the schedule's fields this spec has a parameter for (`kind` is `schedule`)."""
        if self.schedule is None:
            return {}
        out = {}
        for f in dataclasses.fields(self.schedule):
            name = "schedule" if f.name == "kind" else f.name
            if name in self.params:
                out[name] = f.name
        return out

    def make_schedule(self, **fields):
        return self.schedule(**fields)

    def schedule_of(self, p: dict[str, Any]):
        """The schedule object of resolved parameters `p`."""
        return self.make_schedule(**{f: p[k] for k, f in self.schedule_params().items()})

    def config_of(self, schedule) -> dict[str, Any]:
        """The config parameters of a schedule object."""
        return {k: getattr(schedule, f) for k, f in self.schedule_params().items()}

    def params_of_call(self, schedule=None, **overrides) -> dict[str, Any]:
        """The resolved parameters of `compiled(schedule, **overrides)`."""
        return self.resolve({**self.config_of(schedule), **overrides} if schedule is not None else overrides)

    # --- compiling ------------------------------------------------------------------------------
    def build(self, p: dict[str, Any]) -> tuple[Callable, tuple]:
        raise NotImplementedError(f"{self.name} is {self.status}")

    def dynamic_smem_bytes(self, p: dict[str, Any]) -> int | None:
        return None

    def static_extents(self, p: dict[str, Any]) -> set:
        """Sizes a compiled variant fixes besides its int signature parameters (a workspace tile that the config and
        the signature determine); every other extent and stride stays symbolic, so no new shape recompiles."""
        return set()

    def local_memory_note(self, p: dict[str, Any]) -> str | None:
        """Why a variant keeps local memory by design (None: it should have none)."""
        return None

    def compiled(self, schedule=None, **overrides):
        """The compiled callable for `schedule` (a schedule object, for specs whose config it is) and the other
        parameters, through the process-wide compile cache (its memory tier answers a repeated call before any
        parameter is resolved)."""
        from cute_kernels.jit import default_cache

        cache = default_cache()
        memo = (self.name, schedule, tuple(overrides.items()))
        fn = cache.memo.get(memo)
        if fn is None:
            p = self.params_of_call(schedule, **overrides)
            fn = cache.memo[memo] = cache.get(self.key(p), lambda: self.build(p))
        else:
            cache.stats.memory_hits += 1
        return fn

    def representative(self) -> list[dict[str, Any]]:
        return [self.resolve()]

    def sweep(self) -> list[dict[str, Any]]:
        return self.representative()


# ---------------------------------------------------------------------------------------------
# The registry
# ---------------------------------------------------------------------------------------------
# The rest of the curriculum: listed with its status so `cute-kernels list` shows the whole map.
_PLANNED: list[tuple[str, str, int, str]] = []  # (name, family, lesson, summary); every lesson is built now

_KERNELS: dict[str, KernelSpec] = {}


def kernels() -> dict[str, KernelSpec]:
    """Every catalogue entry by name: each family's `SPECS`, then the planned lessons."""
    if not _KERNELS:
        found: dict[str, KernelSpec] = {}
        for fam in FAMILIES:
            for spec in importlib.import_module(f"cute_kernels.{fam}").SPECS:
                found[spec.name] = spec
        for name, fam, lesson, summary in _PLANNED:
            found.setdefault(name, KernelSpec(name, fam, lesson, summary))
        _KERNELS.update(found)
    return _KERNELS


def get(name: str) -> KernelSpec:
    ks = kernels()
    try:
        return ks[name]
    except KeyError:
        close = difflib.get_close_matches(name, ks, n=3, cutoff=0.6) or [k for k in ks if name in k][:3]
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise KeyError(f"unknown kernel {name!r}{hint} (see `cute-kernels list`)") from None


def ready() -> list[KernelSpec]:
    return [s for s in kernels().values() if s.status == "ready"]


def __getattr__(attr):
    if attr == "KERNELS":
        return kernels()
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
