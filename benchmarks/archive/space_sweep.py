"""Correctness sweep: random points of every space kind on every task of three zoo models.

For every task of resnet50, mobilenet_v2 and bert-base on this CPU, and every space kind
that applies (the sketch space; the x86 conv template on convs), samples a few points,
builds each (``tvm.compile``, timed; over 30 s counts as a timeout), runs it on random
inputs and compares with the unscheduled build (tuner.measure's tolerance). Writes
benchmarks/archive/results/space_sweep.json.

    nice -n 10 .venv/bin/python benchmarks/archive/space_sweep.py --points 3
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np
import tvm

from tuner.measure.verify import sweep_tasks
from tuner.device import parse_device
from tuner.frontends import load_model
from tuner.graph.tasks import extract_tasks

logger = logging.getLogger("space_sweep")
RESULTS = Path(__file__).parent / "results" / "space_sweep.json"
TIMEOUT_S = 30.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=3, help="points per task and space kind")
    parser.add_argument("--models", nargs="*", default=["resnet50", "mobilenet_v2", "bert-base"])
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    device = parse_device("cpu")
    report: dict = {"benchmark": "space_sweep", "device": device.description, "points_per_task": args.points,
                    "tvm": tvm.__version__, "models": {}, "failures": []}
    start = time.perf_counter()
    total = {"points": 0, "build_failed": 0, "wrong": 0, "run_error": 0, "build_over_30s": 0,
             "elementwise_tolerance_misses": 0, "tasks": 0}
    builds: list[float] = []
    for model in args.models:
        tasks = extract_tasks(load_model(model).bound(), device.target)
        results = sweep_tasks(model, tasks, device.target, points=args.points)
        rows = []
        for r in results:
            counts = {
                "task": r.task, "kind": r.kind, "points": len(r.checks),
                "build_failed": sum(c.error == "build" for c in r.checks),
                "wrong": sum(c.error == "wrong" for c in r.checks),
                "elementwise_tolerance_misses": sum(not c.elementwise_ok and not c.error for c in r.checks),
                "run_error": sum(c.error == "run" for c in r.checks),
                "build_over_30s": sum(c.build_sec > TIMEOUT_S for c in r.checks),
                "build_max_s": max((c.build_sec for c in r.checks), default=0.0),
                "reference_error": r.reference_error,
            }
            rows.append(counts)
            builds += [c.build_sec for c in r.checks]
            for key in ("points", "build_failed", "wrong", "run_error", "build_over_30s",
                        "elementwise_tolerance_misses"):
                total[key] += counts[key]
            report["failures"] += [{"model": model, "task": r.task, "kind": r.kind, "point": c.point.to_json(),
                                    "error": c.error, "detail": c.detail} for c in r.checks if c.error]
            if r.reference_error:
                report["failures"].append({"model": model, "task": r.task, "error": "reference",
                                           "detail": r.reference_error})
        total["tasks"] += len(tasks)
        report["models"][model] = {"tasks": len(tasks), "rows": rows}
        logger.info("%s: %d tasks done", model, len(tasks))
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(report, indent=1))
    total["build_p50_s"] = float(np.percentile(builds, 50)) if builds else None
    total["build_p95_s"] = float(np.percentile(builds, 95)) if builds else None
    total["build_max_s"] = max(builds, default=None)
    total["wall_s"] = time.perf_counter() - start
    report["total"] = total
    RESULTS.write_text(json.dumps(report, indent=1))
    logger.info("total %s", json.dumps(total))


if __name__ == "__main__":
    main()
