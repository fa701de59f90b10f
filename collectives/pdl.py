"""Programmatic dependent launch (PDL): a kernel launched with `use_pdl=pdl.LAUNCH` may start while the kernel before
it in the stream is still running, so its launch, its set-up (shared memory, barriers, TMA descriptors) and the L2
prefetch of data no earlier kernel writes overlap that kernel's tail. A decode step is a chain of short kernels
(norm, projections, attention, activation) where each boundary costs a launch and a ramp-up; inside a CUDA graph
the dependency is captured as a programmatic edge.

The protocol every kernel launched with PDL keeps (`enter` does both steps):

- `await_inputs` (griddepcontrol.wait) in every thread before its first read of anything an earlier kernel may have
  written and before its first global write (the caching allocator may give this kernel's output the memory the
  previous kernel still reads). It returns once the previous grid has completed and its writes are visible; with
  no programmatic predecessor it returns at once. Before it, only set-up and L2 prefetches: a prefetch cannot
  read stale data (L2 is where every write lands), it only warms the lines the loads after the wait will read.
- then `release_dependents` (griddepcontrol.launch_dependents): the next kernel's CTAs may be scheduled once every
  CTA of this grid has passed here or exited, and wait in their own `await_inputs`.

A kernel must never be launched with PDL without waiting: the next kernel's wait covers only its direct
predecessor, and that predecessor covers the kernels before it only through its own wait
(tests/core/test_pdl_cpu.py checks every launch site).

`LAUNCH` is read when a kernel is traced: `CUTE_KERNELS_PDL=0` in the environment launches every kernel plainly (the
waits then return at once), for a race hunt or an A/B of the launch overlap; the compile cache keeps the two kinds
apart (`cute_kernels.jit`).
"""

from __future__ import annotations

import os

import cutlass.cute as cute

LAUNCH: bool = os.environ.get("CUTE_KERNELS_PDL", "1") != "0"


def await_inputs():
    """Wait for the previous grid's completion and memory (griddepcontrol.wait)."""
    cute.arch.griddepcontrol_wait()


def release_dependents():
    """Let the next grid in the stream launch (griddepcontrol.launch_dependents)."""
    cute.arch.griddepcontrol_launch_dependents()


def enter():
    """`await_inputs`, then `release_dependents`: a kernel's entry once its set-up and prefetches are issued."""
    await_inputs()
    release_dependents()
