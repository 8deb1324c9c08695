"""The overnight job as a user runs it: real ``tune`` subprocesses killed with SIGKILL and
SIGINT at a random point and resumed by the same command, then a second job reusing the
first one's records."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
# The job ends on its trials cap well within the budget; step 4 checks that a budget stops it.
BUDGET_S = 900
# Enough that the interrupted run still has work left after its first batch: with 16, the
# batches already in flight when Ctrl-C came finished the job (exit 0) on a slow machine.
TRIALS = 32
# What a kill -9 leaves uncounted: at most the time since the last batch or heartbeat.
HEARTBEAT_SLACK_S = 25


def _env() -> dict[str, str]:
    env = os.environ | {"COLUMNS": "200", "NO_COLOR": "1"}
    env.pop("NIGHTSHIFT_DB", None)
    return env


def _tune(cwd: Path, *extra: str) -> subprocess.Popen:
    cmd = [str(BIN / "tune"), "--model", "tiny", "--time-budget", f"{BUDGET_S}s", "--trials", str(TRIALS),
           "--trials-per-batch", "4", "--db", "t.db", "--no-verify", "--log-json", "events.jsonl", *extra]  # fmt: skip
    # A session of its own, so the test can clean up the local Ray cluster a SIGKILL orphans.
    return subprocess.Popen(cmd, cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip


def _events(cwd: Path) -> list[dict]:
    path = cwd / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _wait_batches(proc: subprocess.Popen, cwd: Path, n: int, run: int, timeout: float = 1200) -> None:
    """Until run number ``run`` (1-based) has started and written ``n`` batches."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        evs = _events(cwd)
        starts = [i for i, e in enumerate(evs) if e["event"] == "job_start"]
        # Run `run`'s own job_start: until it writes one, the log's last start is the run before.
        if len(starts) >= run and sum(e["event"] == "batch_done" for e in evs[starts[run - 1]:]) >= n:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    raise AssertionError(f"no {n} batches within {timeout} s")


def _reap(proc: subprocess.Popen) -> None:
    """SIGKILL what is left of the run's session (its local Ray cluster)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


def _db(cwd: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(cwd / "t.db") as conn:
        return conn.execute(sql).fetchall()


def test_killed_interrupted_and_resumed_job(tmp_path):
    rng = random.Random()
    # 1. Killed with SIGKILL at a random point after its first batch is stored.
    walls: list[float] = []  # each run's process, start to exit: its counted time is within
    t0 = time.monotonic()
    proc = _tune(tmp_path)
    _wait_batches(proc, tmp_path, 1, run=1)
    # Soon after: on a quiet machine the whole job takes seconds.
    time.sleep(rng.uniform(0, 0.5))
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    walls.append(time.monotonic() - t0)
    _reap(proc)
    assert proc.returncode == -signal.SIGKILL
    ((state,),) = _db(tmp_path, "SELECT state FROM jobs")
    assert state == "running"  # it had no chance to say otherwise
    first_run = len(_db(tmp_path, "SELECT id FROM records"))
    assert first_run >= 1  # a task's first batch may be smaller than --trials-per-batch

    # 2. The same command resumes it at once (the killed process is gone; its heartbeat is
    # fresh); Ctrl-C stops it cleanly after a random delay.
    t0 = time.monotonic()
    proc = _tune(tmp_path)
    _wait_batches(proc, tmp_path, 1, run=2)
    time.sleep(rng.uniform(0, 0.5))
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    walls.append(time.monotonic() - t0)
    _reap(proc)
    assert proc.returncode == 130, out + err
    assert "Resume with:" in err and "--job tiny-cpu" in err, err
    assert "resuming job tiny-cpu" in err
    ((state, elapsed_2),) = _db(tmp_path, "SELECT state, elapsed_sec FROM jobs")
    assert state == "stopped"
    second_run = len(_db(tmp_path, "SELECT id FROM records"))
    assert second_run > first_run

    # 3. Resumed again: runs to the end of its budget or its trials.
    t0 = time.monotonic()
    proc = _tune(tmp_path)
    out, err = proc.communicate(timeout=600)
    walls.append(time.monotonic() - t0)
    _reap(proc)
    assert proc.returncode == 0, out + err

    jobs = _db(tmp_path, "SELECT id, name, state, elapsed_sec, time_budget_sec, trials_done FROM jobs")
    assert len(jobs) == 1, jobs  # one job, resumed twice, not three jobs
    job_id, name, state, elapsed, budget, trials_done = jobs[0]
    assert (name, state, budget) == ("tiny-cpu", "done", BUDGET_S)
    assert elapsed_2 <= elapsed <= BUDGET_S
    # No candidate measured twice: one record per point (record_key) and per program.
    rows = _db(tmp_path, "SELECT workload_id, device_id, program_hash, record_key, job_id FROM records")
    assert len(rows) == trials_done == TRIALS
    assert len({r[3] for r in rows}) == len(rows)
    assert len({r[:3] for r in rows}) == len(rows)
    assert {r[4] for r in rows} == {job_id}

    evs = _events(tmp_path)
    starts = [e for e in evs if e["event"] == "job_start"]
    assert [e["resumed"] for e in starts] == [False, True, True]
    assert starts[1]["trials_before"] == first_run and starts[2]["trials_before"] == second_run
    # Tuning time adds up across the runs: each run's span (first event to last) is in the
    # job's elapsed time, less what the kill -9 left uncounted; and it is no more than the
    # processes lived (the start-up before job_start counts, and takes long on a loaded machine).
    spans: list[float] = []
    for e in evs:
        if e["event"] == "job_start":
            spans.append(0.0)
            t0 = e["t"]
        spans[-1] = e["t"] - t0
    assert sum(spans) - HEARTBEAT_SLACK_S <= elapsed <= sum(walls), (spans, walls, elapsed)
    ends = [e for e in evs if e["event"] == "job_end"]
    assert [(e["state"], e["reason"]) for e in ends] == [("stopped", "interrupted"), ("done", "trials cap reached")]
    # The job's final best of every task is what the database holds for it.
    best_db = dict(_db(tmp_path, "SELECT w.name, min(r.mean_sec) FROM records r JOIN workloads w "
                                 "ON w.id = r.workload_id WHERE r.error_class IS NULL GROUP BY w.name"))  # fmt: skip
    best_job = {k: v for k, v in ends[-1]["best_sec"].items() if v is not None}
    assert best_job == pytest.approx(best_db, rel=1e-12)  # numpy's mean vs the database's sum/len
    assert {"batch_submitted", "batch_done"} <= {e["event"] for e in evs}

    # 4. Another job on the same database: tasks with good records are skipped by the printed
    # rule (skip-after 1); its one-second budget is spent before its first proposal.
    proc = subprocess.run([str(BIN / "tune"), "--model", "tiny", "--job", "again", "--time-budget", "1s",
                           "--db", "t.db", "--no-verify", "--skip-after", "1", "--quiet"], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr.count("from 1 job, best") == len(best_db), proc.stderr
    assert proc.stderr.count("; skipped (>= 1 good records)") == len(best_db), proc.stderr
    ((state, reason_trials),) = _db(tmp_path, "SELECT state, trials_done FROM jobs WHERE name = 'again'")
    assert (state, reason_trials) == ("done", 0)
    assert "time budget spent" in proc.stderr or "every task done" in proc.stderr, proc.stderr
