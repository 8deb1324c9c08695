"""The tuning database's store: engine, sessions, devices, workloads, jobs and records.

The lookups and their trust policy are in :mod:`tuner.db.selection`, the upkeep (jobs' state,
statistics, pruning) in :mod:`tuner.db.maintenance`, URL parsing and redaction in
:mod:`tuner.db.url`; :class:`TuningDatabase` brings them together.
"""

from __future__ import annotations

import getpass
import json
import logging
import random
import re
import socket
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy import event, func, or_, select
from sqlalchemy.engine import URL, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from tuner.db import migrate
from tuner.db.keys import device_class, record_key
from tuner.db.maintenance import Maintenance
from tuner.db.schema import (
    CostModelRow,
    DeviceRow,
    JobRow,
    RecordRow,
    WorkloadRow,
    _now,
)
from tuner.db.selection import PREFERRED_TIMINGS, RecordSelection, _best_stmt, tvm_version
from tuner.db.url import _first_line, database_url, redact
from tuner.db.validate import TimingFloor, record_rejection
from tuner.errors import DatabaseError, JobConflict, UserInputError
from tuner.measure.results import ErrorClass, Timing

if TYPE_CHECKING:  # TVM is imported where a record is written, not to read the database (stats, jobs)
    import tvm

    from tuner.device import Device

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Error class of a timing refused on write (below the roofline, MetaSchedule's failure value).
IMPLAUSIBLE = "implausible_timing"
# What a search is told of a stored success the gate refuses on read.
REFUSED = "refused_record"

# Retries of a write that lost a race (PostgreSQL deadlock or serialization failure, SQLite
# busy past its timeout). Writes are idempotent, so repeating one is safe.
_WRITE_ATTEMPTS = 6
_TRANSIENT_SQLSTATES = {"40001", "40P01"}
_SQLITE_BUSY_TIMEOUT_S = 60
# Error classes that say nothing about the candidate (its node was lost mid-measurement, or its
# timing never got the node's lease): such a record does not count as measured, and a new
# measurement of the point replaces it.
RETRIED_ERRORS: tuple[str, ...] = (ErrorClass.LOST.value, ErrorClass.LEASE_TIMEOUT.value)


@dataclass(frozen=True)
class NewRecord:
    """A measurement to store; ``mean_sec`` is None when ``error_class`` is set.

    ``program_hash`` is :func:`tuner.graph.tasks.program_hash` of the scheduled module: give it,
    so that later jobs skip other points that give the same program.
    """

    workload_key: str
    point: str
    record_json: str
    run_secs: Sequence[float]
    error_class: str | None = None
    error_msg: str | None = None
    build_sec: float | None = None
    run_wall_sec: float | None = None
    program_hash: str | None = None
    timing: Timing = "warm"

    @property
    def mean_sec(self) -> float | None:
        if self.error_class is not None or not self.run_secs:
            return None
        return float(sum(self.run_secs) / len(self.run_secs))


@dataclass(frozen=True)
class ImportSource:
    """Where imported records came from: the file, the device (its TVM target) and TVM version."""

    file: str
    device: str
    tvm_version: str | None = None


def writer() -> dict[str, str | None]:
    """Provenance columns of a record written by this process."""
    try:
        user: str | None = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers)
        user = None
    from tuner import __version__

    return {"host": socket.gethostname(), "os_user": user, "nightshift_version": __version__,
            "tvm_version": tvm_version(), "origin": "local"}  # fmt: skip


def create_engine(url: URL) -> Engine:
    """An engine set up for several processes writing at once.

    SQLite: WAL journal, foreign keys, a busy timeout, and write transactions opened with
    ``BEGIN IMMEDIATE`` so that two writers queue on the lock instead of one failing when it
    upgrades a read transaction (SQLITE_BUSY_SNAPSHOT in WAL mode). PostgreSQL: a connect
    timeout, so an unreachable server fails in seconds.
    """
    if url.get_backend_name() == "sqlite":
        engine = sa_create_engine(url, connect_args={"timeout": _SQLITE_BUSY_TIMEOUT_S})
        event.listen(engine, "connect", _sqlite_connect)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    try:
        return sa_create_engine(url, connect_args={"connect_timeout": 10}, pool_pre_ping=True)
    except (ImportError, NoSuchModuleError) as err:
        raise UserInputError(f"database {redact(url)}: driver {url.drivername!r} is not installed ({err}); "
                             "use postgresql+psycopg://... (psycopg 3 comes with Nightshift)") from err


