"""The tuning database on both backends: SQLite and the real local PostgreSQL."""

import json
import logging
import sqlite3

import pytest
import sqlalchemy as sa
import tvm
import tvm_ffi
from dbtest_utils import add_mod, fake_cpu, matmul_mod

from tuner.compile import fallback_schedule
from tuner.db import NewRecord, TuningDatabase, database_url, migrate, redact
from tuner.db.maintenance import PruneResult
from tuner.db.tvm_adapter import MetaScheduleDatabase
from tuner.errors import DatabaseError, UserInputError
from tuner.graph.keys import workload_key

# The smallest record the trace allow-list accepts: an empty trace.
EMPTY_RECORD = "[[[], []], null, null, null]"


def _rec(key, point, secs, error=None, record_json=EMPTY_RECORD):
    return NewRecord(workload_key=key, point=point, record_json=record_json, run_secs=secs, error_class=error)


def test_best_is_per_device_and_skips_failures(db_url, cpu_device):
    from tuner.device import parse_device

    db = TuningDatabase(db_url)
    mod = add_mod()
    key = workload_key(mod)
    wid = db.workload_id(key, "add", mod, 8.0)
    assert db.workload_id(key, "add", mod, 8.0) == wid
    assert db.get_workload(key).summary == "add(float32[8], float32[8])"
    dev = db.device_id(cpu_device)
    other = db.device_id(parse_device("cuda:0", target_arch="sm_90"))
    assert dev != other and db.device_id(cpu_device) == dev
    job = db.start_job("m", dev, {"trials": 3}, 3)
    db.add_records(dev, job, [
        _rec(key, "a", [3e-3, 3e-3]), _rec(key, "b", [1e-3, 2e-3]),
        _rec(key, "c", [], "build_error"), _rec(key, "d", [5e-4], "wrong_result"),
    ])  # fmt: skip
    db.add_records(other, None, [_rec(key, "z", [1e-6])])
    best = db.best(key, dev, k=5)
    assert [r.point for r in best] == ["b", "a"]
    assert best[0].mean_sec == pytest.approx(1.5e-3)
    assert json.loads(best[0].run_secs) == [1e-3, 2e-3]
    assert best[0].tvm_version == tvm.__version__ and best[0].host
    assert [r.point for r in db.best(key, other)] == ["z"]
    assert db.count_records(key, dev) == 4
    db.update_job(job, trials_done=3, state="done")
    with pytest.raises(DatabaseError, match="unknown workloads"):
        db.add_records(dev, job, [_rec("nope", "x", [1.0])])


def _one_job(db_url, cpu_device):
    """A database with the add workload, the CPU and a job: ``(db, workload key, device id, job id)``."""
    db = TuningDatabase(db_url)
    mod = add_mod()
    key = workload_key(mod)
    db.workload_id(key, "add", mod, 8.0)
    dev = db.device_id(cpu_device)
    return db, key, dev, db.start_job("m", dev, {}, 4)


def test_retime_replaces_a_records_timing_and_the_ranking_follows(db_url, cpu_device):
    from tuner.db.schema import RecordRow

    db, key, dev, job = _one_job(db_url, cpu_device)
    db.add_records(dev, job, [_rec(key, "a", [1e-3]), _rec(key, "b", [2e-3]), _rec(key, "c", [], "build_error")])
    a = db.best(key, dev)[0]
    db.retime(a.id, [3e-3, 4e-3])
    best = db.best(key, dev, k=2)
    assert [r.point for r in best] == ["b", "a"]
    assert best[1].mean_sec == pytest.approx(3.5e-3)
    assert json.loads(best[1].run_secs) == json.loads(best[1].record_json)[1] == [3e-3, 4e-3]
    with db.session() as s:
        failed = s.scalar(sa.select(RecordRow.id).where(RecordRow.point == "c"))
    for record_id in (failed, 10**9):
        with pytest.raises(DatabaseError, match="not a successful record"):
            db.retime(record_id, [1e-3])
    with pytest.raises(ValueError):
        db.retime(a.id, [])
    assert db.count_records(key, dev) == 3


