"""Reduced precision: which precisions a CPU can run, and the graph passes that apply them.

``fp32`` leaves a model as imported. ``bf16`` casts the inputs and weights of every conv2d
and matmul to bfloat16 and accumulates in float32 (:mod:`tuner.precision.bf16`); ``int8``
rewrites a quantized (QDQ) model's dequantize -> conv2d/matmul -> quantize chains into
integer operators (:mod:`tuner.precision.qdq`). The precision is part of every workload key
(:func:`tuner.tasks.workload_key`), so records of one precision never serve another.
"""

from __future__ import annotations

import logging
from typing import Literal

import tvm

from tuner.errors import UserInputError

logger = logging.getLogger(__name__)

Precision = Literal["fp32", "bf16", "int8"]
PRECISIONS: tuple[Precision, ...] = ("fp32", "bf16", "int8")

# A precision runs at speed when the CPU has one of these (/proc/cpuinfo flag names, as
# tuner.device records them); the first is the one named when none is there.
_NEEDS: dict[str, tuple[str, ...]] = {
    "bf16": ("avx512_bf16", "amx_bf16"),
    "int8": ("avx512_vnni", "avx_vnni", "amx_int8"),
}


class UnsupportedPrecisionError(UserInputError):
    """The device lacks the instructions a precision needs (no silent slow emulation)."""


def check_precision(precision: str) -> Precision:
    """``precision`` if it is one Nightshift knows, else UserInputError naming the choices."""
    if precision not in PRECISIONS:
        raise UserInputError(f"unknown precision {precision!r}: use {', '.join(PRECISIONS)}")
    return precision  # type: ignore[return-value]


def missing_feature(precision: str, isa_flags: list[str] | tuple[str, ...]) -> str | None:
    """The CPU feature ``precision`` needs that ``isa_flags`` lack, or None when it has one."""
    needs = _NEEDS.get(precision)
    if needs is None or any(f in isa_flags for f in needs):
        return None
    return needs[0]


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
    missing = missing_feature(precision, device.description.get("isa_flags", ()))
    if missing is not None:
        alternatives = " or ".join(_NEEDS[precision])
        raise UnsupportedPrecisionError(
            f"--precision {precision} needs the CPU feature {missing} ({alternatives}), which "
            f"{device.description.get('model', 'this CPU')} lacks")


def apply_precision(mod: tvm.IRModule, precision: str) -> tvm.IRModule:
    """The bound module (weights as constants) in ``precision``: what tasks are extracted
    from and what is compiled. ``fp32`` returns ``mod`` unchanged."""
    check_precision(precision)
    if precision == "bf16":
        from tuner.precision.bf16 import to_bf16

        return to_bf16(mod)
    if precision == "int8":
        from tuner.precision.qdq import to_int8

        return to_int8(mod).mod
    return mod
