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
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console
from rich.logging import RichHandler
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
    p.add_argument("--layout", default=None, choices=("auto", "NCHW", "NHWC", "NCHWc", "NCHWc:w4", "NCHWc:w2"),
                   help="convs' data layout; auto (default): on x86 with AVX2/AVX-512, tune each conv in NCHWc "
                        "(blocked by the vector width), NCHWc with its 3x3 stride-1 convs by Winograd F(4, 3) or "
                        "F(2, 3) (NCHWc:w4, NCHWc:w2) and NCHW, compile each in the layout its measurements "
                        "favour; bf16 weighs NCHWc and NCHWc:w2 (its GEMMs on vdpbf16ps) where the CPU has "
                        "no AMX, int8 takes NCHWc")
    p.add_argument("--precision", default=None, choices=("fp32", "bf16", "int8"),
                   help="fp32 (default); bf16 (needs AVX512_BF16 or AMX); int8 (needs VNNI): a QDQ model as it "
                        "is, a float one quantized first with onnxruntime")
    p.add_argument("--calibration", type=int, default=None,
                   help="random inputs that --precision int8 calibrates a float model's quantization on (default 32)")
    p.add_argument("--quantize-ops", default=None,
                   help="ONNX operator types --precision int8 quantizes in a float model, comma-separated "
                        "(default Conv,Gemm,MatMul: LayerNorm and the adds stay fp32; all: every one onnxruntime can)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def _add_db_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", default=None,
                   help=f"database URL or SQLite file (default: ${DB_ENV} or ./{DEFAULT_DB})")


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


def _open_db(text: str | None, *, create: bool = False):
    """The tuning database of ``--db``/the environment; only ``tune`` creates a missing one."""
    from tuner.cli_db import db_text, open_existing

    return open_existing(db_text(text), create=create)


def _load(args: argparse.Namespace):
    from tuner.device import parse_device

    args.device = args.device or "cpu"
    from tuner.frontends import load_model
    from tuner.precision import check_device

    device = parse_device(args.device, target_arch=args.target_arch, num_cores=args.num_cores)
    args.precision = args.precision or "fp32"
    if getattr(args, "accuracy_inputs", 1) < 1:
        raise UserInputError(f"--accuracy-inputs must be a positive count, got {args.accuracy_inputs}")
    check_device(args.precision, device)  # before any work: no silent slow emulation
    spec = load_model(args.model, batch_size=args.batch_size, dtype=args.dtype)
    args.fp32_spec = None
    if args.precision == "int8":
        spec = _quantized(args, spec, device)
    return device, spec


def _quantized(args: argparse.Namespace, spec, device):
    """``spec`` when it is a quantized (QDQ) model; a float one quantized first, said so."""
    from tuner.frontends import load_model
    from tuner.precision import int8_weight_bits
    from tuner.precision.quantize import DEFAULT_CALIBRATION, has_qdq, parse_ops, quantized_model

    if has_qdq(spec.bound()):
        return spec
    n = args.calibration or DEFAULT_CALIBRATION
    ops = parse_ops(getattr(args, "quantize_ops", None))
    bits = int8_weight_bits(device.target)
    with console.status(f"quantizing {spec.name} with onnxruntime on {n} random inputs"):
        path = quantized_model(spec, args.model, n, op_types=ops, weight_bits=bits)
    which = f"{', '.join(ops)} only" if ops is not None else "every operator it quantizes"
    weights = ("per-channel int8 weights" if bits == 8 else
               "per-channel 7-bit weights (reduce_range: this CPU's int8 dot product, vpmaddubsw, adds pairs "
               "of products in int16, which 8-bit weights can saturate)")  # fmt: skip
    console.print(f"int8: {spec.name} is a float model; quantized with onnxruntime's quantize_static (QDQ, "
                  f"{weights}, uint8 activations; {which}), calibrated on {n} random inputs: {path}")
    args.fp32_spec, args.model = spec, str(path)
    return load_model(str(path))


def _auto_layouts(args: argparse.Namespace, device) -> tuple[str, ...] | None:
    """The layouts ``--layout auto`` tunes and chooses between for this device, or None where
    it is a fixed plan (an explicit --layout, or one candidate layout: a reduced precision)."""
    from tuner.graph.layout.plan import auto_layouts

    if (getattr(args, "layout", None) or "auto") != "auto":
        return None
    layouts = auto_layouts(device.target, args.precision or "fp32")
    return layouts if len(layouts) > 1 else None


def _extract(args: argparse.Namespace, device, spec):
    """The tasks to tune: with a measured ``--layout auto``, every conv in each candidate layout."""
    from tuner.graph.tasks import extract_layout_tasks, extract_tasks

    layouts = _auto_layouts(args, device)
    if layouts is not None:
        return extract_layout_tasks(spec.bound(), device.target, layouts, precision=args.precision)
    return extract_tasks(spec.bound(), device.target, _plan(args, device), precision=args.precision)


