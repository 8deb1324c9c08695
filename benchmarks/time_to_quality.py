"""Time to quality (#63 item 3): the compiled model's latency against trials and tuning minutes,
for each arm of the search, from an empty database, over several seeds.

Arms (``tune`` options): ``random`` (random search, no cost model), ``evo-none`` (evolutionary,
candidates ranked at random), ``evo-online`` (evolutionary, a model learned from the job's own
measurements), ``evo-pretrained`` (evolutionary, the default: the device family's records, else the
model shipped in cost_models/pretrained/, learning online), ``evo-pretrained-rr`` (``evo-pretrained``
with ``--scheduler round-robin``: the task with the fewest trials next, not Ansor's gradient rule).
``evo-warm`` (#63 item 4) is ``evo-pretrained`` on a database first seeded with this CPU family's
records in ``--warm-db`` (other models' databases): what a shared database gives a model never tuned
before, against ``evo-pretrained`` on an empty one; without ``--warm-db`` it is skipped.

Per model, arm and seed: one job on a new SQLite database, grown through the budgets. After each
budget, its build is timed against the faster of ONNX Runtime and OpenVINO (f32) in the same
interleaved rounds (``model_suite.bench_one``, in a process of its own), with the trials and the
tuning minutes so far. A job that reached its ``--trials`` cap is done, and ``tune`` with its name
starts a new run of it (docs/guide/overnight-job.md), so each step is a run of its own on the same
database with the trials the budget has left. It starts from the earlier runs' records as a resumed
job does: its strategies are told them, ``pretrained`` retrains on them, ``online`` starts
untrained (as on a resume); ``--skip-after 0``, because one job never skips a task for its own
records. A step is named by the trials it starts from and ends at, so a step killed midway is
resumed when it measured nothing and otherwise followed by a new run for what is left. Trials
and minutes are read from the database: every run's records, and the runs' tuning time
(``jobs.elapsed_sec``: search and re-ranking; ``wall_min`` adds each process's start-up).

The curves are ratios to the peer timed in the same rounds (median of the rounds' ratios), so
points timed hours apart on a shared machine compare; the peer is the line at 1.0.

Results go into ``benchmarks/results/time_to_quality_<arch>.json``, rewritten after every point
(``--resume`` continues a killed run), and a PNG beside it (with matplotlib).

    nice -n 10 .venv/bin/python benchmarks/time_to_quality.py --workdir /tmp/ttq
    .venv/bin/python benchmarks/time_to_quality.py --models tiny --seeds 1 --budgets 4 8 \\
        --arms random evo-online --rounds 3 --measurer inline --settle 0   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).parent))
from model_suite import SUITE, _last_event, bench_in_child, bench_one, resolve, tune
from result_file import machine, run_commands, write_result
from settle import settle

console = Console(width=150)  # the table is read in log files too
RESULTS = Path(__file__).parent / "results"

#: Each arm's ``tune`` options: the search strategy and what ranks its proposals.
ARMS: dict[str, list[str]] = {
    "random": ["--strategy", "random", "--cost-model", "none"],
    "evo-none": ["--strategy", "evolutionary", "--cost-model", "none"],
    "evo-online": ["--strategy", "evolutionary", "--cost-model", "online"],
    "evo-pretrained": ["--strategy", "evolutionary", "--cost-model", "pretrained"],
    "evo-pretrained-rr": ["--strategy", "evolutionary", "--cost-model", "pretrained", "--scheduler", "round-robin"],
    "evo-warm": ["--strategy", "evolutionary", "--cost-model", "pretrained"],
}
#: ResNet-50 and two models of the suite that Nightshift was not tuned on during development.
MODELS = ("resnet50", "mnasnet1_0", "squeezenet1_1")
BUDGETS = (64, 128, 256, 512, 2048)
# The faster of these is the peer: PyTorch eager was never the fastest in the model suite.
# openvino-f32 sets INFERENCE_PRECISION_HINT to f32: OpenVINO runs bf16 by default on CPUs with
# AVX512_BF16 or AMX, which would compare an fp32 build with a bf16 one.
PEERS = ("onnxruntime", "openvino-f32")
#: The arm whose database starts with the records of ``--warm-db``.
WARM = "evo-warm"

Key = tuple[str, str, int]  # model, arm, seed


def progress(db: Path) -> tuple[int, float]:
    """Trials measured so far (the records of every run, a killed one's too; not those a warm
    start seeded, which belong to no job) and the runs' tuning seconds."""
    if not db.is_file():
        return 0, 0.0
    from sqlalchemy import func, select

    from tuner.db import TuningDatabase
    from tuner.db.schema import JobRow, RecordRow

    database = TuningDatabase(str(db), create=False)
    try:
        with database.session(write=False) as s:
            trials = s.scalar(select(func.count(RecordRow.id)).where(RecordRow.job_id.is_not(None))) or 0
            seconds = s.scalar(select(func.sum(JobRow.elapsed_sec))) or 0.0
        return int(trials), float(seconds)
    finally:
        database.close()


