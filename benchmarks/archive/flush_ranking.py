"""Warm-cache timings against cold ones: would tuning with the caches flushed pick other schedules?

Nightshift times a candidate by calling it again and again on the same arguments, so its
weights stay in the caches; in the model each conv reads its weights once per inference,
from memory. For the ``--tasks`` heaviest tuned tasks of ``--model`` in ``--db``, the
``--top`` best records are built again and timed twice by the real Ray measurer, once as
tuning times them and once with every argument but the data flushed from the caches before
each run (``TimingConfig.flush_cache``, TVM's ``cache_flush_cpu_non_first_arg``, as
MetaSchedule's ``enable_cpu_cache_flush``). Per task: both times of each record, where the
warm best ranks cold, and how much slower cold the warm best is than the cold best. Writes
benchmarks/archive/results/flush_ranking.json (``--out``).

    .venv/bin/python benchmarks/archive/flush_ranking.py --db tuned.db --model resnet50 --tasks 8 --top 8
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tuner.db import TuningDatabase
from tuner.device import parse_device
from tuner.frontends import load_model
from tuner.graph.layout.plan import LayoutPlan
from tuner.measure.base import MeasureConfig
from tuner.measure.ray_measure import RayMeasurer, connect
from tuner.measure.runner import TimingConfig
from tuner.rerank import record_program
from tuner.graph.tasks import extract_tasks

console = Console()
RESULTS = Path(__file__).parent / "results" / "flush_ranking.json"
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1])]  # archive/, benchmarks/
from result_file import write_result  # noqa: E402


def scheduled(task, row):
    """The program a stored record makes of ``task``."""
    program = record_program(task, row.record_json)
    if program is None:
        raise ValueError(f"record {row.id} does not replay")
    return program


def median_ms(result) -> float | None:
    return 1e3 * statistics.median(result.run.run_secs) if result.run.ok and result.run.run_secs else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--layout", default="NCHWc", choices=["NCHW", "NHWC", "NCHWc"])
    p.add_argument("--tasks", type=int, default=8, help="heaviest tuned tasks (weight x best)")
    p.add_argument("--top", type=int, default=8, help="best records per task")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    device = parse_device("cpu")
    db = TuningDatabase(args.db)
    device_id = db.find_device_id(device)
    if device_id is None:
        raise SystemExit(f"{args.db} has no records of this CPU ({device.fingerprint})")
    tasks = extract_tasks(load_model(args.model).bound(), device.target, LayoutPlan.parse(args.layout, device.target))
    rows = {t.workload_key: db.best(t.workload_key, device_id, k=args.top) for t in tasks}
    tuned = [t for t in tasks if rows[t.workload_key] and rows[t.workload_key][0].mean_sec]
    tuned.sort(key=lambda t: -t.weight * rows[t.workload_key][0].mean_sec)
    connect(num_cpus=os.cpu_count())
    # No early stop: every record is timed in full both ways.
    warm_cfg, cold_cfg = (MeasureConfig(timing=dataclasses.replace(TimingConfig.of_mode(mode), hopeless_factor=0))
                          for mode in ("warm", "cold"))  # as tune --timing times them
    load_before = os.getloadavg()
    out = []
    for task in tuned[: args.tasks]:
        mods = [scheduled(task, r) for r in rows[task.workload_key]]
        with RayMeasurer(device, warm_cfg) as m:
            warm = [median_ms(r) for r in m.measure(task, mods)]
        with RayMeasurer(device, cold_cfg) as m:
            cold = [median_ms(r) for r in m.measure(task, mods)]
        ok = [i for i in range(len(mods)) if warm[i] and cold[i]]
        if not ok:
            continue
        warm_best = min(ok, key=lambda i: warm[i])
        cold_best = min(ok, key=lambda i: cold[i])
        entry = {
            "task": task.name, "workload_key": task.workload_key, "weight": task.weight, "gflop": task.flops / 1e9,
            "records": [{"record_id": r.id, "stored_ms": 1e3 * r.mean_sec, "warm_ms": warm[i], "cold_ms": cold[i]}
                        for i, r in enumerate(rows[task.workload_key])],
            "warm_best": warm_best, "cold_best": cold_best,
            "cold_rank_of_warm_best": sorted(ok, key=lambda i: cold[i]).index(warm_best) + 1,
            "cold_over_warm_of_warm_best": cold[warm_best] / warm[warm_best],
            "warm_best_cold_over_cold_best": cold[warm_best] / cold[cold_best],
        }  # fmt: skip
        out.append(entry)
        console.print(f"{task.name} (x{task.weight}): warm best {warm[warm_best]:.3f} ms, "
                      f"cold {cold[warm_best]:.3f} ms; cold best {cold[cold_best]:.3f} ms "
                      f"(record {cold_best + 1} of {len(ok)})")  # fmt: skip
    table = Table(title=f"{args.model}: the warm best record against the cold best, per task")
    for col in ("task", "calls", "warm best ms", "its cold ms", "cold / warm", "cold rank", "vs cold best"):
        table.add_column(col, justify="left" if col == "task" else "right")
    for e in out:
        wb = e["records"][e["warm_best"]]
        table.add_row(e["task"], str(e["weight"]), f"{wb['warm_ms']:.3f}", f"{wb['cold_ms']:.3f}",
                      f"{e['cold_over_warm_of_warm_best']:.2f}", str(e["cold_rank_of_warm_best"]),
                      f"{e['warm_best_cold_over_cold_best']:.3f}")  # fmt: skip
    console.print(table)
    # What the model would gain per inference by taking each task's cold best instead.
    gain = sum(e["weight"] * (e["records"][e["cold_best"]]["cold_ms"] - e["records"][e["warm_best"]]["cold_ms"])
               for e in out)
    console.print(f"taking the cold best of these tasks would change the model's cold time by {gain:+.3f} ms")
    write_result(args.out, "flush_ranking", {
        "machine": {"cpu": device.description.get("model", platform.processor()), "target": str(device.target),
                    "load_before": load_before, "load_after": os.getloadavg()},
        "model": args.model, "db": args.db, "tasks": out, "cold_best_gain_ms": gain,
    })  # fmt: skip
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
