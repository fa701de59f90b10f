"""CPU: the family homes. Every family of `catalog.FAMILIES` is a folder with its catalogue entries, ops and
suites; its public ops are `cute_kernels.<op>`; the catalogue's metadata, `cute-kernels --help` and `list` load
neither torch nor cutlass; the schedules import no DSL."""

import subprocess
import sys
from pathlib import Path

import pytest

from cute_kernels import catalog

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("family", list(catalog.FAMILIES))
def test_family_folder(family):
    d = ROOT / "cute_kernels" / family
    assert (d / "__init__.py").exists() and (d / "ops.py").exists() and (d / "bench.py").exists()
    kernels = [p for p in d.glob("*.py") if p.name not in ("__init__.py", "ops.py", "bench.py")]
    assert kernels or family == "fp8_gemm", f"{family}: no kernel module"  # fp8_gemm is gemm's blockwise mode
    specs = __import__(f"cute_kernels.{family}", fromlist=["SPECS"]).SPECS
    assert specs and all(s.family == family for s in specs)


def test_the_smallest_family_is_four_files():
    files = sorted(p.name for p in (ROOT / "cute_kernels" / "swiglu").glob("*.py"))
    assert files == ["__init__.py", "bench.py", "kernels.py", "ops.py"]


def test_public_ops_are_the_ops():
    import cute_kernels as ck

    ck.load_ops()
    for fam, ops in catalog.FAMILIES.items():
        __import__(f"cute_kernels.{fam}.ops")
        for op in ops:
            assert callable(getattr(ck, op)) and not isinstance(getattr(ck, op), type(sys)), (fam, op)
    assert set(ck.__all__) >= {op for ops in catalog.FAMILIES.values() for op in ops}


def test_metadata_loads_without_torch_or_cutlass():
    out = _run("import sys; from cute_kernels import catalog; n = len(catalog.kernels()); "
               "import schedules.gemm, schedules.attention, schedules.row_tiling, schedules.fp8_gemm, schedules.gemv, "
               "schedules.grid_stride, schedules.tile_order; "
               "print(n, 'torch' in sys.modules, 'cutlass' in sys.modules)")
    n, torch_loaded, cutlass_loaded = out.split()
    assert int(n) == len(catalog.kernels()) and torch_loaded == "False" and cutlass_loaded == "False"


def test_cli_help_and_list_load_neither():
    out = _run("import sys, contextlib, io\nfrom cute_kernels.cli import main\n"
               "with contextlib.redirect_stdout(io.StringIO()):\n    main(['list'])\n"
               "print('torch' in sys.modules, 'cutlass' in sys.modules)")
    assert out.split() == ["False", "False"]


def test_importing_torch_first_registers_every_op():
    out = _run("import torch, cute_kernels\nprint(hasattr(torch.ops.cute_kernels, 'flash_attn'), "
               "hasattr(torch.ops.cute_kernels, 'rms_norm'))")
    assert out.split() == ["True", "True"]