def _plan(args: argparse.Namespace, device, db=None, spec=None):
    """The layout plan of ``--layout``; for ``auto`` with a database, the per-conv plan its
    measurements favour (:func:`tuner.graph.layout.choose.choose_from_database`), chosen once per command
    and printed with the measured costs behind it."""
    from tuner.graph.layout.plan import LayoutPlan

    if db is None or spec is None or _auto_layouts(args, device) is None:
        return LayoutPlan.parse(getattr(args, "layout", None) or "auto", device.target)
    chosen = getattr(args, "chosen_layout", None)
    if chosen is None:
        with console.status("choosing each conv's layout from the measurements"):
            chosen = args.chosen_layout = measured_plan(spec, device, db, args.precision, show=True)
    return chosen.plan


def choose_layout(spec, device, db, layouts: Sequence[str], precision: str = "fp32"):
    """:func:`tuner.graph.layout.choose.choose_from_database` on ``db``'s best records for ``device``
    (same-architecture records where the device has none, as the compiler uses them)."""
    from tuner.graph.layout.choose import choose_from_database
    from tuner.precision import apply_precision

    dev_id = db.find_device_id(device)
    cache: dict[str, float | None] = {}

    def best(key: str) -> float | None:
        if key not in cache:
            found = db.lookup(key, dev_id, policy="same-arch") if dev_id is not None else []
            cache[key] = found[0].row.mean_sec if found else None
        return cache[key]

    return choose_from_database(apply_precision(spec.bound(), precision, device.target), device.target, best, layouts,
                                precision=precision)  # fmt: skip


def measured_plan(spec, device, db, precision: str = "fp32", *, show: bool = False):
    """What ``--layout auto`` compiles ``spec`` with from ``db``: the :func:`choose_layout`
    choice where the device weighs several layouts at ``precision``, else None (the target's
    default plan). ``show`` prints the choice as ``tune`` does."""
    from tuner.graph.layout.plan import auto_layouts

    layouts = auto_layouts(device.target, precision)
    if len(layouts) < 2:
        return None
    chosen = choose_layout(spec, device, db, layouts, precision)
    if show:
        print_layout_choice(chosen, layouts)
    return chosen


def print_layout_choice(choice, layouts: Sequence[str]) -> None:
    """Each conv's layout and the measured bests it was chosen from, then the plans weighed;
    nothing for a model without convs (BERT), which no layout changes."""
    if not choice.convs:
        return
    table = Table(title="--layout auto: each conv's layout from the measured bests (ms)")
    for col in ("#", "conv", "layout", *layouts):
        table.add_column(col, justify="left" if col in ("conv", "layout") else "right")
    for c in choice.convs:
        cells = [f"{c.seconds[x] * 1e3:.3f}" if x in c.seconds else "-" for x in layouts]
        table.add_row(str(c.index), c.shape, c.layout, *cells)
    out.print(table)
    source = "measured layout_transform tasks" if choice.bandwidth_measured else "no transform measured, assumed"
    # A per-conv plan spells out every conv; the table above already shows each one's layout.
    label = "per conv (the table above)" if choice.plan.layouts else str(choice.plan)
    out.print(f"layout plan {label}: {choice.describe()}; a transform moves {choice.bandwidth / 1e9:.1f} "
              f"GB/s ({source})", highlight=False, soft_wrap=True)  # fmt: skip


def cmd_tasks(args: argparse.Namespace) -> int:
    """Print the model's fused-operator tasks."""
    device, spec = _load(args)
    with console.status("extracting tasks"):
        tasks = _extract(args, device, spec)
    table = Table(title=f"{spec.name} on {device.name} ({device.arch}), {args.precision}: {len(tasks)} tasks")
    for col in ("#", "task", "layout", "weight", "MFLOP", "workload key"):
        table.add_column(col, justify="right" if col in ("#", "weight", "MFLOP") else "left")
    for i, t in enumerate(tasks):
        table.add_row(str(i), t.name, t.layout, str(t.weight), f"{t.flops / 1e6:,.1f}", t.workload_key)
    out.print(table)
    _print_precision(spec, args.precision, device.target)
    total = sum(t.weight * t.flops for t in tasks)
    out.print(f"total {total / 1e9:,.2f} GFLOP per inference")
    return 0


def _print_precision(spec, precision: str, target) -> None:
    """Say which operators the precision converted and which stay fp32 (and why)."""
    from tuner.precision import describe

    line = describe(spec.bound(), precision, target)
    if line is not None:
        out.print(line)


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
    if args.precision != "fp32":
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


