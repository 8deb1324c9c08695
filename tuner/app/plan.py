"""Each conv's data layout for a model on a device: the plan ``--layout`` names, or the one the
database's measurements favour under ``--layout auto`` (:func:`choose_layout`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tuner.db import TuningDatabase
    from tuner.device import Device
    from tuner.frontends.model import ModelSpec
    from tuner.graph.layout.choose import PlanChoice

logger = logging.getLogger(__name__)


def choose_layout(spec: ModelSpec, device: Device, db: TuningDatabase, layouts: Sequence[str],
                  precision: str = "fp32") -> PlanChoice:
    """:func:`tuner.graph.layout.choose.choose_from_database` on ``db``'s best records for ``device``
    (same-architecture records where the device has none, as the compiler uses them)."""
    from tuner.graph.layout.choose import choose_from_database
    from tuner.precision import apply_precision

    dev_id = db.find_device_id(device)
    cache: dict[str, float | None] = {}

    def best(key: str) -> float | None:
        if key not in cache:
            found = db.lookup(key, dev_id, policy="same-arch") if dev_id is not None else []
            cache[key] = found[0].row.mean_sec if found else None
        return cache[key]

    with db.reading("layout plan"):  # the records refused for every conv, said once
        return choose_from_database(apply_precision(spec.bound(), precision, device.target), device.target, best,
                                    layouts, precision=precision)  # fmt: skip


def measured_plan(spec: ModelSpec, device: Device, db: TuningDatabase, precision: str = "fp32") -> PlanChoice | None:
    """What ``--layout auto`` compiles ``spec`` with from ``db``: the :func:`choose_layout`
    choice where the device weighs several layouts at ``precision``, else None (the target's
    default plan)."""
    from tuner.graph.layout.plan import auto_layouts

    layouts = auto_layouts(device.target, precision)
    if len(layouts) < 2:
        return None
    return choose_layout(spec, device, db, layouts, precision)