def test_writes_are_idempotent(db_url, cpu_device):
    db, key, dev, job = _one_job(db_url, cpu_device)
    batch = [_rec(key, f"p{i}", [1e-3 * (i + 1)]) for i in range(4)]
    assert db.add_records(dev, job, batch) == 4
    # A retry of the same batch (say, after a lost commit acknowledgement) adds nothing.
    assert db.add_records(dev, job, batch) == 0
    assert db.add_records(dev, job, [*batch[:2], _rec(key, "p9", [1e-4])]) == 1
    # Records without a job are deduplicated too (NULL job ids used to slip past the constraint).
    assert db.add_records(dev, None, [_rec(key, "q", [1e-3])]) == 1
    assert db.add_records(dev, None, [_rec(key, "q", [1e-3])]) == 0
    assert db.count_records(key, dev) == 6
    # A record's identity is not its job: a point another job (or none) measured is not new.
    job2 = db.start_job("m", dev, {}, 4)
    assert db.add_records(dev, job2, batch[:1]) == 0
    assert db.add_records(dev, None, batch[1:2]) == 0
    assert db.count_records(key, dev) == 6


def test_warm_and_cold_timings_are_separate_records_never_ranked_together(db_url, cpu_device):
    from dataclasses import replace

    from tuner.db.store import measured_results
    from tuner.reuse import task_histories

    db, key, dev, job = _one_job(db_url, cpu_device)
    warm = [_rec(key, "a", [1e-3]), _rec(key, "b", [5e-4])]
    cold = [replace(_rec(key, "a", [1.5e-3]), timing="cold"), replace(_rec(key, "b", [2e-3]), timing="cold")]
    assert db.add_records(dev, job, warm) == 2
    # The same points timed cold are new records, and a retry of either batch adds nothing.
    assert db.add_records(dev, job, cold) == 2
    assert db.add_records(dev, job, [*warm, *cold]) == 0
    assert db.measured_points(key, dev, "cold") == db.measured_points(key, dev, "warm") == {"a", "b"}
    assert sorted((p, m) for p, m, _ in measured_results(db, key, dev, "cold")) == [("a", 1.5e-3), ("b", 2e-3)]
    # Cold first, alone: the warm "b" (0.5 ms) is faster than every cold record but not
    # ranked with them; "a" wins cold although it loses warm.
    assert [(r.point, r.timing) for r in db.best(key, dev, k=4)] == [("a", "cold"), ("b", "cold")]
    assert [(b.row.point, b.row.timing) for b in db.lookup(key, dev, k=4)] == [("a", "cold"), ("b", "cold")]
    assert [r.point for r in db.best(key, dev, k=4, timing="warm")] == ["b", "a"]
    [(_, best_row, n)] = db.best_per_workload(dev)
    assert (best_row.point, best_row.timing, n) == ("a", "cold", 4)
    h = task_histories(db, dev, job, [key], "cold")[key]
    assert (h.ok, h.best_sec) == (2, 1.5e-3)
    assert task_histories(db, dev, job, [key], "warm")[key].best_sec == 5e-4
    # Pruning keeps the best of each mode.
    assert db.prune(keep_top=1) == PruneResult(2, 2)
    assert {(r.point, r.timing) for r in db.best(key, dev, k=4, timing="warm")} == {("b", "warm")}
    assert {(r.point, r.timing) for r in db.best(key, dev, k=4)} == {("a", "cold")}


def test_lookup_fallback_policy(db_url, cpu_device):
    db = TuningDatabase(db_url)
    mod = add_mod()
    key = workload_key(mod)
    db.workload_id(key, "add", mod, 8.0)
    me = db.device_id(cpu_device)
    twin = db.device_id(fake_cpu(cpu_device, cores=64, model="same arch, other machine"))
    alien = db.device_id(fake_cpu(cpu_device, mcpu="cortex-a72", model="another architecture"))
    assert len({me, twin, alien}) == 3
    assert db.lookup(key, me) == []
    db.add_records(alien, None, [_rec(key, "fast-elsewhere", [1e-9])])
    assert db.lookup(key, me) == [], "a record of another architecture must never be used"
    db.add_records(twin, None, [_rec(key, "twin-b", [2e-3]), _rec(key, "twin-a", [1e-3])])
    found = db.lookup(key, me, k=3)
    assert [(b.row.point, b.source) for b in found] == [("twin-a", "same-arch"), ("twin-b", "same-arch")]
    assert found[0].device_fingerprint == fake_cpu(cpu_device, cores=64, model="same arch, other machine").fingerprint
    assert db.lookup(key, me, policy="device") == []
    # Once this device has its own record it wins, even when slower than the twin's.
    db.add_records(me, None, [_rec(key, "mine", [5e-3])])
    assert [(b.row.point, b.source) for b in db.lookup(key, me, k=3)] == [("mine", "device")]


