"""A model tuned with cold timings: every candidate timed with its weights and output flushed
from the CPU caches before each run (``TimingConfig.flush_cache``, as Ansor recommends for
whole networks), instead of called again and again on warm caches.

Runs a real tuning job (local Ray cluster, SQLite file ``--db``) on the model's tasks in one
layout; compare the database with a warm one through ``db_ab.py``. ``tune --timing cold``
does the same on every task of the model (``TimingConfig.of_mode``); this script keeps the
layout fixed and the repeat count open. Cold records are stored as such (``records.timing``)
and never ranked with warm ones.

    .venv/bin/python benchmarks/cold_tuning.py --model resnet50 --trials 2048 --db /tmp/cold.db
"""

from __future__ import annotations

import argparse
import logging

from rich.console import Console

from tuner.db import TuningDatabase
from tuner.device import parse_device
from tuner.frontends import load_model
from tuner.job import TuneConfig, tune_tasks
from tuner.layout import LayoutPlan
from tuner.measure.ray_measure import MeasureConfig, connect
from tuner.measure.runner import TimingConfig
from tuner.tasks import extract_tasks

console = Console()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--layout", default="NCHWc", choices=["NCHW", "NHWC", "NCHWc"])
    p.add_argument("--trials", type=int, default=2048)
    p.add_argument("--repeat", type=int, default=10, help="cold runs per timing (each one call)")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    device = parse_device("cpu")
    spec = load_model(args.model)
    tasks = extract_tasks(spec.bound(), device.target, LayoutPlan.parse(args.layout, device.target))
    connect()
    timing = TimingConfig(flush_cache=True, repeat=args.repeat)
    config = TuneConfig(trials=args.trials, measure=MeasureConfig(timing=timing), name=f"{spec.name}-cold")
    summary = tune_tasks(tasks, device, TuningDatabase(args.db), config, model_name=spec.name)
    console.print(f"{summary.trials} trials in {summary.elapsed_s:.0f} s, {summary.state}: {summary.reason}; "
                  f"failed {summary.errors or 'none'}")  # fmt: skip


if __name__ == "__main__":
    main()
