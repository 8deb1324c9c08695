"""The tuned tasks of a model on this host's CPU, heaviest first: what the scripts that time
stored records again start from."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.db import TuningDatabase
from tuner.device import Device, parse_device
from tuner.frontends import load_model
from tuner.graph.layout.plan import LayoutPlan
from tuner.memory import small_pages
from tuner.precision.quantize import DEFAULT_CALIBRATION, quantized_model
from tuner.graph.tasks import Task, extract_tasks


@dataclass
class Tuned:
    """This CPU, its records in ``db``, and the model's tasks that have any."""

    device: Device
    db: TuningDatabase
    device_id: int
    tasks: list[Task]  # heaviest first: weight x the stored best
    rows: dict[str, list[Any]]  # per workload key, its ``top`` fastest records


def tuned_tasks(db_path: str, model: str, top: int = 1, precision: str = "fp32") -> Tuned:
    """Numpy's huge-page advice off, the host CPU on its ``num-cores`` threads, and the tasks
    of ``model`` in ``precision`` (the host's default layout plan; int8: a zoo name quantized
    as ``tune`` quantizes it, or a QDQ file) with records of this CPU in ``db_path``; exits
    with a message when the database has none."""
    small_pages()
    device = parse_device("cpu")
    device.use_threads()
    db = TuningDatabase(db_path)
    device_id = db.find_device_id(device)
    if device_id is None:
        raise SystemExit(f"{db_path} has no records of this CPU ({device.fingerprint})")
    if precision == "int8" and not model.lower().endswith(".onnx"):
        model = str(quantized_model(load_model(model), model, DEFAULT_CALIBRATION))
    tasks = extract_tasks(load_model(model).bound(), device.target, LayoutPlan.for_target(device.target),
                          precision=precision)  # fmt: skip
    rows = {t.workload_key: db.best(t.workload_key, device_id, k=top) for t in tasks}
    tuned = [t for t in tasks if rows[t.workload_key] and rows[t.workload_key][0].mean_sec]
    tuned.sort(key=lambda t: -t.weight * rows[t.workload_key][0].mean_sec)
    return Tuned(device, db, device_id, tuned, rows)


def add_copy_arguments(p: argparse.ArgumentParser) -> None:
    """The options of a script that reads a database and writes a changed copy of it for
    ``db_ab.py``: ``--db``, ``--out-db``, ``--model`` and a reduced ``--precision``."""
    p.add_argument("--db", required=True)
    p.add_argument("--out-db", required=True, type=Path)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--precision", default="int8", choices=["int8", "bf16"])
