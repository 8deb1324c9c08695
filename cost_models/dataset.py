"""Training data from the tuning database: stored records replayed into per-store features."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field

import numpy as np
import tvm
from sqlalchemy import select
from tvm.s_tir import Schedule
from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

from cost_models.feature_cache import FeatureCache, feature_key
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
        sources: the model of the job that measured each candidate ("" for records of no job).
        spaces: the search space kind of each candidate (``sketch`` or a template's name).
        devices: the device fingerprint of each candidate.
    """

    features: StoreFeatures
    throughputs: np.ndarray
    groups: np.ndarray
    names: dict[str, str] = field(default_factory=dict)
    sources: np.ndarray | None = None
    spaces: np.ndarray | None = None
    devices: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.throughputs)
        for name in ("sources", "spaces", "devices"):
            if getattr(self, name) is None:
                setattr(self, name, np.full(n, "sketch" if name == "spaces" else "", dtype=object))

    def __len__(self) -> int:
        return len(self.throughputs)

    def subset(self, index: np.ndarray) -> Dataset:
        return Dataset(self.features[index], self.throughputs[index], self.groups[index], self.names,
                       self.sources[index], self.spaces[index], self.devices[index])  # fmt: skip

    def family(self, group: str) -> str:
        return task_family(self.names.get(group, group))

    @classmethod
    def concat(cls, parts: list[Dataset]) -> Dataset:
        """All candidates of ``parts``, in order (groups keep their names: use distinct keys)."""
        parts = [p for p in parts if len(p)]
        if not parts:
            return empty_dataset()
        names: dict[str, str] = {}
        for p in parts:
            names |= p.names
        cat = {a: np.concatenate([getattr(p, a) for p in parts])
               for a in ("throughputs", "groups", "sources", "spaces", "devices")}  # fmt: skip
        return cls(StoreFeatures.concat([p.features for p in parts]), names=names, **cat)


def empty_dataset() -> Dataset:
    return Dataset(StoreFeatures.from_list([]), np.zeros(0), np.zeros(0, dtype=str))


def load_dataset(db, device, *, target: tvm.target.Target | None = None, same_arch: bool = True,
                 max_records: int | None = 20_000) -> Dataset:  # fmt: skip
    """Rebuild features and labels from the database's records of ``device`` (and its family).

    Each record's MetaSchedule trace is replayed on its workload and TVM's per-store features
    are extracted for the target of the device that measured it (``target``, when given, for
    all of them), so each record carries its own device's hardware descriptor. Failed records
    get label 0; early-stopped probes and records that no longer replay (another TVM) are left
    out.

    Args:
        db: a :class:`tuner.db.TuningDatabase`.
        device: a :class:`tuner.device.Device`.
        target: target to extract every record's features for, instead of its device's.
        same_arch: include records of other devices of the same kind and architecture.
        max_records: newest records read at most (rebuilding takes ~20 ms a record).
    """
    dev_id = db.find_device_id(device)
    if dev_id is None:
        return empty_dataset()
    rows = db.training_records(dev_id, same_arch=same_arch, limit=max_records)
    return _build(db, rows, device.fingerprint, target)


def load_all(db, *, kind: str = "cpu", max_records: int | None = 20_000) -> Dataset:
    """Every device of ``kind``'s records (newest ``max_records`` of each device), rebuilt as
    :func:`load_dataset` does; each task's group is ``key@fingerprint``: one model learns from
    all the devices, ranking within one task on one device."""
    from tuner.db.schema import DeviceRow

    with db.session(write=False) as s:
        ids = [int(i) for i in s.scalars(select(DeviceRow.id).where(DeviceRow.kind == kind).order_by(DeviceRow.id))]
    rows = [r for i in ids for r in db.training_records(i, same_arch=False, limit=max_records)]
    return _build(db, rows, None, None)


def _device_targets(db) -> dict[str, tvm.target.Target]:
    """Target of every device in the database, by fingerprint."""
    from tuner.db.schema import DeviceRow

    with db.session(write=False) as s:
        stored = s.execute(select(DeviceRow.fingerprint, DeviceRow.target)).all()
    out = {}
    for fingerprint, text in stored:
        try:
            out[fingerprint] = tvm.target.Target(json.loads(text))
        except (ValueError, RuntimeError, TypeError) as err:
            logger.info("device %s's target %s does not load here (%s)", fingerprint, text, err)
    return out


def _job_models(db) -> dict[int, str]:
    from tuner.db.schema import JobRow

    with db.session(write=False) as s:
        return {int(i): str(m) for i, m in s.execute(select(JobRow.id, JobRow.model)).all()}


def _space_kind(point: str) -> str:
    try:
        return str(json.loads(point).get("kind", "sketch"))
    except (ValueError, AttributeError):
        return "sketch"


