"""Re-rank each task's best records by timing them interleaved, and write a database copy.

A job times each candidate once, at whatever moment its turn comes; on a host whose speed
for a kernel flips 1.3-1.6x from one second to the next (``host_states.py``) the stored
best is often the record that met a fast moment. Here the ``--top`` best records of the
``--tasks`` heaviest tuned tasks are built as the job builds them and timed in rounds, one
cold timing (as ``tune --timing cold``) of each record per round, ``--rounds`` rounds: every
record meets the same moments. Each record's ``mean_sec`` in a copy of the database
(``--out-db``) becomes the mean of its rounds' medians (:meth:`TuningDatabase.retime`), so
``nightshift compile`` (and ``db_ab.py``) take the record that is fastest across moments.
The original is not touched.
The timing is ``tuner.rerank``'s, which ``tune`` runs at the end of a job (``--rerank-top``);
this script applies it to a finished database, to measure what it changes in the model.
Writes benchmarks/archive/results/interleaved_rerank.json (``--out``).

    .venv/bin/python benchmarks/archive/interleaved_rerank.py --db tuned.db --out-db reranked.db --tasks 12 --top 6
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import tvm
import tvm_ffi
from rich.console import Console

from tuner.measure.verify import arg_specs
from tuner.db import TuningDatabase
from tuner.measure.builder import build_candidate
from tuner.measure.runner import TimingConfig, random_args
from tuner.rerank import record_program, time_interleaved

console = Console()
RESULTS = Path(__file__).parent / "results" / "interleaved_rerank.json"
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1])]  # archive/, benchmarks/
from result_file import machine, write_result  # noqa: E402
from tuned_tasks import tuned_tasks  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True, help="SQLite tuning database (read only)")
    p.add_argument("--out-db", required=True, help="the re-ranked copy to write")
    p.add_argument("--model", default="resnet50")
    p.add_argument("--tasks", type=int, default=12, help="heaviest tuned tasks (weight x best)")
    p.add_argument("--top", type=int, default=6, help="best records per task")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    tuned = tuned_tasks(args.db, args.model, top=args.top)
    device, rows, timing = tuned.device, tuned.rows, TimingConfig.of_mode("cold")
    load_before = os.getloadavg()
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for task in tuned.tasks[: args.tasks]:
            libs, kept = [], []
            for row in rows[task.workload_key]:
                program = record_program(task, row.record_json)
                built = build_candidate(tvm.ir.save_json(program), dict(device.target.export())) if program else None
                if built is None or built.artifact is None:
                    continue
                path = Path(tmp) / f"{row.id}.so"
                path.write_bytes(built.artifact)
                libs.append(tvm_ffi.load_module(str(path)))
                kept.append(row)
            arrays = [tvm.runtime.tensor(a) for a in random_args(arg_specs(task.mod))]
            times = time_interleaved(libs, arrays, timing, args.rounds)
            records = [{"record_id": r.id, "stored_ms": 1e3 * r.mean_sec, "median_ms": 1e3 * statistics.median(t),
                        "min_ms": 1e3 * min(t), "rounds_ms": [1e3 * x for x in t]}
                       for r, t in zip(kept, times, strict=True)]  # fmt: skip
            pick = min(range(len(records)), key=lambda i: records[i]["median_ms"])
            entry = {"task": task.name, "weight": task.weight, "records": records, "pick": pick,
                     "stored_best_median_ms": records[0]["median_ms"],
                     "pick_median_ms": records[pick]["median_ms"]}  # fmt: skip
            out.append(entry)
            console.print(f"{task.name} (x{task.weight}): stored best {records[0]['stored_ms']:.3f} ms, "
                          f"interleaved medians " + " ".join(f"{r['median_ms']:.3f}" for r in records)
                          + f" -> pick {pick}")  # fmt: skip
    shutil.copyfile(args.db, args.out_db)
    copy = TuningDatabase(args.out_db)
    for e in out:
        for r in e["records"]:
            copy.retime(r["record_id"], [ms / 1e3 for ms in r["rounds_ms"]])  # as tune stores them
    copy.close()
    stored = sum(e["weight"] * e["stored_best_median_ms"] for e in out)
    picked = sum(e["weight"] * e["pick_median_ms"] for e in out)
    changed = sum(e["pick"] != 0 for e in out)
    console.print(f"these tasks per inference, interleaved medians: stored bests {stored:.3f} ms, "
                  f"picks {picked:.3f} ms; {changed} of {len(out)} tasks change their record")  # fmt: skip
    write_result(args.out, "interleaved_rerank", {
        "machine": machine(device, load_before),
        "model": args.model, "db": args.db, "out_db": args.out_db, "rounds": args.rounds, "tasks": out,
        "stored_bests_ms": stored, "picks_ms": picked,
    })  # fmt: skip
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
