"""Search-space throughput and build times, per space kind and target.

For three ResNet-50 conv tasks: valid points sampled per second (a sample is validated by
applying it, postprocessors included, and leaves that schedule cached), points applied per
second from a cold cache, and ``tvm.compile`` time p50/p95/max of sampled points for llvm
(this CPU) and CUDA sm_80 / sm_90 (build only; no GPU needed). A build over 30 s counts as
a timeout (MetaSchedule's LocalBuilder limit). Writes benchmarks/results/space_throughput.json.

    nice -n 10 .venv/bin/python benchmarks/space_throughput.py --points 16
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np
import tvm

import search_spaces
from tuner.device import parse_device
from tuner.frontends import load_model
from tuner.graph.tasks import extract_tasks

logger = logging.getLogger("space_throughput")
RESULTS = Path(__file__).parent / "results" / "space_throughput.json"
TIMEOUT_S = 30.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=16, help="points built per task, kind and target")
    parser.add_argument("--rate-points", type=int, default=64, help="points drawn to measure sampling rates")
    parser.add_argument("--targets", nargs="+", default=["llvm", "cuda-sm_80", "cuda-sm_90"],
                        help="targets to run (default: all)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    cpu = parse_device("cpu")
    targets = {
        "llvm": cpu.target,
        "cuda-sm_80": parse_device("cuda:0", target_arch="sm_80").target,
        "cuda-sm_90": parse_device("cuda:0", target_arch="sm_90").target,
    }
    targets = {name: targets[name] for name in args.targets}
    tasks = [t for t in extract_tasks(load_model("resnet50").bound(), cpu.target) if "conv2d" in t.name]
    tasks = [tasks[i] for i in (1, 2, 4)]
    report: dict = {"benchmark": "space_throughput", "device": cpu.description, "points": args.points,
                    "tvm": tvm.__version__, "rows": []}
    for tname, target in targets.items():
        for task in tasks:
            for kind in search_spaces.applicable_kinds(task.mod, target):
                t0 = time.perf_counter()
                space = search_spaces.create(task.mod, target, kind=kind)
                create_sec = time.perf_counter() - t0
                rng = np.random.default_rng(0)
                t0 = time.perf_counter()
                points = [space.sample(rng) for _ in range(args.rate_points)]
                sample_sec = time.perf_counter() - t0
                space._cache.clear()  # time apply from scratch
                t0 = time.perf_counter()
                for p in points:
                    space.apply(p)
                apply_sec = time.perf_counter() - t0
                builds, failed = [], 0
                for p in points[: args.points]:
                    t0 = time.perf_counter()
                    try:
                        tvm.compile(space.apply(p).mod, target=space.target)
                    except Exception as err:  # a failed build is counted, not raised
                        failed += 1
                        logger.warning("build failed: %s", str(err)[:200])
                    builds.append(time.perf_counter() - t0)
                row = {
                    "target": tname, "task": task.name, "kind": kind, "size": space.size(),
                    "create_s": create_sec,
                    "sampled_per_s": args.rate_points / sample_sec,
                    "applied_per_s": args.rate_points / apply_sec,
                    "build_p50_s": float(np.percentile(builds, 50)),
                    "build_p95_s": float(np.percentile(builds, 95)),
                    "build_max_s": float(max(builds)),
                    "builds": len(builds), "build_failed": failed,
                    "build_over_30s": sum(b > TIMEOUT_S for b in builds),
                }
                logger.info("%s", json.dumps(row))
                report["rows"].append(row)
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
