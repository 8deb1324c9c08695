"""A job runs once: processes opening the same job name at once through the real
``TuningJob._open_job``, on both backends; exactly one runs it, the others stop naming it."""

from __future__ import annotations

import json
import traceback
from pathlib import Path

import pytest
import sqlalchemy as sa

from tuner.db import TuningDatabase

PROCS = 4
JOIN_TIMEOUT_S = 240


def _open(url: str, index: int, out: str, barrier, errors) -> None:
    """One ``tune --job race``: start the job (phase 1), then resume it once stopped (phase 2)."""
    try:
        from dbtest_utils import add_mod

        from tuner.db import TuningDatabase
        from tuner.device import parse_device
        from tuner.graph.keys import workload_key
        from tuner.graph.tasks import Task
        from tuner.job import JobRunning, TuneConfig, TuningJob

        db = TuningDatabase(url)
        device = parse_device("cpu")
        mod = add_mod()
        task = Task("add", mod, 1, 8.0, workload_key(mod))
        db.workload_id(task.workload_key, task.name, mod, task.flops)

        def attempt() -> dict:
            job = TuningJob([task], device, db, TuneConfig(name="race", trials=8, measurer="inline"),
                            model_name="tiny")  # fmt: skip
            job.device_id = db.device_id(device)
            try:
                job._open_job()
            except JobRunning as err:
                return {"refused": str(err)}
            return {"job": job.job_id, "resumed": job.resumed}

        outcomes = []
        for _phase in range(2):
            barrier.wait(timeout=120)
            outcome = attempt()
            outcomes.append(outcome)
            # The winner lives on until every process has tried (a dead winner may be resumed).
            barrier.wait(timeout=120)
            if "job" in outcome:
                db.update_job(outcome["job"], state="stopped")
        Path(out, f"{index}.json").write_text(json.dumps(outcomes))
        db.close()
    except BaseException:
        errors.put(f"process {index}: {traceback.format_exc()}")
        raise


@pytest.mark.slow
def test_one_of_four_processes_runs_the_job(db_url, tmp_path):
    from dbtest_utils import run_at_once

    TuningDatabase(db_url).close()  # the schema race is test_concurrency's
    run_at_once(_open, lambda i: (db_url, i, str(tmp_path)), PROCS, JOIN_TIMEOUT_S)
    outcomes = [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(PROCS)]
    for phase, resumed in ((0, False), (1, True)):
        ran = [o[phase] for o in outcomes if "job" in o[phase]]
        refused = [o[phase]["refused"] for o in outcomes if "refused" in o[phase]]
        assert len(ran) == 1 and ran[0]["resumed"] is resumed, outcomes
        assert len(refused) == PROCS - 1, outcomes
        for line in refused:  # the loser names the live job
            assert f"job 'race' (#{ran[0]['job']}) is running on " in line, line
    engine = sa.create_engine(db_url)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT id, state FROM jobs WHERE name = 'race'")).all()
    engine.dispose()
    assert rows == [(ran[0]["job"], "stopped")]


def test_the_database_refuses_a_second_running_job(db_url, cpu_device):
    """The unique index itself, without the code's checks: a name runs once per device."""
    from tuner.errors import JobConflict

    db = TuningDatabase(db_url)
    dev = db.device_id(cpu_device)
    first = db.start_job("tiny", dev, {}, 0, name="x")
    with pytest.raises(JobConflict, match="'x' is already running"):
        db.start_job("tiny", dev, {}, 0, name="x")
    db.start_job("tiny", dev, {}, 0, name="y")  # other names, and unnamed jobs, are free
    db.start_job("tiny", dev, {}, 0)
    db.start_job("tiny", dev, {}, 0)
    db.update_job(first, state="stopped")
    second = db.start_job("tiny", dev, {}, 0, name="x")
    row = db.find_job("x", dev, state="running")
    assert row is not None and row.id == second
    # A claim on a row that changed since it was read fails; on an unchanged one it succeeds.
    stopped = db.find_job("x", dev, state="stopped")
    assert stopped is not None
    db.update_job(second, state="done")
    kwargs = {"config": {}, "trials_done": 0, "trials_total": 0, "time_budget_sec": None}
    assert not db.claim_job(first, seen_state="running", seen_heartbeat=stopped.heartbeat_at, **kwargs)
    assert db.claim_job(first, seen_state="stopped", seen_heartbeat=stopped.heartbeat_at, **kwargs)
    assert not db.claim_job(first, seen_state="stopped", seen_heartbeat=stopped.heartbeat_at, **kwargs)
    assert db.find_job("x", dev, state="running").id == first


def test_the_migration_stops_all_but_the_newest_of_running_duplicates(db_url):
    """A database used before schema 0007 may hold the race's outcome: two running rows of
    one name. The migration keeps the newest running, stops the others, and adds the index."""
    from tuner.db import database_url, migrate
    from tuner.db.store import create_engine

    url = database_url(db_url)
    engine = create_engine(url)
    migrate.upgrade(engine, url, to="0006")
    now = "2026-01-01 00:00:00"
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO devices (id, fingerprint, kind, arch, target, description, created_at) "
                             f"VALUES (1, 'f00d', 'cpu', 'znver4', '{{}}', '{{}}', '{now}')"))  # fmt: skip
        for jid, name, state in ((1, "race", "running"), (2, "race", "running"), (3, "race", "done"),
                                 (4, None, "running"), (5, None, "running"), (6, "other", "running")):  # fmt: skip
            conn.execute(sa.text(
                "INSERT INTO jobs (id, name, model, device_id, config, state, trials_done, trials_total, elapsed_sec, "
                "created_at, updated_at) VALUES (:id, :name, 'tiny', 1, '{}', :state, 0, 0, 0, :now, :now)"),
                {"id": jid, "name": name, "state": state, "now": now})  # fmt: skip
    engine.dispose()
    from tuner import cli

    assert cli.main(["db", "upgrade", "--db", db_url]) == 0
    engine = sa.create_engine(db_url)
    with engine.connect() as conn:
        states = dict(conn.execute(sa.text("SELECT id, state FROM jobs")).all())
    engine.dispose()
    assert states == {1: "stopped", 2: "running", 3: "done", 4: "running", 5: "running", 6: "running"}
