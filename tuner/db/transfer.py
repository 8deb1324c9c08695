"""Copying records from one tuning database into another, through the schema: a warm start of a
new database from other jobs' records (``benchmarks/time_to_quality.py``'s ``evo-warm`` arm)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from tuner.db.keys import record_key
from tuner.db.schema import DeviceRow, RecordRow, WorkloadRow
from tuner.db.url import redact

if TYPE_CHECKING:
    from tuner.db.store import TuningDatabase
    from tuner.device import Device

logger = logging.getLogger(__name__)
# Keys per SELECT ... WHERE key IN (...): under SQLite's limit of bound parameters per statement.
_IN_SLICE = 500


@dataclass(frozen=True)
class CopySummary:
    """Rows a copy added to the destination (rows it held already are not counted)."""

    devices: int
    workloads: int
    records: int


def copy_records(src: TuningDatabase, dst: TuningDatabase, *, device: Device | None = None,
                 batch: int = 500) -> CopySummary:  # fmt: skip
    """Copy ``src``'s records, with their workloads and devices, into ``dst``.

    Rows are matched by what identifies them, never by id: a device by its fingerprint, a
    workload by its key, a record by its key (:func:`tuner.db.keys.record_key`) computed with
    ``dst``'s ids. A row ``dst`` holds already is kept as it is, so a second copy adds nothing.
    A record keeps its timings and provenance (host, versions, origin) but not its job: the
    source's jobs are not copied, and a job of ``dst`` counts only its own records. Cost models
    are not copied. Every reader of ``dst`` checks a record against the gate again
    (:meth:`TuningDatabase.record_ok`), as for any row not written by ``add_records``.

    Args:
        device: only the records of ``device``'s family (its kind and architecture: what a
            pretrained cost model reads); every record when None.
        batch: records per write transaction; a copy cut short is finished by running it again.

    Raises:
        DatabaseError: either database failed.
    """
    with src.session(write=False) as s:
        devices = list(s.scalars(select(DeviceRow).order_by(DeviceRow.id)))
        if device is not None:
            devices = [d for d in devices if (d.kind, d.arch) == (device.kind, device.arch)]
        src_ids = [d.id for d in devices]
        used = select(RecordRow.workload_id).where(RecordRow.device_id.in_(src_ids)).distinct()
        workloads = list(s.scalars(select(WorkloadRow).where(WorkloadRow.id.in_(used)).order_by(WorkloadRow.id)))
    new_devices, device_ids = _put(dst, DeviceRow, "fingerprint", devices)
    new_workloads, workload_ids = _put(dst, WorkloadRow, "key", workloads)

    table = RecordRow.__table__
    insert = dst._insert(table).on_conflict_do_nothing(index_elements=["record_key"]).returning(RecordRow.id)
    new_records = 0
    with src.session(write=False) as s:
        stmt = select(RecordRow).where(RecordRow.device_id.in_(src_ids)).order_by(RecordRow.id)
        for part in s.scalars(stmt.execution_options(yield_per=batch)).partitions():
            rows = []
            for r in part:
                wid, did = workload_ids[r.workload_id], device_ids[r.device_id]
                rows.append(_values(r) | {"workload_id": wid, "device_id": did, "job_id": None,
                                          "record_key": record_key(wid, did, r.point, r.timing)})  # fmt: skip
            # One key order for every writer, as add_records keeps (no PostgreSQL deadlocks).
            rows.sort(key=lambda v: v["record_key"])
            new_records += dst._write(lambda w, rows=rows: len(w.execute(insert, rows).all()))
    logger.info("copied %d new records of %d workloads from %s into %s", new_records, len(workloads),
                redact(src.url), redact(dst.url))  # fmt: skip
    return CopySummary(devices=new_devices, workloads=new_workloads, records=new_records)


def _put(dst: TuningDatabase, model: type[DeviceRow] | type[WorkloadRow], unique: str,
         rows: list[Any]) -> tuple[int, dict[int, int]]:  # fmt: skip
    """Insert ``rows`` (of another database) that ``dst`` lacks, matched on the column ``unique``:
    how many were new, and each row's id in ``src`` -> its id in ``dst``."""
    if not rows:
        return 0, {}
    column = getattr(model, unique)
    insert = dst._insert(model.__table__).on_conflict_do_nothing(index_elements=[unique]).returning(model.id)
    keys = [getattr(r, unique) for r in rows]

    def work(s: Session) -> tuple[int, dict[str, int]]:
        new = len(s.execute(insert, [_values(r) for r in rows]).all())
        ids: dict[str, int] = {}
        for i in range(0, len(keys), _IN_SLICE):
            ids.update(s.execute(select(column, model.id).where(column.in_(keys[i : i + _IN_SLICE]))).all())
        return new, ids

    new, ids = dst._write(work)
    return new, {r.id: ids[getattr(r, unique)] for r in rows}


def _values(row: DeviceRow | WorkloadRow | RecordRow) -> dict[str, Any]:
    """A row's columns but its id, to insert it into another database."""
    return {c.name: getattr(row, c.name) for c in row.__table__.columns if c.name != "id"}
