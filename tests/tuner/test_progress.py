"""The progress a job's events add up to, and the views of it (no job needed: events are data)."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from tuner.progress import JobProgress, JsonLog, LiveView, event, preferred_plan


def _events() -> list[dict]:
    tasks = [
        {"name": "conv", "workload_key": "k1", "weight": 2, "flops": 2e9, "reuse": "warm",
         "reuse_rule": "40 records from 2 jobs, best 2 ms; warm start", "trials": 0, "best_sec": 2e-3},
        {"name": "dense", "workload_key": "k2", "weight": 1, "flops": 1e8, "reuse": "new", "reuse_rule": "",
         "trials": 0, "best_sec": None},
    ]  # fmt: skip
    start = event("job_start", job_id=7, name="r50", model="resnet50", device="cpu", resumed=True,
                  time_budget_s=3600.0, trials_cap=None, trials_before=10, elapsed_before_s=600.0, tasks=tasks)
    return [
        start,
        event("batch_done", task=0, trials=4, errors={}, best_sec=1e-3, trials_done=14, elapsed_s=660.0),
        event("batch_done", task=1, trials=4, errors={"build_error": 1}, best_sec=4e-4, trials_done=18,
              elapsed_s=720.0),
        event("batch_done", task=1, trials=4, errors={"run_timeout": 2}, best_sec=5e-4, trials_done=22,
              elapsed_s=780.0),
        event("task_done", task=1, reason="converged"),
    ]  # fmt: skip


def test_progress_adds_up():
    p = JobProgress()
    for ev in _events():
        p.apply(ev)
    conv, dense = p.tasks
    assert (conv.trials, conv.best_sec, conv.start_sec) == (4, 1e-3, 2e-3)
    assert (dense.trials, dense.best_sec, dense.start_sec, dense.errors, dense.done) == (8, 4e-4, 4e-4, 3,
                                                                                          "converged")  # fmt: skip
    assert conv.gflops == 2e9 / 1e-3 / 1e9
    # Start: the stored best of conv, the first best of dense; now: both bests.
    assert p.estimate_sec == (2 * 2e-3 + 4e-4, 2 * 1e-3 + 4e-4)
    assert p.errors == {"build_error": 1, "run_timeout": 2}
    assert p.trials_per_min == 12 / 180 * 60  # this run's trials over this run's time
    assert p.time_left_s == 3600 - 780


def test_layout_variants_of_one_conv_count_once_in_the_estimate():
    """Under ``--layout auto`` a conv is tuned in two layouts; the model runs one of them."""
    tasks = [{"name": f"conv_{lay}", "workload_key": f"k{n}", "weight": 3, "flops": 1e9, "choice": "c0",
              "trials": 0, "best_sec": None} for n, lay in enumerate(("nchw8c", "nchw"))]  # fmt: skip
    tasks.append({"name": "dense", "workload_key": "k9", "weight": 1, "flops": 1e8, "trials": 0, "best_sec": None})
    p = JobProgress()
    p.apply(event("job_start", job_id=1, name="j", model="m", device="cpu", resumed=False, tasks=tasks))
    for task, best, done in ((0, 2e-3, 4), (1, 5e-3, 8), (2, 1e-3, 12), (0, 1.5e-3, 16)):
        p.apply(event("batch_done", task=task, trials=4, errors={}, best_sec=best, trials_done=done, elapsed_s=done))
    assert p.estimate_sec == (3 * 2e-3 + 1e-3, 3 * 1.5e-3 + 1e-3)


def test_operators_of_one_layout_plan_count_only_in_the_preferred_plan():
    """A ``mean`` reading NCHW8c and one reading NCHW are one operator in two plans: the
    estimate counts the one of the plan whose conv variants are faster, never both."""
    tasks = [{"name": f"conv_{lay}", "workload_key": f"c{r}", "weight": 2, "flops": 1e9, "choice": "c0",
              "plans": [r], "trials": 0, "best_sec": None} for r, lay in enumerate(("nchw8c", "nchw"))]
    tasks += [{"name": f"mean_{lay}", "workload_key": f"m{r}", "weight": 1, "flops": 1e6, "plans": [r],
               "trials": 0, "best_sec": None} for r, lay in enumerate(("nchw8c", "nchw"))]
    tasks.append({"name": "dense", "workload_key": "d", "weight": 1, "flops": 1e8, "plans": [], "trials": 0,
                  "best_sec": None})
    p = JobProgress()
    p.apply(event("job_start", job_id=1, name="j", model="m", device="cpu", resumed=False, tasks=tasks))
    for task, best, done in ((0, 3e-3, 4), (1, 2e-3, 8), (2, 1e-4, 12), (3, 2e-4, 16), (4, 1e-3, 20)):
        p.apply(event("batch_done", task=task, trials=4, errors={}, best_sec=best, trials_done=done, elapsed_s=done))
    # The NCHW conv is faster: NCHW's mean counts, NCHW8c's does not.
    assert p.estimate_sec == pytest.approx((2 * 2e-3 + 2e-4 + 1e-3, 2 * 2e-3 + 2e-4 + 1e-3))
    assert preferred_plan((t.plans, t.choice, t.best_sec) for t in p.tasks) == 1
    p.apply(event("batch_done", task=0, trials=4, errors={}, best_sec=1e-3, trials_done=24, elapsed_s=24))
    assert p.estimate_sec[1] == pytest.approx(2 * 1e-3 + 1e-4 + 1e-3)


def test_json_log_and_line_view(tmp_path):
    log = JsonLog(tmp_path / "ev.jsonl")
    buf = io.StringIO()
    view = LiveView(Console(file=buf, width=160, force_terminal=False))
    for ev in _events():
        log(ev)
        view(ev)
    view(event("job_end", job_id=7, name="r50", state="done", reason="time budget spent", trials_done=22,
               elapsed_s=800.0, errors={}, best_sec={}))  # fmt: skip
    log.close()
    lines = [json.loads(x) for x in (tmp_path / "ev.jsonl").read_text().splitlines()]
    assert [x["event"] for x in lines] == ["job_start", "batch_done", "batch_done", "batch_done", "task_done"]
    text = buf.getvalue()
    assert "resuming job r50 (#7) after 10m00s and 10 trials" in text
    assert "conv : 40 records from 2 jobs, best 2 ms; warm start" in text
    assert "task dense done: converged" in text
    assert "estimate 4.400 -> 2.400 ms" in text


def test_quiet_view_prints_only_the_rules(tmp_path):
    buf = io.StringIO()
    view = LiveView(Console(file=buf, width=160, force_terminal=False), quiet=True)
    for ev in _events():
        view(ev)
    assert "warm start" in buf.getvalue() and "trials 14" not in buf.getvalue()
