"""Nightshift's schema revision in its own table, with Optuna's studies in the same database.

Optuna keeps its revision in alembic's ``alembic_version``, where Nightshift kept its own up to
commit e085552; the fixtures ``fixtures/main_0005.*`` (made by ``fixtures/make_main_0005.py``
with that commit's code) are databases it left. Both backends.
"""

from __future__ import annotations

import traceback

import optuna
import pytest
import sqlalchemy as sa
from alembic import command
from dbtest_utils import load_fixture, run_at_once
from test_interop import _fill

from tuner import cli
from tuner.db import TuningDatabase, database_url, migrate
from tuner.db.store import create_engine
from tuner.errors import DatabaseError
from tuner.search.optuna_search import optuna_storage

HEAD = migrate.head_revision()
PROCS = 4
JOIN_TIMEOUT_S = 240


def _versions(url: str) -> tuple[list[str] | None, list[str] | None]:
    """Rows of (Nightshift's version table, alembic_version); None for a table that is absent."""
    engine = sa.create_engine(database_url(url))
    with engine.connect() as conn:
        tables = set(sa.inspect(conn).get_table_names())
        out = tuple(
            sorted(conn.execute(sa.text(f"SELECT version_num FROM {t}")).scalars()) if t in tables else None
            for t in (migrate.VERSION_TABLE, "alembic_version")
        )
    engine.dispose()
    return out  # type: ignore[return-value]


def _sql(url: str, *statements: str) -> None:
    engine = sa.create_engine(database_url(url))
    with engine.begin() as conn:
        for s in statements:
            conn.execute(sa.text(s))
    engine.dispose()


def _rows(url: str) -> dict[str, list[tuple]]:
    engine = sa.create_engine(database_url(url))
    with engine.connect() as conn:
        out = {t: [tuple(r) for r in conn.execute(sa.text(f"SELECT * FROM {t} ORDER BY id"))]
               for t in ("devices", "workloads", "jobs", "records", "cost_models")}  # fmt: skip
    engine.dispose()
    return out


def _optuna_head() -> str:
    return optuna.storages.RDBStorage("sqlite://")._version_manager.get_head_version()


def _url(arg: str) -> str:
    return arg if "://" in arg else f"sqlite:///{arg}"


def test_database_of_e085552_is_upgraded_with_its_revision_moved(db_url, tmp_path, capsys):
    arg = load_fixture("main_0005", db_url, tmp_path)
    url = _url(arg)
    assert _versions(url) == (None, ["0005"])
    before = _rows(url)
    assert len(before["records"]) == 21

    # Its schema (0005) is older than this Nightshift's: a command refuses it, saying how to
    # upgrade, and touches nothing (the revision stays where that Nightshift kept it).
    assert cli.main(["db", "stats", "--db", arg]) == 2
    assert f"schema 0005, older than {HEAD}" in " ".join(capsys.readouterr().err.split())
    assert _versions(url) == (None, ["0005"])
    assert _rows(url) == before

    # `db upgrade` moves the revision to Nightshift's table and migrates, in one transaction.
    assert cli.main(["db", "upgrade", "--db", arg]) == 0
    assert f"upgraded from schema 0005 to {HEAD}" in capsys.readouterr().out
    assert _versions(url) == ([HEAD], None)  # alembic_version held nothing else: dropped
    after = _rows(url)
    # Every row kept; the records gained their timing mode (0006), warm: all 0005 knew.
    assert [r[:-1] for r in after["records"]] == before["records"]
    assert {r[-1] for r in after["records"]} == {"warm"}
    assert {t: rows for t, rows in after.items() if t != "records"} == {
        t: rows for t, rows in before.items() if t != "records"}  # fmt: skip

    # Optuna now gets alembic_version to itself, and Nightshift does not read its revision.
    study = optuna.create_study(study_name="s", storage=optuna_storage(url))
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    assert _versions(url) == ([HEAD], [_optuna_head()])
    db = TuningDatabase(url, create=False)
    assert db.schema == migrate.SchemaState(HEAD, HEAD)
    db.close()
    assert cli.main(["db", "upgrade", "--db", arg]) == 0
    assert f"already at schema {HEAD}" in capsys.readouterr().out
    assert len(optuna.load_study(study_name="s", storage=optuna_storage(url)).trials) == 2


def test_outdated_database_of_e085552_fails_with_the_command_then_upgrades(db_url, tmp_path, capsys):
    arg = load_fixture("main_0005", db_url, tmp_path)
    url = _url(arg)
    parsed = database_url(url)
    # The same database at 0004, as that Nightshift kept it: downgraded, revision back in
    # alembic_version, beside a row of some other alembic user.
    engine = create_engine(parsed)
    with migrate._locked(engine) as conn:
        conn.execute(sa.text("DELETE FROM alembic_version"))
        conn.execute(sa.text(f"CREATE TABLE {migrate.VERSION_TABLE} (version_num VARCHAR(32) NOT NULL)"))
        conn.execute(sa.text(f"INSERT INTO {migrate.VERSION_TABLE} VALUES ('0005')"))
        command.downgrade(migrate._config(conn), "0004")
        conn.execute(sa.text(f"DROP TABLE {migrate.VERSION_TABLE}"))
        conn.execute(sa.text("INSERT INTO alembic_version VALUES ('0004'), ('someone-else-1')"))
    engine.dispose()

    for create in (True, False):  # `tune` and the other commands
        with pytest.raises(DatabaseError) as info:
            TuningDatabase(url, create=create)
        assert f"schema 0004, older than {HEAD}" in str(info.value)
        assert f"`nightshift db upgrade --db {arg if db_url.startswith('sqlite') else parsed.render_as_string()}`" \
            in str(info.value)  # fmt: skip
    assert _versions(url) == (None, ["0004", "someone-else-1"])  # refused, untouched
    with pytest.raises(DatabaseError, match="older than"):  # Optuna never sees alembic_version holding 0004
        optuna_storage(url)

    assert cli.main(["db", "upgrade", "--db", arg]) == 0
    assert f"upgraded from schema 0004 to {HEAD}" in capsys.readouterr().out
    assert _versions(url) == ([HEAD], ["someone-else-1"])  # the other row stays where it was
    assert TuningDatabase(url, create=False).schema.current


