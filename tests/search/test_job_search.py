"""Real jobs (builds and timings in this process, SQLite and PostgreSQL) searching with the
evolutionary strategy and Optuna: the second job seeds from the first one's records and never
measures a point again."""

from __future__ import annotations

import json
import logging

import pytest
import search_tasks  # tests/search is on sys.path (pytest's rootdir-relative "prepend" import mode)

from search_spaces import Point
from tuner.db import TuningDatabase
from tuner.job import TuneConfig, TuningJob, parse_record_point, record_point


def test_record_point_keeps_the_kind_and_reads_old_records():
    p = Point(1, ((2, 8), 3, -1))
    text = record_point("x86-conv2d-nchw", p)
    assert json.loads(text)["kind"] == "x86-conv2d-nchw"
    assert parse_record_point(text) == ("x86-conv2d-nchw", p.to_json())
    # Records written before spaces had kinds are sketch points.
    assert parse_record_point(p.to_json()) == ("sketch", p.to_json())
    with pytest.raises(ValueError):
        parse_record_point('{"decisions": []}')


def _records(db_path) -> list[tuple[int, str, str, float | None]]:
    import sqlite3

    with sqlite3.connect(db_path) as conn:
        return conn.execute("SELECT r.job_id, w.key, r.point, r.mean_sec FROM records r "
                            "JOIN workloads w ON w.id = r.workload_id ORDER BY r.id").fetchall()  # fmt: skip


def _hashes(db_path) -> list[str | None]:
    import sqlite3

    with sqlite3.connect(db_path) as conn:
        return [h for (h,) in conn.execute("SELECT program_hash FROM records ORDER BY id")]


def _bred_from(child: tuple[str, Point], parents: list[tuple[str, Point]]) -> bool:
    """A one-knob mutation of a parent, or a per-knob mix of two parents of its space and sketch."""
    kind, child = child
    same = [p for k, p in parents if k == kind and p.sketch == child.sketch]
    for a in same:
        if sum(x != y for x, y in zip(child.decisions, a.decisions, strict=True)) == 1:
            return True
        for b in same:
            if a != b and all(x in (y, z) for x, y, z in zip(child.decisions, a.decisions, b.decisions, strict=True)):
                return True
    return False


@pytest.fixture
def builtin_templates_only(monkeypatch):
    """Only the templates Nightshift ships: tests/search_spaces/conftest.py registers a user
    template for the matmul, which, when both suites run in one session, would split the
    matmul's few trials three ways; this test is about seeding, not about the split."""
    import search_spaces.templates.registry as registry

    registry.templates()  # entry points loaded first, so the filtered registry stays as it is
    shipped = {k: t for k, t in registry._REGISTRY.items()
               if t.schedule.__module__.startswith("search_spaces.templates")}
    monkeypatch.setattr(registry, "_REGISTRY", shipped)