def _build(db, records: list, own_fingerprint: str | None, target: tvm.target.Target | None) -> Dataset:
    """Replay ``(workload key, fingerprint, record)`` rows into a dataset; features of records
    rebuilt before on this host come from the feature cache (:mod:`cost_models.feature_cache`)."""
    start = time.perf_counter()
    targets = _device_targets(db)
    models = _job_models(db)
    cache = FeatureCache.default()
    by_workload: dict[str, list] = {}
    for key, fingerprint, row in records:
        if row.error_class is None and (row.error_msg or "").startswith(EARLY_STOP_PREFIX):
            continue
        by_workload.setdefault(key, []).append((fingerprint, row))
    parts: list[StoreFeatures] = []
    ys: list[float] = []
    gs: list[str] = []
    srcs: list[str] = []
    kinds: list[str] = []
    fps: list[str] = []
    names: dict[str, str] = {}
    skipped = rebuilt = 0
    for key, rows in sorted(by_workload.items()):
        stored = db.get_workload(key)
        by_device: dict[str, list] = {}
        for fingerprint, row in sorted(rows, key=lambda r: r[1].id):
            by_device.setdefault(fingerprint, []).append(row)
        for fingerprint, dev_rows in by_device.items():
            dev_target = target or targets.get(fingerprint)
            if dev_target is None:
                skipped += len(dev_rows)
                continue
            feats, n_rebuilt = _features(stored, dev_target, dev_rows, cache)
            rebuilt += n_rebuilt
            kept = [(row, f) for row, f in zip(dev_rows, feats, strict=True) if f is not None]
            skipped += len(dev_rows) - len(kept)
            parts.append(StoreFeatures.from_list([f for _, f in kept]))
            for row, _ in kept:
                ys.append(_label(row, stored.flops))
                group = key if fingerprint == own_fingerprint else f"{key}@{fingerprint}"
                if row.timing != "warm":  # cold times rank among themselves, not with warm ones
                    group += f"~{row.timing}"
                gs.append(group)
                names[group] = stored.name
                srcs.append(models.get(row.job_id, "") if row.job_id is not None else "")
                kinds.append(_space_kind(row.point))
                fps.append(fingerprint)
    if cache is not None:
        cache.close()
    logger.info("features of %d records of %d workloads in %.1f s: %d rebuilt, the rest cached (%d skipped)",
                len(ys), len(by_workload), time.perf_counter() - start, rebuilt, skipped)  # fmt: skip
    return Dataset(StoreFeatures.concat(parts), np.asarray(ys, dtype=float), np.asarray(gs, dtype=str), names,
                   np.asarray(srcs, dtype=object), np.asarray(kinds, dtype=object), np.asarray(fps, dtype=object))


def _features(stored, target: tvm.target.Target, rows: list, cache: FeatureCache | None,
              ) -> tuple[list[np.ndarray | None], int]:  # fmt: skip
    """Feature rows of each record of one workload on one target (None: it does not replay on
    this TVM), from the cache where it has them, else replayed; and how many were replayed."""
    keys = [feature_key(stored.key, target, row.record_json) for row in rows]
    cached = cache.get_many(keys) if cache is not None else {}
    feats: list[np.ndarray | None] = [cached.get(k) for k in keys]
    missing = [i for i, k in enumerate(keys) if k not in cached]
    if not missing:
        return feats, 0
    try:
        workload = Workload.from_json(json.loads(stored.workload_json))
    except (RuntimeError, ValueError, TypeError) as err:
        logger.info("workload %s does not load on this TVM (%s); its %d records skipped", stored.key, err, len(rows))
        return [None] * len(rows), 0
    replayed: list[tuple[int, Schedule]] = []
    for i in missing:
        try:
            record = TuningRecord.from_json(json.loads(rows[i].record_json), workload)
            sch = Schedule(workload.mod)
            record.trace.apply_to_schedule(sch, remove_postproc=False)
        except (RuntimeError, ValueError, TypeError, KeyError, IndexError, AttributeError) as err:
            logger.debug("record %d does not replay: %s", rows[i].id, str(err).splitlines()[0] if str(err) else err)
            continue
        replayed.append((i, sch))
    extracted = extract_features(workload.mod, target, [sch for _, sch in replayed])
    for j, (i, _) in enumerate(replayed):
        feats[i] = extracted.candidate(j)
    if cache is not None:
        cache.put_many({keys[i]: feats[i] for i in missing})
    return feats, len(missing)


def _label(row, flops: float) -> float:
    if row.error_class is not None or row.mean_sec is None:
        return 0.0
    secs = json.loads(row.run_secs or "[]")
    # The median, as the job's own labels: robust to one slow repeat on a busy machine.
    sec = float(np.median(secs)) if secs else float(row.mean_sec)
    if sec <= 0:
        return 0.0
    return flops / sec / 1e9 if flops else 1.0 / sec