def test_optunas_revision_is_never_taken_for_nightshifts(db_url):
    # Optuna alone made the database: its revision is not a (newer) Nightshift schema.
    optuna.create_study(study_name="alone", storage=db_url).optimize(lambda t: t.suggest_int("k", 0, 3), n_trials=3)
    with pytest.raises(DatabaseError, match="has no tuning schema; run `nightshift db init"):
        TuningDatabase(db_url, create=False)
    assert TuningDatabase(db_url).schema.current  # `tune` and `db init` create the schema beside the studies
    assert _versions(db_url) == ([HEAD], [_optuna_head()])
    assert len(optuna.load_study(study_name="alone", storage=optuna_storage(db_url)).trials) == 3
    # A Nightshift newer than this one is still refused as newer, with Optuna's row beside it.
    _sql(db_url, f"UPDATE {migrate.VERSION_TABLE} SET version_num = '0042'")
    with pytest.raises(DatabaseError, match=f"schema 0042, newer than this Nightshift's {HEAD}"):
        TuningDatabase(db_url)


def test_table_names_do_not_clash():
    from optuna.storages._rdb.models import BaseModel

    from tuner.db.schema import Base

    def names(metadata: sa.MetaData) -> set[str]:
        out = set(metadata.tables)
        for t in metadata.tables.values():
            out |= {i.name for i in t.indexes} | {c.name for c in t.constraints if c.name}
        return out

    assert not names(BaseModel.metadata) & (names(Base.metadata) | {migrate.VERSION_TABLE})


def test_db_commands_on_a_database_with_studies(db_url, cpu_device, tmp_path, capsys):
    db = TuningDatabase(db_url)
    _fill(db, cpu_device, per_workload=2)
    db.close()
    study = optuna.create_study(study_name="job/task", storage=optuna_storage(db_url))
    study.optimize(lambda t: t.suggest_int("k", 0, 7), n_trials=3)
    arg = db_url.removeprefix("sqlite:///")

    assert cli.main(["db", "stats", "--db", arg]) == 0
    assert "6 records (2 failed)" in capsys.readouterr().out
    assert cli.main(["db", "export", "--db", arg, "-o", str(tmp_path / "ms")]) == 0
    assert "exported 4 records of 2 workloads" in capsys.readouterr().out
    assert cli.main(["db", "prune", "--db", arg, "--keep-top", "1", "--yes"]) == 0
    assert "deleted 4 records" in capsys.readouterr().out
    assert cli.main(["db", "import", "--db", arg, str(tmp_path / "ms")]) == 0
    assert "imported" in capsys.readouterr().out
    assert cli.main(["db", "upgrade", "--db", arg]) == 0
    assert f"already at schema {HEAD}" in capsys.readouterr().out
    assert cli.main(["db", "init", "--db", arg]) == 0
    capsys.readouterr()

    # The studies are as they were, and Optuna still reads its own revision.
    trials = optuna.load_study(study_name="job/task", storage=optuna_storage(db_url)).trials
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 3
    assert _versions(db_url) == ([HEAD], [_optuna_head()])


def _opener(url: str, index: int, upgrade: bool, barrier, errors) -> None:
    """One process's first use of the database (after ``db upgrade``, with ``upgrade``):
    Nightshift's, then Optuna's."""
    try:
        from tuner import cli
        from tuner.db import TuningDatabase
        from tuner.search.optuna_search import optuna_storage

        barrier.wait(timeout=120)
        if upgrade:
            assert cli.main(["db", "upgrade", "--db", url]) == 0
        if index % 2:  # half open Optuna's storage first (it opens the tuning database itself)
            TuningDatabase(url).close()
        study = optuna.create_study(study_name=f"proc{index}", storage=optuna_storage(url))
        study.optimize(lambda t: t.suggest_int("k", 0, 7), n_trials=2)
    except BaseException:
        errors.put(f"process {index}: {traceback.format_exc()}")
        raise


@pytest.mark.parametrize("fixture", ["main_0005", None], ids=["e085552-database", "empty"])
@pytest.mark.slow
def test_processes_open_a_database_at_once(db_url, tmp_path, fixture):
    """Each process upgrades the old database and moves its revision (or creates the schema)
    and Optuna's tables at once: one of each wins, the others find them made."""
    url = _url(load_fixture(fixture, db_url, tmp_path)) if fixture else db_url
    run_at_once(_opener, lambda i: (url, i, fixture is not None), PROCS, JOIN_TIMEOUT_S)
    assert _versions(url) == ([HEAD], [_optuna_head()])
    summaries = optuna.get_all_study_summaries(optuna_storage(url))
    assert sorted((s.study_name, s.n_trials) for s in summaries) == [(f"proc{i}", 2) for i in range(PROCS)]
