"""Which records a lookup may use, and in what order: the selection policy over devices,
architectures, timing modes and TVM versions, with the trust checks a record must pass (its
trace on the allow-list, a timing a device can reach).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from tuner.db.schema import DeviceRow, RecordRow, WorkloadRow
from tuner.db.validate import (
    TimingFloor,
    device_peak_bandwidth,
    device_peak_flops,
    output_bytes,
    replay_rejection,
    stored_target_has_amx,
)
from tuner.measure.results import Timing

logger = logging.getLogger(__name__)


FallbackPolicy = Literal["device", "same-arch"]


# Where a looked-up record came from: this device's class, another device of its
# architecture, or an imported (foreign) MetaSchedule database.
Source = Literal["device", "same-arch", "foreign"]


# The order in which lookups try the modes: cold timings rank candidates as they run inside a
# whole model, where the previous operator has evicted this one's weights.
PREFERRED_TIMINGS: tuple[Timing, ...] = ("cold", "warm")


@cache
def tvm_version() -> str:
    """This process's TVM version, imported on first use: reading the database (``db stats``,
    ``jobs``) needs no TVM, whose import takes seconds (it loads torch)."""
    import tvm

    return str(tvm.__version__)


@dataclass(frozen=True)
class BestRecord:
    """A record found by :meth:`TuningDatabase.lookup`, with where it came from.

    Attributes:
        row: the record.
        source: ``"device"`` (measured on the device asked for or an identical one: same
            device class), ``"same-arch"`` (another device of the same kind and architecture;
            its speed may differ) or ``"foreign"`` (imported from a MetaSchedule database: not
            measured by Nightshift).
        device_fingerprint: fingerprint of the device it is stored under.
        same_tvm: whether it was written by this TVM version.
    """

    row: RecordRow
    source: Source
    device_fingerprint: str
    same_tvm: bool


def _best_stmt(workload_id: int, device_ids: list[int], origin: str | None, timing: Timing):
    stmt = (
        select(RecordRow)
        .where(RecordRow.workload_id == workload_id, RecordRow.device_id.in_(device_ids),
               RecordRow.timing == timing, RecordRow.error_class.is_(None), RecordRow.mean_sec.is_not(None))
        .order_by(RecordRow.mean_sec, RecordRow.id)
    )  # fmt: skip
    return stmt if origin is None else stmt.where(RecordRow.origin == origin)


class RecordSelection:
    """The lookups of :class:`~tuner.db.store.TuningDatabase` (a mixin: it uses the store's sessions and caches).

    Every record any reader returns has passed :meth:`record_ok`, the one gate: its trace on
    the allow-list, its timing above the device's floor for the workload. A row written by
    SQL, around ``add_records``'s own checks, is refused there; each reader says once how many
    it refused (:meth:`reading`).
    """

    def _workload_sizes(self, wids: set[int]) -> dict[int, tuple[float, int]]:
        """FLOPs and output bytes of workloads (cached: a workload's row never changes)."""
        todo = wids - self._sizes.keys()
        if todo:
            with self.session(write=False) as s:
                for w, f, summary in s.execute(select(WorkloadRow.id, WorkloadRow.flops, WorkloadRow.summary)
                                               .where(WorkloadRow.id.in_(todo))):  # fmt: skip
                    self._sizes[w] = (float(f or 0.0), output_bytes(summary))
        return {w: self._sizes[w] for w in wids if w in self._sizes}

    def _peak(self, device_id: int) -> tuple[float, float]:
        """Peak FLOP/s and bytes/s of a device (generous bounds, cached)."""
        peak = self._peaks.get(device_id)
        if peak is None:
            with self.session(write=False) as s:
                row = s.get(DeviceRow, device_id)
            try:
                cores = int(json.loads(row.target).get("num-cores") or 0) if row is not None else 0
            except (ValueError, AttributeError, TypeError):
                cores = 0
            # Without a core count, the most any host has: refuse only the absurd.
            amx = row is not None and row.kind == "cpu" and stored_target_has_amx(row.target)
            kind = row.kind if row else "cpu"
            peak = self._peaks[device_id] = (device_peak_flops(kind, cores or 1024, amx),
                                             device_peak_bandwidth(kind, cores or 1024))  # fmt: skip
        return peak

    def timing_floor(self, workload_id: int, device_id: int) -> TimingFloor:
        """What bounds a workload's time on a device from below (:class:`TimingFloor`)."""
        flops, out = self._workload_sizes({workload_id}).get(workload_id, (0.0, 0))
        peak_flops, bandwidth = self._peak(device_id)
        return TimingFloor(flops, peak_flops, out, bandwidth)

    def best(self, workload_key: str, device_id: int, k: int = 1, *, origin: str | None = "local",
             timing: Timing | None = None, job_id: int | None = None) -> list[RecordRow]:  # fmt: skip
        """The ``k`` fastest successful records of a workload on one device (any TVM version),
        measured by Nightshift (``origin="local"``), imported (``"import"``) or either (None),
        by job ``job_id`` if given, all of one timing mode: ``timing``, or by default the first
        of :data:`PREFERRED_TIMINGS` that has any. Records the gate refuses (:meth:`record_ok`)
        are passed over."""
        with self.reading("best"), self.session(write=False) as s:
            wid = s.scalar(select(WorkloadRow.id).where(WorkloadRow.key == workload_key))
            if wid is None:
                return []
            for mode in (timing,) if timing is not None else PREFERRED_TIMINGS:
                stmt = _best_stmt(wid, [device_id], origin, mode)
                if job_id is not None:
                    stmt = stmt.where(RecordRow.job_id == job_id)
                rows = list(self._gated(s, stmt, k))
                if rows:
                    return rows
            return []

    def _gated(self, s: Session, stmt, k: int,
               accept: Callable[[RecordRow], bool] | None = None) -> Iterator[RecordRow]:  # fmt: skip
        """Up to ``k`` rows of an ordered ``stmt`` that pass the gate (and ``accept``), in
        order: fetched a page at a time, the next page only if rows were refused."""
        page, offset, given = min(max(k, 1), 1024), 0, 0
        while given < k:
            rows = list(s.scalars(stmt.offset(offset).limit(page)))
            for row in rows:
                if self.record_ok(row) and (accept is None or accept(row)):
                    yield row
                    given += 1
                    if given == k:
                        return
            if len(rows) < page:
                return
            offset += page
            page = min(page * 4, 1024)

    def lookup(
        self,
        workload_key: str,
        device_id: int,
        k: int = 1,
        *,
        policy: FallbackPolicy = "same-arch",
        replays: Callable[[RecordRow], bool] | None = None,
        fits: Callable[[RecordRow], bool] | None = None,
    ) -> list[BestRecord]:
        """The ``k`` best usable records of a workload for a device, with the fallback policy.

        In order, the first rule that finds any record wins:

        1. records measured by Nightshift on this device or an identical one (same device
           class: kind, TVM target and CPU/GPU model), fastest first, whichever machine;
        2. with ``policy="same-arch"``, records of other devices of the same kind and
           architecture (``source="same-arch"``);
        3. imported (foreign) records of those devices (``source="foreign"``), only when
           ``replays(row)`` says they replay cleanly here, whatever TVM version they claim.

        Within a rule, cold-timed records are ranked first, alone; warm ones only where no
        cold one is usable (:data:`PREFERRED_TIMINGS`). The ``k`` records are of one mode.

        A different architecture is never used. A record the gate refuses (:meth:`record_ok`:
        its trace fails the allow-list, or its time is below the device's floor) is never
        returned; the reason is kept in :attr:`rejected`.
        Records written by another TVM version are used only when ``replays(row)`` says they
        replay cleanly on this one (without ``replays`` they are skipped). ``fits(row)``, when
        given, is asked about every record: one it declines is passed over for the next.
        """
        wid = self._workload_ids_of({workload_key}).get(workload_key)
        if wid is None:
            return []
        with self.reading("lookup"), self.session(write=False) as s:
            me = self._device_row(s, device_id)
            if me is None:
                return []
            # Not cached: an identical or same-architecture device may register at any time.
            family = dict(s.execute(select(DeviceRow.id, DeviceRow.fingerprint).where(
                DeviceRow.kind == me[1], DeviceRow.arch == me[2])).all())  # fmt: skip
            classes = dict(s.execute(select(DeviceRow.id, DeviceRow.device_class).where(
                DeviceRow.id.in_(list(family)))).all())  # fmt: skip
            mine = {d: fp for d, fp in family.items() if d == device_id or (me[3] and classes[d] == me[3])}
            others = {d: fp for d, fp in family.items() if d not in mine}
            found = self._usable(s, wid, mine, k, "device", replays, fits)
            if found:
                return found
            if policy == "same-arch" and others:
                found = self._usable(s, wid, others, k, "same-arch", replays, fits)
                if found:
                    return found
            if replays is None:
                return []
            return self._usable(s, wid, mine if policy == "device" else family, k, "foreign", replays, fits)

    def _device_row(self, s: Session, device_id: int) -> tuple[str, str, str, str | None] | None:
        me = self._device_rows.get(device_id)
        if me is None:
            row = s.get(DeviceRow, device_id)
            if row is None:
                return None
            me = self._device_rows[device_id] = (row.fingerprint, row.kind, row.arch, row.device_class)
        return me

    def _usable(
        self,
        s: Session,
        wid: int,
        devices: dict[int, str],
        k: int,
        source: Source,
        replays: Callable[[RecordRow], bool] | None,
        fits: Callable[[RecordRow], bool] | None = None,
    ) -> list[BestRecord]:
        origin = "import" if source == "foreign" else "local"

        def accept(row: RecordRow) -> bool:
            if fits is not None and not fits(row):
                return False
            # A foreign record's version is only what its importer said: always replay it.
            same = row.tvm_version == tvm_version() and source != "foreign"
            return same or (replays is not None and replays(row))

        for timing in PREFERRED_TIMINGS:  # the k records are of one mode: the first that has any
            out = [BestRecord(row, source, devices[row.device_id], row.tvm_version == tvm_version())
                   for row in self._gated(s, _best_stmt(wid, list(devices), origin, timing), k, accept)]  # fmt: skip
            if out:
                return out
        return []

    def record_ok(self, row: RecordRow) -> bool:
        """The gate every reader puts a stored record through before using it: its trace
        passes the allow-list and, if it is a success, its time is above the device's floor
        for the workload (:func:`tuner.db.validate.replay_rejection`). A refusal is kept in
        :attr:`rejected` and counted for the reader's one warning."""
        return self.refusal(row.id, row.record_json, row.mean_sec if row.error_class is None else None,
                            row.workload_id, row.device_id)[0]  # fmt: skip

    def refusal(self, record_id: int, record_json: str, mean_sec: float | None, workload_id: int,
                device_id: int) -> tuple[bool, str | None]:  # fmt: skip
        """:meth:`record_ok` of a record's columns: ``(passes, why not)``."""
        reason = self.rejected.get(record_id)
        if reason is None:
            # A trace that passed is not parsed again while its text is unchanged (a job's
            # start reads every record of its tasks); the text is compared, by a hash salted
            # per process, because a row may be rewritten by SQL between two reads.
            passed: set[tuple[int, int]] = self.__dict__.setdefault("_passed_traces", set())
            seen = (record_id, hash(record_json))
            try:
                floor = self.timing_floor(workload_id, device_id) if mean_sec is not None else None
                if seen in passed:
                    reason = floor.rejection(mean_sec) if floor is not None else None
                else:
                    reason = replay_rejection(record_json, mean_sec, floor)
            except (TypeError, ValueError, RecursionError) as err:  # a column of the wrong type, set by SQL
                reason = f"unreadable record ({type(err).__name__})"
            if reason is None:
                passed.add(seen)
                return True, None
            self.rejected[record_id] = reason
            tally = getattr(self._tls(), "tally", None)
            if tally is not None:
                tally.append((record_id, reason))
            else:
                logger.warning("record %d refused: %s", record_id, reason)
        return False, reason

    def _tls(self) -> threading.local:
        # Per database and thread: readers in other threads keep their own counts.
        return self.__dict__.setdefault("_reader_tls", threading.local())

    # The name of the first version, which checked the trace only.
    trace_ok = record_ok

    @contextmanager
    def reading(self, reader: str) -> Iterator[None]:
        """Collect the records the gate refuses for the first time while ``reader`` runs, and
        say so once at the end (a nested reader's count goes to the outermost)."""
        local = self._tls()
        if getattr(local, "tally", None) is not None:
            yield
            return
        tally: list[tuple[int, str]] = []
        local.tally = tally
        try:
            yield
        finally:
            local.tally = None
            if tally:
                first_id, first = tally[0]
                logger.warning("%s: %d stored record(s) refused and passed over (record %d: %s%s)", reader,
                               len(tally), first_id, first, "; the rest in TuningDatabase.rejected" if len(tally) > 1
                               else "")  # fmt: skip
