"""How a tile is computed: vectorized global-memory access, the elementwise map, warp / block / cluster
reductions, row slices held in registers, TMA pipelines, WGMMA mainloops, epilogues, block scales, the
online-softmax state, attention masks, and the frame the row-held kernels share.

Collectives are `@cute.jit` building blocks with no launch of their own: a kernel in `cute_kernels/<family>/`
composes them under a schedule from `schedules`. Collectives know no kernel, op or benchmark.
"""

import os

# The project targets Hopper; compile for it unless the user chose another arch. Must happen before
# the DSL is imported, which latches the arch at import.
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

CUTE_KERNELS_LAYER = True  # this is cute-kernels' own layer (checked by `cute_kernels` against a shadowing package)