@pytest.mark.slow
def test_second_job_seeds_from_the_first_and_never_remeasures(cpu_device, tmp_path,
                                                              builtin_templates_only, caplog):
    caplog.set_level(logging.INFO, logger="tuner.job")
    db_path = tmp_path / "t.db"
    db = TuningDatabase(f"sqlite:///{db_path}")
    tasks = [search_tasks.task("matmul"), search_tasks.task("conv")]
    first = TuningJob(tasks, cpu_device, db, TuneConfig(trials=8, batch_size=4, seed=0, measurer="inline"),
                      model_name="t")
    s1 = first.run()
    assert s1.trials == 8
    job1 = _records(db_path)
    assert len(job1) == 8

    second = TuningJob(tasks, cpu_device, db, TuneConfig(trials=8, batch_size=4, seed=0, measurer="inline"),
                       model_name="t")
    s2 = second.run()
    assert s2.trials == 8
    rows = _records(db_path)
    assert len(rows) == 16
    # Never measured twice: (workload, kind, point) is unique across both jobs, and so is
    # the program the point gives (equal programs from different knobs are skipped).
    keys = [(w, *parse_record_point(p)) for _, w, p, _ in rows]
    assert len(set(keys)) == len(keys)
    hashes = _hashes(db_path)
    assert len(hashes) == 16 and None not in hashes and len(set(hashes)) == 16

    # The second job's strategies were told every record of the first before proposing.
    matmul, conv = tasks[0].workload_key, tasks[1].workload_key
    told = second.searches[0].strategies[0].results
    first_ids = {parse_record_point(p)[1] for j, w, p, _ in job1 if w == matmul}
    assert first_ids <= set(told)
    # Its cost model started from them: pre-trained on the first job's records.
    assert any(r.name == "tuner.job" and r.getMessage().startswith("cost model pre-trained on")
               for r in caplog.records), "the second job did not pre-train its cost model"
    # Its proposals drew on them: a point of job 2 bred from a measured point of job 1 (a
    # one-knob mutation or a mix of two) is what the evolutionary strategy proposes when the
    # model ranks children first; with a model pre-trained on 8 noisy timings it may rank
    # fresh samples first, so this is reported, not asserted (see the strategy suite for
    # breeding itself, tests/search/test_strategies.py).
    parents = [(parse_record_point(p)[0], Point.from_json(p))
               for j, w, p, sec in job1 if w == matmul and sec is not None]
    children = [(parse_record_point(p)[0], Point.from_json(p))
                for j, w, p, _ in rows if j == s2.job_id and w == matmul]
    assert parents and children
    logging.getLogger(__name__).info("%d of %d matmul points of job 2 bred from job 1's",
                                     sum(_bred_from(c, parents) for c in children), len(children))

    # Both spaces of the conv were searched (the bandit gives each a first share), and the
    # records say which space each point belongs to.
    conv_kinds = {parse_record_point(p)[0] for _, w, p, _ in rows if w == conv}
    assert conv_kinds == {"sketch", "x86-conv2d-nchw"}
    db.close()


@pytest.mark.slow
def test_records_of_an_earlier_version_of_a_space_are_not_bred_from(cpu_device, tmp_path,
                                                                    builtin_templates_only):
    """A template that gained a knob (x86-conv2d-nchwc's tile_oc did) leaves records whose
    points have one decision fewer. A later job on the same database runs: the old points
    are not told to its search (an evolutionary population would breed wrong-sized points)."""
    import sqlite3

    db_path = tmp_path / "t.db"
    db = TuningDatabase(f"sqlite:///{db_path}")
    tasks = [search_tasks.task("conv")]
    first = TuningJob(tasks, cpu_device, db, TuneConfig(trials=8, batch_size=4, seed=0, measurer="inline"),
                      model_name="t")
    assert first.run().trials == 8
    with sqlite3.connect(db_path) as conn:
        rows = conn.execute("SELECT id, point FROM records").fetchall()
        for rid, text in rows:
            old = json.loads(text)
            old["decisions"] = old["decisions"][:-1]  # the point as the space before the knob wrote it
            conn.execute("UPDATE records SET point = ? WHERE id = ?", (json.dumps(old), rid))
    second = TuningJob(tasks, cpu_device, db, TuneConfig(trials=8, batch_size=4, seed=1, measurer="inline"),
                       model_name="t")
    s2 = second.run()
    assert s2.trials == 8
    for space, strategy in zip(second.searches[0].spaces, second.searches[0].strategies, strict=True):
        assert all(space.static_violation(Point.from_json(cid)) is None for cid in strategy.results)
    db.close()


