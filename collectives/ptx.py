"""Inline PTX snippets as DSL values: pure (side-effect free, so CSE and scheduling apply) `llvm.inline_asm` on 32-bit
registers, and fp32 constants written as PTX literals."""

from __future__ import annotations

import struct

import cutlass
from cutlass import Float32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T


def asm_b32(text: str, constraints: str, *args) -> cutlass.Int32:
    """A snippet on 32-bit integer registers (operands as Int32, `constraints` e.g. "=r,r,r") giving one Int32."""
    return cutlass.Int32(llvm.inline_asm(T.i32(), [cutlass.Int32(a).ir_value() for a in args], text, constraints,
                                         has_side_effects=False, is_align_stack=False))


def asm_f32(text: str, *args) -> Float32:
    """A snippet on fp32 registers: every operand a Float32, one Float32 result ($0)."""
    return Float32(llvm.inline_asm(T.f32(), [Float32(a).ir_value() for a in args], text, "=f" + ",f" * len(args),
                                   has_side_effects=False, is_align_stack=False))


def f32_literal(x: float) -> str:
    """`x` rounded to fp32 as a PTX hexadecimal float literal (0fXXXXXXXX)."""
    return "0f%08X" % struct.unpack("<I", struct.pack("<f", x))[0]
