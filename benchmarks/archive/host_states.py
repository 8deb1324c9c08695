"""Does one record keep its time? The same build timed again and again, as the job times it.

``tune`` stores each candidate's median of one cold timing (10 single calls, weights and
output flushed, about 10-30 ms in all). If the machine's speed for a kernel changes from one
second to the next, a record's stored time says as much about the moment it was timed as
about the record. For ``--tasks`` (task names, or the N heaviest tuned tasks of ``--db``),
the stored best is built as the job builds it (``tuner.measure.builder``), loaded once, and
timed ``--series`` times back to back, exactly as :class:`~tuner.measure.runner.TimingConfig`
``of_mode("cold")`` times, alternating between arguments allocated once and arguments
allocated afresh for each timing (as the device actor allocates them): if both kinds move
together, the time follows the moment, not where the arguments lie.

Per record: its stored time, the series' minimum, median and maximum, the share of timings
more than 1.25x the minimum ("slow"), and the longest stretch of consecutive slow ones.
Writes benchmarks/archive/results/host_states.json (``--out``).

    .venv/bin/python benchmarks/archive/host_states.py --db tuned.db --model resnet50 --tasks 6 --series 40
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import tvm
import tvm_ffi
from rich.console import Console
from rich.table import Table

from tuner.measure.verify import arg_specs
from tuner.measure.builder import build_candidate
from tuner.measure.runner import TimingConfig, random_args

console = Console()
RESULTS = Path(__file__).parent / "results" / "host_states.json"
SLOW = 1.25
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1])]  # archive/, benchmarks/
from flush_ranking import scheduled  # noqa: E402
from result_file import machine, write_result  # noqa: E402
from tuned_tasks import tuned_tasks  # noqa: E402


def series(lib, host_args, n: int, timing: TimingConfig) -> list[dict]:
    """``n`` cold timings of ``lib``'s ``main``, alternating fixed and fresh arguments."""
    fixed = [tvm.runtime.tensor(a) for a in host_args]
    evaluator = lib.time_evaluator("main", tvm.cpu(), number=1, repeat=timing.repeat,
                                   f_preproc="cache_flush_cpu_non_first_arg")  # fmt: skip
    out = []
    start = time.perf_counter()
    for i in range(n):
        args = fixed if i % 2 == 0 else [tvm.runtime.tensor(a) for a in host_args]
        at = time.perf_counter() - start
        ms = 1e3 * statistics.median(evaluator(*args).results)
        out.append({"at_s": at, "args": "fixed" if i % 2 == 0 else "fresh", "ms": ms})
    return out


def longest_run(flags: list[bool]) -> int:
    best = run = 0
    for f in flags:
        run = run + 1 if f else 0
        best = max(best, run)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--tasks", nargs="+", default=["6"], help="task names, or one number: the N heaviest tuned")
    p.add_argument("--series", type=int, default=40, help="timings per record")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    tuned = tuned_tasks(args.db, args.model)
    device, timing = tuned.device, TimingConfig.of_mode("cold")
    if len(args.tasks) == 1 and args.tasks[0].isdigit():
        chosen = tuned.tasks[: int(args.tasks[0])]
    else:
        chosen = [t for t in tuned.tasks if t.name in args.tasks]
    load_before = os.getloadavg()
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for task in chosen:
            row = tuned.rows[task.workload_key][0]
            built = build_candidate(tvm.ir.save_json(scheduled(task, row)), dict(device.target.export()))
            if built.artifact is None:
                console.print(f"{task.name}: record {row.id} does not build: {built.error_msg}")
                continue
            path = Path(tmp) / f"{task.name}.so"
            path.write_bytes(built.artifact)
            lib = tvm_ffi.load_module(str(path))
            timings = series(lib, random_args(arg_specs(task.mod)), args.series, timing)
            ms = [t["ms"] for t in timings]
            slow = [m > SLOW * min(ms) for m in ms]
            by_args = {kind: [s for s, t in zip(slow, timings, strict=True) if t["args"] == kind]
                       for kind in ("fixed", "fresh")}  # fmt: skip
            entry = {"task": task.name, "weight": task.weight, "record_id": row.id, "stored_ms": 1e3 * row.mean_sec,
                     "min_ms": min(ms), "median_ms": statistics.median(ms), "max_ms": max(ms),
                     "slow_share": sum(slow) / len(slow), "longest_slow_run": longest_run(slow),
                     "slow_share_fixed": statistics.mean(by_args["fixed"]),
                     "slow_share_fresh": statistics.mean(by_args["fresh"]),
                     "series": timings}  # fmt: skip
            out.append(entry)
            console.print(f"{task.name} (record {row.id}): " + " ".join(f"{m:.2f}" for m in ms))
    table = Table(title=f"{args.model}: each task's stored best timed {args.series} times in a row (ms)")
    for col in ("task", "stored", "min", "median", "max", f"slow (>{SLOW}x min)", "fixed / fresh args",
                "longest slow stretch"):  # fmt: skip
        table.add_column(col, justify="left" if col == "task" else "right")
    for e in out:
        table.add_row(e["task"], f"{e['stored_ms']:.3f}", f"{e['min_ms']:.3f}", f"{e['median_ms']:.3f}",
                      f"{e['max_ms']:.3f}", f"{e['slow_share']:.0%}",
                      f"{e['slow_share_fixed']:.0%} / {e['slow_share_fresh']:.0%}",
                      str(e["longest_slow_run"]))  # fmt: skip
    console.print(table)
    write_result(args.out, "host_states", {
        "machine": machine(device, load_before),
        "model": args.model, "db": args.db, "slow_factor": SLOW, "records": out,
    })  # fmt: skip
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
