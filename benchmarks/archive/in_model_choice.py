"""Would a heavy task's second or third record run the model faster than its first?

A job ranks each task's records by their own timing (cold on a CPU, then re-ranked in
interleaved rounds), the function alone. Inside the model a function meets other caches
(its input just written by the previous function, half of it by the other core), so the
order could differ there. This measures what choosing in the model would buy, without
changing the database: for the ``--tasks`` heaviest tasks (weight x best time), each of the next ``--candidates - 1``
records within ``--within`` of the best is forced by a copy of the SQLite database without
the records faster than it, the model is compiled from each copy, and every build runs in
the same interleaved rounds as the database's own build. Then the per-task winners (those
whose build ran faster than the database's by more than ``--margin`` at the median) are
combined into one copy and that build is timed against the database's in fresh rounds.
Writes benchmarks/archive/results/in_model_choice.json (``--out``). On a Zen 5 (2026-11-27) no forced
record of BERT-base's or ResNet-50's bf16 databases beat the database's own pick beyond the
noise (benchmarks/archive/README.md).

    .venv/bin/python benchmarks/archive/in_model_choice.py --db bert_bf16.db --model bert-base --precision bf16
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tuner.bench import TvmRunner
from tuner.app.plan import measured_plan
from tuner.compile import compile_model
from tuner.db import TuningDatabase
from tuner.device import parse_device
from tuner.frontends import load_model
from tuner.graph.layout.plan import LayoutPlan
from tuner.graph.tasks import extract_tasks

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1])]  # archive/, benchmarks/
from result_file import machine, write_result

console = Console()
RESULTS = Path(__file__).parent / "results" / "in_model_choice.json"


def forced_copy(src: Path, dst: Path, drops: list[tuple[str, float, str]]) -> None:
    """A copy of the SQLite database ``src`` without, for each (workload key, seconds, timing
    mode), the workload's successful records of that mode faster than ``seconds``: the
    record timed at ``seconds`` becomes the workload's best."""
    shutil.copyfile(src, dst)
    with sqlite3.connect(dst) as c:
        for key, sec, timing in drops:
            c.execute("DELETE FROM records WHERE workload_id = (SELECT id FROM workloads WHERE key = ?) "
                      "AND error_class IS NULL AND timing = ? AND mean_sec < ?", (key, timing, sec))  # fmt: skip


