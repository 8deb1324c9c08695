"""Measurement: builds as Ray tasks on any CPU, timing and verification on a device actor, or
both in this process (:func:`create`, :mod:`tuner.measure.base`).

Kept free of imports so that a runtime-only worker (TVM runtime, no compiler) can import
``tuner.measure.runner`` without pulling in the compiler side.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tuner.device import Device
    from tuner.measure.base import MeasureConfig, Measurer, MeasurerName


def create(kind: MeasurerName | Measurer, device: Device, config: MeasureConfig | None = None) -> Measurer:
    """The measurer named ``kind`` (``"ray"``, ``"inline"``) for ``device``, or ``kind``
    itself when it is already a measurer.

    Raises:
        UserInputError: an unknown name.
    """
    if not isinstance(kind, str):
        return kind
    if kind == "ray":
        from tuner.measure.ray_measure import RayMeasurer

        return RayMeasurer(device, config)
    if kind == "inline":
        from tuner.measure.inline import InlineMeasurer

        return InlineMeasurer(device, config)
    from tuner.errors import UserInputError
    from tuner.measure.base import MEASURERS

    raise UserInputError(f"unknown measurer {kind!r}: use one of {', '.join(MEASURERS)}")
