"""Best latency after N trials: search strategies compared on one conv task, several seeds.

    python benchmarks/search_strategies.py --trials 32 --seeds 0 1 2 --strategies evolutionary random

Each run is a real job (Ray builds and timings on this machine) on a fresh SQLite file, so
no run seeds from another's records. The task is ResNet-50's 3x3 64->64 conv on 28x28 (+bias
+relu), small enough for a 2-core machine; both of its spaces (TVM's sketches and the x86
template) are searched, split by the job's bandit. Runs are interleaved by seed, so a change
in the machine's load touches every strategy alike. Writes benchmarks/results/search_strategies.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

import tvm
from tvm import te, topi

from tuner.db import TuningDatabase
from tuner.device import parse_device
from tuner.graph.keys import workload_key
from tuner.graph.tasks import Task
from tuner.job import TuneConfig, tune_tasks
from tuner.measure.ray_measure import connect

RESULTS = Path(__file__).parent / "results" / "search_strategies.json"


def conv_task() -> Task:
    data = te.placeholder((1, 64, 28, 28), name="data")
    weight = te.placeholder((64, 64, 3, 3), name="weight")
    bias = te.placeholder((1, 64, 1, 1), name="bias")
    conv = topi.nn.conv2d_nchw(data, weight, stride=1, padding=1, dilation=1)
    out = topi.nn.relu(topi.add(conv, bias))
    mod = tvm.IRModule({"main": te.create_prim_func([data, weight, bias, out])})
    return Task("conv3x3_64_28", mod, 1, 2.0 * 64 * 28 * 28 * 64 * 9, workload_key(mod))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--strategies", nargs="+", default=["evolutionary", "random"])
    p.add_argument("--keep", type=Path, default=None, help="keep each run's SQLite file in this folder")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    connect(num_cpus=2)
    device = parse_device("cpu")
    task = conv_task()
    runs = []
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        for strategy in args.strategies:
            with tempfile.TemporaryDirectory() as tmp:
                db = TuningDatabase(f"sqlite:///{args.keep or tmp}/{strategy}-{seed}.db")
                t0 = time.perf_counter()
                summary = tune_tasks([task], device, db, TuneConfig(trials=args.trials, batch_size=args.batch,
                                                                    seed=seed, strategy=strategy),
                                     model_name="bench")  # fmt: skip
                db.close()
            best = summary.best_sec.get(task.workload_key)
            runs.append({"strategy": strategy, "seed": seed, "best_ms": best * 1e3 if best else None,
                         "gflops": task.flops / best / 1e9 if best else None, "errors": summary.errors,
                         "wall_s": time.perf_counter() - t0})  # fmt: skip
            print(json.dumps(runs[-1]), flush=True)
    table = {}
    for strategy in args.strategies:
        got = [r["best_ms"] for r in runs if r["strategy"] == strategy and r["best_ms"]]
        table[strategy] = {"best_ms": got, "median_ms": statistics.median(got) if got else None}
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"task": task.name, "gflop": task.flops / 1e9, "trials": args.trials,
                                   "batch": args.batch, "device": device.name, "runs": runs,
                                   "summary": table}, indent=1))  # fmt: skip
    print(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