def check_reachable(url: URL) -> None:
    """Connect to ``url`` once and leave: a server that is down, unknown or refuses the login
    is reported before any work, and nothing is created.

    Raises:
        DatabaseError: the database cannot be reached or opened.
    """
    engine = create_engine(url)
    try:
        with engine.connect():
            pass
    except DBAPIError as err:
        raise DatabaseError(f"cannot open tuning database {redact(url)}: {_describe(err)}") from err
    finally:
        engine.dispose()


def _sqlite_connect(dbapi_conn, _record) -> None:
    # Take transaction control from the sqlite3 module, which would otherwise BEGIN lazily
    # (deferred) and commit implicitly before DDL; _sqlite_begin issues BEGIN itself.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    # WAL lets readers and one writer of several local processes proceed together. The mode
    # is stored in the file: set it once. Switching needs an exclusive lock, for which SQLite
    # may answer "locked" at once, without the busy timeout, when processes open a new file
    # together: retry until the timeout.
    if str(cur.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
        deadline = time.monotonic() + _SQLITE_BUSY_TIMEOUT_S
        while True:
            try:
                cur.execute("PRAGMA journal_mode=WAL")
                break
            except sqlite3.OperationalError as err:
                if "locked" not in str(err) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute(f"PRAGMA busy_timeout={_SQLITE_BUSY_TIMEOUT_S * 1000}")
    cur.close()


def _sqlite_begin(conn) -> None:
    write = conn.get_execution_options().get("nightshift_write", True)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


class TuningDatabase(RecordSelection, Maintenance):
    """Nightshift's SQL tuning database (SQLite file or PostgreSQL).

    Thread- and process-safe: every method runs in its own transaction; several processes
    on one or several machines may write at once. Writes are idempotent (a record is keyed
    by workload, device and point, whichever job wrote it) and retried when they lose a
    race, so none is lost or duplicated. Opening a database checks its schema; an empty one
    is created.

    Args:
        url: a SQLAlchemy URL or a SQLite file path.
        create: create the schema in an empty database (else raise).

    Raises:
        UserInputError: the URL is malformed or names an unsupported backend.
        DatabaseError: the database cannot be reached or opened, or its schema is not
            this Nightshift's (the message says what to run).
    """

    def __init__(self, url: str | URL, *, create: bool = True) -> None:
        self.url = database_url(url) if isinstance(url, str) else url
        self.engine: Engine = create_engine(self.url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._read_sessions = sessionmaker(
            self.engine.execution_options(nightshift_write=False), expire_on_commit=False
        )
        self._device_ids: dict[str, int] = {}
        self._workload_ids: dict[str, int] = {}
        self._device_rows: dict[int, tuple[str, str, str, str | None]] = {}  # id -> fingerprint, kind, arch, class
        self._peaks: dict[int, tuple[float, float]] = {}  # device id -> peak FLOP/s, bytes/s (tuner.db.validate)
        self._sizes: dict[int, tuple[float, int]] = {}  # workload id -> FLOPs, output bytes
        # Records refused on read (record id -> reason), logged once each.
        self.rejected: dict[int, str] = {}
        try:
            self.schema = migrate.check(self.engine, self.url, create=create)
        except DBAPIError as err:
            self.engine.dispose()
            raise DatabaseError(f"cannot open tuning database {redact(self.url)}: {_describe(err)}") from err
        except DatabaseError:
            self.engine.dispose()
            raise

    @property
    def backend(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self.url.get_backend_name()

    def close(self) -> None:
        """Release the connections."""
        self.engine.dispose()

    @contextmanager
    def session(self, *, write: bool = True) -> Iterator[Session]:
        """A session that commits on success, rolls back on error, translates DB errors.

        Args:
            write: False for read-only work (SQLite then takes no write lock).

        Raises:
            DatabaseError: the database failed; the message has the URL without password.
        """
        session = (self._sessions if write else self._read_sessions)()
        try:
            yield session
            session.commit()
        except SQLAlchemyError as err:
            session.rollback()
            raise DatabaseError(f"tuning database {redact(self.url)} failed: {_describe(err)}") from err
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    def _write(self, work: Callable[[Session], T]) -> T:
        """Run ``work`` in a write transaction, retrying it when it loses a race."""
        for attempt in range(_WRITE_ATTEMPTS):
            try:
                with self.session() as s:
                    return work(s)
            except DatabaseError as err:
                if attempt == _WRITE_ATTEMPTS - 1 or not _transient(err.__cause__):
                    raise
                delay = 0.05 * 2**attempt * (1 + random.random())
                logger.info("write to %s lost a race (%s); retry in %.2f s", redact(self.url), err, delay)
                time.sleep(delay)
        raise AssertionError("unreachable")

    def _insert(self, table):
        if self.backend == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        else:
            from sqlalchemy.dialects.sqlite import insert
        return insert(table)

    # --- devices, workloads, jobs -----------------------------------------------------------

    def device_id(self, device: Device) -> int:
        """The id of ``device``'s fingerprint, registering it if new."""
        cached = self._device_ids.get(device.fingerprint)
        if cached is not None:
            return cached

        def work(s: Session) -> int:
            target = json.dumps(device.target_config, sort_keys=True)
            description = json.dumps(device.description, sort_keys=True)
            s.execute(
                self._insert(DeviceRow.__table__).values(
                    fingerprint=device.fingerprint, kind=device.kind, arch=device.arch, target=target,
                    description=description, device_class=device_class(device.kind, target, description),
                    created_at=_utcnow(),
                ).on_conflict_do_nothing(index_elements=["fingerprint"])
            )  # fmt: skip
            return int(s.scalar(select(DeviceRow.id).where(DeviceRow.fingerprint == device.fingerprint)))

        self._device_ids[device.fingerprint] = dev_id = self._write(work)
        return dev_id

    def find_device_id(self, device: Device) -> int | None:
        """The id of ``device``'s fingerprint if the database knows it (registers nothing)."""
        with self.session(write=False) as s:
            return s.scalar(select(DeviceRow.id).where(DeviceRow.fingerprint == device.fingerprint))

    def workload_id(self, key: str, name: str, mod: tvm.IRModule, flops: float) -> int:
        """The id of workload ``key``, storing the module if new."""
        cached = self._workload_ids.get(key)
        if cached is not None:
            return cached
        with self.session(write=False) as s:
            found = s.scalar(select(WorkloadRow.id).where(WorkloadRow.key == key))
        if found is None:
            from tvm.s_tir.meta_schedule.database import Workload

            values = {
                "key": key, "name": name, "flops": flops, "workload_json": json.dumps(Workload(mod).as_json()),
                "summary": workload_summary(name, mod), "tvm_version": tvm_version(), "created_at": _utcnow(),
            }  # fmt: skip

            def work(s: Session) -> int:
                s.execute(self._insert(WorkloadRow.__table__).values(**values).on_conflict_do_nothing(
                    index_elements=["key"]))
                return int(s.scalar(select(WorkloadRow.id).where(WorkloadRow.key == key)))

            found = self._write(work)
        self._workload_ids[key] = found
        return found

    def get_workload(self, key: str) -> WorkloadRow | None:
        """The stored workload ``key`` (name, FLOPs, MetaSchedule's JSON), if any."""
        with self.session(write=False) as s:
            return s.scalar(select(WorkloadRow).where(WorkloadRow.key == key))

    def start_job(self, model: str, device_id: int, config: dict, trials_total: int, *,
                  name: str | None = None, time_budget_sec: float | None = None) -> int:  # fmt: skip
        """Record a new running job and return its id.

        Args:
            name: what ``tune --job NAME`` resumes it by.
            time_budget_sec: tuning time the job may spend over all its runs (None: no limit).

        Raises:
            JobConflict: a job called ``name`` is running on the device (``ux_jobs_running``).
        """

        def work(s: Session) -> int:
            now = _utcnow()
            job = JobRow(
                model=model, device_id=device_id, config=json.dumps(config, sort_keys=True),
                trials_total=trials_total, host=socket.gethostname(), tvm_version=tvm_version(),
                name=name, time_budget_sec=time_budget_sec, elapsed_sec=0.0, heartbeat_at=now,
            )  # fmt: skip
            s.add(job)
            s.flush()
            return job.id

        # Not retried: a retry after a lost commit acknowledgement would start a second job.
        try:
            with self.session() as s:
                return work(s)
        except DatabaseError as err:
            if name is not None and _unique_violation(err.__cause__):
                raise JobConflict(f"a job {name!r} is already running on this device") from err
            raise

    def claim_job(self, job_id: int, *, seen_state: str, seen_heartbeat: datetime | None, config: dict,
                  trials_done: int, trials_total: int, time_budget_sec: float | None) -> bool:  # fmt: skip
        """Mark job ``job_id`` running on this host, if it is still as the caller saw it.

        The caller read the row, judged that nothing runs it (stopped, failed, or dead) and
        resumes it; another process may have judged the same. The row is read again under a
        lock (``FOR UPDATE`` on PostgreSQL, ``BEGIN IMMEDIATE`` on SQLite) and taken only if its
        state and heartbeat are unchanged, so only one of them resumes it.

        Returns:
            True if this process now runs the job; False if another one took it first.
        """

        def work(s: Session) -> bool:
            job = s.get(JobRow, job_id, with_for_update=True, populate_existing=True)
            if job is None:
                raise DatabaseError(f"job {job_id} is not in the database")
            if job.state != seen_state or job.heartbeat_at != seen_heartbeat:
                return False
            job.state, job.host, job.heartbeat_at = "running", socket.gethostname(), _utcnow()
            job.trials_done, job.trials_total, job.time_budget_sec = trials_done, trials_total, time_budget_sec
            job.config = json.dumps(config, sort_keys=True)
            return True

        return self._write(work)

    def update_job(self, job_id: int, *, trials_done: int | None = None, state: str | None = None,
                   elapsed_sec: float | None = None, time_budget_sec: float | None = None,
                   trials_total: int | None = None, heartbeat: bool = False,
                   config: dict | None = None) -> None:  # fmt: skip
        """Update a job's progress or state.

        Args:
            state: ``running``, ``done``, ``stopped`` (interrupted, resumable) or ``failed``.
            elapsed_sec: tuning time spent over all the job's runs.
            heartbeat: stamp ``heartbeat_at`` (a running job does at least every minute).
        """

        def work(s: Session) -> None:
            job = s.get(JobRow, job_id)
            if job is None:
                raise DatabaseError(f"job {job_id} is not in the database")
            if trials_done is not None:
                job.trials_done = trials_done
            if state is not None:
                job.state = state
            if elapsed_sec is not None:
                job.elapsed_sec = elapsed_sec
            if time_budget_sec is not None:
                job.time_budget_sec = time_budget_sec
            if trials_total is not None:
                job.trials_total = trials_total
            if config is not None:
                job.config = json.dumps(config, sort_keys=True)
            if heartbeat:
                job.heartbeat_at = _utcnow()

        self._write(work)

    def find_job(self, name: str, device_id: int | None = None, *, state: str | None = None) -> JobRow | None:
        """The newest job called ``name`` (on ``device_id``, in ``state`` if given), or None."""
        stmt = select(JobRow).where(JobRow.name == name)
        if device_id is not None:
            stmt = stmt.where(JobRow.device_id == device_id)
        if state is not None:
            stmt = stmt.where(JobRow.state == state)
        with self.session(write=False) as s:
            return s.scalar(stmt.order_by(JobRow.id.desc()).limit(1))

    def job_trials(self, job_id: int) -> int:
        """Records the job wrote (its measured trials, failed ones included): what a resumed
        job counts as done, even when it was killed before updating ``trials_done``."""
        with self.session(write=False) as s:
            return int(s.scalar(select(func.count(RecordRow.id)).where(RecordRow.job_id == job_id)) or 0)

    # --- records ----------------------------------------------------------------------------

    def add_records(self, device_id: int, job_id: int | None, records: Sequence[NewRecord], *,
                    source: ImportSource | None = None) -> int:  # fmt: skip
        """Store measurements of one device in one transaction; return how many were new.

        Idempotent: a point already stored for the workload on this device in the record's
        timing mode (by any job) is skipped, so a retried batch never duplicates and a
        candidate is recorded once per mode. Only a stored record whose error class is in
        :data:`RETRIED_ERRORS` (the candidate's node was lost) is replaced by the new
        measurement; it counts as new.

        Every record keeps who wrote it (host, OS user, Nightshift and TVM versions, job).
        With ``source`` the records are an import: stored as foreign, with the file, device
        and TVM version they came from. A timing that cannot be true (MetaSchedule's failure
        value, or faster than the device's floor for the workload: its FLOPs at peak, its
        output's bytes at the device's bandwidth) is stored as a failed record of class
        :data:`IMPLAUSIBLE`, never as a measurement. A record whose trace fails the allow-list
        (:func:`tuner.db.validate.record_rejection`) is stored as a failure of class
        ``refused_trace`` without its trace, so that nothing replays it; every reader checks
        again (:meth:`record_ok`), for rows written around this method.

        Raises:
            DatabaseError: a record names a workload not stored yet, or the write failed.
        """
        if not records:
            return 0
        keys = {r.workload_key for r in records}
        ids = self._workload_ids_of(keys)
        missing = keys - ids.keys()
        if missing:
            raise DatabaseError(f"records for unknown workloads {sorted(missing)}; store the workload first")
        sizes = self._workload_sizes(set(ids.values()))
        peak_flops, bandwidth = self._peak(device_id)
        now = _utcnow()
        refusals: list[str] = []
        who = writer()
        if source is not None:
            who |= {"origin": "import", "source_file": source.file, "source_device": source.device,
                    "source_tvm_version": source.tvm_version, "tvm_version": source.tvm_version or "unknown"}
        rows: dict[str, dict[str, Any]] = {}
        for r in records:
            wid = ids[r.workload_key]
            rkey = record_key(wid, device_id, r.point, r.timing)
            if rkey in rows and rows[rkey]["error_class"] not in RETRIED_ERRORS:
                continue  # the first measurement of a point in the batch stands, as in the table
            mean, error, msg, record_json = r.mean_sec, r.error_class, r.error_msg, r.record_json
            trace_refused = record_rejection(record_json)
            if trace_refused is not None:
                # Kept as a failure, so the point counts as measured, but without the payload.
                refusals.append(f"the trace of a {r.workload_key[:12]} record: {trace_refused}")
                mean, error, msg = None, ErrorClass.REFUSED_TRACE.value, f"trace refused on write: {trace_refused}"
                record_json = json.dumps([[[], []], None, None, None])
            flops, out = sizes.get(wid, (0.0, 0))
            refused = TimingFloor(flops, peak_flops, out, bandwidth).rejection(mean) if mean is not None else None
            if refused is not None:
                refusals.append(f"the timing of a {r.workload_key[:12]} record (point {r.point[:60]}): {refused}")
                mean, error, msg = None, IMPLAUSIBLE, refused
            rows[rkey] = {
                "record_key": rkey, "workload_id": wid, "device_id": device_id, "job_id": job_id,
                "point": r.point, "program_hash": r.program_hash, "record_json": record_json,
                "run_secs": json.dumps(list(r.run_secs)), "mean_sec": mean, "error_class": error,
                "error_msg": msg, "build_sec": r.build_sec, "run_wall_sec": r.run_wall_sec,
                "timing": r.timing, "created_at": now, **who,
            }  # fmt: skip
        if refusals:
            logger.warning("refused %d of %d records on write (%s%s)", len(refusals), len(records), refusals[0],
                           "; ..." if len(refusals) > 1 else "")  # fmt: skip
        # One key order for every writer: PostgreSQL then locks index entries in the same
        # order in every transaction, which rules out deadlocks between batches.
        ordered = [rows[k] for k in sorted(rows)]
        table = RecordRow.__table__
        insert = self._insert(table)
        replaced = ("id", "record_key", "workload_id", "device_id", "point", "timing")
        stmt = insert.on_conflict_do_update(
            index_elements=["record_key"],
            set_={c.name: insert.excluded[c.name] for c in table.columns if c.name not in replaced},
            # Not IN: an expanding parameter cannot go through executemany.
            where=or_(*(table.c.error_class == e for e in RETRIED_ERRORS)),
        )

        def work(s: Session) -> int:
            # RETURNING yields only the rows inserted or replaced (skipped conflicts return nothing).
            return len(s.execute(stmt.returning(RecordRow.id), ordered).all())

        return self._write(work)

    def retime(self, record_id: int, run_secs: Sequence[float]) -> None:
        """Replace a successful record's timing with a new measurement of the same program, in
        the same mode: its ``run_secs`` (the row's and its TVM record's) and ``mean_sec``.

        For ``tune``'s re-ranking of each task's best few records (``tuner.rerank``): timed
        in interleaved rounds, they are ranked by times taken at the same moments.
        """
        secs = [float(x) for x in run_secs]
        if not secs:
            raise ValueError("a new timing needs at least one run")

        def work(s: Session) -> None:
            row = s.get(RecordRow, record_id)
            if row is None or row.error_class is not None or row.mean_sec is None:
                raise DatabaseError(f"record {record_id} is not a successful record")
            record = json.loads(row.record_json)
            record[1] = secs  # TuningRecord.as_json(): [trace, run_secs, target, args_info]
            row.record_json = json.dumps(record)
            row.run_secs = json.dumps(secs)
            row.mean_sec = sum(secs) / len(secs)

        self._write(work)

    def measured_hashes(self, workload_key: str, device_id: int, timing: Timing = "warm") -> set[str]:
        """Program hashes of every candidate of a workload already measured on a device in
        one timing mode (a program timed warm is not yet measured cold).

        By any job or teammate, failed candidates included (a program that failed once
        fails again); records in :data:`RETRIED_ERRORS` and records older than schema 3
        (no hash) are not in it. One SELECT over the ``ix_records_program`` index.
        """
        stmt = select(RecordRow.program_hash).distinct().where(RecordRow.program_hash.is_not(None))
        return set(self._scalars(self._measured(stmt, workload_key, device_id, timing)))

    def measured_points(self, workload_key: str, device_id: int, timing: Timing = "warm") -> set[str]:
        """Point JSONs of every candidate of a workload already measured on a device.

        The same records as :meth:`measured_hashes`, old ones included: a point is compared
        by its JSON (``Point.to_json()``), a program by its hash. One SELECT.
        """
        return set(self._scalars(self._measured(select(RecordRow.point), workload_key, device_id, timing)))

    def _measured(self, stmt, workload_key: str, device_id: int, timing: Timing):
        wid = self._workload_ids.get(workload_key)
        if wid is not None:
            stmt = stmt.where(RecordRow.workload_id == wid)
        else:  # join rather than a second query for the workload's id
            stmt = stmt.join(WorkloadRow, WorkloadRow.id == RecordRow.workload_id).where(
                WorkloadRow.key == workload_key)  # fmt: skip
        # NULL error classes must be kept explicitly: NOT IN is unknown for NULL.
        ok = RecordRow.error_class.is_(None) | RecordRow.error_class.not_in(RETRIED_ERRORS)
        return stmt.where(RecordRow.device_id == device_id, RecordRow.timing == timing, ok)

    def _scalars(self, stmt) -> list[Any]:
        with self.session(write=False) as s:
            return list(s.scalars(stmt))

    def _workload_ids_of(self, keys: set[str]) -> dict[str, int]:
        ids = {k: self._workload_ids[k] for k in keys if k in self._workload_ids}
        todo = keys - ids.keys()
        if todo:
            with self.session(write=False) as s:
                for key, wid in s.execute(select(WorkloadRow.key, WorkloadRow.id).where(WorkloadRow.key.in_(todo))):
                    ids[key] = self._workload_ids[key] = wid
        return ids

    def count_records(self, workload_key: str | None = None, device_id: int | None = None) -> int:
        """Number of records, optionally of one workload and/or device."""
        with self.session(write=False) as s:
            stmt = select(func.count(RecordRow.id))
            if workload_key is not None:
                stmt = stmt.join(WorkloadRow).where(WorkloadRow.key == workload_key)
            if device_id is not None:
                stmt = stmt.where(RecordRow.device_id == device_id)
            return int(s.scalar(stmt) or 0)

    # --- cost models ------------------------------------------------------------------------

    def save_cost_model(self, device_id: int, kind: str, blob: bytes, num_samples: int) -> None:
        """Store a trained cost model (XGBoost UBJSON bytes; never a pickle)."""
        with self.session() as s:
            s.add(CostModelRow(device_id=device_id, kind=kind, format="ubj", num_samples=num_samples, blob=blob))

    def load_cost_model(self, device_id: int, kind: str, *, same_arch: bool = False) -> bytes | None:
        """The newest cost model of ``kind`` trained on ``device_id``, or None.

        With ``same_arch``, the newest of any device of the same kind and architecture (the
        device family: a CPU's LLVM mcpu, a GPU's sm version), this device's own included.
        """
        with self.session(write=False) as s:
            devices = self._family_stmt(device_id) if same_arch else [device_id]
            return s.scalar(
                select(CostModelRow.blob).where(CostModelRow.device_id.in_(devices), CostModelRow.kind == kind)
                .order_by(CostModelRow.id.desc()).limit(1)
            )  # fmt: skip

    def training_records(self, device_id: int, *, same_arch: bool = True,
                         limit: int | None = None) -> list[tuple[str, str, RecordRow]]:  # fmt: skip
        """``(workload key, device fingerprint, record)`` of a device's records, newest first,
        of both timing modes (``record.timing`` tells them apart).

        With ``same_arch``, records of every device of the same kind and architecture too.
        Failed records are included (a cost model learns from them); ``limit`` caps the count
        read. Records the gate refuses (:meth:`record_ok`) are left out: each is replayed.
        """
        with self.reading("training records"), self.session(write=False) as s:
            devices = self._family_stmt(device_id) if same_arch else [device_id]
            stmt = (
                select(WorkloadRow.key, DeviceRow.fingerprint, RecordRow)
                .join(WorkloadRow, RecordRow.workload_id == WorkloadRow.id)
                .join(DeviceRow, RecordRow.device_id == DeviceRow.id)
                .where(RecordRow.device_id.in_(devices))
                .order_by(RecordRow.id.desc())
            )  # fmt: skip
            if limit is not None:
                stmt = stmt.limit(limit)
            return [(k, fp, row) for k, fp, row in s.execute(stmt).all() if self.record_ok(row)]

    @staticmethod
    def _family_stmt(device_id: int):
        """Ids of the devices with ``device_id``'s kind and architecture, as a subquery."""
        me = select(DeviceRow.kind, DeviceRow.arch).where(DeviceRow.id == device_id).subquery()
        return select(DeviceRow.id).join(me, (DeviceRow.kind == me.c.kind) & (DeviceRow.arch == me.c.arch))

    # --- operations -------------------------------------------------------------------------

    def best_per_workload(self, device_id: int) -> list[tuple[WorkloadRow, RecordRow, int]]:
        """For every workload measured on the device: its best record and its record count.

        The best record measured by Nightshift; only where there is none, the best imported
        (foreign) one (its ``origin`` says so). Cold-timed records first, as :meth:`lookup`
        ranks them; records the gate refuses (:meth:`record_ok`) are passed over.
        """
        with self.reading("best per workload"), self.session(write=False) as s:
            counts = dict(s.execute(select(RecordRow.workload_id, func.count(RecordRow.id))
                                    .where(RecordRow.device_id == device_id)
                                    .group_by(RecordRow.workload_id)).all())  # fmt: skip
            out = []
            for wid, n in counts.items():
                row = next((r for origin in ("local", "import") for timing in PREFERRED_TIMINGS
                            for r in self._gated(s, _best_stmt(wid, [device_id], origin, timing), 1)), None)
                if row is not None:
                    out.append((s.get(WorkloadRow, wid), row, int(n)))
            out.sort(key=lambda t: t[0].name)
            return out

    def other_forms(self, untuned: Mapping[str, str]) -> dict[str, str]:
        """Of ``untuned`` (workload key -> summary of a function without records), those
        whose operator has successful records in another form: a workload of the same name
        with the same first input and output, but another key (its code changed since it was
        tuned, e.g. a dense weight packed since 2026-11-25). Key -> the stored
        summary."""
        by_name: dict[str, list[tuple[str, str]]] = {}
        for key, summary in untuned.items():
            by_name.setdefault(summary.split("(", 1)[0], []).append((key, summary))
        if not by_name:
            return {}
        measured = select(RecordRow.id).where(RecordRow.workload_id == WorkloadRow.id, RecordRow.error_class.is_(None))
        with self.session(write=False) as s:
            stored = s.execute(select(WorkloadRow.key, WorkloadRow.summary)
                               .where(WorkloadRow.name.in_(list(by_name)), measured.exists())).all()  # fmt: skip
        found: dict[str, str] = {}
        for stored_key, stored_summary in stored:
            ends = _outer_args(stored_summary or "")
            for key, summary in by_name.get((stored_summary or "").split("(", 1)[0], []):
                if key != stored_key and ends is not None and ends == _outer_args(summary):
                    found.setdefault(key, stored_summary)
        return found

    def successful_records(self, device_id: int) -> list[tuple[str, RecordRow]]:
        """``(workload JSON, record)`` of every successful record Nightshift measured on the
        device with this TVM version that passes the gate (:meth:`record_ok`)."""
        stmt = (select(WorkloadRow.workload_json, RecordRow).join(WorkloadRow, WorkloadRow.id == RecordRow.workload_id)
                .where(RecordRow.device_id == device_id, RecordRow.origin == "local",
                       RecordRow.tvm_version == tvm_version(), RecordRow.error_class.is_(None),
                       RecordRow.mean_sec.is_not(None)).order_by(RecordRow.id))  # fmt: skip
        with self.reading("successful records"), self.session(write=False) as s:
            return [(w, r) for w, r in s.execute(stmt).all() if self.record_ok(r)]

def workload_summary(name: str, mod: tvm.IRModule) -> str:
    """``name(float32[1, 64, 56, 56], ...)``: a readable one-liner of a PrimFunc workload;
    a conv's ends with its data layout, `` layout=NCHW8c`` (what :func:`tuner.graph.layout.
    stored_layouts` and ``summary LIKE '% layout=NCHW8c'`` read)."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    from tuner.graph.layout.plan import task_layout

    try:
        layout = task_layout(mod)
    except (RuntimeError, ValueError, TypeError):
        layout = ""
    suffix = f" layout={layout}" if layout else ""

    try:
        func_ = mod["main"] if any(g.name_hint == "main" for g in mod.get_global_vars()) else None
        args = ArgInfo.from_prim_func(func_ if func_ is not None else mod[mod.get_global_vars()[0]])
        shown = ", ".join(f"{a.dtype}[{', '.join(str(int(d)) for d in a.shape)}]" for a in args)
    except (RuntimeError, TypeError, ValueError, AttributeError):
        # Dynamic shapes or a non-tensor argument: the name alone still says what it is.
        return name + suffix
    return f"{name}({shown}){suffix}"


_SUMMARY_ARG = re.compile(r"\w+\[[\d, ]*\]")


def _outer_args(summary: str) -> tuple[str, str] | None:
    """The first and last argument (``float32[1, 128, 768]``) of a workload summary."""
    args = _SUMMARY_ARG.findall(summary)
    return (args[0], args[-1]) if len(args) >= 2 else None


def _utcnow() -> datetime:
    return _now()


def _transient(err: BaseException | None) -> bool:
    orig = getattr(err, "orig", None)
    if getattr(orig, "sqlstate", None) in _TRANSIENT_SQLSTATES:
        return True
    text = str(orig or "").lower()
    return "database is locked" in text or "database is busy" in text


def _unique_violation(err: BaseException | None) -> bool:
    """Whether ``err`` is a unique constraint's refusal (SQLite's or PostgreSQL's 23505)."""
    if not isinstance(err, IntegrityError):
        return False
    code = getattr(err.orig, "sqlstate", None)
    return code == "23505" or "UNIQUE constraint failed" in str(err.orig)


def _describe(err: BaseException) -> str:
    """One line about a database error, with a hint for the usual causes."""
    orig = getattr(err, "orig", None) or err
    line = _first_line(orig)
    low = line.lower()
    if "password authentication failed" in low or "no password supplied" in low:
        return f"{line}; check the user and password in --db or $NIGHTSHIFT_DB"
    if "connection refused" in low or "could not translate host" in low or "timeout expired" in low:
        return f"{line}; is the PostgreSQL server running and reachable?"
    if "file is not a database" in low or "malformed" in low:
        return f"{line}; the file is not a healthy SQLite database: pass another --db or restore a backup"
    if "unable to open database file" in low:
        return f"{line}; --db must be a SQLite file in a writable folder (not a folder itself)"
    if "does not exist" in low and "database" in low:
        return f"{line}; create it (createdb) or fix the database name in --db"
    return line


def measured_results(
    db: TuningDatabase, workload_key: str, device_id: int, timing: Timing = "warm"
) -> list[tuple[str, float | None, str | None]]:
    """The records of :meth:`TuningDatabase.measured_points` with their outcome, as
    ``(point JSON, mean_sec, error_class)``, oldest first: what a search strategy is told
    when a job starts or resumes (read-only). A success the gate refuses
    (:meth:`TuningDatabase.record_ok`: a time below the floor, a trace off the allow-list) is
    told as a failure of class :data:`REFUSED`: its point is not measured again, and its time
    steers neither the search nor the scheduler."""
    stmt = select(RecordRow.point, RecordRow.mean_sec, RecordRow.error_class, RecordRow.id, RecordRow.record_json,
                  RecordRow.workload_id, RecordRow.device_id).order_by(RecordRow.id)  # fmt: skip
    out: list[tuple[str, float | None, str | None]] = []
    with db.reading("stored records of a search"), db.session(write=False) as s:
        for p, m, e, rid, text, wid, dev in s.execute(db._measured(stmt, workload_key, device_id, timing)):
            if e is None and m is not None and not db.refusal(rid, text, m, wid, dev)[0]:
                m, e = None, REFUSED
            out.append((p, m, e))
    return out
