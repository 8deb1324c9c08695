"""Which records a lookup may use, and in what order: the selection policy over devices,
architectures, timing modes and TVM versions, with the trust checks a record must pass (its
trace on the allow-list, a timing a device can reach).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import tvm
from sqlalchemy import select
from sqlalchemy.orm import Session

from tuner.db.schema import DeviceRow, RecordRow, WorkloadRow
from tuner.db.validate import device_peak_flops, record_rejection, stored_target_has_amx
from tuner.measure.results import Timing

logger = logging.getLogger(__name__)


FallbackPolicy = Literal["device", "same-arch"]


# Where a looked-up record came from: this device's class, another device of its
# architecture, or an imported (foreign) MetaSchedule database.
Source = Literal["device", "same-arch", "foreign"]


# The order in which lookups try the modes: cold timings rank candidates as they run inside a
# whole model, where the previous operator has evicted this one's weights.
PREFERRED_TIMINGS: tuple[Timing, ...] = ("cold", "warm")


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
    """The lookups of :class:`~tuner.db.store.TuningDatabase` (a mixin: it uses the store's sessions and caches)."""

    def _flops_of(self, wids: set[int]) -> dict[int, float]:
        with self.session(write=False) as s:
            return {w: float(f or 0.0) for w, f in s.execute(
                select(WorkloadRow.id, WorkloadRow.flops).where(WorkloadRow.id.in_(wids)))}  # fmt: skip

    def _peak_flops(self, device_id: int) -> float:
        peak = self._peaks.get(device_id)
        if peak is None:
            with self.session(write=False) as s:
                row = s.get(DeviceRow, device_id)
            try:
                cores = int(json.loads(row.target).get("num-cores") or 0) if row is not None else 0
            except (ValueError, AttributeError):
                cores = 0
            # Without a core count, the most any host has: refuse only the absurd.
            amx = row is not None and row.kind == "cpu" and stored_target_has_amx(row.target)
            peak = self._peaks[device_id] = device_peak_flops(row.kind if row else "cpu", cores or 1024, amx)
        return peak

    def best(self, workload_key: str, device_id: int, k: int = 1, *, origin: str = "local",
             timing: Timing | None = None) -> list[RecordRow]:  # fmt: skip
        """The ``k`` fastest successful records of a workload on one device (any TVM version),
        measured by Nightshift (``origin="local"``) or imported (``"import"``), all of one
        timing mode: ``timing``, or by default the first of :data:`PREFERRED_TIMINGS` that
        has any."""
        with self.session(write=False) as s:
            wid = s.scalar(select(WorkloadRow.id).where(WorkloadRow.key == workload_key))
            if wid is None:
                return []
            for mode in (timing,) if timing is not None else PREFERRED_TIMINGS:
                rows = list(s.scalars(_best_stmt(wid, [device_id], origin, mode).limit(k)))
                if rows:
                    return rows
            return []

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

        A different architecture is never used. A record whose trace fails the allow-list
        (:mod:`tuner.db.validate`) is never returned; the reason is kept in :attr:`rejected`.
        Records written by another TVM version are used only when ``replays(row)`` says they
        replay cleanly on this one (without ``replays`` they are skipped). ``fits(row)``, when
        given, is asked about every record: one it declines is passed over for the next.
        """
        wid = self._workload_ids_of({workload_key}).get(workload_key)
        if wid is None:
            return []
        with self.session(write=False) as s:
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
        for timing in PREFERRED_TIMINGS:  # the k records are of one mode: the first that has any
            out: list[BestRecord] = []
            # Usually every record is usable: fetch k, then more only if some were skipped.
            page, offset = k, 0
            while len(out) < k:
                rows = list(s.scalars(_best_stmt(wid, list(devices), origin, timing).offset(offset).limit(page)))
                for row in rows:
                    if not self.trace_ok(row) or (fits is not None and not fits(row)):
                        continue
                    same = row.tvm_version == tvm.__version__
                    # A foreign record's version is only what its importer said: always replay it.
                    if (same and source != "foreign") or (replays is not None and replays(row)):
                        out.append(BestRecord(row, source, devices[row.device_id], same))
                        if len(out) == k:
                            break
                if len(rows) < page:
                    break
                offset += page
                page = min(page * 4, 1024)
            if out:
                return out
        return []

    def trace_ok(self, row: RecordRow) -> bool:
        """Whether a record's trace passes the allow-list; a rejection is logged once and kept."""
        if row.id in self.rejected:
            return False
        reason = record_rejection(row.record_json)
        if reason is None:
            return True
        self.rejected[row.id] = reason
        logger.warning("record %d (host %s, job %s) rejected: %s", row.id, row.host, row.job_id, reason)
        return False