def resumed(earlier: dict[str, Any]) -> tuple[list, dict[str, str], dict[str, list[str]], list[int], list[str]]:
    """What a resumed file keeps of its earlier runs: points, models, arms, budgets, and their
    commands, oldest first (the file's ``command`` is the newest run's)."""
    return (earlier.get("points", []), earlier.get("models", {}), earlier.get("arms", {}), earlier.get("budgets", []),
            run_commands(earlier))  # fmt: skip


def seed_warm(db: Path, warm: list[Path]) -> int:
    """Copy this CPU family's records in the ``warm`` databases into the new database ``db``
    (``evo-warm``'s start), without their jobs; how many records were new."""
    from tuner.db import TuningDatabase
    from tuner.db.transfer import copy_records
    from tuner.device import parse_device

    device = parse_device("cpu")
    dst = TuningDatabase(str(db))
    try:
        new = 0
        for path in warm:
            src = TuningDatabase(str(path), create=False)
            try:
                new += copy_records(src, dst, device=device).records
            finally:
                src.close()
        return new
    finally:
        dst.close()


def warm_start(db: Path, events: Path) -> dict[str, int]:
    """What ``evo-warm``'s job started from: the seeded records (those of no job), and how many of
    the model's tasks (every layout plan's, in the last run's ``job_start`` event) they hold
    records of."""
    from sqlalchemy import func, select

    from tuner.db import TuningDatabase
    from tuner.db.schema import RecordRow, WorkloadRow

    database = TuningDatabase(str(db), create=False)
    seeded = RecordRow.job_id.is_(None)
    try:
        with database.session(write=False) as s:
            records = s.scalar(select(func.count(RecordRow.id)).where(seeded)) or 0
            keys = set(s.scalars(select(WorkloadRow.key).join(RecordRow, RecordRow.workload_id == WorkloadRow.id)
                                 .where(seeded).distinct()))  # fmt: skip
    finally:
        database.close()
    start = _last_event(events, "job_start")
    tasks = {t["workload_key"] for t in start["tasks"]} if start else set()
    return {"warm_records": int(records), "tasks": len(tasks), "tasks_in_warm": len(tasks & keys)}


def timed(bench: dict[str, Any]) -> dict[str, Any]:
    """The build's latency, the faster peer's and their ratio from ``bench_one``'s result."""
    entries = {e["key"]: e for e in bench["entries"]}
    tvm, peer = entries.get("tvm", {}), bench.get("fastest_peer")
    return {"tvm_ms": tvm.get("median_ms"), "peer": peer, "peer_ms": entries[peer]["median_ms"] if peer else None,
            "ratio": tvm.get("per_round_ratio_to_fastest_peer"), "output_ok": tvm.get("agrees")}  # fmt: skip


