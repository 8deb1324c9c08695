"""Command line: ``tune`` (the tuning job) and ``nightshift`` (tasks, compile, tune).

Configuration flows from here into typed objects; library code never reads the
environment. Errors Nightshift raises on purpose print as one line and exit with code 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console
from rich.logging import RichHandler
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from tuner.errors import NightshiftError, UserInputError

logger = logging.getLogger("tuner")
console = Console(stderr=True)
out = Console()

DEFAULT_DB = "nightshift.db"
DB_ENV = "NIGHTSHIFT_DB"


def _add_model_args(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    p.add_argument("--model", required=required,
                   help="zoo name (resnet50, ...), path to a .onnx file, or package.module:factory")
    p.add_argument("--device", default=None, help="cpu or cuda:N (default: cpu)")
    p.add_argument("--target-arch", default=None,
                   help="CUDA sm_XX to cross-build for without a GPU, or an LLVM mcpu for cpu")
    p.add_argument("--num-cores", type=int, default=None, help="CPU threads to tune for")
    p.add_argument("--batch-size", type=int, default=1, help="model batch size (default 1)")
    p.add_argument("--dtype", default="float32", help="zoo models' dtype (default float32)")
    p.add_argument("--layout", default=None, choices=("auto", "NCHW", "NHWC", "NCHWc"),
                   help="convs' data layout; auto (default): NCHWc blocked by the vector width on x86 AVX2/AVX-512")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def _add_db_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", default=None,
                   help=f"database URL or SQLite file (default: ${DB_ENV} or ./{DEFAULT_DB})")


def _add_tune_args(p: argparse.ArgumentParser) -> None:
    _add_model_args(p, required=False)
    _add_db_arg(p)
    p.add_argument("--config", type=Path, default=None, help="TOML file of these options")
    p.add_argument("--trials", type=int, default=None, help="measurements in all (default 64)")
    p.add_argument("--trials-per-batch", type=int, default=None,
                   help="candidates proposed, built and timed together (default 16)")
    p.add_argument("--build-timeout", type=float, default=None, help="seconds per build (60)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default 0)")
    p.add_argument("--strategy", default=None,
                   help="search strategy: evolutionary (default), random, grid, optuna-tpe, optuna-cmaes")
    p.add_argument("--ray-address", default=None,
                   help="existing Ray cluster: auto (on a node of it), or http://HEAD:8265 to submit the job to "
                        "the head (Ray's Jobs API); default: start one locally")
    p.add_argument("-o", "--output", type=Path, default=None, help="write the tuned module (.so)")
    p.add_argument("--no-verify", action="store_true",
                   help="skip compiling and checking the whole model after tuning")


_TUNE_DEFAULTS = {"device": "cpu", "trials": 64, "trials_per_batch": 16, "build_timeout": 60.0, "seed": 0,
                  "strategy": "evolutionary"}


def _apply_config(args: argparse.Namespace) -> None:
    """Fill options from ``--config``; the command line wins; unknown keys are errors."""
    values: dict = {}
    if args.config is not None:
        try:
            values = tomllib.loads(args.config.read_text())
        except (OSError, tomllib.TOMLDecodeError) as err:
            raise UserInputError(f"cannot read config {args.config}: {err}") from err
        unknown = sorted(k for k in values if k.replace("-", "_") not in vars(args))
        if unknown:
            raise UserInputError(f"config {args.config}: unknown option(s) {', '.join(unknown)}")
    for key, value in values.items():
        key = key.replace("-", "_")
        if getattr(args, key) in (None, False):
            setattr(args, key, Path(value) if key == "output" else value)
    for key, value in _TUNE_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if not args.model:
        raise UserInputError("no model: pass --model NAME|FILE.onnx|package.module:factory or a --config with one")


def _open_db(text: str | None):
    from tuner.db import TuningDatabase

    return TuningDatabase(text or os.environ.get(DB_ENV) or DEFAULT_DB)


def _load(args: argparse.Namespace):
    from tuner.device import parse_device

    args.device = args.device or "cpu"
    from tuner.frontends import load_model

    device = parse_device(args.device, target_arch=args.target_arch, num_cores=args.num_cores)
    spec = load_model(args.model, batch_size=args.batch_size, dtype=args.dtype)
    return device, spec


def _plan(args: argparse.Namespace, device):
    from tuner.layout import LayoutPlan

    return LayoutPlan.parse(getattr(args, "layout", None) or "auto", device.target)


def cmd_tasks(args: argparse.Namespace) -> int:
    """Print the model's fused-operator tasks."""
    from tuner.tasks import extract_tasks

    device, spec = _load(args)
    with console.status("extracting tasks"):
        tasks = extract_tasks(spec.bound(), device.target, _plan(args, device))
    table = Table(title=f"{spec.name} on {device.name} ({device.arch}): {len(tasks)} tasks")
    for col in ("#", "task", "layout", "weight", "MFLOP", "workload key"):
        table.add_column(col, justify="right" if col in ("#", "weight", "MFLOP") else "left")
    for i, t in enumerate(tasks):
        table.add_row(str(i), t.name, t.layout, str(t.weight), f"{t.flops / 1e6:,.1f}", t.workload_key)
    out.print(table)
    total = sum(t.weight * t.flops for t in tasks)
    out.print(f"total {total / 1e9:,.2f} GFLOP per inference")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    """Run a tuning job, then compile and check the model with its best schedules."""
    from tuner.job import TuneConfig, tune_tasks
    from tuner.measure.ray_measure import MeasureConfig, connect
    from tuner.measure.submit import check_address, is_jobs_address, submit
    from tuner.tasks import extract_tasks

    check_address(args.ray_address)
    if is_jobs_address(args.ray_address):  # the driver runs on the head; this process follows it
        return submit(args.ray_address, getattr(args, "argv", None) or [], token=os.environ.get("RAY_AUTH_TOKEN"))

    _apply_config(args)
    config = TuneConfig(
        trials=args.trials, batch_size=args.trials_per_batch, seed=args.seed, strategy=args.strategy,
        measure=MeasureConfig(build_timeout_s=args.build_timeout),
    )  # fmt: skip
    device, spec = _load(args)
    if device.kind == "cuda" and not device.present:
        raise UserInputError(f"{device.name} is not on this machine: tuning needs the device to time on")
    db = _open_db(args.db)
    with console.status("extracting tasks"):
        tasks = extract_tasks(spec.bound(), device.target, _plan(args, device))
    console.print(f"[bold]{spec.name}[/]: {len(tasks)} tasks on {device.name} ({device.arch}, "
                  f"fingerprint {device.fingerprint}); database {db.url.render_as_string(hide_password=True)}")
    with console.status("starting Ray"):
        connect(args.ray_address)
    columns = (TextColumn("[progress.description]{task.description}"), BarColumn(),
               MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())
    with Progress(*columns, console=console) as bar:
        trial_bar = bar.add_task("tuning", total=config.trials)

        def report(p) -> None:
            best = max(p.best_gflops.values(), default=0.0)
            bar.update(trial_bar, completed=p.trials_done, description=(
                f"[cyan]{p.task_name[:24]}[/] task {p.tasks_done}/{p.num_tasks} "
                f"err {p.errors} {best:.1f} GFLOPS"))
            if not console.is_terminal:
                # No live bar in a log file: one line per batch, with the ETA.
                eta = p.elapsed_s / p.trials_done * (p.trials_total - p.trials_done)
                console.print(f"trials {p.trials_done}/{p.trials_total} ({p.task_name}, task {p.tasks_done}/"
                              f"{p.num_tasks}) elapsed {p.elapsed_s:.0f} s, eta {eta:.0f} s, errors {p.errors}")

        summary = tune_tasks(tasks, device, db, config, model_name=spec.name, on_progress=report)
    idle = "" if summary.device_idle_fraction is None else f"; device idle {summary.device_idle_fraction:.0%}"
    console.print(f"job {summary.job_id}: {summary.trials} trials in {summary.elapsed_s:.0f} s; "
                  f"failed candidates: {summary.errors or 'none'}{idle}")
    if args.ray_address is None:
        import ray

        # The local cluster's processes (its device actor's TVM thread pool included) would
        # share the cores with the closing timings.
        ray.shutdown()
    if args.no_verify:
        return 0
    return _verify(spec, device, db, args.output, source=args.model, plan=_plan(args, device))


