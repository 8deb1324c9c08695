"""Proposal against measurement: how long proposing a batch takes beside how long the device
takes to consume one, in a real job.

    nice -n 5 .venv/bin/python benchmarks/archive/propose_pace.py --tasks 3 --trials 64 --propose-on driver cluster

Each run is a real job (Ray builds and timings on this machine, a fresh SQLite file) on the
heaviest ``--tasks`` conv tasks of ResNet-50 (default layout plan), or every task of
``--model tiny``. The job's own events carry the figures: ``batch_submitted.propose_s``
(lease wait, spaces built, the strategy's sample/apply/features/predict, hashing, the job's
feature extraction) and ``batch_done`` (``device_s``: the device actor's busy time for the
batch; ``build_s``: CPU-seconds of its builds; ``wait_s``: how long the job waited for it,
near 0 when proposing, not measuring, sets the pace). Writes
benchmarks/archive/results/propose_pace.json. ``--propose-on driver cluster`` runs the same job once
with proposals' TVM work in the driver and once in Ray tasks (``TuneConfig.propose_on``), one
after the other in one process.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from tuner.db import TuningDatabase
from tuner.device import parse_device
from tuner.job import TuneConfig, tune_tasks
from tuner.measure.ray_measure import connect
from tuner.graph.tasks import Task

RESULTS = Path(__file__).parent / "results" / "propose_pace.json"
PHASES = ("lease", "spaces", "sample", "apply", "features", "predict", "remote", "hash", "job_features", "submit",
          "total")  # fmt: skip


def model_tasks(model: str, n: int, device) -> list[Task]:
    """The ``n`` heaviest conv tasks of ``model`` (every task of ``tiny``)."""
    from tuner.frontends import load_model
    from tuner.graph.tasks import extract_tasks

    tasks = extract_tasks(load_model(model).bound(), device.target)
    if model == "tiny":
        return tasks
    return [t for t in tasks if "conv" in t.name][:n]


def run_job(tasks: list[Task], device, args, db_path: Path, propose_on: str) -> dict:
    events: list[dict] = []
    config = TuneConfig(trials=args.trials, batch_size=args.batch, seed=args.seed, name=f"pace-{args.seed}",
                        propose_on=propose_on)  # fmt: skip
    db = TuningDatabase(f"sqlite:///{db_path}")
    start = time.perf_counter()
    try:
        summary = tune_tasks(tasks, device, db, config, model_name=args.model, on_event=events.append)
    finally:
        db.close()
    wall = time.perf_counter() - start
    submitted = [e for e in events if e["event"] == "batch_submitted"]
    done = [e for e in events if e["event"] == "batch_done"]
    # A task's later batches: the strategy breeds and ranks with the model (the steady state).
    seen: set[int] = set()
    steady = []
    for e in submitted:
        if e["task"] in seen:
            steady.append(e)
        seen.add(e["task"])
    per_trial = {ph: sum(e["propose_s"].get(ph, 0.0) for e in submitted) / max(summary.trials, 1) for ph in PHASES}
    steady_per_trial = {ph: sum(e["propose_s"].get(ph, 0.0) for e in steady) / max(sum(e["trials"] for e in steady), 1)
                        for ph in PHASES}  # fmt: skip
    device_per_trial = sum(e["device_s"] for e in done) / max(summary.trials, 1)
    build_per_trial = sum(e["build_s"] for e in done) / max(summary.trials, 1)
    return {
        "propose_on": propose_on, "trials": summary.trials, "wall_s": wall, "tuning_s": summary.elapsed_s,
        "device_idle_fraction": summary.device_idle_fraction, "errors": summary.errors,
        "propose_s": sum(e["propose_s"]["total"] for e in submitted),
        "propose_s_per_trial": per_trial, "steady_propose_s_per_trial": steady_per_trial,
        "device_s_per_trial": device_per_trial, "build_cpu_s_per_trial": build_per_trial,
        "wait_s": sum(e["wait_s"] for e in done),
        "batches": [{"task": e["task"], "trials": e["trials"], **e["propose_s"]} for e in submitted],
        "done": [{k: e[k] for k in ("task", "trials", "device_s", "build_s", "wait_s")} for e in done],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet50")
    p.add_argument("--tasks", type=int, default=3)
    p.add_argument("--trials", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--propose-on", nargs="+", default=["cluster"], choices=["driver", "cluster"])
    p.add_argument("--keep", type=Path, default=None, help="keep each run's SQLite file in this folder")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    connect(num_cpus=2)
    device = parse_device("cpu")
    tasks = model_tasks(args.model, args.tasks, device)
    load_before = os.getloadavg()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for where in args.propose_on:
            runs.append(run_job(tasks, device, args, folder / f"pace-{where}.db", where))
    out = {
        "command": "benchmarks/archive/propose_pace.py " + " ".join(
            f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
            for k, v in vars(args).items() if k not in ("out", "keep")),
        "machine": {"cpu": platform.processor() or platform.machine(), "llvm_mcpu": device.target_config.get("mcpu"),
                    "cores": os.cpu_count(), "load_before": load_before, "load_after": os.getloadavg()},
        "tasks": [{"name": t.name, "flops": t.flops, "weight": t.weight} for t in tasks],
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, default=str))
    for run in runs:
        print(f"[{run['propose_on']}] {run['trials']} trials in {run['tuning_s']:.0f} s tuning, "
              f"device idle {run['device_idle_fraction']:.0%}, proposing {run['propose_s']:.0f} s")
        every, steady = run["propose_s_per_trial"], run["steady_propose_s_per_trial"]
        print("  per trial, all batches: " + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in every.items()))
        print("  per trial, later batches: " + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in steady.items()))
        print(f"  device busy per trial {run['device_s_per_trial'] * 1e3:.0f} ms, build CPU per trial "
              f"{run['build_cpu_s_per_trial'] * 1e3:.0f} ms, job waited {run['wait_s']:.0f} s for results")
        later = [b["total"] for b in run["batches"]][1:] or [0.0]
        print(f"  median proposal of a later batch {statistics.median(later):.2f} s")


if __name__ == "__main__":
    main()