def curve(key: Key, source: str, budgets: list[int], workdir: Path, args: argparse.Namespace,
          points: list[dict[str, Any]], save: Callable[[], None]) -> None:  # fmt: skip
    """Grow one job through ``budgets``, appending a point (and saving) after each."""
    model, arm, seed = key
    mine = [p for p in points if (p["model"], p["arm"], p["seed"]) == key]
    db = workdir / "tuning.db"
    if mine and not db.is_file():  # the job's database is gone: its curve starts again
        console.print(f"  {model} {arm} seed {seed}: {db} is missing; tuning from the start", highlight=False)
        points[:] = [p for p in points if p not in mine]
        mine = []
    if not mine:  # every curve starts from an empty database
        for stale in ("tuning.db", "events.jsonl"):
            (workdir / stale).unlink(missing_ok=True)
    if arm == WARM and not db.is_file():
        seeded = seed_warm(db, args.warm_db)
        console.print(f"  {model} {arm} seed {seed}: seeded {seeded} records from {len(args.warm_db)} databases",
                      highlight=False)  # fmt: skip
    done = {p["budget"] for p in mine}
    wall_s = max((p["wall_min"] * 60 for p in mine), default=0.0)
    for budget in budgets:
        if budget in done:
            continue
        before, _ = progress(db)
        run = None
        if before < budget:
            options = ["--trials", str(budget - before), "--job", f"ttq-{before}-{budget}", "--seed", str(seed),
                       *ARMS[arm], "--skip-after", "0", "--no-verify", "-q", "--measurer", args.measurer]  # fmt: skip
            run = tune(source, options, workdir, None)
            wall_s += run["wall_s"]
        trials, tuning_s = progress(db)
        point: dict[str, Any] = {"model": model, "arm": arm, "seed": seed, "budget": budget, "trials": trials,
                                 "tuning_min": round(tuning_s / 60, 2), "wall_min": round(wall_s / 60, 2),
                                 "tune": run}  # fmt: skip
        if arm == WARM:
            point |= warm_start(db, workdir / "events.jsonl")
        if run is not None and run["exit_code"] != 0:
            console.print(f"  [red]tune failed[/]: {run['error']}", highlight=False)
            points.append(point)
            save()
            return  # the later budgets would grow a broken job
        if args.settle:
            settle(args.settle, console)
        bench, error = bench_in_child(Path(__file__), source, str(db), workdir / "bench.json", args.rounds, None)
        point |= timed(bench) if bench else {"bench_error": error}
        points.append(point)
        save()
        ratio = f"{point['ratio']:.2f}x {point['peer']}" if point.get("ratio") else point.get("bench_error")
        console.print(f"  {model} {arm} seed {seed}: {trials} trials, {point['tuning_min']} min: {ratio}",
                      highlight=False)  # fmt: skip


def summarize(points: list[dict[str, Any]]) -> dict[str, Any]:
    """Per model, arm and budget: the mean and range over seeds of the ratio, the trials and
    the minutes; per model, the median latency of the peer."""
    out: dict[str, Any] = {}
    for model in dict.fromkeys(p["model"] for p in points):
        ours = [p for p in points if p["model"] == model]
        peer_ms = [p["peer_ms"] for p in ours if p.get("peer_ms")]
        arms: dict[str, list[dict[str, Any]]] = {}
        for arm in dict.fromkeys(p["arm"] for p in ours):
            rows = []
            for budget in sorted({p["budget"] for p in ours if p["arm"] == arm}):
                at = [p for p in ours if p["arm"] == arm and p["budget"] == budget and p.get("ratio")]
                if not at:
                    continue
                ratios = [p["ratio"] for p in at]
                rows.append({"budget": budget, "seeds": len(at), "ratio_mean": statistics.fmean(ratios),
                             "ratio_min": min(ratios), "ratio_max": max(ratios),
                             "trials_mean": statistics.fmean(p["trials"] for p in at),
                             "tuning_min_mean": statistics.fmean(p["tuning_min"] for p in at),
                             "tvm_ms_mean": statistics.fmean(p["tvm_ms"] for p in at)})  # fmt: skip
            arms[arm] = rows
        out[model] = {"peer_ms_median": statistics.median(peer_ms) if peer_ms else None, "arms": arms}
    return out


def render(summary: dict[str, Any], budgets: list[int]) -> Table:
    """Mean ratio to the peer over seeds, one row per model and arm, one column per budget."""
    table = Table(title="latency / faster peer, mean over seeds (lower is better)")
    table.add_column("model")
    table.add_column("arm")
    for b in budgets:
        table.add_column(str(b), justify="right")
    for model, m in summary.items():
        for arm, rows in m["arms"].items():
            by = {r["budget"]: r for r in rows}
            table.add_row(model, arm, *(f"{by[b]['ratio_mean']:.2f}x" if b in by else "" for b in budgets))
    return table


