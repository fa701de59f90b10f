"""CPU: programmatic dependent launch (collectives.pdl) is safe only if every kernel launched with `use_pdl` waits
(griddepcontrol.wait) before it reads an earlier kernel's output: a kernel that releases its dependents early and
a dependent that never waits would read stale data, and the breach would show only as a rare wrong answer on the
GPU. Checked here on the source of every launch site (the kernel method it launches must reach a wait through its
own calls), and on the PTX of representative kernels."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WAITS = {"enter", "await_inputs"}  # collectives.pdl's entry points that wait
WAITING_HELPERS = {"map_vectors"}  # collectives that wait on the kernel's behalf (checked below)


def _methods(tree: ast.Module) -> dict[str, dict[str, ast.FunctionDef]]:
    return {c.name: {f.name: f for f in c.body if isinstance(f, ast.FunctionDef)}
            for c in ast.walk(tree) if isinstance(c, ast.ClassDef)}


def _waits(fn: ast.FunctionDef, methods: dict[str, ast.FunctionDef], seen: set[str]) -> bool:
    """Whether `fn` reaches a wait: pdl.enter / pdl.await_inputs, a waiting collective, or a method of its class
    that does."""
    seen.add(fn.name)
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            if f.value.id == "pdl" and f.attr in WAITS:
                return True
            if f.value.id == "self" and f.attr in methods and f.attr not in seen:
                if _waits(methods[f.attr], methods, seen):
                    return True
        if isinstance(f, ast.Name) and f.id in WAITING_HELPERS:
            return True
    return False


def _pdl_launches():
    """(file, class, launched kernel method) of every `.launch(..., use_pdl=...)` in the packages."""
    out = []
    for pkg in ("cute_kernels", "collectives", "schedules"):
        for src in sorted((ROOT / pkg).rglob("*.py")):
            tree = ast.parse(src.read_text())
            for cls in (c for c in ast.walk(tree) if isinstance(c, ast.ClassDef)):
                for node in ast.walk(cls):
                    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                            and node.func.attr == "launch" and any(k.arg == "use_pdl" for k in node.keywords)):
                        continue
                    callee = node.func.value  # self.<kernel>(...).launch
                    assert isinstance(callee, ast.Call) and isinstance(callee.func, ast.Attribute), \
                        f"{src}:{node.lineno}: launch of something other than self.<kernel>(...)"
                    out.append((src, cls.name, callee.func.attr))
    return out


LAUNCHES = _pdl_launches()


def test_launch_sites_found():
    # the decode chain's kernels at least: norm, GEMM, streaming GEMV, attention, merge, append, SwiGLU, add
    kernels = {(p.parent.name, c) for p, c, _ in LAUNCHES}
    for want in (("rowwise", "NormFwd"), ("gemm", "Gemm"), ("w4a16", "W4A16Stream"), ("attention", "FlashDecode"),
                 ("attention", "MergeStates"), ("attention", "KVAppend"), ("swiglu", "GatedActivation"),
                 ("elementwise", "Elementwise")):
        assert want in kernels, want


@pytest.mark.parametrize("src,cls,kernel", LAUNCHES, ids=[f"{p.parent.name}.{c}.{k}" for p, c, k in LAUNCHES])
def test_every_pdl_launch_waits(src, cls, kernel):
    methods = _methods(ast.parse(src.read_text()))[cls]
    assert kernel in methods, f"{cls}.{kernel} not found in {src}"
    assert _waits(methods[kernel], methods, set()), \
        f"{src.name}: {cls}.{kernel} is launched with use_pdl but never reaches pdl.enter / pdl.await_inputs"


def test_waiting_helpers_wait():
    tree = ast.parse((ROOT / "collectives" / "vector_map.py").read_text())
    fns = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    for name in WAITING_HELPERS:
        assert _waits(fns[name], {}, set()), f"collectives.vector_map.{name} no longer waits"


@pytest.mark.parametrize("name", ["elementwise.add", "swiglu.swiglu_fwd", "rmsnorm.fwd", "merge_attention_states"])
def test_ptx_waits_then_releases(name, tmp_path):
    """The PTX of a PDL-launched kernel: the wait, then the release (a release before the wait would let the
    dependent's CTAs take the SM slots this grid's later CTAs need, for nothing)."""
    from cute_kernels import catalog
    from cute_kernels.artifacts import compile_with_artifacts

    spec = catalog.get(name)
    _, files = compile_with_artifacts(spec, spec.representative()[0], str(tmp_path))
    ptx = files["ptx"].read_text()
    w, r = ptx.find("griddepcontrol.wait"), ptx.find("griddepcontrol.launch_dependents")
    assert 0 <= w < r, (w, r)


def test_cache_keeps_plain_kernels_apart(monkeypatch, tmp_path):
    from collectives import pdl
    from cute_kernels.jit import CompileCache

    cache = CompileCache(root=tmp_path, disk=True)
    monkeypatch.setattr(pdl, "LAUNCH", True)
    with_pdl = cache.directory()
    monkeypatch.setattr(pdl, "LAUNCH", False)
    assert cache.directory() != with_pdl and cache.directory().name.endswith("-plain")