def test_other_tvm_versions_are_used_only_when_they_replay(db_url, cpu_device):
    target = cpu_device.target
    mod = matmul_mod(32)
    sch = fallback_schedule(mod, target)
    assert sch is not None
    workload = tvm.s_tir.meta_schedule.database.Workload(mod)
    good = tvm.s_tir.meta_schedule.database.TuningRecord(sch.trace, workload, [1e-3], target, None)
    good_json = json.dumps(good.as_json())
    broken = json.loads(good_json)
    broken[0] = [[["GetSBlock", [], ["no_such_block", "main"], ["b0"]]], []]

    db = TuningDatabase(db_url)
    key = workload_key(mod)
    db.workload_id(key, "matmul", mod, 2 * 32**3)
    dev = db.device_id(cpu_device)
    db.add_records(dev, None, [
        _rec(key, "old-broken", [1e-4], record_json=json.dumps(broken)),
        _rec(key, "old-good", [2e-4], record_json=good_json),
        _rec(key, "current", [3e-3], record_json=good_json),
    ])  # fmt: skip
    with db.engine.begin() as conn:
        conn.execute(sa.text("UPDATE records SET tvm_version = '0.19.0' WHERE point LIKE 'old-%'"))
    # Kept, but skipped when nothing checks that they replay.
    assert db.count_records(key, dev) == 3
    assert [b.row.point for b in db.lookup(key, dev, k=3)] == ["current"]
    # TVM's compile path checks: the broken trace is dropped, the good one is used.
    adapter = MetaScheduleDatabase(db, dev, read_only=True)
    records = adapter.get_top_k(workload, 2)
    assert len(records) == 2
    assert adapter.decisions[key].kind == "tuned"
    assert adapter.decisions[key].detail == "0.200 ms, TVM 0.19.0"


def test_adapter_feeds_tvm_query_schedule(db_url, cpu_device):
    """TVM's own Database.query_schedule reads the best record through the adapter."""
    target = cpu_device.target
    mod = matmul_mod(32)
    sch = fallback_schedule(mod, target)
    db = TuningDatabase(db_url)
    dev = db.device_id(cpu_device)
    adapter = MetaScheduleDatabase(db, dev)
    workload = adapter.commit_workload(mod)
    adapter.commit_tuning_record(tvm.s_tir.meta_schedule.database.TuningRecord(sch.trace, workload, [1e-3], target,
                                                                               None))  # fmt: skip
    assert len(adapter) == 1
    got = adapter.query_schedule(mod, target, "matmul")
    assert got is not None
    assert tvm_ffi.structural_equal(got.mod, sch.mod)


def test_prune_keeps_the_best(db_url, cpu_device):
    db = TuningDatabase(db_url)
    mods = [add_mod(8), add_mod(16)]
    keys = [workload_key(m) for m in mods]
    for k, m in zip(keys, mods, strict=True):
        db.workload_id(k, "add", m, 8.0)
    dev = db.device_id(cpu_device)
    for k in keys:
        db.add_records(dev, None, [_rec(k, f"p{i}", [1e-3 * (10 - i)]) for i in range(10)]
                       + [_rec(k, "f", [], "build_error")])  # fmt: skip
    assert db.prune(keep_top=3, dry_run=True).deleted == 2 * 8
    assert db.count_records() == 22
    assert db.prune(keep_top=3, keep_failed=True).deleted == 2 * 7
    assert db.prune(keep_top=3) == PruneResult(2, 6)
    for k in keys:
        assert [r.point for r in db.best(k, dev, k=10)] == ["p9", "p8", "p7"]
    with pytest.raises(UserInputError, match="--keep-top"):
        db.prune(keep_top=-1)