def interleaved(runners: dict[str, TvmRunner], inputs, rounds: int) -> dict[str, list[float]]:
    """Seconds per run of each build, the builds in turn within every round (alternating
    direction, so none always follows the same one)."""
    for r in runners.values():
        r.run(inputs)
    out: dict[str, list[float]] = {k: [] for k in runners}
    names = list(runners)
    for i in range(rounds):
        for k in names if i % 2 == 0 else reversed(names):
            t0 = time.perf_counter()
            runners[k].run(inputs)
            out[k].append(time.perf_counter() - t0)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True, type=Path, help="a SQLite tuning database (it is only read)")
    p.add_argument("--model", default="bert-base")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "int8"])
    p.add_argument("--tasks", type=int, default=4, help="the heaviest tasks to try other records of")
    p.add_argument("--candidates", type=int, default=3, help="records per task, the best included")
    p.add_argument("--within", type=float, default=0.10, help="only records within this of the best's time")
    p.add_argument("--margin", type=float, default=0.005, help="a forced record must beat the database's build by this")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    device = parse_device("cpu")
    spec = load_model(args.model)
    db = TuningDatabase(str(args.db))
    device_id = db.find_device_id(device)
    if device_id is None:
        raise SystemExit(f"{args.db} has no records of this device")
    chosen = measured_plan(spec, device, db, args.precision)
    plan = chosen.plan if chosen else LayoutPlan.for_target(device.target)
    # extract_tasks applies the precision itself (twice would find no QDQ chain left for int8).
    tasks = extract_tasks(spec.bound(), device.target, plan, precision=args.precision)
    heavy = []
    for t in tasks:
        best = db.best(t.workload_key, device_id, k=args.candidates)
        if best and best[0].mean_sec:
            heavy.append((t.weight * best[0].mean_sec, t, best))
    heavy.sort(key=lambda h: -h[0])
    load_before = os.getloadavg()
    inputs = spec.random_inputs()

    def build(path: Path, label: str) -> TvmRunner:
        compiled = compile_model(spec, device, TuningDatabase(str(path)), plan=plan, precision=args.precision)
        return TvmRunner(compiled, device, label, args.precision)

    with tempfile.TemporaryDirectory() as tmp:
        runners = {"database": build(args.db, "database")}
        variants: dict[str, dict] = {}
        for _, task, best in heavy[: args.tasks]:
            for rank, rec in enumerate(best[1:], start=2):
                if rec.mean_sec > best[0].mean_sec * (1 + args.within):
                    break
                name = f"{task.name}#{rank}"
                path = Path(tmp) / f"v{len(variants)}.db"
                forced_copy(args.db, path, [(task.workload_key, rec.mean_sec, rec.timing)])
                runners[name] = build(path, name)
                variants[name] = {"task": task.name, "weight": task.weight, "rank": rank, "record_id": rec.id,
                                  "timed_sec": rec.mean_sec, "best_sec": best[0].mean_sec,
                                  "drop": (task.workload_key, rec.mean_sec, rec.timing)}  # fmt: skip
        console.print(f"{len(variants)} forced records of the {args.tasks} heaviest tasks; "
                      f"{args.rounds} interleaved rounds of {len(runners)} builds")  # fmt: skip
        first = interleaved(runners, inputs, args.rounds)
        base = statistics.median(first["database"])
        table = Table(title=f"{args.model} {args.precision}: each forced record's build against the database's")
        for col in ("task", "rank", "as timed (x best)", "model ms", "x database"):
            table.add_column(col, justify="left" if col == "task" else "right")
        for name, v in variants.items():
            v["model_ms"] = 1e3 * statistics.median(first[name])
            v["x_database"] = statistics.median(first[name]) / base
            table.add_row(v["task"], str(v["rank"]), f"{v['timed_sec'] / v['best_sec']:.3f}", f"{v['model_ms']:.2f}",
                          f"{v['x_database']:.3f}")  # fmt: skip
        console.print(table)
        console.print(f"database's build: {1e3 * base:.2f} ms")
        winners: dict[str, str] = {}
        for name, v in variants.items():
            if v["x_database"] < 1 - args.margin and (v["task"] not in winners
                                                      or v["x_database"] < variants[winners[v["task"]]]["x_database"]):
                winners[v["task"]] = name
        second = None
        if winners:
            path = Path(tmp) / "combined.db"
            forced_copy(args.db, path, [variants[n]["drop"] for n in winners.values()])
            pair = {"database": runners["database"], "combined": build(path, "combined")}
            second = interleaved(pair, inputs, args.rounds)
            ms = {k: 1e3 * statistics.median(v) for k, v in second.items()}
            console.print(f"combined ({', '.join(winners.values())}): {ms['combined']:.2f} ms against the "
                          f"database's {ms['database']:.2f}: {ms['combined'] / ms['database']:.3f}x")  # fmt: skip
        else:
            console.print("no forced record beat the database's build by the margin")
    for v in variants.values():
        v.pop("drop")
    write_result(args.out, "in_model_choice", {
        "model": args.model, "precision": args.precision, "db": str(args.db), "rounds": args.rounds,
        "machine": machine(device, load_before), "database_ms": 1e3 * base, "variants": variants,
        "winners": winners,
        "combined": None if second is None else {k: [1e3 * s for s in v] for k, v in second.items()},
        "combined_x_database": None if second is None else
        statistics.median(second["combined"]) / statistics.median(second["database"]),
    })  # fmt: skip
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
