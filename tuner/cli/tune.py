"""``tune``: run (or resume) a tuning job, then compile, verify and time the model."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from rich.table import Table

from tuner.cli.common import (
    DB_ENV,
    _add_db_arg,
    _add_model_args,
    _load,
    _plan,
    _print_precision,
    console,
    db_text,
    out,
    with_examples,
)
from tuner.config import seconds_arg
from tuner.db.url import redact_argv
from tuner.errors import UserInputError

logger = logging.getLogger(__name__)


#: ``tune --help``'s text before the options (``nightshift tune`` shows the same).
TUNE_DESCRIPTION = (
    "Run a tuning job, or resume it (the same --job name goes on where it stopped), then "
    "compile the model with its best schedules and check it against the untuned build. "
    "Every option can come from a --config TOML file (configs/ has some)."
)


def tune_examples(prog: str) -> dict[str, Any]:
    """The examples of ``tune --help`` or ``nightshift tune --help`` (``prog``)."""
    return with_examples(f"{prog} --model resnet50 --time-budget 8h --job nightly",
                         f"{prog} --model model.onnx --trials 200 -o model.so",
                         f"{prog} --config configs/resnet50-cpu.toml --time-budget 2h")  # fmt: skip


def _add_tune_args(p: argparse.ArgumentParser) -> None:
    _add_model_args(p, required=False)
    # None unless given, so that a config file fills them (tuner.config.DEFAULTS has the defaults).
    p.set_defaults(batch_size=None, dtype=None, verbose=None)
    _add_db_arg(p)
    p.add_argument("--config", type=Path, default=None, help="TOML file of these options (see configs/)")
    p.add_argument("--job", default=None,
                   help="job name: running the same name again resumes it (default: MODEL-DEVICE)")
    p.add_argument("--time-budget", default=None,
                   help="tuning time over all runs of the job: 90s, 45m, 2h, 8h, 1d; a plain number is "
                        "seconds (default: none)")  # fmt: skip
    p.add_argument("--trials", type=int, default=None,
                   help="measurements in all, a cap beside --time-budget (default 64 without a budget)")
    p.add_argument("--trials-per-batch", type=int, default=None,
                   help="candidates proposed, built and timed together (default 16)")
    p.add_argument("--build-timeout", type=seconds_arg, default=None,
                   help="time per build: 90s, 2m; a plain number is seconds (default 60)")
    p.add_argument("--timing", choices=["warm", "cold"], default=None,
                   help="time candidates on warm caches, or cold: inputs and weights flushed from the CPU "
                        "caches before each run, as inside a whole model (default: cold on a CPU, warm on a GPU)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default 0)")
    p.add_argument("--strategy", default=None,
                   help="search strategy: evolutionary (default), random, grid, optuna-tpe, optuna-cmaes")
    p.add_argument("--cost-model", choices=["pretrained", "online", "none"], default=None,
                   help="what ranks the candidates: pretrained (default: the device family's records, else a "
                        "stored or the shipped model, learning as the job measures), online (untrained at the "
                        "start), none (no model: ranked at random)")
    p.add_argument("--scheduler", choices=["gradient", "round-robin"], default=None,
                   help="which task gets the next batch: gradient (default: the one expected to lower the "
                        "model's latency most per trial), round-robin (the one with the fewest trials)")  # fmt: skip
    p.add_argument("--fresh", action="store_true", default=None,
                   help="ignore other jobs' records: skip no task, seed no search from them")
    p.add_argument("--skip-after", type=int, default=None,
                   help="skip a task with this many good records on the device (default 512; 0: never)")
    p.add_argument("--rerank-top", type=int, default=None,
                   help="after the search, time each heavy task's K fastest records in interleaved rounds and "
                        "rank them by those times (default 4; 0: off; CPU on a local cluster only)")
    p.add_argument("--ray-address", default=None,
                   help="existing Ray cluster: auto (on a node of it), or http://HEAD:8265 to submit the job to "
                        "the head (Ray's Jobs API); default: start one locally")
    p.add_argument("--measurer", choices=("ray", "inline"), default=None,
                   help="what builds and times the candidates: ray (default), a Ray cluster with build and run "
                        "timeouts; inline, this process without Ray (no timeouts, no isolation: for a laptop)")
    p.add_argument("-o", "--output", type=Path, default=None,
                   help="write the verified artifact: X.so (+ X.json) or a folder (nightshift run runs it)")
    p.add_argument("--no-verify", action="store_true", default=None,
                   help="skip compiling and checking the whole model after tuning")
    p.add_argument("--accuracy-inputs", type=int, default=None,
                   help="random inputs the accuracy vs fp32 is measured on, for bf16/int8 (default 8)")
    p.add_argument("-q", "--quiet", action="store_true", default=None, help="no live view")
    p.add_argument("--log-json", type=Path, default=None, help="append one JSON object per job event to FILE")


def cmd_tune(args: argparse.Namespace) -> int:
    """Run (or resume) a tuning job, then compile and check the model with its best schedules.

    The steps are :mod:`tuner.app.tune`'s, as :func:`tuner.api.tune` runs them; this shows them.
    """
    from tuner.app.tune import TuneOptions, check_options, check_tuned, gpu_absent, prepare, run_job
    from tuner.config import apply_config
    from tuner.measure.submit import check_address, is_jobs_address, submit
    from tuner.progress import JsonLog, LiveView

    check_address(args.ray_address)
    if is_jobs_address(args.ray_address):  # the driver runs on the head; this process follows it
        argv = getattr(args, "argv", None) or []
        # Ray keeps the entrypoint in its job list: the password stays here, and the head
        # takes it from its own $NIGHTSHIFT_DB or ~/.pgpass (db_text).
        shown = redact_argv(argv)
        if shown != argv:
            console.print("the job's command line carries --db without its password: the head reads it from its "
                          f"${DB_ENV} (the same URL) or ~/.pgpass", soft_wrap=True, highlight=False)  # fmt: skip
        return submit(args.ray_address, shown, token=os.environ.get("RAY_AUTH_TOKEN"))

    apply_config(args)
    if args.verbose:
        logging.getLogger().setLevel(logging.DEBUG)
    options = TuneOptions.from_namespace(args, db=db_text(args.db))
    db_url = check_options(options)
    loaded = _load(args)
    job = prepare(options, loaded, db_url, status=console.status)
    log = None
    if args.log_json is not None:
        try:
            log = JsonLog(args.log_json)
        except OSError as err:
            raise UserInputError(f"cannot write --log-json {args.log_json}: {err.strerror}") from err
    from tuner.db import redact

    spec, device = loaded.spec, job.device
    _print_precision(spec, loaded.precision, device.target)
    from tuner.graph.tasks import operator_count

    ops = operator_count(job.tasks)
    of = f" for {ops} operators (layout alternatives tuned side by side)" if ops != len(job.tasks) else ""
    console.print(f"[bold]{spec.name}[/] ({loaded.precision}): {len(job.tasks)} tasks{of} on {device.name} "
                  f"({device.arch}, fingerprint {device.fingerprint}); database {redact(job.db.url)}")
    view = LiveView(console, quiet=args.quiet)

    def on_event(ev: dict) -> None:
        view(ev)
        if log is not None:
            log(ev)

    try:
        summary = run_job(job, on_event=on_event, status=console.status)
    except KeyboardInterrupt:
        view.close()
        console.print(f"stopped job {job.config.name}; everything measured is saved. Resume with:\n  "
                      f"{_resume_command(job.config.name)}", highlight=False, soft_wrap=True)
        return 130
    finally:
        view.close()
        if log is not None:
            log.close()
    idle = "" if summary.device_idle_fraction is None else f"; device idle {summary.device_idle_fraction:.0%}"
    console.print(f"job {summary.name} (#{summary.job_id}) {summary.state}: {summary.reason}; {summary.trials} "
                  f"trials in {summary.elapsed_s:.0f} s; failed candidates: {summary.errors or 'none'}{idle}")
    if loaded.auto_layouts() is not None:
        _plan(loaded, job.db)  # say which layout each conv gets, and why, even without -o
    if not options.verify:
        return 0
    if gpu_absent(job):  # tuned on a GPU worker: compile and check there
        console.print(f"no {device.name} on this machine to check the tuned model on; run "
                      f"`nightshift compile` on a machine with the GPU")
        return 0
    checked = check_tuned(job, summary, status=console.status)
    if checked.reduced is not None:
        return _show_reduced(checked, spec, device)
    return _show_verified(checked, spec, device)


def _resume_command(name: str) -> str:
    """The command line that resumes the job: this one, with ``--job NAME``."""
    import shlex

    argv = [Path(sys.argv[0]).name, *sys.argv[1:]]
    if argv[0] not in ("tune", "nightshift"):
        argv = ["tune", *sys.argv[1:]]
    if "--job" not in argv and not any(a.startswith("--job=") for a in argv):
        argv += ["--job", name]
    shown = redact_argv(argv)
    # The hidden password is found again where the hint is run (db_text).
    note = f"  (the password from ${DB_ENV} or ~/.pgpass)" if shown != argv else ""
    return shlex.join(shown) + note


def _latency_cells(stats, median_s: float) -> tuple[str, str]:
    """A row's median and IQR cells (ms); the IQR is blank without the runs."""
    if stats is None:
        return f"{median_s * 1e3:,.3f}", ""
    return f"{stats.median_ms:,.3f}", f"{stats.p25_ms:,.3f}-{stats.p75_ms:,.3f}"


