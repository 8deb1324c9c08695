"""No repeated work: what has been measured of a workload on a device, by any job, and schema 3."""

import pytest
import sqlalchemy as sa
import tvm
from alembic import command
from dbtest_utils import EMPTY_RECORD, add_mod, fake_cpu, matmul_mod

from tuner.db import NewRecord, TuningDatabase, database_url, migrate
from tuner.db.keys import record_key, record_key_v2
from tuner.db.store import create_engine
from tuner.graph.keys import workload_key

NOW = "2026-01-01 00:00:00"


def _rec(key, point, secs, error=None, program_hash=None):
    return NewRecord(workload_key=key, point=point, record_json=EMPTY_RECORD, run_secs=secs, error_class=error,
                     program_hash=program_hash)  # fmt: skip


@pytest.fixture
def db(db_url):
    database = TuningDatabase(db_url)
    yield database
    database.close()


def test_measured_by_any_job_on_this_device_only(db, cpu_device):
    mod, other_mod = add_mod(8), add_mod(16)
    key, other_key = workload_key(mod), workload_key(other_mod)
    db.workload_id(key, "add", mod, 8.0)
    db.workload_id(other_key, "add", other_mod, 16.0)
    dev = db.device_id(cpu_device)
    twin = db.device_id(fake_cpu(cpu_device, model="Another CPU of the same arch"))
    job1 = db.start_job("m", dev, {}, 4)
    job2 = db.start_job("m", dev, {}, 4)
    db.add_records(dev, job1, [_rec(key, "p1", [1e-3], program_hash="aa"), _rec(key, "p2", [], "build_error",
                                                                                   program_hash="bb")])  # fmt: skip
    db.add_records(dev, job2, [_rec(key, "p3", [2e-3], program_hash="aa")])  # same program, other knobs
    db.add_records(dev, None, [_rec(key, "p4", [3e-3])])  # a teammate's import: no hash
    db.add_records(dev, job2, [_rec(key, "p5", [], "lost", program_hash="cc")])  # node died: not measured
    db.add_records(twin, None, [_rec(key, "t1", [1e-3], program_hash="dd")])
    db.add_records(dev, job1, [_rec(other_key, "o1", [1e-3], program_hash="ee")])

    assert db.measured_hashes(key, dev) == {"aa", "bb"}
    assert db.measured_points(key, dev) == {"p1", "p2", "p3", "p4"}
    assert db.measured_hashes(key, twin) == {"dd"}
    assert db.measured_points(other_key, dev) == {"o1"}
    assert db.measured_hashes("unknown", dev) == set() and db.measured_points("unknown", dev) == set()


