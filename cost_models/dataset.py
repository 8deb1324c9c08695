"""Training data from the tuning database: stored records replayed into per-store features."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm.s_tir import Schedule
from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

from cost_models.features import StoreFeatures, extract_features

logger = logging.getLogger(__name__)

# Prefix the job gives the error_msg of a candidate timed by one cold run only: its time is a
# lower bound, not a label.
EARLY_STOP_PREFIX = "stopped early"

FAMILIES = ("conv2d", "dense/matmul", "other")


def task_family(name: str) -> str:
    """``conv2d``, ``dense/matmul`` or ``other``, from a task's name."""
    low = name.lower()
    if "conv" in low:
        return "conv2d"
    if "dense" in low or "matmul" in low:
        return "dense/matmul"
    return "other"


def device_family(kind: str, arch: str) -> str:
    """Key of a device family: ``cpu:znver4``, ``cuda:sm_90``."""
    return f"{kind}:{arch}"


@dataclass
class Dataset:
    """Labelled candidates of several tasks.

    Attributes:
        features: per-store features, one entry per candidate.
        throughputs: GFLOPS (1/s when the task's FLOPs are unknown); 0 for failures.
        groups: task of each candidate: the workload key, with ``@fingerprint`` appended for
            records of another device than the one asked for (its speeds differ).
        names: task name of each group.
    """

    features: StoreFeatures
    throughputs: np.ndarray
    groups: np.ndarray
    names: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.throughputs)

    def subset(self, index: np.ndarray) -> Dataset:
        return Dataset(self.features[index], self.throughputs[index], self.groups[index], self.names)

    def family(self, group: str) -> str:
        return task_family(self.names.get(group, group))


def load_dataset(db, device, *, target: tvm.target.Target | None = None, same_arch: bool = True,
                 max_records: int | None = 20_000) -> Dataset:  # fmt: skip
    """Rebuild features and labels from the database's records of ``device`` (and its family).

    Each record's MetaSchedule trace is replayed on its workload and TVM's per-store features
    are extracted for ``target`` (the device's by default). Failed records get label 0;
    early-stopped probes and records that no longer replay (another TVM) are left out.

    Args:
        db: a :class:`tuner.db.TuningDatabase`.
        device: a :class:`tuner.device.Device`.
        target: target to extract features for; ``device.target`` by default.
        same_arch: include records of other devices of the same kind and architecture.
        max_records: newest records read at most (rebuilding takes ~20 ms a record).
    """
    target = target or device.target
    dev_id = db.find_device_id(device)
    if dev_id is None:
        return Dataset(StoreFeatures.from_list([]), np.zeros(0), np.zeros(0, dtype=str))
    start = time.perf_counter()
    by_workload: dict[str, list] = {}
    for key, fingerprint, row in db.training_records(dev_id, same_arch=same_arch, limit=max_records):
        if row.error_class is None and (row.error_msg or "").startswith(EARLY_STOP_PREFIX):
            continue
        by_workload.setdefault(key, []).append((fingerprint, row))
    parts: list[StoreFeatures] = []
    ys: list[float] = []
    gs: list[str] = []
    names: dict[str, str] = {}
    skipped = 0
    for key, rows in sorted(by_workload.items()):
        stored = db.get_workload(key)
        try:
            workload = Workload.from_json(json.loads(stored.workload_json))
        except (RuntimeError, ValueError, TypeError) as err:
            logger.info("workload %s does not load on this TVM (%s); its %d records skipped", key, err, len(rows))
            skipped += len(rows)
            continue
        schedules, labels, groups = [], [], []
        for fingerprint, row in sorted(rows, key=lambda r: r[1].id):
            try:
                record = TuningRecord.from_json(json.loads(row.record_json), workload)
                sch = Schedule(workload.mod)
                record.trace.apply_to_schedule(sch, remove_postproc=False)
            except (RuntimeError, ValueError, TypeError, KeyError, IndexError, AttributeError) as err:
                logger.debug("record %d does not replay: %s", row.id, str(err).splitlines()[0] if str(err) else err)
                skipped += 1
                continue
            schedules.append(sch)
            labels.append(_label(row, stored.flops))
            group = key if fingerprint == device.fingerprint else f"{key}@{fingerprint}"
            if row.timing != "warm":  # cold times rank among themselves, not with warm ones
                group += f"~{row.timing}"
            groups.append(group)
            names[group] = stored.name
        if schedules:
            parts.append(extract_features(workload.mod, target, schedules))
            ys += labels
            gs += groups
    logger.info("rebuilt features of %d records of %d workloads in %.1f s (%d skipped)", len(ys), len(by_workload),
                time.perf_counter() - start, skipped)  # fmt: skip
    return Dataset(StoreFeatures.concat(parts), np.asarray(ys, dtype=float), np.asarray(gs, dtype=str), names)


def _label(row, flops: float) -> float:
    if row.error_class is not None or row.mean_sec is None:
        return 0.0
    secs = json.loads(row.run_secs or "[]")
    # The median, as the job's own labels: robust to one slow repeat on a busy machine.
    sec = float(np.median(secs)) if secs else float(row.mean_sec)
    if sec <= 0:
        return 0.0
    return flops / sec / 1e9 if flops else 1.0 / sec
