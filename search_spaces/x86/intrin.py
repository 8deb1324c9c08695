"""x86 dot-product tensor intrinsics that TVM 0.27 does not ship: ``vdpbf16ps`` (AVX512_BF16),
``vpdpbusd`` (AVX512_VNNI) accumulating into a register tile, and AVX2's uint8 x int8 dot
product (``vpmaddubsw`` + ``vpmaddwd``) on 8 lanes.

Registered the way ``tvm.s_tir.tensor_intrin.x86`` registers ``dot_16x4_vnni``: a
description (16 float32 lanes, each adding the products of 2 adjacent bfloat16 pairs) and
an implementation that calls LLVM's ``llvm.x86.avx512bf16.dpbf16ps.512``.

TVM legalizes every bfloat16 value to float32 (compute) and uint16 (storage) before code
generation, so a TIR call cannot hand LLVM the ``<32 x bfloat>`` operands the intrinsic
takes. The implementation therefore passes the bits as ``<16 x i32>`` to a 4-line LLVM IR
helper (linked into the module through ``pragma_import_llvm``, inlined by LLVM) that
bitcasts them and calls the intrinsic.

A third intrinsic reads its A operand as uint16 bits of bfloat16 values
(``dot_16x2_bf16bits_avx512_local``): a buffer that a function allocates itself (Winograd's
transformed data, :mod:`tuner.graph.winograd`) is stored float32 when declared bfloat16, so it
holds the rounded bits instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
import tvm
from tvm import tirx
from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

BF16_DOT_16x2_INTRIN = "dot_16x2_bf16_avx512"
# The same, accumulating into a register tile (a ``local`` buffer), as templates do.
BF16_DOT_16x2_LOCAL_INTRIN = "dot_16x2_bf16_avx512_local"
# The same with A as uint16 bits (see _bf16_bits_dot_16x2).
BF16_BITS_DOT_16x2_LOCAL_INTRIN = "dot_16x2_bf16bits_avx512_local"
# LLVM feature name of the instruction set the intrinsic needs.
BF16_FEATURE = "avx512bf16"
# TVM's dot_16x4_vnni (uint8 x int8 quadruples into 16 int32 lanes) with a ``local`` accumulator.
VNNI_DOT_16x4_LOCAL_INTRIN = "dot_16x4_vnni_local"
VNNI_FEATURE = "avx512vnni"
# float32 / int32 lanes of the AVX-512 instructions' accumulator (one zmm register).
DOT_LANES = 16
# AVX2's uint8 x int8 quadruples into 8 int32 lanes (one ymm register): vpmaddubsw adds the
# products of adjacent pairs into int16, which saturates, then vpmaddwd by ones adds pairs.
AVX2_DOT_8x4_LOCAL_INTRIN = "dot_8x4_avx2_local"
AVX2_FEATURE = "avx2"
# vpmaddubsw's int16 sum of a pair of uint8 x int8 products is exact while it stays within
# [-32768, 32767]: weights whose positive (and negative) parts of each pair add up to at most
# 128 (255 * 128 = 32640), which 7-bit weights always do (quantize_static's reduce_range).
PAIR_WEIGHT_LIMIT = 128


@dataclass(frozen=True)
class DotInstruction:
    """An x86 dot-product instruction as the templates and the graph passes use it: each of
    ``lanes`` lanes adds ``elements`` products of (A, B) ``dtypes`` into an ``acc`` sum;
    ``intrin`` is its tensor intrinsic with a register-tile (``local``) accumulator;
    ``scratch``: vector registers it needs besides the accumulator and its operands;
    ``saturates``: whether pairs of products go through int16 (see :func:`exact_for`)."""

    dtypes: tuple[str, str]
    elements: int
    acc: str
    intrin: str
    feature: str
    lanes: int = DOT_LANES
    scratch: int = 0
    saturates: bool = False


BF16_DOT = DotInstruction(("bfloat16", "bfloat16"), 2, "float32", BF16_DOT_16x2_LOCAL_INTRIN, BF16_FEATURE)
VNNI_DOT = DotInstruction(("uint8", "int8"), 4, "int32", VNNI_DOT_16x4_LOCAL_INTRIN, VNNI_FEATURE)
# The int16 products of vpmaddubsw take a register before vpmaddwd adds them.
AVX2_DOT = DotInstruction(("uint8", "int8"), 4, "int32", AVX2_DOT_8x4_LOCAL_INTRIN, AVX2_FEATURE, lanes=8,
                          scratch=1, saturates=True)
#: By the (A, B) dtypes an operator reads and the lanes of its output channel block.
DOTS = {(d.dtypes, d.lanes): d for d in (BF16_DOT, VNNI_DOT, AVX2_DOT)}


def dot_for(dtypes: tuple[str, str], lanes: int) -> DotInstruction | None:
    """The instruction for an operator reading ``dtypes`` in blocks of ``lanes`` output
    channels (columns): 16 lanes are AVX-512's, 8 AVX2's; None when there is none."""
    return DOTS.get((dtypes, lanes))


def exact_for(dot: DotInstruction, weight: np.ndarray, axis: int) -> bool:
    """Whether ``dot`` computes ``weight``'s sums exactly: always, but for a saturating
    instruction (AVX2's), whose int16 pair sums of uint8 x int8 products are exact only where
    the weights of each pair of adjacent reduction elements (along ``axis``, pairs from 0) have
    positive and negative parts of at most :data:`PAIR_WEIGHT_LIMIT` each (a pair of a
    positive and a negative weight never saturates)."""
    if not dot.saturates:
        return True
    w = np.moveaxis(np.asarray(weight, dtype=np.int32), axis, -1)
    if w.shape[-1] % 2:  # an odd count is padded with a zero weight (an RGB stem's 3 channels)
        w = np.concatenate([w, np.zeros((*w.shape[:-1], 1), np.int32)], axis=-1)
    pairs = w.reshape(*w.shape[:-1], -1, 2)
    pos, neg = np.maximum(pairs, 0).sum(axis=-1), np.maximum(-pairs, 0).sum(axis=-1)
    return int(max(pos.max(initial=0), neg.max(initial=0))) <= PAIR_WEIGHT_LIMIT


_HELPER = "nightshift_dpbf16ps_512"
_HELPER_IR = f"""
define linkonce_odr <16 x float> @{_HELPER}(<16 x float> %acc, <16 x i32> %a, <16 x i32> %b) alwaysinline {{
  %a.bf = bitcast <16 x i32> %a to <32 x bfloat>
  %b.bf = bitcast <16 x i32> %b to <32 x bfloat>
  %r = call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> %acc, <32 x bfloat> %a.bf, <32 x bfloat> %b.bf)
  ret <16 x float> %r
}}
declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)
"""


def bf16_bits(value: tirx.PrimExpr) -> tirx.PrimExpr:
    """A float32 value rounded to bfloat16 (to nearest, ties to even), as its uint16 bits:
    what a buffer that the bits intrinsic reads holds (Winograd's ``data_pack``)."""
    bits = tirx.reinterpret("uint32", value)
    rounding = ((bits >> tirx.const(16, "uint32")) & tirx.const(1, "uint32")) + tirx.const(0x7FFF, "uint32")
    return ((bits + rounding) >> tirx.const(16, "uint32")).astype("uint16")


def bf16_value(bits: tirx.PrimExpr) -> tirx.PrimExpr:
    """The float32 value of bfloat16 ``bits`` (uint16), exact: how the bits intrinsic's
    description widens its A operand, so a compute that reads A this way tensorizes."""
    return tirx.reinterpret("float32", tirx.shift_left(bits.astype("uint32"), tirx.const(16, "uint32")))


def _dot_desc(n: int, a_dtype: str, b_dtype: str, acc: str, scope: str, widen_a=None, lanes: int = 16):
    """What a dot-product instruction of ``lanes`` lanes computes: each lane ``i`` of ``C``
    (``acc``) adds the ``n`` products of ``A`` (broadcast) and row ``i`` of ``B``.
    ``widen_a``: how an element of A becomes ``acc`` (default a cast)."""
    widen = widen_a or (lambda a: T.cast(a, acc))

    @T.prim_func(s_tir=True)
    def desc(
        A: T.Buffer((n,), a_dtype, offset_factor=1),
        B: T.Buffer((lanes, n), b_dtype, offset_factor=1),
        C: T.Buffer((lanes,), acc, offset_factor=1, scope=scope),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:n], B[0:lanes, 0:n])
            T.writes(C[0:lanes])
            for i in T.serial(0, lanes):
                for k in T.serial(0, n):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + widen(A[vk]) * T.cast(B[vi, vk], acc)

    return desc


