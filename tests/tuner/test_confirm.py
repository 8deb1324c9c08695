"""Confirming each task's best at the end of a real job (``tuner.confirm``): the fastest
records are timed again by the job's measurer and ranked by those times."""

from __future__ import annotations

import json

import pytest
from job_tasks import matmul_task

from tuner.db import TuningDatabase
from tuner.errors import UserInputError
from tuner.job import TuneConfig, TuningJob


def test_job_times_its_fastest_records_again_and_ranks_them_by_those_times(ray_cluster, cpu_device, tmp_path):
    db = TuningDatabase(f"sqlite:///{tmp_path / 't.db'}")
    task = matmul_task(64)
    snapshot: dict[int, list[float]] = {}
    events: list[dict] = []

    def on_event(ev: dict) -> None:
        events.append(ev)
        if ev["event"] == "batch_done":  # the last one is the state the confirmation starts from
            dev = db.find_device_id(cpu_device)
            snapshot.clear()
            snapshot.update({r.id: json.loads(r.run_secs) for r in db.best(task.workload_key, dev, k=3)})

    job = TuningJob([task], cpu_device, db, TuneConfig(trials=12, batch_size=4, confirm_top=3),
                    model_name="m", on_event=on_event)  # fmt: skip
    summary = job.run()
    dev = db.find_device_id(cpu_device)
    [confirmed] = [e for e in events if e["event"] == "task_confirmed"]
    assert [e["event"] for e in events[-2:]] == ["task_confirmed", "job_end"]
    assert len(snapshot) == 3 and confirmed["failed"] == 0 and confirmed["retimed"] >= 3
    stored_best = min(snapshot.items(), key=lambda kv: sum(kv[1]) / len(kv[1]))
    assert confirmed["stored_sec"] == pytest.approx(sum(stored_best[1]) / len(stored_best[1]))
    rows = {r.id: r for r in db.best(task.workload_key, dev, k=12)}
    for record_id, old in snapshot.items():
        new = json.loads(rows[record_id].run_secs)
        assert new != old, "every record of the top 3 is timed again"
        assert json.loads(rows[record_id].record_json)[1] == new
        assert rows[record_id].mean_sec == pytest.approx(sum(new) / len(new))
    best = db.best(task.workload_key, dev)[0]
    assert confirmed["best_sec"] == best.mean_sec == summary.best_sec[task.workload_key]
    assert confirmed["changed"] == (best.id != stored_best[0])
    assert summary.state == "done" and summary.trials == 12 and db.count_records(task.workload_key, dev) == 12
    db.close()


def test_confirm_top_is_checked():
    with pytest.raises(UserInputError, match="--confirm-top"):
        TuneConfig(trials=1, confirm_top=-1)
    assert TuneConfig(trials=1).confirm_top == 4
