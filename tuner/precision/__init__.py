"""Reduced precision: which precisions a CPU can run, and the graph passes that apply them.

``fp32`` leaves a model as imported. ``bf16`` casts the inputs and weights of every conv2d
and matmul to bfloat16 and accumulates in float32 (:mod:`tuner.precision.bf16`), or rounds
their weights to bf16 and computes in float32 where that is faster (:func:`bf16_arithmetic`); ``int8``
rewrites a quantized (QDQ) model's dequantize -> conv2d/matmul -> quantize chains into
integer operators (:mod:`tuner.precision.qdq`). The precision is part of every workload key
(:func:`tuner.graph.tasks.workload_key`), so records of one precision never serve another.
"""

from __future__ import annotations

import logging
import os
from enum import StrEnum
from typing import TYPE_CHECKING, Literal

from tuner.errors import UserInputError

if TYPE_CHECKING:
    import tvm

logger = logging.getLogger(__name__)

BF16_ARITHMETIC_ENV = "NIGHTSHIFT_BF16_ARITHMETIC"

# A precision runs at speed when the target has one of these LLVM CPU features (and the
# host, when it is the device, the matching /proc/cpuinfo flag); the first is the one named
# when none is there.
# int8's features whose instruction adds uint8 x int8 products in int32 directly.
_EXACT_INT8 = (("avx512vnni", "avx512_vnni"), ("avxvnni", "avx_vnni"), ("amx-int8", "amx_int8"))
_NEEDS: dict[str, tuple[tuple[str, str], ...]] = {
    "bf16": (("avx512bf16", "avx512_bf16"), ("amx-bf16", "amx_bf16")),
    # AVX-512BW without VNNI: TVM's dot_16x4_avx512 (vpmaddubsw + vpmaddwd); AVX2: the
    # same on 8 lanes (intrin_x86.AVX2_DOT). Both add pairs of products in int16, which
    # saturates: exact with 7-bit weights (int8_weight_bits).
    "int8": (*_EXACT_INT8, ("avx512bw", "avx512bw"), ("avx2", "avx2")),
}


class UnsupportedPrecisionError(UserInputError):
    """The device lacks the instructions a precision needs (no silent slow emulation)."""


class Precision(StrEnum):
    """The precision a model is tuned and compiled in; the one place its choices are written.

    A ``StrEnum``: each member is its own name as a string (``Precision.BF16 == "bf16"``), so
    it stands wherever a precision string did (JSON, the database, workload keys).
    """

    FP32 = "fp32"
    BF16 = "bf16"
    INT8 = "int8"

    @classmethod
    def parse(cls, text: str | Precision | None) -> Precision:
        """The precision ``text`` names (None: fp32), else UserInputError naming the choices."""
        if text is None:
            return cls.FP32
        try:
            return cls(text)
        except ValueError:
            raise UserInputError(f"unknown precision {text!r}: use {', '.join(PRECISIONS)}") from None

    @property
    def reduced(self) -> bool:
        """Whether it is below fp32: its accuracy is measured against the fp32 build."""
        return self is not Precision.FP32

    @property
    def blocked_only(self) -> bool:
        """Whether its convs run in the blocked layout alone (int8's dot products read it)."""
        return self is Precision.INT8

    @property
    def key_suffix(self) -> str:
        """What it adds to a workload key (nothing for fp32), so records never mix precisions."""
        return "" if self is Precision.FP32 else f"/{self.value}"

    @property
    def needs_quantized_model(self) -> bool:
        """Whether the model must be quantized (QDQ) first: a float one is quantized by onnxruntime."""
        return self is Precision.INT8

    def missing_feature(self, target: tvm.target.Target, host_flags: list[str] | None = None) -> str | None:
        """:func:`missing_feature` of this precision."""
        return missing_feature(self, target, host_flags)

    def check_device(self, device) -> None:
        """:func:`check_device` of this precision."""
        check_device(self, device)