def test_optuna_job_interrupted_and_resumed_keeps_one_study(cpu_device, db_url, builtin_templates_only):
    """An optuna-tpe job stopped with its second batch in flight (Ctrl-C: that batch is
    dropped) and resumed: one study per space, in the tuning database, whose trials the
    killed run left running are measured on resume as those trials; no point has two."""
    import optuna
    import sqlalchemy as sa

    from tuner.search.optuna_search import optuna_storage

    db = TuningDatabase(db_url)
    storage = optuna_storage(db_url)
    tasks = [search_tasks.task("matmul")]
    config = TuneConfig(trials=8, batch_size=4, seed=0, strategy="optuna-tpe", name="opt", measurer="inline")

    events: list[str] = []

    def ctrl_c_with_a_batch_in_flight(ev: dict) -> None:
        # A task's second batch is proposed once its first is done: stop right after that.
        events.append(ev["event"])
        if ev["event"] == "batch_submitted" and "batch_done" in events:
            raise KeyboardInterrupt

    first = TuningJob(tasks, cpu_device, db, config, model_name="t", on_event=ctrl_c_with_a_batch_in_flight)
    with pytest.raises(KeyboardInterrupt):
        first.run()
    studies = {s.study_name for s in optuna.get_all_study_summaries(storage)}
    assert studies and all(name.startswith(f"t/{cpu_device.fingerprint}/") for name in studies)
    left_running = {name: {t.number: t.user_attrs["nightshift_point"]
                           for t in optuna.load_study(study_name=name, storage=storage).trials
                           if t.state == optuna.trial.TrialState.RUNNING}
                    for name in studies}  # fmt: skip
    assert any(left_running.values()), "no batch was in flight at the interrupt"

    second = TuningJob(tasks, cpu_device, db, config, model_name="t")
    summary = second.run()
    assert second.resumed and summary.trials == 8
    engine = sa.create_engine(db_url)
    with engine.connect() as conn:
        jobs = conn.execute(sa.text("SELECT id, state FROM jobs")).all()
        points = [p for (p,) in conn.execute(sa.text("SELECT point FROM records"))]
        tables = set(sa.inspect(conn).get_table_names())
    engine.dispose()
    assert [state for _, state in jobs] == ["done"] and len(points) == 8
    assert "trials" in tables  # the studies are in the tuning database

    # The same studies (none made again), every trial finished, one trial per point.
    assert {s.study_name for s in optuna.get_all_study_summaries(storage)} == studies
    measured = {parse_record_point(p) for p in points}
    for name in studies:
        kind = name.split("/")[3]
        trials = optuna.load_study(study_name=name, storage=storage).trials
        assert all(t.state.is_finished() for t in trials)
        by_point = [t.user_attrs["nightshift_point"] for t in trials if "nightshift_point" in t.user_attrs]
        assert len(by_point) == len(set(by_point)), "a point got two trials"
        assert {cid for k, cid in measured if k == kind} <= set(by_point)
        # What was in flight at the interrupt was measured on resume, as the same trials.
        for number, cid in left_running[name].items():
            assert trials[number].user_attrs["nightshift_point"] == cid
            assert trials[number].state == optuna.trial.TrialState.FAIL or (kind, cid) in measured
    db.close()


def test_the_scheduler_option_reaches_the_job(cpu_device, tmp_path):
    """``--scheduler``: the job's task scheduler runs in the configured mode (nothing is tuned)."""
    db = TuningDatabase(f"sqlite:///{tmp_path / 't.db'}")
    tasks = [search_tasks.task("matmul")]
    for mode in ("gradient", "round-robin"):
        config = TuneConfig(trials=4, scheduler=mode, measurer="inline")
        assert TuningJob(tasks, cpu_device, db, config, model_name="t").scheduler.mode == mode


@pytest.mark.slow
def test_the_cost_model_arms_of_the_ablation(cpu_device, tmp_path, builtin_templates_only):
    """``--cost-model``: ``pretrained`` trains on the database's records before the first
    proposal, ``online`` starts untrained on the same database, ``none`` ranks at random and
    stores no model."""
    import cost_models

    db = TuningDatabase(f"sqlite:///{tmp_path / 't.db'}")
    tasks = [search_tasks.task("matmul")]
    runs = {}
    for arm in ("pretrained", "online", "none"):
        job = TuningJob(tasks, cpu_device, db, TuneConfig(trials=4, batch_size=4, seed=0, measurer="inline",
                                                          cost_model=arm, name=arm), model_name="t")  # fmt: skip
        before = cost_models.pretrain(db, job.device, max_records=None).num_samples
        job.run()
        runs[arm] = (before, job.model)
    assert runs["online"][0] > 0  # the database had records; the online arm did not start from them
    # Only this job's own labels: a failed candidate or an early-stopped probe (a lower bound,
    # not a label) leaves fewer than 4, the database's records would make it more.
    online = runs["online"][1]
    assert online.name == "xgb" and 0 < online.num_samples <= 4 and online.num_samples == online.num_labelled
    assert runs["pretrained"][1].name == "xgb"
    assert runs["none"][1].name == "random"
    with pytest.raises(Exception, match="cost-model must be one of"):
        TuningJob(tasks, cpu_device, db, TuneConfig(trials=4, cost_model="bogus", measurer="inline"), model_name="t")
