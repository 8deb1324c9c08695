"""Upgrading real old data: a database Nightshift 0.1 left (schema 0001), on both backends.

The fixtures (``fixtures/legacy_0001.*``, made by ``fixtures/make_legacy_0001.py``) hold what
0.1 really allowed, duplicates of job-less records included; upgrading them to the newest
schema must lose nothing but those duplicates.
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from dbtest_utils import load_fixture
from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

from tuner import cli
from tuner.db import TuningDatabase, database_url, migrate
from tuner.db.validate import record_rejection

KEPT_COLUMNS = ("id", "workload_id", "device_id", "job_id", "point", "record_json", "run_secs", "mean_sec",
                "error_class", "error_msg", "build_sec", "tvm_version", "host")  # fmt: skip


def _rows(url: str, table: str, columns: tuple[str, ...] | None = None) -> dict[int, tuple]:
    engine = sa.create_engine(database_url(url))
    with engine.connect() as conn:
        cols = ", ".join(columns) if columns else "*"
        rows = {r[0]: tuple(r) for r in conn.execute(sa.text(f"SELECT {cols} FROM {table} ORDER BY id"))}
    engine.dispose()
    return rows


def _expected_duplicates(records: dict[int, tuple]) -> set[int]:
    """Ids 0002 must remove: job-less repeats of a (workload, device, point), all but one each."""
    groups: dict[tuple, list[tuple]] = {}
    for r in records.values():
        _id, wid, did, job, point, *_ = r
        if job is None:
            groups.setdefault((wid, did, point), []).append(r)
    doomed: set[int] = set()
    for group in groups.values():
        # The oldest successful record stays (columns: ..., mean_sec at 7, error_class at 8).
        ok = [r for r in group if r[8] is None and r[7] is not None]
        keep = min(ok or group, key=lambda r: r[0])
        doomed |= {r[0] for r in group if r is not keep}
    return doomed


def test_legacy_database_upgrades_without_loss(db_url, tmp_path, capsys):
    url = load_fixture("legacy_0001", db_url, tmp_path)
    old_columns = {t: tuple(_columns(url, t)) for t in ("devices", "workloads", "jobs", "cost_models")}
    before = {t: _rows(url, t, cols) for t, cols in old_columns.items()}
    records = _rows(url, "records", KEPT_COLUMNS)
    doomed = _expected_duplicates(records)
    assert len(records) == 25 and len(doomed) == 4  # the fixture has the duplicates it claims

    assert cli.main(["db", "upgrade", "--db", url]) == 0
    assert f"upgraded from schema 0001 to {migrate.head_revision()}" in capsys.readouterr().out
    after = _rows(url, "records", KEPT_COLUMNS)
    assert set(after) == set(records) - doomed
    assert all(after[i] == records[i] for i in after)  # every kept record unchanged
    for table, rows in before.items():  # every other row and value as it was
        assert _rows(url, table, old_columns[table]) == rows, table
    # Of the three copies of an import, the oldest stays; of a lost and a successful copy, the successful one.
    kept_imports = sorted((r[1], r[2], r[7]) for r in after.values() if r[3] is None)
    assert (2, 1, 9e-6) in kept_imports and (1, 1, 3e-7) in kept_imports

    db = TuningDatabase(url, create=False)
    assert db.schema.current
    # Old records are the writers' own (not imports), and their traces replay on this TVM.
    wkey = _rows(url, "workloads", ("id", "key"))[2][1]
    best = db.best(wkey, 1, k=3)
    assert [round(r.mean_sec, 9) for r in best] == [9e-6, 1.9e-5, 2e-5]
    workload = Workload.from_json(json.loads(db.get_workload(wkey).workload_json))
    for row in best:
        assert record_rejection(row.record_json) is None
        TuningRecord.from_json(json.loads(row.record_json), workload).trace.apply_to_schedule(
            __import__("tvm").s_tir.Schedule(workload.mod), remove_postproc=False)  # fmt: skip
    assert db.load_cost_model(1, "xgb") == b"{U\x04name"
    db.close()


def _columns(url: str, table: str) -> list[str]:
    engine = sa.create_engine(database_url(url))
    cols = [c["name"] for c in sa.inspect(engine).get_columns(table)]
    engine.dispose()
    return cols
