"""float32 -> bfloat16 casts on ``vcvtneps2bf16`` where the CPU has AVX512_BF16.

TVM 0.27 lowers every cast to bfloat16 in software (``BF16ComputeLegalize``): the float's
bits plus ``0x7fff`` plus the lowest kept bit, shifted right by 16 (round to nearest even),
then narrowed to 16 bits. On x86 with AVX-512 that is five integer instructions and a
two-uop ``vpmovdw`` per 16 lanes, where AVX512_BF16's ``vcvtneps2bf16`` does the same
rounding in one. Every bf16 kernel that writes bf16 pays it in its epilogue (a conv's output
for the next conv, BERT's GELU output for the next matmul).

:func:`native_bf16_casts` runs after TVM's pipeline, on the lowered functions, and stores
each vector of exactly that expression with the LLVM intrinsic instead, into the ``uint16``
buffer TVM keeps bfloat16 in: 8 or 16 lanes at once, a multiple of 16 in pieces of 16.
Scalars, other lane counts, a value loaded lane by lane (a transpose's gather: BERT's key and
value packs measured 1.07-1.08x slower converted in pieces, benchmarks/bf16_casts.py
``--convert-gathers``) and targets without AVX512_BF16 keep TVM's lowering. Both round to nearest
even and agree bit for bit on every float but denormals, which the instruction flushes to
zero as ``vdpbf16ps`` and AMX's ``tdpbf16ps`` treat them anyway, and NaNs, which stay NaNs
(tests/search_spaces/test_bf16_casts.py). The rewrite changes no workload key: records tuned
before it build with it.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx
from tvm.ir.expr import TensorLoad
from tvm.ir.prim.expr import BitwiseAnd as _BitwiseAnd
from tvm.ir.prim.expr import RShift as _RShift

from search_spaces.ir_map import map_functions
from search_spaces.x86.intrin import target_has_bf16_dot

# Lanes -> LLVM's intrinsic for them (the 256-bit form needs AVX512VL, which every CPU with
# AVX512_BF16 has).
_INTRINSICS = {16: "llvm.x86.avx512bf16.cvtneps2bf16.512", 8: "llvm.x86.avx512bf16.cvtneps2bf16.256"}
_WIDEST = 16
_ROUNDING_BIAS = 0x7FFF


def _dtype(expr: tirx.PrimExpr) -> str:
    return str(expr.ty.dtype)


def _call(expr: tirx.PrimExpr, op: str) -> list[tirx.PrimExpr] | None:
    if isinstance(expr, tvm.ir.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == op:
        return list(expr.args)
    return None


def _operands(expr: tirx.PrimExpr, node: type, op: str) -> list[tirx.PrimExpr] | None:
    """The two operands of a binary node (``x >> y`` and ``x & y`` are nodes in TVM 0.27, calls
    of ``tirx.shift_right`` and ``tirx.bitwise_and`` before)."""
    if isinstance(expr, node):
        return [expr.a, expr.b]
    return _call(expr, op)


def _const(expr: tirx.PrimExpr, value: int) -> bool:
    if isinstance(expr, tirx.Broadcast):
        expr = expr.value
    return isinstance(expr, tirx.IntImm) and int(expr.value) == value


def _shifted_right_16(expr: tirx.PrimExpr) -> tirx.PrimExpr | None:
    args = _operands(expr, _RShift, "tirx.shift_right")
    return args[0] if args and _const(args[1], 16) else None


def _bits_of(expr: tirx.PrimExpr) -> tirx.PrimExpr | None:
    """``f`` of ``reinterpret(uint32, f)`` for a float32 vector ``f``, else None."""
    args = _call(expr, "tirx.reinterpret")
    if args and _dtype(expr).startswith("uint32") and _dtype(args[0]).startswith("float32"):
        return args[0]
    return None


def _gathers(expr: tirx.PrimExpr) -> bool:
    """Whether ``expr`` loads a vector from other than consecutive addresses (TVM loads such
    a gather lane by lane; see the module's docstring for why those keep TVM's rounding)."""
    found = []

    def load(node: TensorLoad) -> None:
        index = node.indices[-1] if len(node.indices) else None
        lanes = int(node.ty.dtype.lanes)
        if lanes > 1 and not (isinstance(index, tirx.Ramp) and _const(index.stride, 1)):
            found.append(node)

    tvm_ffi.structural_walk(expr, (TensorLoad, load))
    return bool(found)


def rounded_source(cast: tirx.Cast) -> tirx.PrimExpr | None:
    """The float32 vector whose bfloat16 bits ``cast`` computes as TVM's legalization writes
    them, ``uint16((bits + (((bits >> 16) & 1) + 0x7fff)) >> 16)``, or None."""
    total = _shifted_right_16(cast.value)
    if not _dtype(cast).startswith("uint16") or not isinstance(total, tirx.Add):
        return None
    source, rest = _bits_of(total.a), total.b
    if source is None or not isinstance(rest, tirx.Add) or not _const(rest.b, _ROUNDING_BIAS):
        return None
    lowest = _operands(rest.a, _BitwiseAnd, "tirx.bitwise_and")
    if not lowest or not _const(lowest[1], 1):
        return None
    shifted = _shifted_right_16(lowest[0])
    again = None if shifted is None else _bits_of(shifted)
    if again is None or not tvm_ffi.structural_equal(again, source):
        return None
    return source


def _native(store: tirx.BufferStore) -> tirx.Stmt:
    # Only a cast stored as it is: the intrinsic's LLVM value is a bfloat vector, which TVM
    # would take for the uint16 vector it declares in any other use, and LLVM stores as is.
    cast = store.value
    if not isinstance(cast, tirx.Cast) or not _dtype(cast).startswith("uint16"):
        return store
    lanes = int(cast.ty.dtype.lanes)
    source = rounded_source(cast) if lanes in _INTRINSICS or lanes % _WIDEST == 0 else None
    if source is None or _gathers(source):
        return store
    if lanes in _INTRINSICS:
        return tirx.BufferStore(store.buffer, _convert(source, lanes), store.indices)
    # Wider vectors (a template's 32 or 64 lanes) in pieces of 16 lanes, from one value.
    (index,) = store.indices if len(store.indices) == 1 else (None,)
    if not isinstance(index, tirx.Ramp) or not _const(index.stride, 1):
        return store
    whole = tirx.Var("bf16_source", tvm.ir.PrimType(_dtype(source)))
    pieces: list[tirx.Stmt] = [tirx.LetStmt(whole, source)]
    for first in range(0, lanes, _WIDEST):
        piece = tirx.Shuffle([whole], [tirx.const(first + i, "int32") for i in range(_WIDEST)])
        at = tirx.Ramp(index.base + tirx.const(first, index.base.ty.dtype), index.stride, _WIDEST)
        pieces.append(tirx.BufferStore(store.buffer, _convert(piece, _WIDEST), [at]))
    return tirx.SeqStmt(pieces)


def _convert(source: tirx.PrimExpr, lanes: int) -> tirx.PrimExpr:
    return tirx.call_llvm_pure_intrin(f"uint16x{lanes}", _INTRINSICS[lanes], source)


def native_bf16_casts(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` (lowered by TVM's pipeline) with its vector casts to bfloat16 on
    ``vcvtneps2bf16`` in the functions whose target has AVX512_BF16."""
    return map_functions(mod, target_has_bf16_dot, (tirx.BufferStore, _native))
