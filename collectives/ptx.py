"""Inline PTX snippets as DSL values: pure (side-effect free, so CSE and scheduling apply) `llvm.inline_asm` on 32-bit
registers, fp32 constants written as PTX literals, the two shared-memory matrix moves ldmatrix.x4.trans /
stmatrix.x4 (volatile: they stay in order with the barriers around them), bf16x2 packing, `st.async` into a peer
CTA's shared memory, and an mbarrier phase wait."""

from __future__ import annotations

import struct

import cutlass
import cutlass.cute as cute
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


def ldmatrix_x4_trans(addr) -> tuple:
    """`ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16` at the 32-bit shared address `addr` (lanes 8 i .. 8 i + 7
    give the row addresses of matrix i): four Int32, register i holding matrix i's transposed fragment (thread t:
    b16 elements (row 2 (t % 4), column t // 4) low and (row 2 (t % 4) + 1, column t // 4) high). A read of shared
    memory: kept in order with the barriers around it (volatile)."""
    st = llvm.StructType.get_literal([T.i32()] * 4)
    r = llvm.inline_asm(st, [cutlass.Int32(addr).ir_value()],
                        "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,r",
                        has_side_effects=True, is_align_stack=False)
    return tuple(cutlass.Int32(llvm.extractvalue(T.i32(), r, [i])) for i in range(4))


def stmatrix_x4(addr, r0, r1, r2, r3) -> None:
    """`stmatrix.sync.aligned.m8n8.x4.shared.b16` at the 32-bit shared address `addr` (lanes 8 i .. 8 i + 7 give the
    row addresses of matrix i): register i of thread t is row t // 4, b16 columns 2 (t % 4), 2 (t % 4) + 1 of
    matrix i."""
    llvm.inline_asm(None, [cutlass.Int32(x).ir_value() for x in (addr, r0, r1, r2, r3)],
                    "stmatrix.sync.aligned.m8n8.x4.shared.b16 [$0], {$1, $2, $3, $4};", "r,r,r,r,r",
                    has_side_effects=True, is_align_stack=False)


def pack_bf16x2(hi, lo) -> cutlass.Int32:
    """`cvt.rn.bf16x2.f32`: two fp32 values rounded to bf16 (nearest even, as a 16-bit GEMM output is) in one 32-bit
    word, `lo` in the low half."""
    return cutlass.Int32(llvm.inline_asm(T.i32(), [Float32(hi).ir_value(), Float32(lo).ir_value()],
                                         "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f", has_side_effects=False,
                                         is_align_stack=False))


def unpack_bf16x2(w) -> tuple:
    """(lo, hi) fp32 values of a `pack_bf16x2` word (exact: a bf16 is the top half of its fp32)."""
    w = cutlass.Int32(w)
    return (w << 16).bitcast(Float32), (w & cutlass.Int32(-65536)).bitcast(Float32)


def st_async_v4(remote_addr, r0, r1, r2, r3, remote_mbar) -> None:
    """`st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32`: 16 bytes into a peer CTA's shared memory at the
    32-bit cluster address `remote_addr`, completing 16 bytes on the peer's mbarrier at `remote_mbar`."""
    llvm.inline_asm(None, [cutlass.Int32(x).ir_value() for x in (remote_addr, r0, r1, r2, r3, remote_mbar)],
                    "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [$0], {$1, $2, $3, $4}, [$5];",
                    "r,r,r,r,r,r", has_side_effects=True, is_align_stack=False)


def st_async_f32(remote_addr, v, remote_mbar) -> None:
    """`st.async` of one fp32 value into a peer CTA's shared memory, completing 4 bytes on its mbarrier."""
    llvm.inline_asm(None, [cutlass.Int32(remote_addr).ir_value(), Float32(v).ir_value(),
                           cutlass.Int32(remote_mbar).ir_value()],
                    "st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [$0], $1, [$2];", "r,f,r",
                    has_side_effects=True, is_align_stack=False)


@cute.jit
def mbarrier_wait(mbar, phase) -> None:
    """Spin until mbarrier `mbar` has completed the phase of parity `phase`: a loop the compiler sees
    (`cute.arch.mbarrier_wait`'s asm loop made ptxas spill in `collectives.reduce.cluster_reduce`)."""
    done = cute.arch.mbarrier_try_wait(mbar, phase)
    while not done:
        done = cute.arch.mbarrier_try_wait(mbar, phase)