def test_measured_queries_are_one_select(db_url, cpu_device):
    writer = TuningDatabase(db_url)
    mod = add_mod()
    key = workload_key(mod)
    writer.workload_id(key, "add", mod, 8.0)
    dev = writer.device_id(cpu_device)
    writer.add_records(dev, None, [_rec(key, f"p{i}", [1e-3], program_hash=f"{i:016x}") for i in range(50)])
    writer.close()
    reader = TuningDatabase(db_url)  # nothing cached: the workload id comes with the same SELECT
    statements: list[str] = []
    sa.event.listen(reader.engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    try:
        assert len(reader.measured_hashes(key, dev)) == 50
        assert len(reader.measured_points(key, dev)) == 50
    finally:
        reader.close()
    selects = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
    assert len(selects) == 2, statements


def test_a_point_is_recorded_once_whoever_measures_it(db, cpu_device):
    mod = add_mod()
    key = workload_key(mod)
    db.workload_id(key, "add", mod, 8.0)
    dev = db.device_id(cpu_device)
    job1 = db.start_job("m", dev, {}, 1)
    job2 = db.start_job("m", dev, {}, 1)
    assert db.add_records(dev, job1, [_rec(key, "p", [1e-3], program_hash="aa")]) == 1
    assert db.add_records(dev, job2, [_rec(key, "p", [5e-4], program_hash="aa")]) == 0
    # Within one batch too, the first measurement of a point stands.
    assert db.add_records(dev, job2, [_rec(key, "q", [2e-3]), _rec(key, "q", [1e-4])]) == 1
    rows = {r.point: r for r in db.best(key, dev, k=10)}
    assert rows["p"].job_id == job1 and rows["p"].mean_sec == pytest.approx(1e-3)
    assert rows["q"].mean_sec == pytest.approx(2e-3)
    assert rows["p"].record_key == record_key(rows["p"].workload_id, dev, "p")


@pytest.mark.parametrize("error", ["lost", "lease_timeout"])
def test_a_lost_measurement_is_replaced(db, cpu_device, error):
    """Neither a lost node nor a timing that never got the node's lease says anything about the
    candidate: the point stays unmeasured and its next measurement replaces the record."""
    mod = add_mod()
    key = workload_key(mod)
    db.workload_id(key, "add", mod, 8.0)
    dev = db.device_id(cpu_device)
    assert db.add_records(dev, None, [_rec(key, "p", [], error, program_hash="aa")]) == 1
    assert db.measured_points(key, dev) == set()
    job = db.start_job("m", dev, {}, 1)
    assert db.add_records(dev, job, [_rec(key, "p", [1e-3], program_hash="aa")]) == 1
    assert db.count_records(key, dev) == 1
    [row] = db.best(key, dev)
    assert (row.error_class, row.job_id, row.program_hash) == (None, job, "aa")
    assert db.measured_hashes(key, dev) == {"aa"}
    # A measured record is never replaced, not even by a lost one.
    assert db.add_records(dev, job, [_rec(key, "p", [], error)]) == 0
    assert db.best(key, dev)[0].mean_sec == pytest.approx(1e-3)


def _schema2_database(url: str) -> None:
    """A database at schema 0002 with records: one point measured by two jobs and by none."""
    parsed = database_url(url)
    engine = create_engine(parsed)
    migrate.upgrade(engine, parsed, to="0002")
    with engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO devices (id, fingerprint, kind, arch, target, description, created_at) "
            f"VALUES (1, 'f00d', 'cpu', 'znver4', '{{}}', '{{}}', '{NOW}')"))
        conn.execute(sa.text(
            "INSERT INTO workloads (id, key, name, flops, workload_json, created_at) "
            f"VALUES (1, 'k1', 'conv', 1.0, '[]', '{NOW}')"))
        for job in (1, 2):
            conn.execute(sa.text(
                "INSERT INTO jobs (id, model, device_id, config, state, trials_done, trials_total, created_at, "
                f"updated_at) VALUES ({job}, 'tiny', 1, '{{}}', 'done', 2, 2, '{NOW}', '{NOW}')"))
        rows = [(1, 1, "p1", "0.002", "NULL"), (2, 1, "p2", "NULL", "'build_error'"), (3, 2, "p1", "0.003", "NULL"),
                (4, None, "p1", "0.004", "NULL"), (5, 2, "p3", "0.001", "NULL")]  # fmt: skip
        for rid, job, point, mean, error in rows:
            rkey = record_key_v2(1, 1, job, point)
            conn.execute(sa.text(
                "INSERT INTO records (id, record_key, workload_id, device_id, job_id, point, record_json, run_secs, "
                "mean_sec, error_class, tvm_version, host, created_at) "
                f"VALUES ({rid}, '{rkey}', 1, 1, {job or 'NULL'}, '{point}', '{EMPTY_RECORD}', '[]', {mean}, {error}, "
                f"'0.27.0', 'h', '{NOW}')"))  # fmt: skip
        if parsed.get_backend_name() == "postgresql":
            for table in ("devices", "workloads", "jobs", "records"):
                conn.execute(sa.text(f"SELECT setval('{table}_id_seq', (SELECT max(id) FROM {table}))"))
    engine.dispose()


def _records(db: TuningDatabase) -> list:
    with db.engine.connect() as conn:
        query = "SELECT id, job_id, point, record_key, program_hash FROM records ORDER BY id"
        return conn.execute(sa.text(query)).all()