def test_stats_and_cost_models(db_url, cpu_device):
    db = TuningDatabase(db_url)
    mod = add_mod()
    key = workload_key(mod)
    db.workload_id(key, "add", mod, 8.0)
    dev = db.device_id(cpu_device)
    job = db.start_job("m", dev, {}, 2)
    db.add_records(dev, job, [_rec(key, "a", [1e-3]), _rec(key, "b", [], "timeout")])
    db.save_cost_model(dev, "xgb", b"{UBJSON}", 2)
    db.save_cost_model(dev, "xgb", b"{newer}", 4)
    assert db.load_cost_model(dev, "xgb") == b"{newer}"
    assert db.load_cost_model(dev, "other") is None
    st = db.stats()
    assert (st["workloads"], st["records"], st["failed_records"], st["cost_models"]) == (1, 2, 1, 2)
    assert st["jobs"] == {"running": 1}
    assert st["devices"] == [{"fingerprint": cpu_device.fingerprint, "kind": "cpu", "arch": cpu_device.arch,
                              "records": 2, "ok": 1}]  # fmt: skip


def test_reopen_keeps_data(db_url, cpu_device):
    db = TuningDatabase(db_url)
    dev = db.device_id(cpu_device)
    db.close()
    assert TuningDatabase(db_url).device_id(cpu_device) == dev


def test_newer_schema_is_refused(db_url):
    db = TuningDatabase(db_url)
    with db.engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {migrate.VERSION_TABLE} SET version_num = '9999'"))
    db.close()
    head = migrate.head_revision()
    with pytest.raises(DatabaseError, match=rf"schema 9999, newer than this Nightshift's {head}; upgrade Nightshift"):
        TuningDatabase(db_url)


def test_foreign_tables_are_refused(db_url):
    engine = sa.create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE records (id INTEGER PRIMARY KEY)"))
    engine.dispose()
    with pytest.raises(DatabaseError, match="not a Nightshift tuning database"):
        TuningDatabase(db_url)


def test_corrupt_sqlite_file(tmp_path):
    path = tmp_path / "bad.db"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(DatabaseError, match=r"cannot open.*not a healthy SQLite database"):
        TuningDatabase(str(path))
    assert path.read_bytes().startswith(b"this is not")


def test_sqlite_uses_wal(tmp_path):
    TuningDatabase(str(tmp_path / "t.db"))
    with sqlite3.connect(tmp_path / "t.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_unwritable_path_and_bad_urls(tmp_path):
    with pytest.raises(UserInputError, match="does not exist"):
        database_url(str(tmp_path / "no" / "such" / "dir" / "t.db"))
    # /proc refuses new files even to root, unlike a chmod-ed folder.
    with pytest.raises(UserInputError, match="cannot write"):
        database_url("/proc/nightshift-tuning.db")
    with pytest.raises(UserInputError, match="unsupported database 'mysql'") as info:
        database_url("mysql://bob:hunter2@db/x")
    assert "hunter2" not in str(info.value)
    assert database_url("postgresql://u@h/d").drivername == "postgresql+psycopg"


def test_unreachable_server_and_redaction(caplog):
    url = "postgresql+psycopg://alice:s3cret@127.0.0.1:1/nightshift"
    caplog.set_level(logging.DEBUG)
    with pytest.raises(DatabaseError) as info:
        TuningDatabase(url)
    message = str(info.value)
    assert "s3cret" not in message and "127.0.0.1:1" in message and "reachable" in message
    assert "s3cret" not in caplog.text
    assert "s3cret" not in redact(url)


def test_wrong_password(pg_password_url, caplog):
    caplog.set_level(logging.DEBUG)
    right = sa.make_url(pg_password_url)
    TuningDatabase(right).close()  # the right password works
    wrong = right.set(password="not-the-password")
    with pytest.raises(DatabaseError) as info:
        TuningDatabase(wrong)
    message = str(info.value)
    assert "password authentication failed" in message and "check the user and password" in message
    assert "not-the-password" not in message and "s3cret" not in message
    assert "not-the-password" not in caplog.text


def test_missing_postgres_database(pg_server_url):
    url = sa.make_url(pg_server_url).set(database="nightshift_no_such_db")
    with pytest.raises(DatabaseError, match="does not exist; create it"):
        TuningDatabase(url)