def _verify(spec, device, db, output: Path | None, source: str | None = None, *, plan=None) -> int:
    """Compile untuned and tuned, run both on the same input, compare, report latency.

    Beside the untuned build, the tuned one is timed interleaved with the zero-trial fallback
    build and the faster of ONNX Runtime and OpenVINO (f32: ``INFERENCE_PRECISION_HINT=f32``) where
    installed (``tuner.bench``).
    """
    import numpy as np

    from tuner.compile import compile_model, run_model

    inputs = spec.random_inputs(seed=0)
    with console.status("compiling and running the untuned model"):
        base = compile_model(spec, device, None, plan=plan)
        base_out, base_lat = run_model(base, device, inputs)
    with console.status("compiling and running the tuned model"):
        tuned = compile_model(spec, device, db, plan=plan)
        tuned_out, tuned_lat = run_model(tuned, device, inputs)
    worst = 0.0
    for a, b in zip(base_out, tuned_out, strict=True):
        scale = max(float(np.max(np.abs(a))), 1e-6)
        worst = max(worst, float(np.max(np.abs(a.astype(np.float64) - b))) / scale)
    peers = _closing_peers(spec, device, db, tuned, source, plan) if device.kind == "cpu" else None
    table = Table(title=f"{spec.name} on {device.name}")
    table.add_column("build")
    table.add_column("latency (ms)", justify="right")
    table.add_row("untuned (TVM default)", f"{base_lat * 1e3:,.2f}")
    if peers is not None and peers.fallback is not None:
        table.add_row("fallback schedules (0 trials)", f"{peers.fallback * 1e3:,.2f}")
    if peers is not None:
        tuned_lat = peers.tuned  # timed interleaved with the rows below and above it
    table.add_row(f"tuned ({len(tuned.tuned)} ops tuned, {len(tuned.fallback)} default)",
                  f"{tuned_lat * 1e3:,.2f}")
    if peers is not None and peers.peer is not None:
        table.add_row(peers.peer_label, f"{peers.peer * 1e3:,.2f}")
    out.print(table)
    out.print(f"speed-up {base_lat / tuned_lat:.2f}x; max relative output difference {worst:.2e}")
    if peers is not None:
        out.print(peers.summary)
    if output is not None:
        tuned.executable.export_library(str(output))
        out.print(f"wrote {output}")
    if not np.isfinite(worst) or worst > 1e-2:
        console.print("[red]error:[/] the tuned model's output differs from the untuned build's")
        return 1
    if peers is not None and not peers.agree:
        console.print("[red]error:[/] the tuned model's output differs from the peer's (run nightshift bench)")
        return 1
    return 0


