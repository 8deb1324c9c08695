"""Per task of one or more tuning jobs: the best time the job measured, the space that found
it, and the trials it took, read from each job's ``tune --log-json`` file (its
``batch_done`` events). Jobs of one model side by side show which task a change moved.
Writes benchmarks/archive/results/job_log_tasks.json (``--out``).

    .venv/bin/python benchmarks/archive/job_log_tasks.py --log before=job1.jsonl --log after=job2.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1])]  # archive/, benchmarks/
from result_file import write_result

RESULTS = Path(__file__).parent / "results" / "job_log_tasks.json"


def tasks_of(path: Path) -> dict[str, dict]:
    """Task name -> best seconds, its space, trials, from a ``--log-json`` file."""
    out: dict[str, dict] = {}
    for line in path.read_text().splitlines():
        event = json.loads(line)
        if event.get("event") != "batch_done":
            continue
        task = out.setdefault(event["task_name"], {"best_ms": None, "space": None, "trials": 0})
        task["trials"] = event["task_trials"]
        best = event.get("best_sec")
        if best and (task["best_ms"] is None or best * 1e3 < task["best_ms"]):
            task["best_ms"], task["space"] = best * 1e3, event["space"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--log", action="append", required=True, help="LABEL=FILE, a tune --log-json file (repeatable)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    logs = dict(item.split("=", 1) for item in args.log)
    jobs = {label: tasks_of(Path(file)) for label, file in logs.items()}
    table = Table(title="best time per task (ms), space, trials")
    table.add_column("task")
    for label in jobs:
        table.add_column(label)
    names = sorted({n for tasks in jobs.values() for n in tasks})
    for name in names:
        cells = []
        for tasks in jobs.values():
            t = tasks.get(name)
            found = t is not None and t["best_ms"] is not None
            cells.append(f"{t['best_ms']:.3f} {t['space']} ({t['trials']})" if found else "-")
        table.add_row(name[:70], *cells)
    Console().print(table)
    write_result(args.out, "job_log_tasks", {"logs": logs, "jobs": jobs})


if __name__ == "__main__":
    main()
