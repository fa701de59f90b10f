"""ptxas's own report on a kernel variant (its C75xx advisories: why wgmma is serialized, spills), on a CPU machine:
the DSL's PTX is compiled again by the CUDA toolkit's ptxas with the .version line lowered to what that ptxas reads.

    python -m perf.ptxas_check flash_attn_bwd head_dim=64 mask=causal
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def check(kernel: str, overrides: dict, ptxas: str | None = None) -> str:
    from cute_kernels import catalog
    from cute_kernels.artifacts import compile_with_artifacts

    spec = catalog.get(kernel)
    p = spec.resolve(overrides)
    with tempfile.TemporaryDirectory() as tmp:
        _, files = compile_with_artifacts(spec, p, tmp)
        ptx = files["ptx"].read_text()
        exe = ptxas or shutil.which("ptxas") or "/usr/local/cuda/bin/ptxas"
        ver = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
        m = re.search(r"release (\d+)\.(\d+)", ver)
        isa = f"{int(m.group(1)) - 4}.{m.group(2)}" if m else "9.0"  # CUDA 13.0 reads PTX ISA 9.0
        src = Path(tmp) / "k.ptx"
        src.write_text(re.sub(r"^\.version \d+\.\d+", f".version {isa}", ptx, count=1, flags=re.M))
        out = subprocess.run([exe, "-arch=sm_90a", "-v", "-warn-spills", str(src), "-o", str(Path(tmp) / "k.cubin")],
                             capture_output=True, text=True)
        lines = [ln for ln in (out.stdout + out.stderr).splitlines()
                 if "C75" in ln or "spill" in ln.lower() or "Used" in ln or "error" in ln.lower()]
        return "\n".join(re.sub(r"'kernel_\w+'", "'<kernel>'", ln) for ln in lines)


if __name__ == "__main__":
    kernel, *pairs = sys.argv[1:]
    over = {}
    for kv in pairs:
        k, v = kv.split("=", 1)
        over[k] = {"True": True, "False": False}.get(v, int(v) if v.lstrip("-").isdigit() else v)
    print(check(kernel, over))