def _closing_peers(spec, device, db, tuned, source: str | None, plan=None):
    """The fallback build and the fastest quick peer, timed interleaved with the tuned build."""
    from tuner.bench import QUICK_PEERS, BenchConfig, closing_comparison

    with console.status("timing the tuned build against the fallback build and a peer"):
        return closing_comparison(spec, device, db, tuned, source=source or spec.name,
                                  config=BenchConfig(rounds=5, peers=QUICK_PEERS, plan=plan))  # fmt: skip


def cmd_compile(args: argparse.Namespace) -> int:
    """Compile a model with the database's best schedules into a deployable library."""
    from tuner.compile import compile_model

    device, spec = _load(args)
    db = _open_db(args.db)
    with console.status("compiling"):
        compiled = compile_model(spec, device, db, policy=args.policy, plan=_plan(args, device))
    table = Table(title=f"{spec.name} on {device.name} ({device.arch}): what each operator got")
    for col in ("operator", "schedule", "detail"):
        table.add_column(col)
    order = {"tuned": 0, "same-arch": 1, "fallback": 2, "tvm-default": 3}
    for d in sorted(compiled.decisions.values(), key=lambda d: (order.get(d.kind, 9), d.name)):
        table.add_row(d.name, d.kind, d.detail)
    kinds = [d.kind for d in compiled.decisions.values()]
    out.print(f"{kinds.count('tuned')} operators tuned on this device, {kinds.count('same-arch')} from another "
              f"device of the same architecture, {kinds.count('fallback')} with the fallback schedule, "
              f"{kinds.count('tvm-default')} with TVM's default lowering")
    out.print(table)
    compiled.executable.export_library(str(args.output))
    out.print(f"wrote {args.output} in {compiled.compile_s:.1f} s")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Benchmark the database's build and the fallback build against the installed peers."""
    import json

    from tuner.bench import BenchConfig, bench, render

    if args.json is not None and not args.json.parent.is_dir():
        raise UserInputError(f"--json {args.json}: folder {args.json.parent} does not exist")
    device, spec = _load(args)
    config = BenchConfig(rounds=args.rounds, peers=tuple(args.peers), plan=_plan(args, device))
    db = _open_db(args.db)
    with console.status("benchmarking") as status:
        result = bench(spec, device, db, source=args.model, config=config,
                       on_stage=lambda text: status.update(text))  # fmt: skip
    out.print(render(result))
    if args.json is not None:
        try:
            args.json.write_text(json.dumps(result.to_json(), indent=2) + "\n")
        except OSError as err:
            raise UserInputError(f"cannot write --json {args.json}: {err.strerror}") from err
        out.print(f"wrote {args.json}")
    if not result.ok:
        console.print("[red]error:[/] outputs differ beyond tolerance (max error column)")
        return 1
    return 0


