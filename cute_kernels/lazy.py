"""Modules imported on first use, so that the catalogue's metadata, the schedules and the CLI's start load neither
cutlass nor torch: `cutlass` and `cute` below stand for `cutlass` and `cutlass.cute` and import them at the first
attribute access (a spec's `build`, an op's call)."""

from __future__ import annotations

import importlib
from types import ModuleType


class LazyModule(ModuleType):
    def __init__(self, name: str):
        super().__init__(name)
        self.__dict__["_name"] = name
        self.__dict__["_module"] = None

    def _load(self):
        mod = self.__dict__["_module"]
        if mod is None:
            from cute_kernels import target  # noqa: F401  (the DSL latches its arch at import)

            mod = self.__dict__["_module"] = importlib.import_module(self.__dict__["_name"])
        return mod

    def __getattr__(self, attr):
        return getattr(self._load(), attr)

    def __repr__(self) -> str:
        return f"<lazy module {self.__dict__['_name']!r}>"


cutlass = LazyModule("cutlass")
cute = LazyModule("cutlass.cute")
