"""benchmarks/time_to_quality.py run for real on the tiny model: two arms, each one job grown
through two budgets from an empty database, each point timed against the peers."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tvm
from bench_scripts import load_script
from tvm import te

from tuner.db import NewRecord, TuningDatabase
from tuner.device import Device
from tuner.graph.keys import workload_key

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "time_to_quality.py"


@pytest.mark.slow
def test_two_arms_grow_through_two_budgets(tmp_path):
    """Every (arm, budget) has a point, the trials grow with the budget and each point has the
    build's latency (and its ratio to the peer where ONNX Runtime is installed); the PNG is
    written where matplotlib is."""
    out = tmp_path / "ttq.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "NIGHTSHIFT_"))}
    env["NIGHTSHIFT_CACHE"] = os.environ["NIGHTSHIFT_CACHE"]  # the session's (tests/conftest.py), not ~/.cache
    # The inline measurer: four Ray start-ups would double the test's time.
    cmd = [sys.executable, str(SCRIPT), "--models", "tiny", "--seeds", "1", "--budgets", "4", "8",
           "--arms", "random", "evo-online", "--rounds", "3", "--measurer", "inline", "--settle", "0",
           "--workdir", str(tmp_path / "work"), "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    points = json.loads(out.read_text())["points"]
    assert sorted((p["arm"], p["budget"]) for p in points) == [
        ("evo-online", 4), ("evo-online", 8), ("random", 4), ("random", 8)]  # fmt: skip
    peer = importlib.util.find_spec("onnxruntime") is not None
    for arm in ("random", "evo-online"):
        curve = sorted((p for p in points if p["arm"] == arm), key=lambda p: p["budget"])
        assert [p["trials"] for p in curve] == [4, 8], curve
        assert curve[0]["tuning_min"] < curve[1]["tuning_min"], curve
        for p in curve:
            assert p["tune"]["exit_code"] == 0 and p["tvm_ms"] > 0, p
            assert not peer or p["ratio"] > 0, p
    if importlib.util.find_spec("matplotlib") is not None:
        assert out.with_suffix(".png").stat().st_size > 0


def test_warm_arm_seeds_once_and_counts_only_its_jobs_trials(tmp_path, cpu_device):
    """evo-warm's database starts with the warm databases' records of this CPU family, and its
    points count only the trials its own runs measured (``tune`` and the timing faked)."""
    a = te.placeholder((8,), name="a")
    mod = tvm.IRModule({"main": te.create_prim_func([a, te.compute((8,), lambda i: a[i] + 1, name="b")])})
    key = workload_key(mod)

    def records(db: TuningDatabase, device, job: int | None, points: list[str]) -> None:
        db.workload_id(key, "add", mod, 8.0)
        db.add_records(db.device_id(device), job, [
            NewRecord(workload_key=key, point=p, record_json="[[[], []], null, null, null]", run_secs=[1e-3])
            for p in points])  # fmt: skip

    warm = TuningDatabase(str(tmp_path / "warm.db"))
    records(warm, cpu_device, warm.start_job("other model", warm.device_id(cpu_device), {}, 3), ["w1", "w2", "w3"])
    alien = Device(kind="cpu", index=0, target_config=cpu_device.target_config | {"mcpu": "cortex-a72"},
                   description=cpu_device.description | {"model": "another architecture"})  # fmt: skip
    records(warm, alien, None, ["alien"])  # another family: not copied
    warm.close()

    workdir = tmp_path / "work"
    workdir.mkdir()
    asked: list[int] = []

    def fake_tune(source: str, options: list[str], workdir: Path, seq_len: int | None) -> dict:
        trials = int(options[options.index("--trials") + 1])
        asked.append(trials)
        db = TuningDatabase(str(workdir / "tuning.db"))
        dev = db.device_id(cpu_device)
        job = db.start_job("tiny", dev, {}, trials, name=options[options.index("--job") + 1])
        records(db, cpu_device, job, [f"{job}-{i}" for i in range(trials)])
        db.update_job(job, state="done", elapsed_sec=6.0)
        db.close()
        tasks = [{"workload_key": key}, {"workload_key": "not in the warm data"}]
        with (workdir / "events.jsonl").open("a") as f:
            f.write(json.dumps({"event": "job_start", "tasks": tasks}) + "\n")
        return {"exit_code": 0, "wall_s": 1.0, "error": None}

    ttq = load_script("time_to_quality")
    ttq.tune = fake_tune
    ttq.bench_in_child = lambda *_: (None, "not timed")
    args = argparse.Namespace(warm_db=[tmp_path / "warm.db"], measurer="inline", settle=0, rounds=1)
    points: list[dict] = []
    ttq.curve(("tiny", ttq.WARM, 0), "tiny", [2, 4], workdir, args, points, lambda: None)
    ttq.curve(("tiny", ttq.WARM, 0), "tiny", [2, 4, 7], workdir, args, points, lambda: None)  # resumed: no new seed

    assert asked == [2, 2, 3]
    assert [p["trials"] for p in points] == [2, 4, 7]
    assert [p["tuning_min"] for p in points] == [0.1, 0.2, 0.3]
    assert all((p["warm_records"], p["tasks"], p["tasks_in_warm"]) == (3, 2, 1) for p in points), points
    db = TuningDatabase(str(workdir / "tuning.db"), create=False)
    assert db.count_records() == 3 + 7
    db.close()
    assert ttq.ARMS[ttq.WARM] == ttq.ARMS["evo-pretrained"]


def test_a_resumed_file_keeps_its_earlier_runs():
    ttq = load_script("time_to_quality")
    first = {"command": "time_to_quality.py --models a", "models": {"a": "tiny"}, "arms": {"random": []},
             "budgets": [4], "points": [{"model": "a"}]}  # fmt: skip
    points, models, arms, budgets, commands = ttq.resumed(first)
    assert (points, models, arms, budgets) == ([{"model": "a"}], {"a": "tiny"}, {"random": []}, [4])
    assert commands == ["time_to_quality.py --models a"]
    second = first | {"command": "time_to_quality.py --resume --models b", "earlier_commands": commands}
    assert ttq.resumed(second)[4] == ["time_to_quality.py --models a", "time_to_quality.py --resume --models b"]
    assert ttq.resumed({}) == ([], {}, {}, [], [])