def _bf16_dot_impl(scope: str, a_dtype: str):
    """``vdpbf16ps``'s implementation for an A of ``a_dtype`` (bfloat16, or uint16 bits of
    bfloat16 values) and an accumulator ``C`` in ``scope``."""
    a_pair = f"{a_dtype}x2"

    @T.prim_func(s_tir=True)
    def impl(
        A: T.Buffer((2,), a_dtype, offset_factor=1),
        B: T.Buffer((16, 2), "bfloat16", offset_factor=1),
        C: T.Buffer((16,), "float32", offset_factor=1, scope=scope),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:2], B[0:16, 0:2])
            T.writes(C[0:16])
            with T.attr(0, "pragma_import_llvm", _HELPER_IR):
                # The pair of A is one 32-bit lane, broadcast to all 16 lanes.
                A_pair = T.reinterpret(A.vload([0], a_pair), dtype="int32")
                C[T.ramp(T.int32(0), 1, 16)] = T.call_pure_extern(
                    "float32x16", _HELPER,
                    C.vload([0], dtype="float32x16"),
                    T.broadcast(A_pair, 16),
                    T.reinterpret(B.vload([0, 0], dtype="bfloat16x32"), dtype="int32x16"),
                )

    return impl


def _bf16_dot_16x2(scope: str):
    """The description and implementation, for an accumulator ``C`` in ``scope``."""
    return _dot_desc(2, "bfloat16", "bfloat16", "float32", scope), _bf16_dot_impl(scope, "bfloat16")


