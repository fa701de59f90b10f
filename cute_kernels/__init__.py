"""cute-kernels: Hopper (sm_90a) kernels in CUTLASS's CuTe Python DSL.

Three layers: `schedules` (when and where work runs), `collectives` (how a tile is computed) and
this package (what is computed: one folder per kernel family with its kernels, catalogue entry and torch ops;
the compile cache, the CLI and the benchmark suites).

    import cute_kernels as ck
    ck.add(x, y); ck.axpby(2.0, x, -1.0, y); ck.sum(x, dim=-1)

The ops are exported lazily, so that the CLI and the catalogue start without torch or cutlass: a program that
imports torch before `cute_kernels` gets every `torch.ops.cute_kernels.*` registered at import (as the families'
ops modules load: ~0.1 s, no DSL); otherwise the first `ck.<op>` registers them all. `load_ops()` does it
explicitly. The DSL itself loads when the first kernel is compiled or fetched from the cache.
"""

from __future__ import annotations

import importlib
import os as _os
import sys as _sys
import types as _types

from cute_kernels import target  # noqa: F401  (sets the DSL's arch before cutlass is imported)
from cute_kernels.catalog import FAMILIES, OP_FAMILY

__version__ = "0.1.0"
__all__ = [op for ops in FAMILIES.values() for op in ops] + ["load_ops", "__version__"]


def _check_layers() -> None:
    """`schedules` and `collectives` are installed as top-level packages beside this one (README, "Install"):
    refuse a same-named package of someone else's that shadows them, instead of failing later inside a kernel."""
    here = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
    for layer in ("schedules", "collectives"):
        mod = importlib.import_module(layer)
        if not getattr(mod, "CUTE_KERNELS_LAYER", False):
            where = getattr(mod, "__file__", None) or list(getattr(mod, "__path__", []))
            raise ImportError(f"cute_kernels: the package {layer!r} found at {where} is not cute-kernels' own layer "
                              f"(expected beside {here}); another package of that name shadows it: install "
                              "cute-kernels into its own virtual environment")


_check_layers()


def load_ops() -> None:
    """Import every family's ops, registering all of `torch.ops.cute_kernels.*`."""
    for fam in FAMILIES:
        importlib.import_module(f"cute_kernels.{fam}.ops")


def __getattr__(name: str):
    fam = OP_FAMILY.get(name)
    if fam is None:
        raise AttributeError(f"module 'cute_kernels' has no attribute {name!r}")
    load_ops()
    value = getattr(importlib.import_module(f"cute_kernels.{fam}.ops"), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


class _Package(_types.ModuleType):
    """Seven families are named like their op (`gemm`, `gemv`, `transpose`, `swiglu`, `argmax`, `fp8_gemm`, `moe`):
    when the import system loads such a subpackage it would bind it over the op (`ck.gemm` would become a module).
    The subpackage stays reachable by its import path (`from cute_kernels.gemm import ops`, `sys.modules`); the
    package attribute stays the op. (So `import cute_kernels.gemm.ops as m`, which walks attributes, does not work for
    those seven: write `from cute_kernels.gemm import ops as m`.)"""

    def __setattr__(self, name, value):
        if name in OP_FAMILY and isinstance(value, _types.ModuleType):
            return
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package

if "torch" in _sys.modules:
    load_ops()
