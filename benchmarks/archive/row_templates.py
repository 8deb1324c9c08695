"""The row templates' points (``x86-softmax``, ``x86-layer-norm``) against the best schedule a
tuning job found for the same task in the sketch space, timed interleaved in one process.

Takes the task (``--task``, a workload name such as BERT-base int8's
``fused_softmax_multiply3_tir_round3_maximum5_minimum5_multiply3``) and its best sketch
record from ``--db``, builds every point of the row template that applies to it, checks
each against that record's output on the same inputs (they must agree exactly: the same
arithmetic, in another loop order), and times them all in ``--rounds`` interleaved rounds
with TVM's ``time_evaluator``. Writes benchmarks/archive/results/row_templates.json (``--out``).

    .venv/bin/python benchmarks/archive/row_templates.py --db tuned.db \
        --task fused_softmax_multiply3_tir_round3_maximum5_minimum5_multiply3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import tvm
from rich.console import Console
from rich.table import Table
from sqlalchemy import select
from tvm.s_tir.meta_schedule.database import Workload

import search_spaces
from search_spaces.base import Point
from search_spaces.templates.x86_layer_norm import NAME as LAYER_NORM
from search_spaces.templates.x86_softmax import NAME as SOFTMAX
from tuner.measure.verify import arg_specs
from tuner.db import TuningDatabase
from tuner.db.schema import RecordRow, WorkloadRow
from tuner.device import parse_device

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1])]  # archive/, benchmarks/
from result_file import write_result

RESULTS = Path(__file__).parent / "results" / "row_templates.json"
console = Console()


def _task_and_best(db: TuningDatabase, name: str) -> tuple[tvm.IRModule, Point, float]:
    """The task ``name``'s module and its fastest sketch record (point, seconds)."""
    with db.session(write=False) as s:
        row = s.execute(select(WorkloadRow.workload_json, RecordRow.point, RecordRow.mean_sec)
                        .join(WorkloadRow, WorkloadRow.id == RecordRow.workload_id)
                        .where(WorkloadRow.name == name, RecordRow.mean_sec.is_not(None))
                        .order_by(RecordRow.mean_sec)).all()  # fmt: skip
    sketches = [(w, p, t) for w, p, t in row if json.loads(p).get("kind", "sketch") == "sketch"]
    if not sketches:
        raise SystemExit(f"{name}: no sketch record in the database")
    workload, point, seconds = sketches[0]
    return Workload.from_json(json.loads(workload)).mod, Point.from_json(point), seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True)
    p.add_argument("--task", required=True, help="workload name of a softmax or layer norm task")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    device = parse_device("cpu")
    device.use_threads()
    target = device.target
    mod, best, recorded = _task_and_best(TuningDatabase(args.db), args.task)
    kinds = [k for k in (SOFTMAX, LAYER_NORM) if k in search_spaces.applicable_kinds(mod, target)]
    if not kinds:
        raise SystemExit(f"{args.task}: neither {SOFTMAX} nor {LAYER_NORM} applies")
    template = search_spaces.create(mod, target, kind=kinds[0])
    schedules = {"sketch space, the job's best": search_spaces.create(mod, target).apply(best).mod}
    for point in template.enumerate():
        schedules[json.dumps(template.values(point))] = template.apply(point).mod
    dev = tvm.cpu()
    rng = np.random.default_rng(0)
    specs = arg_specs(mod)
    # The scores (the first argument) spread as BERT's are; the other inputs (scales) near 1.
    arrays = [tvm.runtime.tensor((rng.normal(0, 3, a.shape) if i == 0 else rng.uniform(0.5, 2, a.shape))
                                 .astype(a.dtype), dev) for i, a in enumerate(specs[:-1])]  # fmt: skip
    arrays.append(tvm.runtime.tensor(np.zeros(specs[-1].shape, specs[-1].dtype), dev))
    funcs, outputs = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, scheduled) in enumerate(schedules.items()):
            path = os.path.join(tmp, f"{i}.so")
            tvm.compile(scheduled, target=target).export_library(path)
            funcs[label] = tvm.runtime.load_module(path)
            funcs[label]["main"](*arrays)
            outputs[label] = arrays[-1].numpy().copy()
    reference = outputs["sketch space, the job's best"]
    times: dict[str, list[float]] = {label: [] for label in funcs}
    for _ in range(args.rounds):
        for label, f in funcs.items():
            times[label].append(min(f.time_evaluator("main", dev, number=50, repeat=3)(*arrays).results))
    base = statistics.median(times["sketch space, the job's best"])
    table = Table(title=f"{args.task}: {kinds[0]} against the sketch space's best ({args.rounds} rounds)")
    for col in ("schedule", "median ms", "x sketch best", "same output"):
        table.add_column(col)
    rows = []
    for label, t in times.items():
        same = bool(np.array_equal(outputs[label], reference))
        rows.append({"schedule": label, "median_ms": statistics.median(t) * 1e3, "runs_ms": [x * 1e3 for x in t],
                     "ratio": statistics.median(t) / base, "same_output": same})  # fmt: skip
        table.add_row(label, f"{statistics.median(t) * 1e3:.4f}", f"{statistics.median(t) / base:.2f}x", str(same))
    console.print(table)
    write_result(args.out, "row_templates", {
        "db": args.db, "task": args.task, "template": kinds[0], "recorded_best_ms": recorded * 1e3,
        "rounds": args.rounds, "load_before_after": os.getloadavg(), "rows": rows,
    })  # fmt: skip
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