def plot(summary: dict[str, Any], path: Path) -> None:
    """One row per model: the ratio against trials and against tuning minutes, one line per arm
    (mean over seeds, min-max band), the peer at 1.0."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import ScalarFormatter
    except ImportError:
        console.print("matplotlib is not installed: no chart (pip install matplotlib)")
        return
    fig, axes = plt.subplots(len(summary), 2, figsize=(11, 3.4 * len(summary)), squeeze=False)
    for row, (model, m) in zip(axes, summary.items(), strict=True):
        for arm, rows in m["arms"].items():
            y = [r["ratio_mean"] for r in rows]
            for ax, x in zip(row, ([r["trials_mean"] for r in rows], [r["tuning_min_mean"] for r in rows]),
                             strict=True):  # fmt: skip
                # One colour per arm in every panel, whichever arms a model has.
                color = f"C{list(ARMS).index(arm) % 10}" if arm in ARMS else None
                (line,) = ax.plot(x, y, marker="o", label=arm, color=color)
                ax.fill_between(x, [r["ratio_min"] for r in rows], [r["ratio_max"] for r in rows],
                                color=line.get_color(), alpha=0.15)  # fmt: skip
        peer = f"faster peer ({m['peer_ms_median']:.3g} ms)" if m["peer_ms_median"] else "faster peer"
        for ax, xlabel in zip(row, ("trials", "tuning minutes"), strict=True):
            ax.axhline(1.0, color="black", linewidth=0.8, label=peer)
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(ScalarFormatter())  # 64, 0.5: not 2^6, 2^-1
            ax.set_xlabel(xlabel)
            ax.set_ylabel("latency / faster peer")
            ax.set_title(model)
            ax.grid(alpha=0.3)
        row[0].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(MODELS),
                   help=f"--model texts or suite names (default: {' '.join(MODELS)})")  # fmt: skip
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS), help="default: all")
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per model and arm (default 3)")
    p.add_argument("--budgets", nargs="+", type=int, default=list(BUDGETS),
                   help=f"trials at each point of a job (default {' '.join(map(str, BUDGETS))})")  # fmt: skip
    p.add_argument("--rounds", type=int, default=20, help="interleaved timing rounds per point (default 20)")
    p.add_argument("--measurer", choices=("ray", "inline"), default="ray", help="tune's --measurer (default ray)")
    p.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "nightshift-ttq",
                   help="each job's database (kept for --resume; default %(default)s)")  # fmt: skip
    p.add_argument("--out", type=Path, default=None, help="JSON (default results/time_to_quality_<arch>.json)")
    p.add_argument("--resume", action="store_true", help="keep the points already in --out and go on")
    p.add_argument("--warm-db", nargs="+", type=Path, default=[], metavar="PATH",
                   help="SQLite tuning databases of other models' jobs on this CPU (model_suite.py's "
                        f"DIR/<model>/tuning.db), whose records seed the {WARM} arm's database")  # fmt: skip
    p.add_argument("--settle", type=float, default=60.0,
                   help="wait up to this long for a quiet machine before each timing (default 60)")  # fmt: skip
    p.add_argument("--bench-one", nargs=3, metavar=("SOURCE", "DB", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.bench_one:
        source, db, out = args.bench_one
        result = bench_one(source, db, args.rounds, None, peers=PEERS, fallback=False, with_sensitivity=False)
        Path(out).write_text(json.dumps(result))
        return

    budgets = sorted(set(args.budgets))
    if budgets[0] <= 0:
        p.error("budgets are positive trial counts")
    missing = [str(path) for path in args.warm_db if not path.is_file()]
    if missing:
        p.error(f"--warm-db {' '.join(missing)}: no such file")
    if WARM in args.arms and not args.warm_db:
        console.print(f"{WARM}: no --warm-db databases to start from; arm skipped")
        args.arms = [a for a in args.arms if a != WARM]
        if not args.arms:
            return
    from tuner.device import parse_device

    device = parse_device("cpu")
    out = args.out or RESULTS / f"time_to_quality_{device.arch}.json"
    earlier = json.loads(out.read_text()) if args.resume and out.is_file() else {}
    points, models, arms, seen, earlier_commands = resumed(earlier)
    models |= {m: SUITE.get(m, m) for m in args.models}
    arms |= {a: ARMS[a] for a in args.arms}
    every_budget = sorted({*seen, *budgets})
    load_before = os.getloadavg()

    def save() -> None:
        write_result(out, "time_to_quality", {
            "earlier_commands": earlier_commands, "models": models, "arms": arms,
            "seeds": args.seeds, "budgets": every_budget, "peers": list(PEERS), "rounds": args.rounds,
            "measurer": args.measurer, "warm_db": [str(path) for path in args.warm_db],
            "machine": machine(device, load_before),
            "summary": summarize(points), "points": points,
        })  # fmt: skip

    # Seeds outermost: a run stopped early has every model and arm at the first seeds.
    for seed in range(args.seeds):
        for model in args.models:
            source = resolve(SUITE.get(model, model), args.workdir / model.replace(":", "_"))
            for arm in args.arms:
                console.print(f"[bold]{model}[/] {arm} seed {seed}", highlight=False)
                workdir = args.workdir / model.replace(":", "_") / arm / f"seed{seed}"
                workdir.mkdir(parents=True, exist_ok=True)
                curve((model, arm, seed), source, budgets, workdir, args, points, save)
    save()
    summary = summarize(points)
    console.print(render(summary, budgets))
    plot(summary, out.with_suffix(".png"))
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
