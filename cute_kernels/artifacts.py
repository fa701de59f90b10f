"""Compile one catalogue kernel with its artifacts kept: PTX, cubin, SASS and the resource report."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from cute_kernels import catalog
from cute_kernels.jit import compile_fn
from cute_kernels.report import Report, build_report, disassemble
from cute_kernels.target import current_arch


def _text_or_file(value) -> str | bytes | None:
    """The DSL hands back either the artifact itself or the path it was written to."""
    if value is None:
        return None
    if isinstance(value, str) and len(value) < 4096 and os.path.isfile(value):
        return Path(value).read_bytes() if value.endswith(".cubin") else Path(value).read_text()
    return value


def compile_with_artifacts(spec: catalog.KernelSpec, params: dict[str, Any], dump_dir: str | None = None,
                           arch: str | None = None, cache: bool = False) -> tuple[Report, dict[str, Path]]:
    """Compile `spec` with `params`, write `<name>.ptx/.cubin/.sass` into `dump_dir`, report on them.

    `cache` (the CLI's `compile` and `main`): look in the compile cache first, where a compile kept these artifacts
    beside the compiled object (`CompileCache.artifacts_dir`); on a miss, compile, keep the artifacts there and the
    compiled kernel in the cache for the library. `report.from_cache` says which happened. Without `dump_dir` the
    files are the cache's (with `cache`) or a temporary folder's (removed with the process's temp files only)."""
    from cute_kernels.jit import CacheKey, default_cache

    arch = arch or current_arch()
    k = spec.key(params)
    key = CacheKey(k.kernel, k.config, k.signature, arch)
    stem = spec.name.replace(".", "_")
    art = default_cache().artifacts_dir(key) if cache else None
    if art is not None and (art / f"{stem}.ptx").exists() and (art / f"{stem}.cubin").exists():
        files = {kind: art / f"{stem}.{kind}" for kind in ("ptx", "cubin", "sass") if (art / f"{stem}.{kind}").exists()}
        if dump_dir:
            Path(dump_dir).mkdir(parents=True, exist_ok=True)
            files = {kind: Path(shutil.copy(f, Path(dump_dir) / f.name)) for kind, f in files.items()}
        sass = files["sass"].read_text() if "sass" in files else None
        report = build_report(f"{spec.name} {k.config} {k.signature}", arch, files["ptx"].read_text(),
                              files["cubin"].read_bytes(), sass, spec.dynamic_smem_bytes(params))
        report.from_cache = True
        return report, files
    own_tmp = dump_dir is None and art is None
    out_dir = Path(dump_dir or (tempfile.mkdtemp(prefix="ck_artifacts_") if own_tmp else
                                tempfile.mkdtemp(prefix=".tmp_", dir=art.parent)))
    out_dir.mkdir(parents=True, exist_ok=True)
    raw_dir = out_dir / ".dsl"
    fn, args = spec.build(params)
    compiled = compile_fn(fn, args, arch, dump_dir=str(raw_dir))
    ptx = _text_or_file(compiled.artifacts.PTX)
    cubin = _text_or_file(compiled.artifacts.CUBIN)
    if not isinstance(ptx, str) or not isinstance(cubin, bytes):
        raise RuntimeError(f"{spec.name}: the DSL returned no PTX/cubin artifacts")
    files = {"ptx": out_dir / f"{stem}.ptx", "cubin": out_dir / f"{stem}.cubin"}
    files["ptx"].write_text(ptx)
    files["cubin"].write_bytes(cubin)
    sass = disassemble(files["cubin"])
    if sass is not None:
        files["sass"] = out_dir / f"{stem}.sass"
        files["sass"].write_text(sass)
    for f in raw_dir.glob("*"):
        f.unlink()
    raw_dir.rmdir()
    report = build_report(f"{spec.name} {k.config} {k.signature}", arch, ptx, cubin, sass,
                          spec.dynamic_smem_bytes(params))
    if art is not None:
        default_cache().put(key, compiled)  # the library's next call to this kernel loads it
        if dump_dir:  # a copy of the artifacts for the cache
            tmp = Path(tempfile.mkdtemp(prefix=".tmp_", dir=art.parent))
            for f in files.values():
                shutil.copy(f, tmp / f.name)
        else:
            tmp = out_dir
        try:
            os.rename(tmp, art)  # atomic
        except OSError:  # a concurrent compile of the same key put its (equal) artifacts there first
            shutil.rmtree(tmp, ignore_errors=True)
        if not dump_dir:
            files = {kind: art / f.name for kind, f in files.items()}
    if own_tmp:
        report.notes.append(f"artifacts in {out_dir}")
    return report, files
