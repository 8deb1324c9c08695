"""A job killed with SIGKILL and resumed against the same job left alone, at equal time budget.

    python benchmarks/overnight_resume.py --model resnet50 --budget 45m --kills 2
    python benchmarks/overnight_resume.py --model tiny --budget 2m --kills 1 --out /tmp/t.json  # smoke

Two real ``tune`` commands (subprocesses, local Ray, each on a fresh SQLite file, so neither
seeds from the other): the uninterrupted one runs its budget out; the interrupted one is
killed with SIGKILL when its tuning time reaches 1/(kills+1), 2/(kills+1), ... of the budget
(read from its ``--log-json`` events) and rerun with the same command each time. Reported:
the trials each got, the trials lost to the kills (proposed and sent to be measured, never
stored: at most the batches in flight), the tuning time each spent, and the estimated
end-to-end latency (sum of weight x best per operator, a conv's layout variants counted once
at the faster) at the end of each. ``--summarize WORKDIR`` recomputes the JSON from a kept
workdir without running anything. Writes
benchmarks/results/overnight_resume.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tuner.config import parse_duration
from tuner.progress import per_operator

RESULTS = Path(__file__).parent / "results" / "overnight_resume.json"
BIN = Path(sys.executable).parent


def _events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _command(args: argparse.Namespace, db: Path, log: Path, job: str) -> list[str]:
    return [str(BIN / "tune"), "--model", args.model, "--device", args.device, "--time-budget", args.budget,
            "--trials-per-batch", str(args.batch), "--db", str(db), "--job", job, "--log-json", str(log),
            "--no-verify", "--quiet"]  # fmt: skip


def _run(cmd: list[str], log: Path, kill_at_s: float | None) -> int:
    """Run ``cmd``; with ``kill_at_s``, SIGKILL it once its job's tuning time reaches that."""
    env = os.environ | {"NO_COLOR": "1"}
    with open(log.with_suffix(".out"), "a") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while proc.poll() is None:
            time.sleep(0.5)
            if kill_at_s is None:
                continue
            evs = _events(log)
            starts = [i for i, e in enumerate(evs) if e["event"] == "job_start"]
            if not starts:
                continue
            start = evs[starts[-1]]
            tuned = start["elapsed_before_s"] + (time.time() - start["t"])
            if tuned >= kill_at_s:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                return -signal.SIGKILL
        return proc.returncode
    finally:
        # What a SIGKILL orphans (the run's local Ray cluster) goes too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _summary(log: Path, db: Path) -> dict:
    evs = _events(log)
    end = [e for e in evs if e["event"] == "job_end"][-1]
    start = next(e for e in evs if e["event"] == "job_start")
    best = {k: v for k, v in end["best_sec"].items() if v is not None}
    # Under --layout auto a conv is tuned in two layouts and runs in one: count each operator
    # once, at its faster variant (as the live view and the report do).
    costs = per_operator((t.get("choice", ""), t["weight"] * best[t["name"]] if t["name"] in best else None)
                         for t in start["tasks"])  # fmt: skip
    # Per run: trials sent to be measured minus those stored; a run without a job_end was killed.
    runs: list[dict] = []
    for e in evs:
        if e["event"] == "job_start":
            runs.append({"submitted": 0, "stored": 0, "ended": False})
        elif e["event"] == "batch_submitted":
            runs[-1]["submitted"] += e["trials"]
        elif e["event"] == "batch_done":
            runs[-1]["stored"] += e["trials"]
        elif e["event"] == "job_end":
            runs[-1]["ended"] = True
    lost = sum(r["submitted"] - r["stored"] for r in runs if not r["ended"])
    with sqlite3.connect(db) as conn:
        records = conn.execute("SELECT count(*) FROM records").fetchone()[0]
        dup = conn.execute("SELECT count(*) - count(DISTINCT workload_id || '/' || program_hash) FROM records "
                           "WHERE program_hash IS NOT NULL").fetchone()[0]  # fmt: skip
        elapsed = conn.execute("SELECT elapsed_sec FROM jobs").fetchone()[0]
    return {
        "runs": len(runs), "trials": end["trials_done"], "records": records, "programs_measured_twice": dup,
        "trials_lost_to_kills": lost, "tuning_s": round(elapsed, 1),
        "tasks_tuned": len(best), "tasks": len(start["tasks"]), "operators": len(costs),
        "estimated_latency_ms": round(sum(c for c in costs if c is not None) * 1e3, 4),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--budget", default="45m", help="time budget of each job (45m)")
    parser.add_argument("--kills", type=int, default=2, help="SIGKILLs of the interrupted job (2)")
    parser.add_argument("--batch", type=int, default=16, help="trials per batch (16)")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the databases and logs here")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--summarize", type=Path, default=None, metavar="WORKDIR",
                        help="recompute --out's summaries from a kept workdir (its wall times stay)")
    args = parser.parse_args()
    if args.summarize is not None:
        _write(args.out, json.loads(args.out.read_text()), args.summarize)
        return
    budget_s = parse_duration(args.budget)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="overnight-"))
    work.mkdir(parents=True, exist_ok=True)

    t0 = time.time()
    db_a, log_a = work / "uninterrupted.db", work / "uninterrupted.jsonl"
    rc = _run(_command(args, db_a, log_a, "uninterrupted"), log_a, None)
    assert rc == 0, f"uninterrupted run failed ({rc}); see {log_a.with_suffix('.out')}"
    wall_a = time.time() - t0

    t0 = time.time()
    db_b, log_b = work / "killed.db", work / "killed.jsonl"
    cmd = _command(args, db_b, log_b, "killed")
    for k in range(1, args.kills + 1):
        rc = _run(cmd, log_b, budget_s * k / (args.kills + 1))
        assert rc == -signal.SIGKILL, f"run {k} ended before its kill ({rc}); see {log_b.with_suffix('.out')}"
    rc = _run(cmd, log_b, None)
    assert rc == 0, f"last resumed run failed ({rc}); see {log_b.with_suffix('.out')}"
    wall_b = time.time() - t0

    result = {
        "benchmark": "overnight_resume", "model": args.model, "device": args.device, "budget": args.budget,
        "kills": args.kills, "trials_per_batch": args.batch, "date": time.strftime("%Y-%m-%d %H:%M"),
        "load_avg_1m_at_end": os.getloadavg()[0], "uninterrupted": {"wall_s": round(wall_a, 1)},
        "killed_and_resumed": {"wall_s": round(wall_b, 1)},
    }  # fmt: skip
    _write(args.out, result, work)


def _write(out: Path, result: dict, work: Path) -> None:
    """Fill ``result`` with both jobs' summaries from ``work`` and write it to ``out``."""
    for key, name in (("uninterrupted", "uninterrupted"), ("killed_and_resumed", "killed")):
        summary = _summary(work / f"{name}.jsonl", work / f"{name}.db")
        summary["trials_per_tuning_min"] = round(summary["trials"] / summary["tuning_s"] * 60, 1)
        result[key] = summary | {"wall_s": result[key]["wall_s"]}
    a, b = result["uninterrupted"], result["killed_and_resumed"]
    result["latency_ratio_killed_over_uninterrupted"] = (
        round(b["estimated_latency_ms"] / a["estimated_latency_ms"], 3) if a["estimated_latency_ms"] else None)
    result["workdir"] = str(work)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
