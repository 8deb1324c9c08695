"""The morning after a job: ``nightshift run``, ``nightshift report`` and ``nightshift jobs``.

Registered on the main parser by :func:`add_report_commands`. ``run`` needs TVM's runtime
only (it imports :mod:`tuner.artifact`, never the compiler side of Nightshift).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.table import Table

from tuner.cli.common import _open_db, out, with_examples
from tuner.errors import UserInputError


def add_report_commands(
    sub: argparse._SubParsersAction, add_db_arg: Callable[[argparse.ArgumentParser], None]
) -> None:
    """Add ``run``, ``report`` and ``jobs`` to the ``nightshift`` subparsers."""
    p = sub.add_parser(
        "run", help="run a tuned artifact (tune -o) on inputs from .npy files or random ones, and time it, with "
                    "TVM's runtime only",
        description="Run an artifact that tune -o or nightshift compile -o wrote, with TVM's runtime "
                    "only (no compiler, no database): on inputs from .npy/.npz files or random ones of "
                    "its own shapes; print its outputs' summary and, with --rounds, time it.",
        **with_examples("nightshift run resnet50.so --random-input --rounds 100",
                        "nightshift run resnet50.so --input image.npy --output logits.npy",
                        "nightshift run artifact/ --random-input --num-cores 4 --rounds 50"),
    )  # fmt: skip
    p.add_argument("artifact", type=Path,
                   help="the .so that tune -o or nightshift compile -o wrote (with its .json), or the artifact folder")
    given = p.add_mutually_exclusive_group(required=True)
    given.add_argument("--input", type=Path, action="append", metavar="FILE",
                       help="a .npy per input, in order (repeat the option), or one .npz keyed by input name "
                            "(this or --random-input)")
    given.add_argument("--random-input", action="store_true",
                       help="random inputs of the artifact's own shapes and dtypes (from its metadata)")
    p.add_argument("--output", type=Path, default=None, help="write the output (.npy; .npz for several)")
    p.add_argument("--rounds", type=int, default=0,
                   help="also time this many runs: latency p50/p90/p99, mean and spread, throughput (default 0)")
    # The names bench and tune use; the old ones stay accepted, unlisted.
    p.add_argument("--repeat", type=int, dest="rounds", help=argparse.SUPPRESS)
    p.add_argument("--num-cores", type=int, default=None, help="CPU threads (default: those it was tuned on)")
    p.add_argument("--threads", type=int, dest="num_cores", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help="seed of --random-input (default 0)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser(
        "report", help="write a job's report: tuning curves, tasks, time, errors (one HTML file)",
        description="Write the morning report of a tuning job as one HTML file: its tuning curves, each "
                    "task's best before and after and share of the compiled plan, where the time went, and "
                    "the errors; with several --job, a comparison of them. Sortable tables, zoomable "
                    "charts and JSON/CSV exports, all inside the page.",
        **with_examples("nightshift report --job nightly -o nightly.html",
                        "nightshift report --job 12 -o r.html --artifact model.so --bench b.json",
                        "nightshift report --job nightly --job last-week -o compare.html"),
    )  # fmt: skip
    add_db_arg(p)
    p.add_argument("--job", required=True, action="append", metavar="NAME_OR_ID",
                   help="the job's name (tune --job) or id; repeat it to compare jobs with the first (their "
                        "curves on the same axes, each task's best per job as x of the first)")
    p.add_argument("-o", "--output", type=Path, required=True, help="the HTML file to write")
    p.add_argument("--artifact", type=Path, default=None,
                   help="the job's artifact (tune -o): its latency, verification, task weights and the tasks of the "
                        "plan it was compiled with (the shares and estimate count those)")
    p.add_argument("--bench", type=Path, action="append", default=[], metavar="FILE",
                   help="nightshift bench --json results to compare with (repeatable)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.set_defaults(func=cmd_report)
    p = sub.add_parser(
        "jobs", help="list the database's jobs and their state",
        description="List the database's jobs, newest first: model, device, state (a running job "
                    "whose heartbeat stopped shows as dead), trials, tuning time and budget, and the "
                    "last heartbeat. nightshift db jobs is the same command.",
        **with_examples("nightshift jobs", "nightshift jobs --db postgresql+psycopg://tuner@dbhost/nightshift"),
    )  # fmt: skip
    add_db_arg(p)
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.set_defaults(func=cmd_jobs)


def cmd_run(args: argparse.Namespace) -> int:
    """Run an artifact on the given (or random) inputs; print the outputs' summary and, with
    --rounds, the latency's percentiles, mean, spread and throughput."""
    import numpy as np

    from tuner.app.run import LatencyStats, random_inputs
    from tuner.artifact import check_inputs, load_artifact, load_inputs, read_metadata

    if args.rounds < 0:
        raise UserInputError(f"--rounds must be 0 or more, got {args.rounds}")
    if args.output is not None and not args.output.parent.is_dir():
        raise UserInputError(f"--output {args.output}: folder {args.output.parent} does not exist")
    metadata = read_metadata(args.artifact)
    if args.random_input:
        arrays = random_inputs(metadata, seed=args.seed)
        shown = ", ".join(f"{i['name']} {tuple(i['shape'])} {i['dtype']}" for i in metadata.get("inputs", []))
        out.print(f"random inputs: {shown}", highlight=False)
    else:
        arrays = load_inputs(args.input, metadata.get("inputs", []))
    # Before loading: TVM's loader logs to stderr, and a usage error is one line.
    check_inputs(metadata, arrays)
    artifact = load_artifact(args.artifact, threads=args.num_cores)
    outputs = artifact.run(arrays)
    for n, o in enumerate(outputs):
        out.print(f"output {n}: shape {tuple(o.shape)} {o.dtype}, mean {float(np.mean(o)):.6g}, "
                  f"max |x| {float(np.max(np.abs(o))) if o.size else 0.0:.6g}")  # fmt: skip
    if args.output is not None:
        try:
            if args.output.suffix == ".npz" or len(outputs) > 1:
                np.savez(args.output, *outputs)
            else:
                np.save(args.output, outputs[0])
        except OSError as err:
            raise UserInputError(f"cannot write --output {args.output}: {err.strerror or err}") from err
        out.print(f"wrote {args.output}")
    if args.rounds:
        stats = LatencyStats.of(artifact.time(arrays, args.rounds))
        out.print(stats.describe(), highlight=False)
        tuned = metadata.get("latency_ms")
        if isinstance(tuned, int | float):
            out.print(f"latency at tuning time {tuned:.3f} ms", highlight=False)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Write the HTML report of a job."""
    from tuner.artifact import read_metadata
    from tuner.report import find_job, job_data, render

    if not args.output.parent.is_dir():
        raise UserInputError(f"-o {args.output}: folder {args.output.parent} does not exist")
    artifact = read_metadata(args.artifact) if args.artifact is not None else None
    bench = [_read_bench(p) for p in args.bench]
    db = _open_db(args.db)
    jobs = [find_job(db, name) for name in args.job]
    if len({j.id for j in jobs}) != len(jobs):
        raise UserInputError("--job names one job twice: give each job to compare once")
    # The artifact's plan applies to every job of its model (job_data checks the model).
    data = [job_data(db, job, artifact=artifact) for job in jobs]
    try:
        args.output.write_text(render(data[0], bench=bench, artifact=artifact, compare=data[1:]))
    except OSError as err:
        raise UserInputError(f"cannot write -o {args.output}: {err.strerror or err}") from err
    job = jobs[0]
    compared = f"; compared with {', '.join(j.label for j in jobs[1:])}" if len(jobs) > 1 else ""
    out.print(f"wrote {args.output}: job {job.label}, {data[0].num_records} records of {len(data[0].tasks)} tasks"
              f"{compared}")
    return 0


def _read_bench(path: Path) -> dict[str, Any]:
    try:
        result = json.loads(path.read_text())
    except OSError as err:
        raise UserInputError(f"--bench {path}: {err.strerror or err}") from err
    except ValueError as err:
        raise UserInputError(f"--bench {path}: not JSON ({err})") from err
    if not isinstance(result, dict) or not isinstance(result.get("entries"), list):
        raise UserInputError(f"--bench {path}: not the output of nightshift bench --json (no entries)")
    return result


def _span(sec: float) -> str:
    """A duration in a few characters: ``45s``, ``12m``, ``1.5h``, ``8h``."""
    if sec < 90:
        return f"{sec:.0f}s"
    if sec < 90 * 60:
        return f"{sec / 60:.0f}m"
    hours = sec / 3600
    return f"{hours:.0f}h" if hours >= 10 or hours.is_integer() else f"{hours:.1f}h"


def _ago(when: datetime | None, now: datetime) -> str:
    if when is None:
        return "–"
    return f"{_span(max((now - when).total_seconds(), 0.0))} ago"


#: Below this many columns the jobs table leaves out the host (it still fits 80 columns).
_HOST_FROM_WIDTH = 100


def _fit(needs: tuple[int, int], room: int) -> tuple[int, int]:
    """Widths of two columns that share ``room``: each its natural width where both fit, else
    the shorter keeps its width up to half the room and the other takes what is left
    (at least 6 each, where an ellipsis still says something)."""
    a, b = needs
    if a + b <= room:
        return a, b
    half = room // 2
    if a <= half:
        return a, max(room - a, 6)
    if b <= half:
        return max(room - b, 6), b
    return max(half, 6), max(room - half, 6)


def cmd_jobs(args: argparse.Namespace) -> int:
    """List the jobs, newest first; a running job without a heartbeat for 5 minutes shows as dead.

    ``nightshift jobs`` and ``nightshift db jobs`` both run this: one table, which fits the
    terminal down to 80 columns (a long name or model is cut with an ellipsis, the host left
    out below 100).
    """
    from rich import box

    from tuner.report import list_jobs

    db = _open_db(args.db)
    try:
        jobs = list_jobs(db)
    finally:
        db.close()
    if not jobs:
        out.print("no jobs in the database")
        return 0
    now = datetime.now(UTC)
    wide = out.width >= _HOST_FROM_WIDTH
    colors = {"dead": "red", "failed": "red", "running": "cyan", "done": "green"}
    rows = []
    for j in jobs:
        state = j.shown_state(now)
        trials = f"{j.trials_done}/{j.trials_total}" if j.trials_total else str(j.trials_done)
        spent = _span(j.wall_sec) + (f"/{_span(j.time_budget_sec)}" if j.time_budget_sec else "")
        rows.append([str(j.id), j.name or "–", j.model, f"{j.device} {j.device_arch}", state, trials, spent,
                     _ago(j.last_alive, now), *([j.host or "–"] if wide else [])])  # fmt: skip
    # "time": tuning time spent, then "/" the budget; "alive": the last heartbeat.
    headers = ["id", "name", "model", "device", "state", "trials", "time", "alive", *(["host"] if wide else [])]
    natural = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    natural[3] = min(natural[3], 16)  # a long CPU architecture: its start names it
    if wide:
        natural[8] = min(natural[8], 24)
    # No vertical rules and one space between columns (2 per column in all, edges included):
    # at 80 columns the rules would take the width the names need.
    fixed = sum(natural) - natural[1] - natural[2] + 2 * len(headers)
    name_w, model_w = _fit((natural[1], natural[2]), max(out.width - fixed, 12))
    widths = [natural[0], name_w, model_w, *natural[3:]]
    title = f"{len(jobs)} job" + ("s" if len(jobs) != 1 else "")
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for header, width in zip(headers, widths, strict=True):
        right = header in ("id", "trials", "time", "alive")
        table.add_column(header, justify="right" if right else "left", no_wrap=True, overflow="ellipsis",
                         width=width)  # fmt: skip
    for r in rows:
        r[4] = f"[{colors.get(r[4], 'white')}]{r[4]}[/]"
        table.add_row(*r)
    out.print(table)
    return 0
