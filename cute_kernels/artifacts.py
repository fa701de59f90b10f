"""Compile one catalogue kernel with its artifacts kept: PTX, cubin, SASS and the resource report."""

from __future__ import annotations

import os
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
                           arch: str | None = None) -> tuple[Report, dict[str, Path]]:
    """Compile `spec` with `params`, write `<name>.ptx/.cubin/.sass` into `dump_dir`, report on them."""
    arch = arch or current_arch()
    own_tmp = dump_dir is None
    out_dir = Path(dump_dir or tempfile.mkdtemp(prefix="ck_artifacts_"))
    out_dir.mkdir(parents=True, exist_ok=True)
    raw_dir = out_dir / ".dsl"
    fn, args = spec.build(params)
    compiled = compile_fn(fn, args, arch, dump_dir=str(raw_dir))
    ptx = _text_or_file(compiled.artifacts.PTX)
    cubin = _text_or_file(compiled.artifacts.CUBIN)
    if not isinstance(ptx, str) or not isinstance(cubin, bytes):
        raise RuntimeError(f"{spec.name}: the DSL returned no PTX/cubin artifacts")
    stem = spec.name.replace(".", "_")
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
    report = build_report(f"{spec.name} {spec.key(params).config} {spec.key(params).signature}", arch, ptx, cubin,
                          sass, spec.dynamic_smem_bytes(params))
    if own_tmp:
        report.notes.append(f"artifacts in {out_dir}")
    return report, files
