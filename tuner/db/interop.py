"""Import and export TVM MetaSchedule's JSON database (a workload file and a record file).

Both directions go through TVM's own ``JSONDatabase``, so the files are exactly what
``tune_tir``/``compile_relax`` with ``work_dir`` read and write.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

import tvm
from tvm.s_tir.analysis import estimate_tir_flops
from tvm.s_tir.meta_schedule.database import JSONDatabase, TuningRecord, Workload

from tuner.db.store import ImportSource, NewRecord, TuningDatabase
from tuner.db.validate import record_rejection
from tuner.errors import UserInputError
from tuner.graph.keys import trace_program_hash, workload_key
from tuner.trace_json import record_as_json

logger = logging.getLogger(__name__)

WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"
# MetaSchedule stores a failed run as this many seconds.
_MS_FAILED_SEC = 1e9


@dataclass(frozen=True)
class TransferSummary:
    """What an import or export moved."""

    workloads: int
    records: int
    skipped: int
    # Records refused by the allow-list: (line of the record file, reason).
    rejected: tuple[tuple[int, str], ...] = ()


def trace_point(record_json: str) -> str:
    """The point of a record that came from TVM (no knobs): its JSON's digest."""
    return json.dumps({"trace_sha256": hashlib.sha256(record_json.encode()).hexdigest()})


def export_json(db: TuningDatabase, device_id: int, folder: Path, *, top_k: int | None = None) -> TransferSummary:
    """Write the device's successful records as a MetaSchedule JSON database in ``folder``.

    Args:
        top_k: only the k fastest records of each workload (all when None).

    Raises:
        UserInputError: the files exist already (MetaSchedule would append to them).
    """
    paths = _paths(folder)
    existing = [str(p) for p in paths if p.exists()]
    if existing:
        raise UserInputError(f"{', '.join(existing)} exist; export into an empty folder")
    folder.mkdir(parents=True, exist_ok=True)
    out = JSONDatabase(path_workload=str(paths[0]), path_tuning_record=str(paths[1]), allow_missing=True)
    workloads = records = skipped = 0
    for wrow, _best, _n in db.best_per_workload(device_id):
        # Only records measured here that pass the allow-list: an export is replayed elsewhere.
        rows = db.best(wrow.key, device_id, k=top_k or 2**31 - 1)  # through the gate
        try:
            workload = out.commit_workload(Workload.from_json(json.loads(wrow.workload_json)).mod)
        except (RuntimeError, ValueError, TypeError, IndexError) as err:
            logger.warning("workload %s (%s) does not load on this TVM: %s", wrow.key, wrow.name, err)
            skipped += len(rows)
            continue
        workloads += 1
        for row in rows:
            try:
                out.commit_tuning_record(TuningRecord.from_json(json.loads(row.record_json), workload))
                records += 1
            except (RuntimeError, ValueError, TypeError, IndexError, KeyError) as err:
                logger.info("record %d not exportable: %s", row.id, err)
                skipped += 1
    return TransferSummary(workloads, records, skipped)


def import_json(db: TuningDatabase, device_id: int, device_kind: str, folder: Path, *,
                tvm_version: str | None = None) -> TransferSummary:  # fmt: skip
    """Store the records of a MetaSchedule JSON database in ``folder`` as foreign records of a device.

    Every record line is checked against the allow-list (:mod:`tuner.db.validate`) before TVM
    parses it; rejected ones are reported with the reason and not stored. The rest keep their
    provenance: stored as imports (``origin="import"``, used only when no record measured by
    Nightshift exists, after a replay check) with the file, the target they name and
    ``tvm_version`` (the TVM that wrote them, if known). Idempotent: importing the same files
    twice stores each record once.

    Raises:
        UserInputError: the files are missing or unreadable, or their target is of another
            kind than the device (a CUDA record cannot describe a CPU).
    """
    paths = _paths(folder)
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise UserInputError(f"no MetaSchedule database: {', '.join(missing)} not found")
    rejected: list[tuple[int, str]] = []
    try:
        lines = paths[1].read_text().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise UserInputError(f"cannot read {paths[1]}: {err}") from err
    accepted = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            reason = record_rejection(json.dumps(entry[1])) if isinstance(entry, list) and len(entry) == 2 else (
                "not [workload index, record]")
        except ValueError:
            reason = "not JSON"
        if reason is None:
            accepted.append(line)
        else:
            rejected.append((n, reason))
            logger.warning("%s line %d rejected: %s", paths[1], n, reason)
    with tempfile.TemporaryDirectory(prefix="nightshift-import-") as tmp:
        checked = Path(tmp) / RECORD_FILE
        checked.write_text("".join(line + "\n" for line in accepted))
        try:
            src = JSONDatabase(path_workload=str(paths[0]), path_tuning_record=str(checked), allow_missing=False)
            all_records = list(src.get_all_tuning_records())
        except (RuntimeError, ValueError, TypeError, json.JSONDecodeError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise UserInputError(f"cannot read the MetaSchedule database in {folder}: {first}") from err
    keys: set[str] = set()
    batch: list[NewRecord] = []
    skipped = 0
    targets: set[str] = set()
    for rec in all_records:
        kind = rec.target.kind.name if rec.target is not None else None
        want = "llvm" if device_kind == "cpu" else device_kind
        if kind is not None and kind != want:
            raise UserInputError(
                f"records in {folder} target {kind}, not the {device_kind} device given; pass the --device they were "
                "measured on"
            )
        if rec.target is not None:
            targets.add(json.dumps(dict(rec.target.export()), sort_keys=True, default=str))
        mod = rec.workload.mod
        key = workload_key(mod)
        if key not in keys:
            try:
                flops = float(estimate_tir_flops(mod))
            except RuntimeError:
                flops = 0.0
            db.workload_id(key, _name(mod), mod, flops)
            keys.add(key)
        record_json = json.dumps(record_as_json(rec))
        secs = [float(x) for x in (rec.run_secs or [])]
        failed = not secs or min(secs) >= _MS_FAILED_SEC
        if not secs:
            skipped += 1
            continue
        batch.append(NewRecord(
            workload_key=key, point=trace_point(record_json), record_json=record_json,
            run_secs=[] if failed else secs, error_class="metaschedule_failed" if failed else None,
            program_hash=trace_program_hash(rec.trace, mod),
        ))  # fmt: skip
    source = ImportSource(file=str(paths[1].resolve()), device="; ".join(sorted(targets))[:2000] or "unknown",
                          tvm_version=tvm_version)  # fmt: skip
    new = db.add_records(device_id, None, batch, source=source)
    return TransferSummary(len(keys), new, skipped + len(batch) - new, tuple(rejected))


def _paths(folder: Path) -> tuple[Path, Path]:
    return folder / WORKLOAD_FILE, folder / RECORD_FILE


def _name(mod: tvm.IRModule) -> str:
    gv = mod.get_global_vars()[0]
    func = mod[gv]
    if func.attrs and "global_symbol" in func.attrs:
        return str(func.attrs["global_symbol"])
    return gv.name_hint
