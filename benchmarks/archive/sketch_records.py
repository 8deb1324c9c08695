"""Replay every sketch-space record of a tuning database through the sketch space of this
code, and count, by how the record's build ended (ok, crashed, other error), which ones the
space now rejects and why (``search_spaces.sketch.vectorized_vectors`` among its checks).

Nothing is built or timed: each record's point is applied (TVM's postprocessors, then the
space's own checks). Writes benchmarks/archive/results/sketch_records.json (``--out``).

    .venv/bin/python benchmarks/archive/sketch_records.py --db /work/bench/bert-base_int8.db \
        --out benchmarks/archive/results/sketch_records_bert-base_int8_zen4.json
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

from sqlalchemy import select
from tvm.s_tir.meta_schedule.database import Workload

import search_spaces
from search_spaces.base import InvalidPointError, Point
from tuner.db import TuningDatabase
from tuner.db.schema import RecordRow, WorkloadRow
from tuner.device import parse_device

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1])]  # archive/, benchmarks/
from result_file import write_result

RESULTS = Path(__file__).parent / "results" / "sketch_records.json"


def _ending(error_class: str | None, message: str | None) -> str:
    if not error_class:
        return "built and ran"
    message = message or ""
    if "crashed" in message:
        return "build process crashed"
    return f"{error_class}: {message.splitlines()[0][:80]}" if message else error_class


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    target = parse_device("cpu").target
    db = TuningDatabase(args.db)
    spaces: dict[int, search_spaces.SearchSpace] = {}
    counts: collections.Counter[tuple[str, str, str]] = collections.Counter()
    stmt = (select(WorkloadRow.id, WorkloadRow.name, WorkloadRow.workload_json, RecordRow.point,
                   RecordRow.error_class, RecordRow.error_msg)
            .join(RecordRow, RecordRow.workload_id == WorkloadRow.id))  # fmt: skip
    with db.session(write=False) as session:
        rows = [r for r in session.execute(stmt) if json.loads(r.point).get("kind") == "sketch"]
    for wid, name, workload_json, point_json, error_class, error_msg in rows:
        if wid not in spaces:
            spaces[wid] = search_spaces.create(Workload.from_json(json.loads(workload_json)).mod, target, kind="sketch")
        point = json.loads(point_json)
        decisions = tuple(tuple(d) if isinstance(d, list) else d for d in point["decisions"])
        try:
            spaces[wid].apply(Point(point["sketch"], decisions))
            verdict = "passes"
        except InvalidPointError as err:
            verdict = f"rejected: {err}"
        counts[(name, _ending(error_class, error_msg), verdict)] += 1
    table = [{"task": t, "record": e, "now": v, "count": n} for (t, e, v), n in sorted(counts.items())]
    for row in table:
        print(f"{row['count']:5d}  {row['record']:<40.40}  {row['now']:<60.60}  {row['task'][:60]}")
    write_result(args.out, "sketch_records", {"db": args.db, "sketch_records": len(rows), "counts": table})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