def _warn_if_slower(checked) -> None:
    """A tuned build slower than its baseline, said loudly with the reason."""
    warning = checked.slower_warning()
    if warning is not None:
        console.print(f"[bold yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)


def _show_reduced(checked, spec, device) -> int:
    """:func:`tuner.app.verify.verify_reduced`'s result as a table; 1 if its output is not finite."""
    from tuner.bench import ratio_text

    r = checked.reduced
    precision = r.precision
    runs = "medians" if r.tuned_stats is None else f"median of {r.tuned_stats.runs} runs"
    table = Table(title=f"{spec.name} on {device.name}: latency in ms, {runs}")
    for col in ("build", "median ms", "IQR ms", "max rel. error", "top-1 agreement"):
        table.add_column(col, justify="left" if col == "build" else "right")
    table.add_row(f"fp32 ({len(r.reference.tuned)} ops tuned)",
                  *_latency_cells(r.reference_stats, r.reference_latency_s), "reference", "reference")  # fmt: skip
    acc = r.accuracy
    top1 = "n/a" if acc.top1_agreement is None else f"{acc.top1_agreement:.1%}"
    table.add_row(f"{precision} ({len(r.tuned.tuned)} ops tuned, {len(r.tuned.fallback)} default)",
                  *_latency_cells(r.tuned_stats, r.tuned_latency_s), f"{acc.max_rel_error:.2e}", top1)  # fmt: skip
    out.print(table)
    if r.tuned_stats is not None:
        out.print(r.tuned_stats.headline(f"{precision} build"), highlight=False)
    out.print(f"{precision} build: {ratio_text(r.tuned_latency_s, r.reference_latency_s, 'the fp32 build')} "
              f"(lower is better); accuracy {acc.describe()}", highlight=False)  # fmt: skip
    _warn_if_slower(checked)
    if checked.artifact is not None:
        out.print(f"wrote {checked.artifact} (metadata {checked.metadata}); run it with: "
                  f"nightshift run {checked.artifact} --random-input --rounds 100")
    if not r.ok:
        console.print(f"[red]error:[/] the {precision} model's output is not finite")
        return 1
    return 0


def _show_verified(checked, spec, device) -> int:
    """:func:`tuner.app.verify.verify`'s result as a table, the tuned build's latency as a
    multiple of the fallback build's and the fastest peer's (CPU; else of TVM's default
    build), and the artifact written; 1 if the output differs from the reference's or the peer's."""
    from tuner.bench import ratio_text

    r = checked.verified
    peers = r.peers
    if peers is not None:
        timing = f"medians of {peers.rounds} interleaved rounds"
    else:
        timing = "medians" if r.tuned_stats is None else f"median of {r.tuned_stats.runs} runs"
    # The method is said in full on the tuned build's line below: a long title wraps.
    table = Table(title=f"{spec.name} on {device.name}: latency in ms, {timing}")
    for col in ("build", "median ms", "IQR ms"):
        table.add_column(col, justify="left" if col == "build" else "right")
    if peers is not None and peers.fallback is not None:
        table.add_row("fallback schedules (0 trials)", *_latency_cells(peers.fallback_stats, peers.fallback))
    table.add_row(f"tuned ({len(r.tuned.tuned)} ops tuned, {len(r.tuned.fallback)} default)",
                  *_latency_cells(r.tuned_stats, r.tuned_latency_s))
    if peers is not None and peers.peer is not None:
        table.add_row(peers.peer_label, *_latency_cells(peers.peer_stats, peers.peer))
    untuned = "TVM default build"
    if peers is not None:
        untuned += f", timed apart{'' if r.base_stats is None else f' ({r.base_stats.runs} runs)'}"
    table.add_row(f"[dim]{untuned}[/]", *_latency_cells(r.base_stats, r.base_latency_s))
    out.print(table)
    if r.tuned_stats is not None:
        out.print(r.tuned_stats.headline("tuned build"), highlight=False)
    if peers is not None:
        out.print(peers.summary, markup=False, highlight=False)
        for line in peers.peer_mismatches:
            console.print(f"[yellow]warning:[/] {line}", highlight=False)
    else:  # no fallback build or peer timed here (a GPU): TVM's default build is the baseline
        out.print(f"tuned build: {ratio_text(r.tuned_latency_s, r.base_latency_s, 'TVM default build')} "
                  "(lower is better)", highlight=False)  # fmt: skip
    out.print(f"max relative output difference vs the TVM default build {r.untuned_error:.2e}", highlight=False)
    _warn_if_slower(checked)
    if r.check.reference != "untuned TVM build":
        out.print(f"max relative output difference vs {r.check.reference} {r.check.max_error:.2e}")
    if checked.artifact is not None:
        out.print(f"wrote {checked.artifact} (metadata {checked.metadata}); run it with: "
                  f"nightshift run {checked.artifact} --random-input --rounds 100")
    if not r.check.ok:
        console.print(f"[red]error:[/] the tuned model's output differs from the {r.check.reference}'s")
        return 1
    if peers is not None and not peers.agree:
        console.print("[red]error:[/] the tuned model's output differs from the reference peer's "
                      "(nightshift bench shows each runtime's error)")
        return 1
    return 0