def _parser(prog: str) -> argparse.ArgumentParser:
    from tuner.peers import PEERS

    parser = argparse.ArgumentParser(prog=prog, description="Nightshift: tune models with TVM on Ray.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("tune", help="run a tuning job")
    _add_tune_args(p)
    p.set_defaults(func=cmd_tune)
    p = sub.add_parser("tasks", help="list a model's fused-operator tasks")
    _add_model_args(p)
    p.set_defaults(func=cmd_tasks)
    p = sub.add_parser("compile", help="compile a model with the database's best schedules")
    _add_model_args(p)
    _add_db_arg(p)
    p.add_argument("-o", "--output", type=Path, required=True, help="output library (.so)")
    p.add_argument("--policy", choices=("same-arch", "device"), default="same-arch",
                   help="same-arch (default): records of another device of the same architecture may stand in")
    p.set_defaults(func=cmd_compile)
    p = sub.add_parser("bench", help="time the tuned and fallback builds against ONNX Runtime, OpenVINO, PyTorch")
    _add_model_args(p)
    _add_db_arg(p)
    p.add_argument("--json", type=Path, default=None, help="also write the results as JSON to this file")
    p.add_argument("--rounds", type=int, default=10, help="interleaved timed rounds (default 10)")
    p.add_argument("--peers", nargs="+", choices=list(PEERS), default=list(PEERS), metavar="PEER",
                   help=f"peers to run (default all: {' '.join(PEERS)})")
    p.set_defaults(func=cmd_bench)
    from tuner.cli_db import add_db_commands

    add_db_commands(sub, _add_db_arg)
    from tuner.cli_model import add_model_commands

    add_model_commands(sub, _add_db_arg)
    return parser


def _run(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.DEBUG if getattr(args, "verbose", False) else logging.WARNING,
        format="%(message)s", handlers=[RichHandler(console=console, show_path=False)],
    )  # fmt: skip
    start = time.perf_counter()
    try:
        return func(args)
    except NightshiftError as err:
        console.print(f"[red]error:[/] {err}", soft_wrap=True, highlight=False)
        return 2
    except KeyboardInterrupt:
        console.print(f"interrupted after {time.perf_counter() - start:.0f} s; measurements so far are saved")
        return 130


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``nightshift``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser("nightshift").parse_args(argv)
    args.argv = argv
    return _run(args.func, args)


def tune_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``tune`` (same as ``nightshift tune``)."""
    parser = argparse.ArgumentParser(prog="tune", description="Run a Nightshift tuning job.")
    _add_tune_args(parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = ["tune", *argv]
    return _run(cmd_tune, args)


if __name__ == "__main__":
    sys.exit(main())
