"""nightshift jobs: every job with its state; a running job whose heartbeat stopped is dead."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from morning_job import TRIALS, run, tiny_job

# Each runs the command line in processes of its own: seconds each.
pytestmark = pytest.mark.slow


def _rows(stdout: str) -> dict[str, str]:
    """Table lines by job id (the first cell)."""
    out = {}
    for line in stdout.splitlines():
        cells = line.split()  # the table has no vertical rules: cells are apart by spaces
        if len(cells) > 2 and cells[0].isdigit() and cells[1] != "jobs":
            out[cells[0]] = line
    return out


def test_lists_the_real_job(tmp_path_factory):
    job = tiny_job(tmp_path_factory)
    proc = run("nightshift", "jobs", "--db", "t.db", cwd=job)
    assert proc.returncode == 0, proc.stderr
    line = _rows(proc.stdout)["1"]
    assert "tiny" in line and "done" in line and f"{TRIALS}/{TRIALS}" in line and "cpu" in line


def test_states_names_and_dead_jobs_on_both_backends(db_url, tmp_path):
    from tuner.db import TuningDatabase
    from tuner.db.schema import JobRow
    from tuner.device import parse_device
    from tuner.report import find_job, list_jobs

    db = TuningDatabase(db_url)
    device = db.device_id(parse_device("cpu"))
    now = datetime.now(UTC).replace(tzinfo=None)
    jobs = {}
    # (name, state, heartbeat age in minutes or None, trials done)
    for name, state, age, done in [("nightly", "done", None, 64), ("nightly", "running", 1, 10),
                                   ("killed", "running", 30, 7), (None, "failed", None, 3)]:  # fmt: skip
        jid = db.start_job("resnet50" if name else "tiny", device, {"device": "cpu"}, 64)
        with db.session() as s:
            row = s.get(JobRow, jid)
            row.name, row.state, row.trials_done, row.elapsed_sec = name, state, done, 60.0 * done
            row.heartbeat_at = None if age is None else now - timedelta(minutes=age)
        jobs[(name, state)] = jid
    listed = {j.id: j for j in list_jobs(db)}
    assert [j.id for j in list_jobs(db)] == sorted(listed, reverse=True)
    assert listed[jobs[("killed", "running")]].shown_state() == "dead"
    assert listed[jobs[("nightly", "running")]].shown_state() == "running"
    assert listed[jobs[("nightly", "done")]].shown_state() == "done"
    # A name finds the newest job of that name; an id finds that job; neither: a clear error.
    assert find_job(db, "nightly").id == jobs[("nightly", "running")]
    assert find_job(db, str(jobs[("nightly", "done")])).state == "done"
    from tuner.errors import UserInputError

    with pytest.raises(UserInputError, match=r"no job named 'nope'.*nightly"):
        find_job(db, "nope")
    db.close()

    proc = run("nightshift", "jobs", "--db", db_url, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = _rows(proc.stdout)
    assert len(rows) == 4
    dead = rows[str(jobs[("killed", "running")])]
    assert "dead" in dead and "killed" in dead and "7/64" in dead and "30m ago" in dead
    alive = rows[str(jobs[("nightly", "running")])]
    assert "running" in alive and "10/64" in alive and " 10m " in alive
    assert "failed" in rows[str(jobs[(None, "failed")])]
    # The report finds jobs by name on this backend too (a job without records: charts say so).
    proc = run("nightshift", "report", "--db", db_url, "--job", "killed", "-o", "r.html", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    html = (tmp_path / "r.html").read_text()
    assert "Nightshift job killed: resnet50" in html and 'class="state-dead">dead' in html


def test_empty_database(tmp_path):
    assert run("nightshift", "db", "init", "--db", "empty.db", cwd=tmp_path).returncode == 0
    proc = run("nightshift", "jobs", "--db", "empty.db", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "no jobs" in proc.stdout