def _bf16_bits_dot_16x2(scope: str):
    """``vdpbf16ps`` with an A of bfloat16 bits in uint16 (a buffer a function allocates:
    TVM would store a bfloat16 one as float32; Winograd's ``data_pack``, :mod:`tuner.graph.winograd`),
    widened by :func:`bf16_value`."""
    desc = _dot_desc(2, "uint16", "bfloat16", "float32", scope, bf16_value)
    return desc, _bf16_dot_impl(scope, "uint16")


def _vnni_dot_16x4(scope: str):
    """TVM's ``dot_16x4_vnni`` (``tvm.s_tir.tensor_intrin.x86``) for an accumulator in ``scope``.

    The LLVM that TVM 0.27's wheel links declares ``vpdpbusd.512`` on ``<64 x i8>`` operands;
    TVM's own implementation passes ``<16 x i32>`` and fails LLVM's verifier.
    """

    @T.prim_func(s_tir=True)
    def impl(
        A: T.Buffer((4,), "uint8", offset_factor=1),
        B: T.Buffer((16, 4), "int8", offset_factor=1),
        C: T.Buffer((16,), "int32", offset_factor=1, scope=scope),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:4], B[0:16, 0:4])
            T.writes(C[0:16])
            C[T.ramp(T.int32(0), 1, 16)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512"),
                C.vload([0], dtype="int32x16"),
                T.reinterpret(T.broadcast(T.reinterpret(A.vload([0], "uint8x4"), dtype="int32"), 16), dtype="int8x64"),
                B.vload([0, 0], dtype="int8x64"),
                dtype="int32x16",
            )

    return _dot_desc(4, "uint8", "int8", "int32", scope), impl


def _avx2_dot_8x4(scope: str):
    """uint8 x int8 quadruples into 8 int32 lanes on AVX2: ``vpmaddubsw`` adds each pair of
    products into int16 (saturating: exact for the weights :func:`exact_for` accepts), and
    ``vpmaddwd`` by ones adds the two pairs of a lane into int32."""

    @T.prim_func(s_tir=True)
    def impl(
        A: T.Buffer((4,), "uint8", offset_factor=1),
        B: T.Buffer((8, 4), "int8", offset_factor=1),
        C: T.Buffer((8,), "int32", offset_factor=1, scope=scope),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:8], A[0:4], B[0:8, 0:4])
            T.writes(C[0:8])
            C[T.ramp(T.int32(0), 1, 8)] = C.vload([0], dtype="int32x8") + T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id("llvm.x86.avx2.pmadd.wd"),
                T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id("llvm.x86.avx2.pmadd.ub.sw"),
                    T.reinterpret(T.broadcast(T.reinterpret(A.vload([0], "uint8x4"), dtype="int32"), 8),
                                  dtype="int8x32"),
                    B.vload([0, 0], dtype="int8x32"),
                    dtype="int16x16",
                ),
                T.broadcast(T.int16(1), 16),
                dtype="int32x8",
            )

    return _dot_desc(4, "uint8", "int8", "int32", scope, lanes=8), impl


@cache
def register_intrinsics() -> None:
    """Register the intrinsics (once per process; TensorIntrin names are global), and ours
    of ``dot_16x4_vnni`` over TVM's, which MetaSchedule's sketches and fallback schedules
    tensorize with on VNNI CPUs and which fails LLVM's verifier (see :func:`_vnni_dot_16x4`)."""
    from search_spaces.quick_import import import_tvm_intrinsics

    import_tvm_intrinsics()  # TVM's own first: registering after ours would fail
    from tvm.s_tir.tensor_intrin.x86 import VNNI_DOT_16x4_INTRIN

    TensorIntrin.register(VNNI_DOT_16x4_INTRIN, *_vnni_dot_16x4("global"), override=True)
    TensorIntrin.register(BF16_DOT_16x2_INTRIN, *_bf16_dot_16x2("global"), override=True)
    TensorIntrin.register(BF16_DOT_16x2_LOCAL_INTRIN, *_bf16_dot_16x2("local"), override=True)
    TensorIntrin.register(VNNI_DOT_16x4_LOCAL_INTRIN, *_vnni_dot_16x4("local"), override=True)
    TensorIntrin.register(BF16_BITS_DOT_16x2_LOCAL_INTRIN, *_bf16_bits_dot_16x2("local"), override=True)
    TensorIntrin.register(AVX2_DOT_8x4_LOCAL_INTRIN, *_avx2_dot_8x4("local"), override=True)


def target_has(target: tvm.target.Target, feature: str) -> bool:
    """Whether ``target`` (an LLVM CPU) has the LLVM CPU ``feature`` (asked once per target:
    :class:`~search_spaces.x86.features.CpuFeatures`)."""
    from search_spaces.x86.features import CpuFeatures

    return CpuFeatures.of(target).has(feature)


def target_has_bf16_dot(target: tvm.target.Target) -> bool:
    """Whether ``target`` (an LLVM CPU) has ``vdpbf16ps``."""
    return target_has(target, BF16_FEATURE)
