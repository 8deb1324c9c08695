"""Seeding a job from the other timing mode's records: the same job seeded and not, on copies
of one database.

    .venv/bin/python benchmarks/archive/seed_other_mode.py --db warm_tuned.db --model bert-base --timing cold --trials 448

``--db`` holds records of the model's tasks timed in the other mode than ``--timing`` (a
team database tuned warm before cold timing was the default, say). Each arm is a real job
(local Ray, this CPU) on its own copy of it, with the same seed and the same pre-trained cost
model: ``seeded`` measures each task's 8 fastest points per space of the other mode first
(``TuneConfig.seed_points``, the default), ``unseeded`` has ``seed_points=0`` and learns
from those records only through its cost model. The arms run one after the other,
``--order`` deciding which goes first. From the jobs' own events: the estimated model
latency (sum of weight x best over the tasks) after every batch once each task has a best,
and at the end. Writes benchmarks/archive/results/seed_other_mode_<model>.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

from rich.console import Console

from tuner.db import TuningDatabase
from tuner.device import parse_device
from tuner.frontends import load_model
from tuner.job import TuneConfig, tune_tasks
from tuner.graph.layout.plan import auto_layouts
from tuner.measure.base import MeasureConfig
from tuner.measure.ray_measure import connect
from tuner.measure.runner import TimingConfig
from tuner.reuse import SEED_POINTS
from tuner.graph.tasks import extract_layout_tasks

RESULTS = Path(__file__).parent / "results"
console = Console()


def curve(events: list[dict]) -> list[tuple[int, float]]:
    """``(trials done, estimated ms)`` after each batch once every task has a best."""
    [start] = [e for e in events if e["event"] == "job_start"]
    weight = {t["index"]: t["weight"] for t in start["tasks"]}
    best: dict[int, float] = {}
    out = []
    for e in events:
        if e["event"] == "batch_done" and e.get("task_best_sec"):
            best[e["task"]] = e["task_best_sec"]
            if len(best) == len(weight):
                out.append((e["trials_done"], 1e3 * sum(weight[i] * b for i, b in best.items())))
    return out


def run_arm(arm: str, tasks, device, args, src: Path, tmp: Path) -> dict:
    db_path = tmp / f"{arm}.db"
    shutil.copy(src, db_path)
    config = TuneConfig(trials=args.trials, seed=args.seed, name=f"seed-{arm}",
                        measure=MeasureConfig(timing=TimingConfig.of_mode(args.timing)),
                        seed_points=SEED_POINTS if arm == "seeded" else 0)  # fmt: skip
    events: list[dict] = []
    db = TuningDatabase(f"sqlite:///{db_path}")
    start = time.perf_counter()
    try:
        tune_tasks(tasks, device, db, config, model_name=args.model, on_event=events.append)
    finally:
        db.close()
    points = curve(events)
    seeded = sum(1 for t in next(e for e in events if e["event"] == "job_start")["tasks"]
                 if "fastest points" in (t.get("reuse_rule") or ""))  # fmt: skip
    result = {"arm": arm, "wall_s": round(time.perf_counter() - start, 1), "tasks_seeded": seeded,
              "final_estimate_ms": points[-1][1] if points else None,
              "first_complete": points[0] if points else None, "curve": points}  # fmt: skip
    console.print(f"{arm}: {result['final_estimate_ms']:.2f} ms estimated after {args.trials} trials "
                  f"({seeded} tasks seeded, {result['wall_s']} s)")
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", type=Path, required=True, help="SQLite file with the other mode's records")
    p.add_argument("--model", required=True)
    p.add_argument("--timing", choices=("warm", "cold"), default="cold", help="the jobs' timing mode")
    p.add_argument("--trials", type=int, default=448)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--order", nargs=2, default=["seeded", "unseeded"], choices=("seeded", "unseeded"))
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    connect()
    device = parse_device("cpu")
    layouts = auto_layouts(device.target)
    tasks = extract_layout_tasks(load_model(args.model).bound(), device.target, layouts, precision="fp32")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        arms = [run_arm(arm, tasks, device, args, args.db, Path(tmp)) for arm in args.order]
    out = args.out or RESULTS / f"seed_other_mode_{args.model}.json"
    doc = {"benchmark": "seed_other_mode", "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
           "host": platform.node(), "cpu": device.description, "db": str(args.db), "model": args.model,
           "timing": args.timing, "trials": args.trials, "tasks": len(tasks),
           "load_average_1_5_15min": {"before": load_before, "after": os.getloadavg()}, "arms": arms}  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
