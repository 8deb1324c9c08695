"""Schema migrations: from the first schema (Nightshift 0.1's create_all) to the newest."""

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from dbtest_utils import EMPTY_RECORD

from tuner import cli
from tuner.db import TuningDatabase, database_url, migrate
from tuner.db.keys import record_key, record_key_v2
from tuner.db.schema import Base
from tuner.db.store import create_engine
from tuner.errors import DatabaseError

HEAD = migrate.head_revision()

NOW = "2026-01-01 00:00:00"


def _first_schema_database(url: str, *, legacy: bool) -> None:
    """A database as Nightshift 0.1 left it, with a few rows of every table."""
    parsed = database_url(url)
    engine = create_engine(parsed)
    migrate.upgrade(engine, parsed, to="0001")
    with engine.begin() as conn:
        if legacy:
            # 0.1 had no alembic: only its nightshift_meta row says which schema it is.
            conn.execute(sa.text(f"DROP TABLE {migrate.VERSION_TABLE}"))
        conn.execute(sa.text(
            "INSERT INTO devices (id, fingerprint, kind, arch, target, description, created_at) "
            f"VALUES (1, 'f00d', 'cpu', 'znver4', '{{}}', '{{}}', '{NOW}')"))
        conn.execute(sa.text(
            "INSERT INTO workloads (id, key, name, flops, workload_json, created_at) "
            f"VALUES (1, 'k1', 'conv', 1.0, '[]', '{NOW}')"))
        conn.execute(sa.text(
            "INSERT INTO jobs (id, model, device_id, config, state, trials_done, trials_total, created_at, updated_at) "
            f"VALUES (1, 'tiny', 1, '{{}}', 'done', 2, 2, '{NOW}', '{NOW}')"))
        for rid, job, point, mean in ((1, "1", "p1", "0.002"), (2, "1", "p2", "0.001"), (3, "NULL", "p1", "NULL")):
            conn.execute(sa.text(
                "INSERT INTO records (id, workload_id, device_id, job_id, point, record_json, run_secs, mean_sec, "
                "tvm_version, host, created_at) "
                f"VALUES ({rid}, 1, 1, {job}, '{point}', '{EMPTY_RECORD}', '[]', {mean}, '0.27.0', 'h', '{NOW}')"))
        conn.execute(sa.text(
            "INSERT INTO cost_models (id, device_id, kind, format, num_samples, blob, created_at) "
            f"VALUES (1, 1, 'xgb', 'ubj', 3, :blob, '{NOW}')"), {"blob": b"{UBJ"})  # fmt: skip
        if parsed.get_backend_name() == "postgresql":
            for table in ("devices", "workloads", "jobs", "records", "cost_models"):
                conn.execute(sa.text(f"SELECT setval('{table}_id_seq', (SELECT max(id) FROM {table}))"))
    engine.dispose()


def _expected_command(url: str) -> str:
    parsed = database_url(url)
    arg = parsed.database if parsed.get_backend_name() == "sqlite" else parsed.render_as_string(hide_password=True)
    return f"`nightshift db upgrade --db {arg}`"


@pytest.mark.parametrize("legacy", [True, False], ids=["made-by-0.1", "at-revision-0001"])
def test_upgrade_from_first_schema(db_url, legacy, capsys):
    _first_schema_database(db_url, legacy=legacy)
    with pytest.raises(DatabaseError) as info:
        TuningDatabase(db_url)
    assert f"older than {HEAD}" in str(info.value)
    assert _expected_command(db_url) in str(info.value)

    assert cli.main(["db", "upgrade", "--db", db_url]) == 0
    assert f"upgraded from schema 0001 to {HEAD}" in capsys.readouterr().out
    db = TuningDatabase(db_url)
    assert db.schema.revision == migrate.head_revision()
    with db.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT id, workload_id, device_id, job_id, point, record_key FROM records "
                                    "ORDER BY id")).all()  # fmt: skip
        assert conn.execute(sa.text("SELECT value FROM nightshift_meta")).scalar() == str(int(HEAD))
    assert [r.id for r in rows] == [1, 2, 3]
    # Keys without the job; record 3 measured record 1's point again and keeps its old key.
    assert [r.record_key for r in rows] == [record_key(1, 1, "p1"), record_key(1, 1, "p2"),
                                            record_key_v2(1, 1, None, "p1")]  # fmt: skip
    assert [r.point for r in db.best("k1", 1, k=5)] == ["p2", "p1"]
    assert db.load_cost_model(1, "xgb") == b"{UBJ"
    # New writes work on migrated data, idempotently.
    from tuner.db import NewRecord

    new = [NewRecord("k1", "p1", EMPTY_RECORD, [0.002]), NewRecord("k1", "p3", EMPTY_RECORD, [0.003])]
    assert db.add_records(1, 1, new) == 1
    # A second upgrade is a no-op.
    assert cli.main(["db", "upgrade", "--db", db_url]) == 0
    assert f"already at schema {HEAD}" in capsys.readouterr().out


def test_migrations_match_the_models(db_url):
    """The migration chain builds exactly the tables schema.py declares."""
    db = TuningDatabase(db_url)
    with db.engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"version_table": migrate.VERSION_TABLE})
        diff = compare_metadata(context, Base.metadata)
    assert diff == []


def test_outdated_schema_through_the_cli(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    _first_schema_database(url, legacy=True)
    assert cli.main(["db", "stats", "--db", str(tmp_path / "old.db")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error:")
    assert f"`nightshift db upgrade --db {tmp_path / 'old.db'}`" in err


def test_newer_schema_through_the_cli(db_url, capsys):
    TuningDatabase(db_url).close()
    engine = sa.create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {migrate.VERSION_TABLE} SET version_num = '0042'"))
    engine.dispose()
    for argv in (["db", "stats", "--db", db_url], ["db", "upgrade", "--db", db_url]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert f"schema 0042, newer than this Nightshift's {HEAD}" in err and "pip install -U nightshift" in err
