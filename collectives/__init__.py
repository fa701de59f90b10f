"""How a tile is computed: vectorized global-memory access, warp/block reductions, and (later)
TMA pipelines, WGMMA mainloops, epilogues and the online-softmax state.

Collectives are `@cute.jit` building blocks with no launch of their own: a kernel in
`cute_kernels.kernels` composes them under a schedule from `schedules`.
"""

import os

# The project targets Hopper; compile for it unless the user chose another arch. Must happen before
# the DSL is imported, which latches the arch at import.
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