def test_upgrade_from_schema_2_keeps_every_record(db_url):
    _schema2_database(db_url)
    parsed = database_url(db_url)
    engine = create_engine(parsed)
    assert migrate.upgrade(engine, parsed).revision == migrate.head_revision()
    engine.dispose()
    db = TuningDatabase(db_url)
    rows = _records(db)
    assert [r.id for r in rows] == [1, 2, 3, 4, 5]
    assert all(r.program_hash is None for r in rows)
    # The oldest record of each point takes the job-free key; later repeats keep theirs.
    assert [r.record_key for r in rows] == [
        record_key(1, 1, "p1"), record_key(1, 1, "p2"), record_key_v2(1, 1, 2, "p1"),
        record_key_v2(1, 1, None, "p1"), record_key(1, 1, "p3"),
    ]  # fmt: skip
    assert db.measured_points("k1", 1) == {"p1", "p2", "p3"}
    assert db.measured_hashes("k1", 1) == set()
    assert [r.mean_sec for r in db.best("k1", 1, k=10)] == pytest.approx([0.001, 0.002, 0.003, 0.004])
    # New jobs neither re-store old points nor lose new ones.
    assert db.add_records(1, None, [_rec("k1", "p1", [1e-4]), _rec("k1", "p9", [1e-3], program_hash="ab")]) == 1
    assert db.measured_hashes("k1", 1) == {"ab"}
    db.close()

    # And back: schema 2's keys and uniqueness hold again, the hashes are gone.
    engine = create_engine(parsed)
    with migrate._locked(engine) as conn:
        command.downgrade(migrate._config(conn), "0002")
    with engine.connect() as conn:
        back = conn.execute(sa.text("SELECT id, job_id, point, record_key FROM records ORDER BY id")).all()
        columns = {c["name"] for c in sa.inspect(conn).get_columns("records")}
    engine.dispose()
    assert "program_hash" not in columns
    assert [r.record_key for r in back] == [record_key_v2(1, 1, r.job_id, r.point) for r in back]
    assert [r.point for r in back] == ["p1", "p2", "p1", "p1", "p3", "p9"]


def test_metaschedule_records_carry_the_program_hash(db, cpu_device):
    """Records TVM commits through the adapter dedupe against Nightshift's own candidates."""
    from tvm.s_tir.meta_schedule.database import TuningRecord

    from tuner.compile import fallback_schedule
    from tuner.db.tvm_adapter import MetaScheduleDatabase
    from tuner.graph.keys import program_hash

    mod = matmul_mod(32)
    sch = fallback_schedule(mod, cpu_device.target)
    dev = db.device_id(cpu_device)
    adapter = MetaScheduleDatabase(db, dev)
    workload = adapter.commit_workload(mod)
    adapter.commit_tuning_record(TuningRecord(sch.trace, workload, [1e-3], cpu_device.target, None))
    assert db.measured_hashes(workload_key(mod), dev) == {program_hash(sch.mod)}


def test_an_operator_tuned_in_an_older_form_is_found_by_name_and_shapes(db, cpu_device):
    """A compiled function without records whose name, first input and output match a
    workload measured in another form (a dense weight packed since it was tuned) is named;
    one with other shapes, or whose namesake has only failed records, is not."""
    from tvm import te

    from tuner.db.store import workload_summary
    from tuner.graph.layout.ops import matmul_packed

    def dense(packed: bool, n: int = 32) -> tvm.IRModule:
        a = te.placeholder((1, 4, 8), name="A")
        w = te.placeholder((n // 32, 8, 32) if packed else (8, n), name="W")
        if packed:
            c = matmul_packed(a, w)
        else:
            k = te.reduce_axis((0, 8), name="k")
            c = te.compute((1, 4, n), lambda z, i, j: te.sum(a[z, i, k] * w[k, j], axis=k), name="matmul")
        return tvm.IRModule({"main": te.create_prim_func([a, w, c])})

    row_major, packed, wider = dense(False), dense(True), dense(True, 64)
    dev = db.device_id(cpu_device)
    db.workload_id(workload_key(row_major), "fused_matmul", row_major, 1.0)
    db.add_records(dev, None, [_rec(workload_key(row_major), "p1", [1e-3])])
    # The wider dense's row-major form failed to build: nothing to re-tune from.
    failed = dense(False, 64)
    db.workload_id(workload_key(failed), "fused_matmul", failed, 1.0)
    db.add_records(dev, None, [_rec(workload_key(failed), "p1", [], "build_error")])
    added = add_mod(8)  # measured, but another operator
    db.workload_id(workload_key(added), "add", added, 1.0)
    db.add_records(dev, None, [_rec(workload_key(added), "p1", [1e-3])])
    untuned = {workload_key(m): workload_summary(name, m)
               for name, m in (("fused_matmul", packed), ("fused_matmul", wider), ("add", add_mod(16)))}
    found = db.other_forms(untuned)
    assert found == {workload_key(packed): workload_summary("fused_matmul", row_major)}
    assert db.other_forms({}) == {}
