"""The fake arguments a catalogue entry compiles its kernel against: tensors whose sizes and strides are
symbolic (one compiled kernel serves every shape of its signature) and the stream TVM-FFI fills in at call
time. Used by the specs' `build`; importing this module does not load the DSL."""

from __future__ import annotations

from cute_kernels.lazy import cute


def index_sym(index64: bool, divisibility: int = 1):
    """A symbolic size or stride of the given index width (32 or 64 bits)."""
    return cute.sym_int64(divisibility=divisibility) if index64 else cute.sym_int32(divisibility=divisibility)


def fake_tensor(dt, shape, stride, align):
    return cute.runtime.make_fake_tensor(dt, shape, stride=stride, assumed_align=align)


def fake_stream():
    """The stream argument: at call time TVM-FFI passes the caller's current torch stream."""
    return cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
