"""Jobs in the database on both backends: names, budgets, elapsed time, heartbeats, lookup by name."""

from datetime import UTC, datetime

import pytest
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


def _job(db: TuningDatabase, dev: int, model: str, name: str, config: dict) -> int:
    jid = db.start_job(model, dev, config, 64, name=name, time_budget_sec=8 * 3600.0)
    db.update_job(jid, trials_done=10, elapsed_sec=600.0, state="done", heartbeat=True)
    return jid


def test_jobs_and_db_jobs_are_one_table_in_80_columns(db_url, cpu_device, capsys, monkeypatch):
    """nightshift jobs and nightshift db jobs print the same table; at 80 columns no line is
    longer and a long name is cut with an ellipsis rather than wrapped."""
    from tuner import cli

    monkeypatch.setenv("COLUMNS", "80")
    db = TuningDatabase(db_url)
    dev = db.device_id(cpu_device)
    _job(db, dev, "torchvision:efficientnet_b0", "nightly-efficientnet-b0-on-the-team-cpu-box", {"device": "cpu"})
    _job(db, dev, "tiny", "short", {"device": "cpu"})
    db.close()
    assert cli.main(["jobs", "--db", db_url]) == 0
    listed = capsys.readouterr().out
    assert cli.main(["db", "jobs", "--db", db_url]) == 0
    assert capsys.readouterr().out == listed
    lines = listed.splitlines()
    assert max(len(line) for line in lines) <= 80
    header = next(line for line in lines if " name " in line)
    assert header.split() == ["id", "name", "model", "device", "state", "trials", "time", "alive"]
    rows = [line for line in lines if line.split() and line.split()[0].isdigit() and "jobs" not in line]
    assert len(rows) == 2 and "10/64" in rows[1] and "10m/8h" in rows[1] and "done" in rows[1]
    assert "nightly-" in rows[1] and "…" in rows[1] and "short" in rows[0]


def test_job_fills_the_model_options(tmp_path, cpu_device, capsys):
    """compile/bench --job NAME take the job's model, device and stored model options where the
    command line gives none; one it gives wins; an unknown job is a clear error."""
    from tuner.cli import build_parser
    from tuner.cli.common import fill_from_job
    from tuner.errors import UserInputError

    path = str(tmp_path / "t.db")
    db = TuningDatabase(path)
    dev = db.device_id(cpu_device)
    stored = {"model": "/models/net.onnx", "device": "cpu", "batch_size": 4, "precision": "bf16", "layout": "NCHWc",
              "seq_len": None}  # fmt: skip
    _job(db, dev, "net", "nightly", {"device": "cpu", "model_options": stored})
    _job(db, dev, "resnet50", "old", {"device": "cpu"})  # tuned before the options were kept
    db.close()
    parser = build_parser()
    args = parser.parse_args(["bench", "--db", path, "--job", "nightly", "--batch-size", "2"])
    fill_from_job(args)
    assert (args.model, args.device, args.batch_size, args.precision, args.layout, args.seq_len) == (
        "/models/net.onnx", "cpu", 2, "bf16", "NCHWc", None)  # fmt: skip
    assert "job nightly: --model /models/net.onnx" in capsys.readouterr().err
    args = parser.parse_args(["compile", "--db", path, "--job", "old", "-o", "x.so"])
    fill_from_job(args)
    assert (args.model, args.device, args.batch_size) == ("resnet50", "cpu", None)
    with pytest.raises(UserInputError, match=r"no job named 'nope'.*nightly"):
        fill_from_job(parser.parse_args(["compile", "--db", path, "--job", "nope", "-o", "x.so"]))
    with pytest.raises(UserInputError, match=r"no model: pass --model .* or --job NAME"):
        fill_from_job(parser.parse_args(["compile", "--db", path, "-o", "x.so"]))
