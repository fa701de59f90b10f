"""Which CTA of a split cell is the last one to finish (split-K tiles, split-KV row tiles): that CTA merges every
split's partial, in split order, so the result is the same bits on every run and no second kernel runs.

Each thread's partial stores are released at gpu scope, the cell's threads meet at a named barrier, and one
thread adds 1 to the cell's int32 counter. The thread that takes the count to splits - 1 resets it to 0 (for the
next launch, in stream order: `cute_kernels.torch_ops.split_counters` zeroes the counters once), and the count goes
to the others through a shared-memory slot. The last CTA acquires the other CTAs' stores before reading them.
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Int32


@cute.jit
def last_split(counter: cute.Tensor, cell, splits: Int32, slot: cute.Tensor, bar, leader):
    """Whether this CTA is the cell's last split to finish (every thread of `bar` gets the same answer). `counter`:
    the int32 counters, `cell` this CTA's coordinate in them; `slot`: one Int32 of shared memory; `bar`: a named
    barrier of the merging threads; `leader`: true on exactly one of them. Acquire included: the caller reads the
    other splits' partials right after."""
    cute.arch.fence_acq_rel_gpu()
    bar.arrive_and_wait()
    if leader:
        ptr = counter.iterator + cute.crd2idx(cell, counter.layout)
        old = cute.arch.atomic_add(ptr.llvm_ptr, Int32(1), sem="relaxed", scope="gpu")
        if old == splits - 1:
            counter[cell] = Int32(0)
        slot[0] = old
    bar.arrive_and_wait()
    is_last = slot[0] == splits - 1
    if is_last:
        cute.arch.fence_acq_rel_gpu()
    return is_last
