"""Every point of ``x86-conv2d-winograd`` on each Winograd task of a tuning database, timed.

A job's Winograd tasks are alternatives of direct convs (``--layout auto``): the scheduler
probes each with a few trials and gives it more only if it looks able to beat the direct
conv. This times the whole template space of each (it has 24-96 points), so a probe's best
can be set against the space's best. Each point is built and timed on the host's threads,
inputs random: warm with TVM's ``time_evaluator`` (20 runs, median of 5 repeats), or with
``--timing cold`` as a job times it (``TimingConfig.of_mode("cold")``: the caches flushed
before each of 10 one-call runs, median). ``--tasks`` keeps the tasks whose names contain
one of its strings. Writes benchmarks/results/winograd_sweep.json (``--out``).

    .venv/bin/python benchmarks/winograd_sweep.py --db /work/bench/resnet50_bf16.db \
        --out benchmarks/results/winograd_sweep_resnet50_bf16_zen4.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import tvm
from sqlalchemy import select
from tvm.s_tir.meta_schedule.database import Workload

from search_spaces import lowering
from search_spaces.template_space import TemplateSpace
from search_spaces.verify import arg_specs
from tuner.db import TuningDatabase
from tuner.db.schema import WorkloadRow
from tuner.device import parse_device
from tuner.measure.runner import TimingConfig, random_args

sys.path.insert(0, str(Path(__file__).parent))
from result_file import write_result

RESULTS = Path(__file__).parent / "results" / "winograd_sweep.json"
TEMPLATE = "x86-conv2d-winograd"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--timing", choices=("warm", "cold"), default="warm")
    p.add_argument("--tasks", nargs="*", default=None, help="substrings of the task names to sweep")
    args = p.parse_args()
    cold = TimingConfig.of_mode("cold")
    lowering.install()
    device = parse_device("cpu")
    device.use_threads()  # the target's num-cores threads, as a job times them (TVM's default: half)
    target = device.target
    dev = tvm.cpu(0)
    with TuningDatabase(args.db).session(write=False) as session:
        workloads = session.execute(select(WorkloadRow.name, WorkloadRow.workload_json, WorkloadRow.flops)
                                    .where(WorkloadRow.name.like("%winograd%"))).all()  # fmt: skip
    tasks = {}
    for name, workload_json, flops in workloads:
        if args.tasks and not any(t in name for t in args.tasks):
            continue
        mod = Workload.from_json(json.loads(workload_json)).mod
        space = TemplateSpace(mod, target, TEMPLATE)
        arrays = [tvm.runtime.tensor(a, dev) for a in random_args(arg_specs(mod), seed=0)]
        points = []
        for point in space.enumerate():
            values = dict(space.values(point))
            try:
                lib = tvm.compile(space.apply(point).mod, target=target)
                if args.timing == "cold":
                    runs = cold.evaluator(lib.mod, "main", dev, cold.repeat)(*arrays).results
                else:
                    runs = lib.mod.time_evaluator("main", dev, number=20, repeat=5)(*arrays).results
                points.append({"values": values, "ms": float(np.median(runs)) * 1e3})
            except Exception as err:  # a point that fails to build is a datum of the sweep
                points.append({"values": values, "ms": None, "error": f"{type(err).__name__}: {err}"[:200]})
        points.sort(key=lambda r: r["ms"] if r["ms"] is not None else float("inf"))
        tasks[name] = {"flops": flops, "points": points}
        best = [(tuple(r["values"][k] for k in ("tile_p", "tile_oc", "tile_ci", "pad_inline")), round(r["ms"], 3))
                for r in points[:5] if r["ms"] is not None]  # fmt: skip
        print(f"{name}: {len(points)} points; fastest (tile_p, tile_oc, tile_ci, pad_inline), ms: {best}", flush=True)
    write_result(args.out, "winograd_sweep",
                 {"db": args.db, "template": TEMPLATE, "timing": args.timing, "tasks": tasks})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
