"""Fill the on-disk compile cache in parallel worker processes (CPU only: no kernel is launched).

Each worker imports the DSL once and compiles its share of (kernel, params) into the shared cache
directory; the per-key file locks of `cute_kernels.jit` make concurrent workers safe. The process
that later runs the kernels loads them in ~2 ms each instead of tracing and compiling (~1.5 s).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context


def item(name: str, params: dict) -> tuple:
    """The picklable work item of kernel `name` under `params` (resolved by its catalogue entry,
    which raises ValueError for a combination it refuses): what `precompile` takes."""
    from cute_kernels import catalog

    return name, tuple(sorted(catalog.get(name).resolve(params).items()))


def _variants(sweep: bool):
    from cute_kernels import catalog

    out = []
    for spec in catalog.ready():
        for p in spec.sweep() if sweep else spec.representative():
            out.append(item(spec.name, p))
    return list(dict.fromkeys(out))


def _compile_one(item) -> bool:
    """Fetch `item`'s kernel through the compile cache; True when it had to be compiled."""
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # compile only; never create a CUDA context here
    from cute_kernels import catalog
    from cute_kernels.jit import default_cache

    name, items = item
    spec = catalog.get(name)
    p = spec.resolve(dict(items))
    cache = default_cache()
    before = cache.stats.compiles
    cache.get(spec.key(p), lambda: spec.build(p))
    return cache.stats.compiles > before


def precompile(items, jobs: int) -> tuple[int, int, float]:
    """(items, how many were compiled (the rest were in the cache), seconds)."""
    t0 = time.perf_counter()
    if jobs <= 1:
        done = [_compile_one(it) for it in items]
    else:
        with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as ex:
            done = list(ex.map(_compile_one, items, chunksize=1))
    return len(items), sum(done), time.perf_counter() - t0


def precompile_all(jobs: int = 1, sweep: bool = False) -> tuple[int, int, float]:
    return precompile(_variants(sweep), jobs)