def cmd_compile(args: argparse.Namespace) -> int:
    """Compile a model with the database's best schedules into a deployable library."""
    from tuner.compile import compile_model

    device, spec = _load(args)
    db = _open_db(args.db)
    with console.status("compiling"):
        compiled = compile_model(spec, device, db, policy=args.policy, plan=_plan(args, device, db, spec),
                                 precision=args.precision)  # fmt: skip
    table = Table(title=f"{spec.name} on {device.name} ({device.arch}), {args.precision}: what each operator got")
    for col in ("operator", "schedule", "detail"):
        table.add_column(col)
    order = {"tuned": 0, "same-arch": 1, "foreign": 2, "fallback": 3, "tvm-default": 4}
    for d in sorted(compiled.decisions.values(), key=lambda d: (order.get(d.kind, 9), d.name)):
        table.add_row(d.name, d.kind, d.detail)
    kinds = [d.kind for d in compiled.decisions.values()]
    out.print(f"{kinds.count('tuned')} operators tuned on this device, {kinds.count('same-arch')} from another "
              f"device of the same architecture, {kinds.count('foreign')} from imported records, "
              f"{kinds.count('fallback')} with the fallback schedule, {kinds.count('tvm-default')} with TVM's "
              "default lowering")
    out.print(table)
    stale = compiled.tuned_in_another_form(db)
    if stale:
        from tuner.compile import retune_hint

        console.print(f"[yellow]warning:[/] {retune_hint(stale)}", soft_wrap=True, highlight=False)
    if db.rejected:
        console.print(f"[yellow]warning:[/] {len(db.rejected)} record(s) rejected by the trace allow-list: "
                      + "; ".join(f"record {i}: {r}" for i, r in sorted(db.rejected.items())[:5]),
                      soft_wrap=True, highlight=False)  # fmt: skip
    from tuner.artifact import Verification, write_artifact
    from tuner.compile import VERIFY_TOLERANCE, max_difference, verify_wanted

    checked = None
    if verify_wanted(args.verify, spec, device):
        with console.status("checking the output against the untuned build"):
            worst = max_difference(spec, device, compiled, plan=_plan(args, device, db, spec))
        checked = Verification("untuned TVM build", worst, VERIFY_TOLERANCE)
        if not checked.ok:
            console.print(f"[red]error:[/] the compiled model's output differs from the untuned build's "
                          f"(max relative difference {worst:.2e}); {args.output} not written")
            return 1
        out.print(f"output checked against the untuned build (max relative difference {worst:.1e})")
    # The same artifact as `tune -o` writes: `nightshift run` needs its metadata.
    meta = write_artifact(args.output, compiled, spec, device, latency_s=None, verification=checked, source=args.model)
    out.print(f"wrote {args.output} (metadata {meta}) in {compiled.compile_s:.1f} s; run it with: "
              f"nightshift run {args.output} --input x.npy")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Benchmark the database's build and the fallback build against the installed peers."""
    import json

    from tuner.bench import BenchConfig, bench, render

    if args.json is not None and not args.json.parent.is_dir():
        raise UserInputError(f"--json {args.json}: folder {args.json.parent} does not exist")
    device, spec = _load(args)
    db = _open_db(args.db)
    plan = _plan(args, device, db, spec)
    config = BenchConfig(rounds=args.rounds, peers=tuple(args.peers), plan=plan, precision=args.precision,
                         accuracy_inputs=args.accuracy_inputs, reference_spec=args.fp32_spec,
                         layout_choice=getattr(args, "chosen_layout", None))  # fmt: skip
    with console.status("benchmarking") as status:
        result = bench(spec, device, db, source=args.model, config=config,
                       on_stage=lambda text: status.update(text))  # fmt: skip
    out.print(render(result))
    if result.accuracy is not None:
        out.print(f"TVM {args.precision} accuracy {result.accuracy.describe()}")
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
    p.add_argument("--verify", choices=("auto", "on", "off"), default="auto",
                   help="check the output against the untuned build (auto, default: when that build is cheap)")
    p.set_defaults(func=cmd_compile)
    p = sub.add_parser("bench", help="time the tuned and fallback builds against ONNX Runtime, OpenVINO, PyTorch")
    _add_model_args(p)
    _add_db_arg(p)
    p.add_argument("--json", type=Path, default=None, help="also write the results as JSON to this file")
    p.add_argument("--rounds", type=int, default=10, help="interleaved timed rounds (default 10)")
    p.add_argument("--accuracy-inputs", type=int, default=8,
                   help="random inputs the accuracy vs fp32 is measured on, for bf16/int8 (default 8)")
    p.add_argument("--peers", nargs="+", choices=list(PEERS), default=list(PEERS), metavar="PEER",
                   help=f"peers to run (default all: {' '.join(PEERS)})")
    p.set_defaults(func=cmd_bench)
    from tuner.cli_db import add_db_commands

    add_db_commands(sub, _add_db_arg)
    from tuner.cli_model import add_model_commands

    add_model_commands(sub, _add_db_arg)
    from tuner.cli_report import add_report_commands

    add_report_commands(sub, _add_db_arg)
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


def build_parser(prog: str = "nightshift") -> argparse.ArgumentParser:
    """The ``nightshift`` command line's parser (every command and option)."""
    return _parser(prog)


def build_tune_parser() -> argparse.ArgumentParser:
    """The ``tune`` command line's parser."""
    parser = argparse.ArgumentParser(prog="tune", description="Run a Nightshift tuning job.")
    _add_tune_args(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``nightshift``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser("nightshift").parse_args(argv)
    args.argv = argv
    return _run(args.func, args)


def tune_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``tune`` (same as ``nightshift tune``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_tune_parser().parse_args(argv)
    args.argv = ["tune", *argv]
    return _run(cmd_tune, args)


if __name__ == "__main__":
    sys.exit(main())
