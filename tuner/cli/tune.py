"""``tune``: run (or resume) a tuning job, then compile, verify and time the model."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from rich.table import Table

from tuner.cli.common import (
    _add_db_arg,
    _add_model_args,
    _auto_layouts,
    _extract,
    _load,
    _open_db,
    _plan,
    _print_precision,
    console,
    out,
)
from tuner.errors import UserInputError

logger = logging.getLogger(__name__)


def _add_tune_args(p: argparse.ArgumentParser) -> None:
    _add_model_args(p, required=False)
    # None unless given, so that a config file fills them (tuner.config.DEFAULTS has the defaults).
    p.set_defaults(batch_size=None, dtype=None, verbose=None)
    _add_db_arg(p)
    p.add_argument("--config", type=Path, default=None, help="TOML file of these options (see configs/)")
    p.add_argument("--job", default=None,
                   help="job name: running the same name again resumes it (default: MODEL-DEVICE)")
    p.add_argument("--time-budget", default=None,
                   help="tuning time over all runs of the job: 90s, 45m, 2h, 8h (default: none)")
    p.add_argument("--trials", type=int, default=None,
                   help="measurements in all, a cap beside --time-budget (default 64 without a budget)")
    p.add_argument("--trials-per-batch", type=int, default=None,
                   help="candidates proposed, built and timed together (default 16)")
    p.add_argument("--build-timeout", type=float, default=None, help="seconds per build (60)")
    p.add_argument("--timing", choices=["warm", "cold"], default=None,
                   help="time candidates on warm caches, or cold: inputs and weights flushed from the CPU "
                        "caches before each run, as inside a whole model (default: cold on a CPU, warm on a GPU)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default 0)")
    p.add_argument("--strategy", default=None,
                   help="search strategy: evolutionary (default), random, grid, optuna-tpe, optuna-cmaes")
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
    """Run (or resume) a tuning job, then compile and check the model with its best schedules."""
    from tuner.config import apply_config, parse_duration
    from tuner.job import TuneConfig, tune_tasks
    from tuner.measure.base import MeasureConfig
    from tuner.measure.ray_measure import connect
    from tuner.measure.runner import TimingConfig
    from tuner.measure.submit import check_address, is_jobs_address, submit
    from tuner.progress import JsonLog, LiveView

    check_address(args.ray_address)
    if is_jobs_address(args.ray_address):  # the driver runs on the head; this process follows it
        return submit(args.ray_address, getattr(args, "argv", None) or [], token=os.environ.get("RAY_AUTH_TOKEN"))

    apply_config(args)
    if args.verbose:
        logging.getLogger().setLevel(logging.DEBUG)
    budget = None if args.time_budget is None else parse_duration(args.time_budget)
    trials = args.trials if args.trials is not None or budget is not None else 64
    device, spec = _load(args)
    if args.timing == "cold" and device.kind != "cpu":
        raise UserInputError(f"--timing cold flushes CPU caches; {device.name} is timed warm: drop --timing")
    # Cold on a CPU: ResNet-50 as fast as warm-tuned at equal trials in 40% less tuning time,
    # BERT-base 11-13% faster, on a Zen 4 (benchmarks/README.md, "Cold timing in tune").
    timing = args.timing or ("cold" if device.kind == "cpu" else "warm")
    config = TuneConfig(
        trials=trials, time_budget_s=budget, batch_size=args.trials_per_batch, seed=args.seed,
        strategy=args.strategy,
        measure=MeasureConfig(build_timeout_s=args.build_timeout, timing=TimingConfig.of_mode(timing)),
        name=args.job or f"{spec.name}-{device.name}", fresh=args.fresh, skip_after=args.skip_after,
        rerank_top=args.rerank_top, measurer=args.measurer,
    )  # fmt: skip
    if args.measurer == "inline" and (args.ray_address is not None or device.kind != "cpu"):
        raise UserInputError("--measurer inline times on this machine's CPU: drop --ray-address, use --device cpu")
    if device.kind == "cuda":
        device = _gpu_worker_device(device, args.ray_address)
    log = None
    if args.log_json is not None:
        try:
            log = JsonLog(args.log_json)
        except OSError as err:
            raise UserInputError(f"cannot write --log-json {args.log_json}: {err.strerror}") from err
    db = _open_db(args.db, create=True)
    with console.status("extracting tasks"):
        tasks = _extract(args, device, spec)
    from tuner.db import redact

    _print_precision(spec, args.precision, device.target)
    console.print(f"[bold]{spec.name}[/] ({args.precision}): {len(tasks)} tasks on {device.name} ({device.arch}, "
                  f"fingerprint {device.fingerprint}); database {redact(db.url)}")
    if args.measurer == "ray":
        with console.status("starting Ray"):
            connect(args.ray_address)  # already connected for a CUDA device
    view = LiveView(console, quiet=args.quiet)

    def on_event(ev: dict) -> None:
        view(ev)
        if log is not None:
            log(ev)

    try:
        summary = tune_tasks(tasks, device, db, config, model_name=spec.name, on_event=on_event)
    except KeyboardInterrupt:
        view.close()
        console.print(f"stopped job {config.name}; everything measured is saved. Resume with:\n  "
                      f"{_resume_command(config.name)}", highlight=False, soft_wrap=True)
        return 130
    finally:
        view.close()
        if log is not None:
            log.close()
    idle = "" if summary.device_idle_fraction is None else f"; device idle {summary.device_idle_fraction:.0%}"
    console.print(f"job {summary.name} (#{summary.job_id}) {summary.state}: {summary.reason}; {summary.trials} "
                  f"trials in {summary.elapsed_s:.0f} s; failed candidates: {summary.errors or 'none'}{idle}")
    if args.ray_address is None and args.measurer == "ray":
        import ray

        # The local cluster's processes (its device actor's TVM thread pool included) would
        # share the cores with the closing timings.
        ray.shutdown()
    if _auto_layouts(args, device) is not None:
        _plan(args, device, db, spec)  # say which layout each conv gets, and why, even without -o
    if args.no_verify:
        return 0
    if device.kind == "cuda":
        from tuner.cuda_runtime import gpu_identity

        if gpu_identity(device.index) is None:  # tuned on a GPU worker: compile and check there
            console.print(f"no {device.name} on this machine to check the tuned model on; run "
                          f"`nightshift compile` on a machine with the GPU")
            return 0
    if args.precision.reduced:
        return _verify_reduced(spec, device, db, args.output, plan=_plan(args, device, db, spec),
                               precision=args.precision, num_inputs=args.accuracy_inputs,
                               fp32_spec=args.fp32_spec)  # fmt: skip
    return _verify(spec, device, db, args.output, source=args.model, plan=_plan(args, device, db, spec),
                   job={"id": summary.job_id, "name": summary.name}, tasks=tasks)


def _resume_command(name: str) -> str:
    """The command line that resumes the job: this one, with ``--job NAME``."""
    import shlex

    argv = [Path(sys.argv[0]).name, *sys.argv[1:]]
    if argv[0] not in ("tune", "nightshift"):
        argv = ["tune", *sys.argv[1:]]
    if "--job" not in argv and not any(a.startswith("--job=") for a in argv):
        argv += ["--job", name]
    return shlex.join(argv)


def _gpu_worker_device(device, ray_address: str | None):
    """The CUDA device as the cluster node that times it sees it (the driver may have no GPU)."""
    import ray

    from tuner.errors import CudaToolchainError
    from tuner.measure.base import device_resource
    from tuner.measure.ray_measure import connect, identify_gpu_worker, worker_command

    with console.status("starting Ray"):
        connect(ray_address)
    resource = device_resource(device)
    if ray.cluster_resources().get(resource, 0) < 1:
        where = "this machine has none and no --ray-address was given" if ray_address is None else \
            "no node of the Ray cluster offers it"
        raise UserInputError(f"no GPU worker for {device.name} ({resource}): {where}; start one with: "
                             f"{worker_command(device)}")
    try:
        return identify_gpu_worker(device)
    except CudaToolchainError as err:
        raise UserInputError(str(err)) from err


def _verify_reduced(spec, device, db, output: Path | None, *, plan, precision: str, num_inputs: int,
                    fp32_spec=None) -> int:  # fmt: skip
    """Compile the reduced-precision model and its fp32 build (the database's records of each),
    report latency and accuracy against fp32 (:mod:`tuner.precision.accuracy`). ``fp32_spec``:
    the float model a QDQ ``spec`` was quantized from, the reference when given."""
    import numpy as np

    from tuner.compile import compile_model, run_model
    from tuner.precision.accuracy import measure_accuracy

    inputs = spec.random_inputs(seed=0)
    with console.status("compiling and running the fp32 model"):
        ref = compile_model(fp32_spec or spec, device, db, plan=plan)
        _, ref_lat = run_model(ref, device, inputs)
    with console.status(f"compiling and running the {precision} model"):
        tuned = compile_model(spec, device, db, plan=plan, precision=precision)
        _, tuned_lat = run_model(tuned, device, inputs)
    with console.status(f"measuring accuracy on {num_inputs} inputs"):
        acc = measure_accuracy(spec, device, ref, tuned, num_inputs=num_inputs)
    table = Table(title=f"{spec.name} on {device.name}")
    for col in ("build", "latency (ms)", "max rel. error", "top-1 agreement"):
        table.add_column(col, justify="left" if col == "build" else "right")
    table.add_row(f"fp32 ({len(ref.tuned)} ops tuned)", f"{ref_lat * 1e3:,.2f}", "reference", "reference")
    top1 = "n/a" if acc.top1_agreement is None else f"{acc.top1_agreement:.1%}"
    table.add_row(f"{precision} ({len(tuned.tuned)} ops tuned, {len(tuned.fallback)} default)",
                  f"{tuned_lat * 1e3:,.2f}", f"{acc.max_rel_error:.2e}", top1)  # fmt: skip
    out.print(table)
    out.print(f"{precision} speed-up over fp32 {ref_lat / tuned_lat:.2f}x; accuracy {acc.describe()}")
    if output is not None:
        tuned.executable.export_library(str(output))
        out.print(f"wrote {output}")
    if not np.isfinite(acc.max_rel_error):
        console.print(f"[red]error:[/] the {precision} model's output is not finite")
        return 1
    return 0


def _verify(spec, device, db, output: Path | None, source: str | None = None, *, plan=None,
            job: dict | None = None, tasks=()) -> int:
    """Compile untuned and tuned, run both on the same input, verify, report latency, write the artifact.

    The tuned output is verified against ONNX Runtime for ONNX models (where installed), else
    against the untuned build; ``output`` gets the artifact (``tuner.artifact``).

    Beside the untuned build, the tuned one is timed interleaved with the zero-trial fallback
    build and the faster of ONNX Runtime and OpenVINO (f32: ``INFERENCE_PRECISION_HINT=f32``) where
    installed (``tuner.bench``).
    """
    from tuner.artifact import Verification, onnx_reference, scaled_error, write_artifact
    from tuner.compile import compile_model, run_model

    inputs = spec.random_inputs(seed=0)
    with console.status("compiling and running the untuned model"):
        base = compile_model(spec, device, None, plan=plan)
        base_out, base_lat = run_model(base, device, inputs)
    with console.status("compiling and running the tuned model"):
        tuned = compile_model(spec, device, db, plan=plan)
        tuned_out, tuned_lat = run_model(tuned, device, inputs)
    worst = scaled_error(base_out, tuned_out)
    check = Verification("untuned TVM build", worst)
    if source is not None and source.lower().endswith(".onnx"):
        reference = onnx_reference(source, inputs, int(device.target_config.get("num-cores", 1)))
        if reference is not None:
            check = Verification(reference[0], scaled_error(reference[1], tuned_out))
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
    if check.reference != "untuned TVM build":
        out.print(f"max relative output difference vs {check.reference} {check.max_error:.2e}")
    if output is not None:
        meta = write_artifact(output, tuned, spec, device, latency_s=tuned_lat, untuned_latency_s=base_lat,
                              verification=check, job=job, source=source, outputs=tuned_out,
                              # Under --layout auto the job tuned convs in layouts the plan leaves out.
                              tasks=[t for t in tasks if t.workload_key in tuned.decisions] or tasks)
        out.print(f"wrote {output} (metadata {meta}); run it with: nightshift run {output} --input x.npy")
    if not check.ok:
        console.print(f"[red]error:[/] the tuned model's output differs from the {check.reference}'s")
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