PRECISIONS: tuple[str, ...] = tuple(p.value for p in Precision)


def check_precision(precision: str) -> Precision:
    """``precision`` as a :class:`Precision`, else UserInputError naming the choices."""
    return Precision.parse(precision)


def missing_feature(precision: str, target: tvm.target.Target, host_flags: list[str] | None = None) -> str | None:
    """The CPU feature ``precision`` needs that ``target`` lacks, or None when it has one.

    Args:
        precision: ``fp32``, ``bf16`` or ``int8``.
        target: an LLVM target (its ``mcpu``, as LLVM knows it, says what it has).
        host_flags: the host's ``/proc/cpuinfo`` flags when the target is this machine: a
            hypervisor may hide a feature the CPU model has, and the code would then fault.
    """
    from tvm.target import codegen

    needs = _NEEDS.get(precision)
    if needs is None:
        return None
    for llvm_name, flag in needs:
        try:
            has = bool(codegen.target_has_features(llvm_name, target))
        except (RuntimeError, ValueError):  # a target LLVM cannot resolve has none
            has = False
        if has and (host_flags is None or flag in host_flags):
            return None
    return needs[0][0]


def int8_weight_bits(target: tvm.target.Target) -> int:
    """Bits of the weights ``--precision int8`` quantizes a float model to for ``target``: 8
    where it adds uint8 x int8 products in int32 (VNNI, AMX); 7 where its instruction adds
    pairs of them in int16 first (AVX2's and AVX-512BW's ``vpmaddubsw``), which 8-bit weights
    can saturate and 7-bit ones cannot (onnxruntime's ``reduce_range``, which its
    documentation advises on such CPUs for the same reason)."""
    from search_spaces.x86.features import CpuFeatures

    return CpuFeatures.of(target).int8_weight_bits


def check_device(precision: str, device) -> None:
    """Raise :class:`UnsupportedPrecisionError` when ``device`` cannot run ``precision`` natively.

    Args:
        precision: ``fp32``, ``bf16`` or ``int8``.
        device: a :class:`tuner.device.Device`.
    """
    check_precision(precision)
    if precision == "fp32":
        return
    if device.kind != "cpu":
        raise UnsupportedPrecisionError(f"--precision {precision} is implemented for CPUs only, not {device.name}")
    from tuner.device import host_cpu_info

    host = host_cpu_info()
    on_host = device.arch == host["mcpu"]
    missing = missing_feature(precision, device.target, list(host["isa_flags"]) if on_host else None)
    if missing is not None:
        alternatives = " or ".join(name for name, _ in _NEEDS[precision])
        raise UnsupportedPrecisionError(
            f"--precision {precision} needs the CPU feature {missing} ({alternatives}), which the target "
            f"{device.arch} lacks")


def bf16_arithmetic(target: tvm.target.Target | None) -> Literal["bf16", "fp32"]:
    """The arithmetic ``--precision bf16`` computes conv2d and matmul in for ``target``.

    ``bf16`` (dot products on ``vdpbf16ps`` or AMX tiles) where they beat float32 FMAs:
    AMX-BF16, and AMD's cores (on a Zen 4 and a Zen 5 OpenVINO's bf16 ResNet-50 ran 0.52x
    and 0.53x the time of its f32, ``INFERENCE_PRECISION_HINT`` f32; benchmarks/README.md; a
    Zen 5 retired 490-498 GFLOP/s a core on ``vdpbf16ps`` against 267-268 on ``vfmadd231ps``,
    ``benchmarks/results/dot_rates_zen5.jsonl``).
    ``fp32`` (FMAs on weights rounded to bf16, :mod:`tuner.precision.bf16`) on other cores
    with AVX512_BF16, Intel's: an Emerald Rapids without AMX retired 89-92 GFLOP/s a core on
    ``vdpbf16ps`` against 183-188 on ``vfmadd231ps`` (``benchmarks/dot_rate.c``,
    ``benchmarks/results/dot_rates_emr_noamx.jsonl``), and OpenVINO's bf16 default ran
    ResNet-50 in 1.64x the time of its f32 (``INFERENCE_PRECISION_HINT`` f32). Other Intel
    cores without AMX (Cooper Lake, Sapphire Rapids) are taken to be alike, not measured.

    ``NIGHTSHIFT_BF16_ARITHMETIC=bf16|fp32`` chooses instead (e.g. to time both on one CPU);
    a database holds both apart, their operators' workload keys differ.
    """
    forced = _forced_bf16_arithmetic()
    if forced:
        return forced  # type: ignore[return-value]
    if target is None or str(target.kind.name) != "llvm":
        return "bf16"
    from search_spaces.x86.features import CpuFeatures

    features = CpuFeatures.of(target)
    if features.amx_bf16 or features.amd:
        return "bf16"
    return "fp32"


