"""Jobs in the database on both backends: names, budgets, elapsed time, heartbeats, lookup by name."""

from datetime import UTC, datetime

from dbtest_utils import EMPTY_RECORD, add_mod

from tuner.db import NewRecord, TuningDatabase
from tuner.graph.keys import workload_key


def test_job_by_name_budget_and_heartbeat(db_url, cpu_device):
    db = TuningDatabase(db_url)
    dev = db.device_id(cpu_device)
    assert db.find_job("r50", dev) is None
    first = db.start_job("resnet50", dev, {}, 0, name="r50", time_budget_sec=3600.0)
    other = db.start_job("resnet50", dev, {}, 0, name="other")
    row = db.find_job("r50", dev)
    assert (row.id, row.state, row.time_budget_sec, row.elapsed_sec) == (first, "running", 3600.0, 0.0)
    assert row.heartbeat_at is not None
    before = row.heartbeat_at.replace(tzinfo=row.heartbeat_at.tzinfo or UTC)
    db.update_job(first, elapsed_sec=125.5, heartbeat=True, time_budget_sec=7200.0, trials_total=64,
                  config={"pid": 1}, state="stopped")  # fmt: skip
    row = db.find_job("r50")
    assert (row.state, row.elapsed_sec, row.time_budget_sec, row.trials_total, row.config) == (
        "stopped", 125.5, 7200.0, 64, '{"pid": 1}')  # fmt: skip
    assert row.heartbeat_at.replace(tzinfo=row.heartbeat_at.tzinfo or UTC) >= before
    assert row.heartbeat_at.replace(tzinfo=row.heartbeat_at.tzinfo or UTC) <= datetime.now(UTC)
    # The newest job of a name wins; another name or device is not found.
    again = db.start_job("resnet50", dev, {}, 0, name="r50")
    assert db.find_job("r50", dev).id == again
    assert db.find_job("r50", dev + 1000) is None
    assert db.find_job("other").id == other


def test_job_trials_count_its_records(db_url, cpu_device):
    db = TuningDatabase(db_url)
    mod = add_mod()
    key = workload_key(mod)
    db.workload_id(key, "add", mod, 8.0)
    dev = db.device_id(cpu_device)
    job = db.start_job("m", dev, {}, 4, name="j")
    rec = [NewRecord(workload_key=key, point=p, record_json=EMPTY_RECORD, run_secs=[1e-3]) for p in "abc"]
    db.add_records(dev, job, rec)
    db.add_records(dev, None, [NewRecord(workload_key=key, point="z", record_json=EMPTY_RECORD, run_secs=[1e-3])])
    assert db.job_trials(job) == 3
