"""Shared test helpers: fresh random inputs, poisoned outputs, dtype-aware error bounds."""

from __future__ import annotations

import torch

EPS = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}


def randn(*shape, dtype=torch.bfloat16, device="cuda", seed=None):
    g = torch.Generator(device=device)
    g.manual_seed(seed if seed is not None else torch.randint(0, 2**31 - 1, ()).item())
    return torch.randn(*shape, generator=g, dtype=torch.float32, device=device).to(dtype)


def poison_empty(monkeypatch) -> None:
    """Make `torch.empty` return NaN-filled floating tensors for the rest of a test, so an op that
    leaves an output element unwritten fails the finiteness checks.

    Only plain tensors that do not require grad are filled. torch.compile calls `torch.empty` too:
    on a process's first Inductor compile its pattern matcher builds example inputs as fake tensors
    with `torch.empty(..., requires_grad=True)`, and an in-place fill of such a leaf raises ("a leaf
    Variable that requires grad is being used in an in-place operation"), failing the compile."""
    real = torch.empty

    def nan_empty(*args, **kwargs):
        t = real(*args, **kwargs)
        if type(t) is torch.Tensor and t.is_floating_point() and t.numel() and not t.requires_grad:
            t.fill_(float("nan"))
        return t

    monkeypatch.setattr(torch, "empty", nan_empty)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    den = ref.norm().item()
    return (out - ref).norm().item() / (den if den else 1.0)


def loads_128_bits(report, ptx: str, params: dict) -> bool:
    """The kernel's global reads are 128-bit: `ld.global.v4`, or, for row tensors staged in shared
    memory (`staging="smem"`), 16-byte `cp.async.cg.shared.global` copies."""
    if report.ptx_census["ld.global.v4 (128-bit)"] > 0:
        return True
    return params.get("staging") == "smem" and "cp.async.cg.shared.global" in ptx and ", 16, 16;" in ptx


def plans_with(match, **changes):
    """A `cute_kernels.rowwise.launch.plan_for` replacement: the production plan with `changes` applied
    (`dataclasses.replace`) for the kernels whose name `match(name)` accepts, the others unchanged.
    For `run_with_plans`."""
    import dataclasses

    from cute_kernels.rowwise import launch as R

    orig = R.plan_for

    def plan_for(name, dtype, n, aligned):
        p = orig(name, dtype, n, aligned)
        return dataclasses.replace(p, **changes) if match(name) else p

    return plan_for


def run_with_plans(monkeypatch, plan_for, fn):
    """Run `fn` with the row-wise ops' plan choice (`cute_kernels.rowwise.launch.plan_for`) replaced
    by `plan_for`, their compiled-function cache emptied before and after (so nothing compiled
    under the patch outlives it). Returns (fn's result, {kernel name: the plan it ran})."""
    from cute_kernels.rowwise import launch as R

    with monkeypatch.context() as m:
        m.setattr(R, "plan_for", plan_for)
        R._fns.clear()
        out = fn()
        plans = {k[0]: plan for k, (_, plan) in R._fns.items()}
    R._fns.clear()
    return out, plans


def sass_or_skip(report, files) -> str:
    """The kernel's SASS text; the test is skipped where nvdisasm is missing (no SASS census)."""
    import pytest

    if report.sass_census is None:
        pytest.skip("no nvdisasm")
    return files["sass"].read_text()


def compiled_sass(name: str, config: dict, out_dir) -> tuple:
    """Compile catalogue kernel `name` with `config` (resolved) into `out_dir`: (resolved params,
    report, `sass_instructions` of its SASS); the test is skipped where nvdisasm is missing."""
    from cute_kernels import catalog
    from cute_kernels.artifacts import compile_with_artifacts

    spec = catalog.get(name)
    p = spec.resolve(config)
    report, files = compile_with_artifacts(spec, p, str(out_dir))
    return p, report, sass_instructions(sass_or_skip(report, files))


def sass_instructions(sass: str) -> list[tuple[str, str]]:
    """(opcode, operands) of each SASS instruction in order; predicates (@P0, @!UPT, ...) dropped."""
    import re

    out = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][\w.]*)\s*(.*?)\s*;", line)
        if m:
            out.append((m.group(1), m.group(2)))
    return out


def highest_register(sass: str) -> int:
    """The highest general register (Rn) the SASS names: what `setmaxnreg` must leave room for."""
    import re

    return max(int(r) for r in re.findall(r"\bR(\d+)\b", sass))


def assert_within_registers(report, sass: str, limit: int) -> None:
    """No spill instructions, and every register a consumer touches below `limit` (its setmaxnreg)."""
    assert report.sass_census["LDL/STL (spills)"] == 0
    used = highest_register(sass)
    assert used < limit, f"R{used} past the consumers' {limit} registers"


