"""(value, index) pair reductions for argmax (curriculum lesson 12), as one 64-bit key.

A thread scans its elements in increasing index order keeping (best value, its index): it takes an
element only if it is strictly greater, or if it is the first NaN, so ties keep the lowest index and
the first NaN wins, as in `torch.argmax`. Across threads the pair is packed into one Int64 key whose
signed order is the argmax order:

    key = ordered(value) << 32  |  (0xFFFFFFFF - index)

`ordered` maps an fp32 to an int32 with the same order (negative floats have their 31 magnitude bits
flipped), after turning -0.0 into +0.0 (torch treats them as equal) and every NaN into INT32_MAX
(above +inf). A larger key is a larger value or, for equal values, a lower index. One `max` over
keys (through `collectives.reduce.group_reduce`, 64-bit shuffles) is then the pair reduction; the
result does not depend on the reduction order, so it is bit-for-bit deterministic. Keys are also
what a split row writes as partials for the second pass. Indices must fit in 32 bits (rows shorter
than 2^32 elements).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

EMPTY = -(2**63)  # the key of a thread that saw no element: below every real key
_LOW = 0xFFFFFFFF


@cute.jit
def scan_update(best: Float32, idx, v: Float32, i):
    """One step of a thread's in-order scan: take `v` (at index `i`) if it beats `best`."""
    take = (v > best) | ((v != v) & (best == best))
    if take:
        best = v
        idx = i
    return best, idx


@cute.jit
def ordered_bits(v: Float32) -> Int32:
    """An int32 whose signed order is v's order; -0.0 == +0.0; every NaN above +inf."""
    r = cute.make_rmem_tensor((1,), Float32)
    r[0] = v + Float32(0.0)  # -0.0 + 0.0 = +0.0
    b = cute.recast_tensor(r, Int32)[0]
    b = b ^ ((b >> 31) & Int32(0x7FFFFFFF))
    if v != v:
        b = Int32(0x7FFFFFFF)
    return b


@cute.jit
def pack_key(best: Float32, idx, has) -> Int64:
    """The Int64 key of a thread's (best, idx); EMPTY when the thread saw nothing (`has` false)."""
    key = (Int64(ordered_bits(best)) << 32) | (Int64(_LOW) - Int64(idx))
    if not has:
        key = Int64(EMPTY)
    return key


@cute.jit
def key_index(key: Int64) -> Int64:
    """The element index a key carries."""
    return Int64(_LOW) - (key & Int64(_LOW))


def max_key(a, b):
    """The pair-reduction op on keys."""
    return cutlass.max(a, b)
