"""Re-ranking each task's best records at the end of a real job (``tuner.rerank``): the
fastest records are built again, timed in interleaved rounds on this node and ranked by
those times."""

from __future__ import annotations

import json

import pytest
from job_tasks import matmul_task

from tuner.db import TuningDatabase
from tuner.errors import UserInputError
from tuner.job import TuneConfig, TuningJob


@pytest.mark.slow
def test_job_times_its_fastest_records_in_rounds_and_ranks_them_by_those_times(cpu_device, tmp_path):
    db = TuningDatabase(f"sqlite:///{tmp_path / 't.db'}")
    task = matmul_task(64)
    snapshot: dict[int, list[float]] = {}
    events: list[dict] = []

    def on_event(ev: dict) -> None:
        events.append(ev)
        if ev["event"] == "batch_done":  # the last one is the state the re-ranking starts from
            dev = db.find_device_id(cpu_device)
            snapshot.clear()
            snapshot.update({r.id: json.loads(r.run_secs) for r in db.best(task.workload_key, dev, k=3)})

    config = TuneConfig(trials=12, batch_size=4, rerank_top=3, rerank_rounds=5, measurer="inline")
    summary = TuningJob([task], cpu_device, db, config, model_name="m", on_event=on_event).run()
    dev = db.find_device_id(cpu_device)
    [reranked] = [e for e in events if e["event"] == "task_reranked"]
    assert [e["event"] for e in events[-2:]] == ["task_reranked", "job_end"]
    assert len(snapshot) == 3 and reranked["retimed"] >= 3
    stored_best = min(snapshot.items(), key=lambda kv: sum(kv[1]) / len(kv[1]))
    assert reranked["stored_sec"] == pytest.approx(sum(stored_best[1]) / len(stored_best[1]))
    rows = {r.id: r for r in db.best(task.workload_key, dev, k=12)}
    for record_id, old in snapshot.items():
        new = json.loads(rows[record_id].run_secs)
        assert len(new) == 5 and new != old, "every record of the top 3 has one median per round"
        assert json.loads(rows[record_id].record_json)[1] == new
        assert rows[record_id].mean_sec == pytest.approx(sum(new) / len(new))
    best = db.best(task.workload_key, dev)[0]
    assert len(json.loads(best.run_secs)) == 5, "the best is a record timed in the rounds"
    assert reranked["best_sec"] == best.mean_sec == summary.best_sec[task.workload_key]
    assert reranked["changed"] == (best.id != stored_best[0])
    assert summary.state == "done" and summary.trials == 12 and db.count_records(task.workload_key, dev) == 12
    db.close()


def test_rerank_options_are_checked():
    with pytest.raises(UserInputError, match="--rerank-top"):
        TuneConfig(trials=1, rerank_top=-1)
    with pytest.raises(UserInputError, match="rerank_rounds"):
        TuneConfig(trials=1, rerank_rounds=0)
    assert TuneConfig(trials=1).rerank_top == 0  # the library's default; tune asks for 4
