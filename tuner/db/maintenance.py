"""Keeping a database in shape: the jobs and their state as seen now, statistics, and pruning
old, failed or surplus records."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from tuner.db.schema import CostModelRow, DeviceRow, JobRow, RecordRow, WorkloadRow
from tuner.db.url import redact
from tuner.errors import UserInputError

logger = logging.getLogger(__name__)
# Ids per DELETE ... WHERE id IN (...): under SQLite's limit of bound parameters per statement.
_DELETE_SLICE = 500


# A running job whose heartbeat is older than this is dead (it writes one at least every minute).
DEAD_AFTER = timedelta(minutes=5)


@dataclass(frozen=True)
class PruneResult:
    """Records a prune deleted (or would delete) and the records left in the database."""

    deleted: int
    kept: int


def job_state(job: JobRow, now: datetime) -> str:
    """A job's state as seen at ``now``: ``"dead"`` for a running job whose heartbeat stopped."""
    if job.state != "running":
        return job.state
    seen = job.heartbeat_at or job.updated_at
    if seen is None:
        return job.state
    if seen.tzinfo is None:  # stored as naive UTC
        seen = seen.replace(tzinfo=UTC)
    return "dead" if now - seen > DEAD_AFTER else job.state


class Maintenance:
    """The upkeep of :class:`~tuner.db.store.TuningDatabase` (a mixin: it uses the store's sessions and writes)."""

    def stats(self) -> dict[str, Any]:
        """Counts for ``nightshift db stats``: tables, records per device, jobs per state."""
        with self.session(write=False) as s:
            per_device = s.execute(
                select(DeviceRow.fingerprint, DeviceRow.kind, DeviceRow.arch, func.count(RecordRow.id),
                       func.count(RecordRow.mean_sec))
                .join(RecordRow, RecordRow.device_id == DeviceRow.id, isouter=True)
                .group_by(DeviceRow.id, DeviceRow.fingerprint, DeviceRow.kind, DeviceRow.arch)
                .order_by(DeviceRow.id)
            ).all()  # fmt: skip
            jobs: dict[str, int] = {}
            now = datetime.now(UTC)
            for job in s.scalars(select(JobRow)):
                state = job_state(job, now)
                jobs[state] = jobs.get(state, 0) + 1
            versions = dict(s.execute(select(RecordRow.tvm_version, func.count(RecordRow.id))
                                      .group_by(RecordRow.tvm_version)).all())  # fmt: skip
            return {
                "url": redact(self.url),
                "schema": self.schema.revision,
                "workloads": int(s.scalar(select(func.count(WorkloadRow.id))) or 0),
                "records": int(s.scalar(select(func.count(RecordRow.id))) or 0),
                "failed_records": int(s.scalar(select(func.count(RecordRow.id))
                                               .where(RecordRow.error_class.is_not(None))) or 0),
                "cost_models": int(s.scalar(select(func.count(CostModelRow.id))) or 0),
                "jobs": {str(k): int(v) for k, v in jobs.items()},
                "tvm_versions": {str(k): int(v) for k, v in versions.items()},
                "devices": [
                    {"fingerprint": fp, "kind": kind, "arch": arch, "records": int(n), "ok": int(ok)}
                    for fp, kind, arch, n, ok in per_device
                ],
            }

    def jobs(self) -> list[tuple[JobRow, str]]:
        """Every job, newest first, with its state as seen now: a "running" job whose heartbeat
        (or, without one, its last update) is older than :data:`DEAD_AFTER` is ``"dead"``."""
        with self.session(write=False) as s:
            rows = list(s.scalars(select(JobRow).order_by(JobRow.id.desc())))
        now = datetime.now(UTC)
        return [(j, job_state(j, now)) for j in rows]

    def prune(
        self,
        *,
        keep_top: int | None = None,
        keep_failed: bool = False,
        device_id: int | None = None,
        tvm_version: str | None = None,
        older_than: timedelta | None = None,
        dry_run: bool = False,
    ) -> PruneResult:
        """Delete records; return how many were (or, with ``dry_run``, would be) deleted and kept.

        The records that may go are those of ``device_id``, written by ``tvm_version`` and
        older than ``older_than`` (each filter only when given). Of those, with ``keep_top``,
        the ``keep_top`` fastest successful ones of each workload, device, TVM version,
        origin and timing mode stay (a schedule that replays on one TVM version may not on
        another), and failed ones go unless ``keep_failed``; without ``keep_top``, all of
        them go.

        Raises:
            UserInputError: ``keep_top`` is negative, or nothing says what to delete.
        """
        if keep_top is not None and keep_top < 0:
            raise UserInputError(f"--keep-top must be 0 or more, got {keep_top}")
        if keep_top is None and tvm_version is None and older_than is None:
            raise UserInputError("say what to prune: --keep-top N, --tvm-version V and/or --older-than AGE")
        scope = []
        if device_id is not None:
            scope.append(RecordRow.device_id == device_id)
        if tvm_version is not None:
            scope.append(RecordRow.tvm_version == tvm_version)
        if older_than is not None:
            scope.append(RecordRow.created_at < (datetime.now(UTC) - older_than).replace(tzinfo=None))
        ranked_out: list[int] = []
        if keep_top is None:
            doomed = [select(RecordRow.id).where(*scope)]
        else:
            successes = (RecordRow.mean_sec.is_not(None), RecordRow.error_class.is_(None), *scope)
            ranked_out = self._beyond_top(keep_top, successes)
            doomed = []
            if not keep_failed:
                doomed.append(select(RecordRow.id).where(
                    (RecordRow.error_class.is_not(None)) | RecordRow.mean_sec.is_(None), *scope))  # fmt: skip

        def work(s: Session) -> PruneResult:
            total = int(s.scalar(select(func.count(RecordRow.id))) or 0)
            n = sum(int(s.scalar(select(func.count()).select_from(d.subquery())) or 0) for d in doomed)
            n += len(ranked_out)
            if not dry_run:
                for d in doomed:
                    s.execute(delete(RecordRow).where(RecordRow.id.in_(d)))
                # In slices: a bound parameter per id, and SQLite allows some thousands per statement.
                for i in range(0, len(ranked_out), _DELETE_SLICE):
                    s.execute(delete(RecordRow).where(RecordRow.id.in_(ranked_out[i:i + _DELETE_SLICE])))
            return PruneResult(n, total - n)

        return self._write(work)

    def _beyond_top(self, keep_top: int, successes: tuple) -> list[int]:
        """Ids of the successful records that are not among the ``keep_top`` fastest of their
        workload, device, TVM version, origin and timing mode that pass the read gate
        (``refusal``), refused ones included: an impossible time set by SQL ranks first and
        would otherwise push the real bests out."""
        group = (RecordRow.workload_id, RecordRow.device_id, RecordRow.tvm_version, RecordRow.origin,
                 RecordRow.timing)  # fmt: skip
        stmt = (select(RecordRow.id, RecordRow.record_json, RecordRow.mean_sec, *group)
                .where(*successes).order_by(*group, RecordRow.mean_sec, RecordRow.id))  # fmt: skip
        out: list[int] = []
        counts: dict[tuple, int] = {}
        with self.reading("prune"), self.session(write=False) as s:
            for rid, record_json, mean_sec, *key in s.execute(stmt).yield_per(1000):
                k = tuple(key)
                if counts.get(k, 0) < keep_top and self.refusal(rid, record_json, mean_sec, key[0], key[1])[0]:
                    counts[k] = counts.get(k, 0) + 1
                else:
                    out.append(rid)
        return out