def op_signature(name: str, **sig) -> dict:
    """The plain signature of row-wise kernel `name` as the ops pass it: the norms with a bf16 weight (LayerNorm fwd
    also a bias, present with the weight) and no residual; `sig` overrides."""
    base = {}
    if name.startswith(("rmsnorm", "layernorm")):
        base.update(weight=True, w_dtype="bf16", residual=False)
    if name == "layernorm.fwd":
        base["bias"] = sig.get("weight", True)
    return {**base, **sig}


def plan_params(name: str, plan, **sig) -> dict:
    """The resolved catalogue parameters of row-wise kernel `name` under `plan` (`specs_rowwise.config_of`): bf16,
    aligned, 32-bit indexing, `op_signature`'s operands; `sig` overrides."""
    from cute_kernels import catalog
    from cute_kernels.rowwise import config_of

    base = dict(dtype="bf16", aligned=True, index64=False)
    return catalog.get(name).resolve({**base, **config_of(plan, name), **op_signature(name, **sig)})


def case_id(case) -> str:
    """The pytest id of a (catalogue name, parameter overrides) compile case."""
    name, over = case
    return name + "".join(f",{k}={v}" for k, v in over.items())


def compile_and_check_census(case, out_dir) -> None:
    """Compile the (catalogue name, parameter overrides) case into `out_dir` and `check_census` it."""
    from cute_kernels import catalog
    from cute_kernels.artifacts import compile_with_artifacts

    name, over = case
    spec = catalog.get(name)
    report, files = compile_with_artifacts(spec, spec.resolve(over), str(out_dir))
    check_census(name, over, report, files)


def check_census(name: str, over: dict, report, files) -> None:
    """The instructions a GEMV, transpose, SiLU/SwiGLU or ArgMax kernel (catalogue `name` under `over`) is meant to
    use: 128-bit global accesses where vectorized, 128-bit shared accesses in the tiled transposes, one TMA load and
    one TMA store per tile in the TMA transpose, shuffles in the row reductions, no local memory anywhere."""
    import re

    ptx_text = files["ptx"].read_text()
    ptx, sass = report.ptx_census, report.sass_census
    assert not report.spills, report.format()
    assert report.kernels[0].registers <= 255
    aligned = (over.get("aligned", True) or over.get("row_head", False)) and over.get("dtype") != "key"
    family = name.split(".")[0]
    if name == "transpose.tma":
        q = over.get("sub", 1) ** 2
        # one TMA load and one TMA store per tile; the persistent kernel issues its loads in two places
        # (the first block, the next block from the loop)
        assert ptx["cp.async.bulk.tensor"] == (3 if over.get("persistent") else 2) * q, ptx["cp.async.bulk.tensor"]
        assert ptx["mbarrier"] > 0 and ptx["ld.global (all)"] == 0 and ptx["st.global (all)"] == 0
        if sass is not None and not over.get("persistent"):
            assert sass["UTMALDG (TMA load)"] == q and sass["UTMASTG (TMA store)"] == q
        assert len(re.findall(r"ld\.shared\.v4", ptx_text)) > 0
        return
    if aligned:
        assert ptx["ld.global.v4 (128-bit)"] > 0
        if sass is not None:
            assert sass["LDG.128"] > 0
    else:
        assert ptx["ld.global.v4 (128-bit)"] == 0
    if family == "swiglu" and aligned:
        assert ptx["st.global.v4 (128-bit)"] > 0
    if family == "swiglu":
        # 16-bit outputs: sigmoid by the hardware reciprocal, no IEEE division (its Newton steps and slow-path
        # call per element); fp32 outputs keep the division
        fast = over.get("dtype", "bf16") != "fp32"
        assert ("rcp.approx.ftz.f32" in ptx_text) == fast
        assert (re.search(r"\b(div|rcp)\.rn\.f32", ptx_text) is None) == fast
    if family in ("argmax", "gemv") and over.get("threads_per_row", 2) > 1:
        assert ptx["shfl.sync"] > 0
    if name == "transpose.naive":
        assert ptx["st.global.v4 (128-bit)"] == 0, "naive writes scalars down the output's columns"
    if name in ("transpose.smem", "transpose.swizzle"):
        assert len(re.findall(r"ld\.shared\.v4", ptx_text)) > 0, "the smem transpose reads 16-byte chunks"
        if aligned:
            assert ptx["st.global.v4 (128-bit)"] > 0
            assert len(re.findall(r"st\.shared\.v4", ptx_text)) > 0