def _forced_bf16_arithmetic() -> str | None:
    """``NIGHTSHIFT_BF16_ARITHMETIC`` when set (``bf16`` or ``fp32``), else None."""
    forced = os.environ.get(BF16_ARITHMETIC_ENV)
    if forced and forced not in ("bf16", "fp32"):
        raise UserInputError(f"{BF16_ARITHMETIC_ENV}={forced!r}: use bf16 or fp32")
    return forced or None


def _bf16_dots(target: tvm.target.Target | None) -> bool:
    """Whether int8's matmuls of two activations run on bf16 dot products for ``target``."""
    return target is not None and str(target.kind.name) == "llvm" and missing_feature("bf16", target) is None


def _pair_limit(target: tvm.target.Target | None) -> bool:
    """Whether ``target``'s int8 dot product adds pairs of products in int16 (AVX2's)."""
    return target is not None and str(target.kind.name) == "llvm" and int8_weight_bits(target) == 7


def apply_precision(mod: tvm.IRModule, precision: str, target: tvm.target.Target | None = None) -> tvm.IRModule:
    """The bound module (weights as constants) in ``precision``: what tasks are extracted
    from and what is compiled. ``fp32`` returns ``mod`` unchanged.

    ``target``: the device's; int8 then puts matmuls of two activations on bf16 dot products
    where it has them. Tasks and the compiled model must be made with the same target.
    """
    check_precision(precision)
    if precision == "bf16":
        from tuner.precision.bf16 import to_bf16

        return to_bf16(mod, fp32_arithmetic=bf16_arithmetic(target) == "fp32")
    if precision == "int8":
        from tuner.precision.qdq import to_int8

        rewrite = to_int8(mod, bf16_dots=_bf16_dots(target), pair_limit=_pair_limit(target))
        if not any(rewrite.rewritten.values()):
            raise UserInputError(
                "--precision int8 needs a quantized (QDQ) ONNX model, as onnxruntime.quantization.quantize_static "
                f"writes it: this one has no dequantize -> conv2d/matmul chain ({rewrite.describe()})")
        return rewrite.mod
    return mod


def describe(mod: tvm.IRModule, precision: str, target: tvm.target.Target | None = None) -> str | None:
    """One line on what ``precision`` does to the bound module for ``target`` (which
    operators it converts, which it leaves in fp32 and why); None for fp32."""
    if precision == "int8":
        from tuner.precision.qdq import to_int8

        return to_int8(mod, bf16_dots=_bf16_dots(target), pair_limit=_pair_limit(target)).describe()
    if precision == "bf16":
        from tuner.precision.bf16 import bf16_summary

        forced = _forced_bf16_arithmetic()
        why = f"{BF16_ARITHMETIC_ENV}={forced}" if forced else (
            "an Intel core without AMX: on an Emerald Rapids vdpbf16ps did half the flops of the fp32 FMAs")
        return bf16_summary(mod, fp32_arithmetic=bf16_arithmetic(target) == "fp32", why=why)
    return None
