"""A tuning job as a use case: typed options in, the job's summary and its checked artifact out.

``tune`` (the command line) and :func:`tuner.api.tune` (Python) run the same steps, each
showing them its own way: :func:`check_options` refuses what it can before any work,
:func:`prepare` loads nothing itself but turns a loaded model into a job ready to run,
:func:`run_job` tunes it, and :func:`check_tuned` compiles, checks, times and writes the
artifact. Nothing here prints; long steps are shown through a :data:`Status`.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.app.inputs import DEFAULT_DB, check_db, check_output, extract_tasks, open_existing
from tuner.app.model import ModelOptions, Status, no_status
from tuner.errors import UserInputError

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

    from tuner.app.model import LoadedModel
    from tuner.app.verify import Verified, VerifiedReduced
    from tuner.db import TuningDatabase
    from tuner.device import Device
    from tuner.graph.tasks import Task
    from tuner.job import TuneConfig, TuneSummary
    from tuner.progress import EventSink

logger = logging.getLogger(__name__)

#: The trials cap of a job given neither ``trials`` nor a time budget.
DEFAULT_TRIALS = 64


@dataclass(frozen=True, kw_only=True)
class TuneOptions:
    """What a tuning job is asked to do: ``tune``'s options, checked and typed.

    Attributes:
        model: what to load and how (:class:`ModelOptions`).
        db: the tuning database's URL or SQLite file.
        job: the job's name: the same name again resumes it (default ``MODEL-DEVICE``).
        time_budget_s: tuning seconds over all runs of the job (None: no budget).
        trials: measurements in all (None: 64 without a budget, else no cap).
        trials_per_batch: candidates proposed, built and timed together.
        build_timeout_s: seconds per build.
        timing: ``warm`` or ``cold`` caches (None: cold on a CPU, warm on a GPU).
        seed: the random seed.
        strategy: the search strategy's name.
        cost_model: ``pretrained``, ``online`` or ``none`` (:attr:`tuner.job.TuneConfig.cost_model`).
        scheduler: ``gradient`` or ``round-robin`` (:attr:`tuner.job.TuneConfig.scheduler`).
        fresh: ignore other jobs' records.
        skip_after: skip a task with this many good records on the device (0: never).
        rerank_top: time each heavy task's K fastest records again, interleaved (0: off).
        ray_address: an existing Ray cluster (``auto``); None: a local one, or the one this
            process already runs.
        measurer: ``ray`` (builds and timings on a Ray cluster) or ``inline`` (this process).
        output: where to write the verified artifact (None: not written).
        verify: compile, check and time the whole model after tuning.
        accuracy_inputs: random inputs a bf16/int8 model's accuracy is measured on.
    """

    model: ModelOptions
    db: str = DEFAULT_DB
    job: str | None = None
    time_budget_s: float | None = None
    trials: int | None = None
    trials_per_batch: int = 16
    build_timeout_s: float = 60.0
    timing: str | None = None
    seed: int = 0
    strategy: str = "evolutionary"
    cost_model: str = "pretrained"
    scheduler: str = "gradient"
    fresh: bool = False
    skip_after: int = 512
    rerank_top: int = 4
    ray_address: str | None = None
    measurer: str = "ray"
    output: Path | None = None
    verify: bool = True
    accuracy_inputs: int = 8

    def __post_init__(self) -> None:
        if self.timing not in (None, "warm", "cold"):
            raise UserInputError(f"--timing must be warm or cold, got {self.timing!r}")
        if self.measurer not in ("ray", "inline"):
            raise UserInputError(f"--measurer must be ray or inline, got {self.measurer!r}")
        if self.accuracy_inputs < 1:
            raise UserInputError(f"--accuracy-inputs must be a positive count, got {self.accuracy_inputs}")
        if self.time_budget_s is not None and not self.time_budget_s > 0:
            raise UserInputError(f"--time-budget must be positive, got {self.time_budget_s}")

    @property
    def trials_cap(self) -> int | None:
        """The trials cap the job runs under: :attr:`trials`, or 64 when neither it nor a budget is given."""
        return self.trials if self.trials is not None or self.time_budget_s is not None else DEFAULT_TRIALS

    @classmethod
    def from_namespace(cls, args: argparse.Namespace, *, db: str) -> TuneOptions:
        """The options of ``tune``'s namespace, once a config file and the defaults filled it
        (:func:`tuner.config.apply_config`); ``db`` is the database the caller resolved."""
        from tuner.config import parse_duration

        return cls(
            model=ModelOptions.from_namespace(args), db=db, job=args.job,
            time_budget_s=None if args.time_budget is None else parse_duration(args.time_budget),
            trials=args.trials, trials_per_batch=args.trials_per_batch, build_timeout_s=args.build_timeout,
            timing=args.timing, seed=args.seed, strategy=args.strategy, cost_model=args.cost_model, fresh=args.fresh,
            skip_after=args.skip_after, scheduler=args.scheduler,
            rerank_top=args.rerank_top, ray_address=args.ray_address, measurer=args.measurer, output=args.output,
            verify=not args.no_verify, accuracy_inputs=args.accuracy_inputs,
        )  # fmt: skip


def check_options(options: TuneOptions, *, output_option: str = "-o") -> URL:
    """Refuse what can be refused before the model loads, tuning starts and the database is
    created (a bad output path or database found after hours of tuning loses the artifact);
    the database's URL. ``output_option`` names the output in a message.

    Raises:
        UserInputError: the output cannot be written, the database path is unusable.
        DatabaseError: a PostgreSQL server cannot be reached.
    """
    if options.output is not None and options.verify:
        check_output(options.output, output_option, artifact=True)
    return check_db(options.db)


@dataclass(kw_only=True)
class PreparedJob:
    """A job ready to run: the model on its device, its tasks, the open database and the config.

    Attributes:
        ray_started: whether this job started the local Ray cluster it runs on (then
            :func:`run_job` shuts it down); False for one it joined or found running.
    """

    options: TuneOptions
    loaded: LoadedModel
    db: TuningDatabase
    tasks: list[Task]
    config: TuneConfig
    ray_started: bool = field(default=False)

    @property
    def device(self) -> Device:
        """The device the job tunes for (for CUDA: as the GPU worker sees it)."""
        return self.loaded.device


def prepare(options: TuneOptions, loaded: LoadedModel, db_url: URL, *, status: Status = no_status) -> PreparedJob:
    """The job of ``options`` on ``loaded``: the config checked, for CUDA the GPU worker found
    (on Ray), the tasks extracted, and the database opened (created if missing).

    Raises:
        UserInputError: options that contradict the device, no GPU worker, a graph TVM cannot
            extract tasks from.
    """
    from tuner.job import TuneConfig
    from tuner.measure.base import MeasureConfig
    from tuner.measure.runner import TimingConfig

    device = loaded.device
    if options.timing == "cold" and device.kind != "cpu":
        raise UserInputError(f"--timing cold flushes CPU caches; {device.name} is timed warm: drop --timing")
    # Cold on a CPU: ResNet-50 as fast as warm-tuned at equal trials in 40% less tuning time,
    # BERT-base 11-13% faster, on a Zen 4 (benchmarks/README.md, "Cold timing in tune").
    timing = options.timing or ("cold" if device.kind == "cpu" else "warm")
    config = TuneConfig(
        trials=options.trials_cap, time_budget_s=options.time_budget_s, batch_size=options.trials_per_batch,
        seed=options.seed, strategy=options.strategy, cost_model=options.cost_model, scheduler=options.scheduler,
        measure=MeasureConfig(build_timeout_s=options.build_timeout_s, timing=TimingConfig.of_mode(timing)),
        name=options.job or f"{loaded.spec.name}-{device.name}", fresh=options.fresh,
        skip_after=options.skip_after, rerank_top=options.rerank_top, measurer=options.measurer,
        model_options=options.model.stored(),
    )  # fmt: skip
    if options.measurer == "inline" and (options.ray_address is not None or device.kind != "cpu"):
        raise UserInputError("--measurer inline times on this machine's CPU: drop --ray-address, use --device cpu")
    started = False
    if device.kind == "cuda":
        loaded.device, started = _gpu_worker_device(device, options.ray_address, status)
    try:
        with status("extracting tasks"):
            tasks = extract_tasks(loaded)
        db = open_existing(db_url, create=True)
    except BaseException:
        if started:  # a Python caller goes on: leave no cluster of ours behind
            import ray

            ray.shutdown()
        raise
    return PreparedJob(options=options, loaded=loaded, db=db, tasks=tasks, config=config, ray_started=started)


def _gpu_worker_device(device: Device, ray_address: str | None, status: Status) -> tuple[Device, bool]:
    """The CUDA device as the cluster node that times it sees it (the driver may have no GPU),
    and whether connecting started the local Ray cluster."""
    import ray

    from tuner.errors import CudaToolchainError
    from tuner.measure.base import device_resource
    from tuner.measure.ray_measure import connect, identify_gpu_worker, worker_command

    with status("starting Ray"):
        started = bool(connect(ray_address))
    resource = device_resource(device)
    if ray.cluster_resources().get(resource, 0) < 1:
        where = "this machine has none and no --ray-address was given" if ray_address is None else \
            "no node of the Ray cluster offers it"
        if started:
            ray.shutdown()
        raise UserInputError(f"no GPU worker for {device.name} ({resource}): {where}; start one with: "
                             f"{worker_command(device)}")
    try:
        return identify_gpu_worker(device), started
    except CudaToolchainError as err:
        if started:
            ray.shutdown()
        raise UserInputError(str(err)) from err


def run_job(job: PreparedJob, *, on_event: EventSink | None = None, status: Status = no_status) -> TuneSummary:
    """Tune the job's tasks (:func:`tuner.job.tune_tasks`), on Ray or inline; a local Ray
    cluster this job started is shut down after it, one that was running is left running.

    Raises:
        KeyboardInterrupt: the job was interrupted; everything measured is saved.
    """
    from tuner.job import tune_tasks

    options = job.options
    if options.measurer == "ray":
        from tuner.measure.ray_measure import connect

        with status("starting Ray"):
            # Already connected for a CUDA device. connect() says whether it started a local
            # cluster; one found running (a notebook's ray.init(), RAY_ADDRESS's) is not ours.
            job.ray_started = bool(connect(options.ray_address)) or job.ray_started
    try:
        return tune_tasks(job.tasks, job.device, job.db, job.config, model_name=job.loaded.spec.name,
                          on_event=on_event)  # fmt: skip
    finally:
        if job.ray_started:
            import ray

            # The local cluster's processes (its device actor's TVM thread pool included)
            # would share the cores with the closing timings.
            ray.shutdown()
            job.ray_started = False


@dataclass(kw_only=True)
class Checked:
    """The tuned model compiled, checked and timed after its job (:func:`check_tuned`).

    Attributes:
        verified: a float model's result (:class:`tuner.app.verify.Verified`), or None.
        reduced: a bf16/int8 model's result (:class:`tuner.app.verify.VerifiedReduced`), or None.
        artifact: the artifact written (``options.output``), or None.
        metadata: its metadata file, or None (a bf16/int8 library is written without one).
        trials, tasks: the trials the job ran over every run, and the model's tasks (the
            reason given when the tuned build is slower than its baseline).
    """

    verified: Verified | None = None
    reduced: VerifiedReduced | None = None
    artifact: Path | None = None
    metadata: Path | None = None
    trials: int = 0
    tasks: int = 0

    def slower_warning(self) -> str | None:
        """A sentence when the tuned build is slower than its baseline (the 0-trial fallback
        build timed in the same rounds, else TVM's default build; fp32 for bf16/int8), with
        the reason; None when it is not."""
        from tuner.app.verify import slower_reason
        from tuner.bench import ratio_text

        if self.verified is not None:
            v = self.verified
            tuned, stats = v.tuned_latency_s, v.tuned_stats
            base, name = (v.fallback_latency_s, "the fallback build (0 trials)") if v.fallback_latency_s else \
                (v.base_latency_s, "TVM's default build")
        elif self.reduced is not None:
            r = self.reduced
            tuned, stats, base, name = r.tuned_latency_s, r.tuned_stats, r.reference_latency_s, "the fp32 build"
        else:
            return None
        if not base or tuned <= base:
            return None
        spread = stats.spread if stats is not None else 0.0
        reason = slower_reason(tuned / base, trials=self.trials, tasks=self.tasks, spread=spread)
        return f"the tuned build is slower than {name} ({ratio_text(tuned, base, 'it')}): {reason}"

    @property
    def ok(self) -> bool:
        """Whether the outputs agree with the reference (and the peer), or are finite (bf16/int8)."""
        result: Any = self.verified or self.reduced
        return bool(result is None or result.ok)


def gpu_absent(job: PreparedJob) -> bool:
    """Whether the job tuned a GPU this machine does not have (on a Ray worker): the model is
    then compiled and checked on a machine with the GPU (``nightshift compile``)."""
    if job.device.kind != "cuda":
        return False
    from tuner.cuda_runtime import gpu_identity

    return gpu_identity(job.device.index) is None


def check_tuned(job: PreparedJob, summary: TuneSummary, *, status: Status = no_status) -> Checked:
    """Compile the model with the database's best schedules, check its output against a
    reference, time it, and write the artifact to ``options.output`` (if given).

    The layout plan is the one the job's measurements favour (:meth:`LoadedModel.plan`).
    """
    from tuner.app.verify import verify, verify_reduced

    loaded, options, db = job.loaded, job.options, job.db
    spec, device, output = loaded.spec, job.device, options.output
    plan = loaded.plan(db)
    if loaded.precision.reduced:
        reduced = verify_reduced(spec, device, db, plan=plan, precision=loaded.precision,
                                 num_inputs=options.accuracy_inputs, fp32_spec=loaded.fp32_spec,
                                 status=status)  # fmt: skip
        meta = None
        if output is not None:
            from tuner.artifact import write_artifact

            ref = reduced.reference_stats
            fp32 = {} if ref is None else {"fp32": {"label": "the fp32 build", **ref.to_json(),
                                                    "ratio": reduced.tuned_latency_s * 1e3 / ref.median_ms}}
            # Same metadata as fp32's, so `nightshift run`, `bench --job` and the report read it.
            meta = write_artifact(output, reduced.tuned, spec, device, latency_s=reduced.tuned_latency_s,
                                  latency=reduced.tuned_stats, baselines=fp32, source=loaded.source, verification=None,
                                  job={"id": summary.job_id, "name": summary.name},
                                  precision={"name": str(reduced.precision), **reduced.accuracy.to_json()},
                                  tasks=[t for t in job.tasks if t.workload_key in reduced.tuned.decisions]
                                  or job.tasks)  # fmt: skip
        return Checked(reduced=reduced, artifact=output, metadata=meta, trials=summary.trials, tasks=len(job.tasks))
    from tuner.artifact import write_artifact

    r = verify(spec, device, db, source=loaded.source, plan=plan, status=status)
    meta = None
    if output is not None:
        meta = write_artifact(output, r.tuned, spec, device, latency_s=r.tuned_latency_s,
                              untuned_latency_s=r.base_latency_s, verification=r.check,
                              latency=r.tuned_stats, baselines=_baselines_json(r),
                              job={"id": summary.job_id, "name": summary.name}, source=loaded.source,
                              outputs=r.tuned_outputs,
                              # Under --layout auto the job tuned convs in layouts the plan leaves out.
                              tasks=[t for t in job.tasks if t.workload_key in r.tuned.decisions] or job.tasks)
    return Checked(verified=r, artifact=output, metadata=meta, trials=summary.trials, tasks=len(job.tasks))


def _baselines_json(r: Verified) -> dict[str, Any]:
    """The artifact's record of what the tuned build was judged against: each baseline's
    latency (median and quartiles) and the tuned build's latency as a multiple of it."""
    from tuner.bench import TVM_FALLBACK

    out: dict[str, Any] = {}
    if r.base_stats is not None:
        out["untuned"] = {"label": "TVM default build (timed apart)", **r.base_stats.to_json(),
                          "ratio": r.tuned_latency_s * 1e3 / r.base_stats.median_ms}  # fmt: skip
    peers = r.peers
    if peers is None:
        return out
    for key, label, stats in ((TVM_FALLBACK, "fallback build (0 trials)", peers.fallback_stats),
                              ("peer", peers.peer_label, peers.peer_stats)):  # fmt: skip
        if stats is not None and stats.median_ms > 0:
            out[key] = {"label": label, **stats.to_json(), "ratio": r.tuned_latency_s * 1e3 / stats.median_ms}
    return out
