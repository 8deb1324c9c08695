"""Nightshift from Python: :func:`tune`, :func:`compile_model` and :func:`load`, for notebooks and scripts.

The same steps as the command line (``tune``, ``nightshift compile``, ``nightshift run``),
with keyword arguments for its options and small result objects instead of tables::

    import tuner

    result = tuner.tune("resnet50", trials=200, db="tuning.db", output="resnet50.so")
    art = tuner.load(result.artifact)
    outputs = art.run(tuner.random_inputs(art))

Errors raise :class:`tuner.errors.NightshiftError` subclasses (:class:`~tuner.errors.UserInputError`,
:class:`~tuner.errors.UnknownModelError`, :class:`~tuner.errors.DatabaseError`, ...) instead of
printing a line and exiting. A tuned model whose output disagrees with its reference is not an
error: its result says so (``ok``), as the command line exits with 1 rather than 2.

This module sits beside :mod:`tuner.cli` at the top: nothing in the library imports it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.app.inputs import DEFAULT_DB, environment_db
from tuner.app.model import ModelOptions, Status, no_status
from tuner.app.run import LatencyStats
from tuner.errors import UserInputError

if TYPE_CHECKING:
    import numpy as np

    from tuner.artifact import Artifact

__all__ = ["CompileResult", "LatencyStats", "TuneResult", "compile_model", "latency", "load", "random_inputs", "tune"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class TuneResult:
    """What :func:`tune` did.

    Attributes:
        job_id, job_name: the job in the database (the name resumes it).
        state: ``done`` or ``stopped``; ``reason`` says why it ended.
        trials: measurements over every run of the job; ``elapsed_s`` its tuning time.
        errors: failed candidates by error class.
        tasks: the model's tasks tuned.
        device, precision: what it was tuned for.
        artifact: the verified artifact written (``output``), or None.
        metadata: the artifact's metadata file, or None.
        latency_ms: the tuned build's median latency, or None (not verified). Every latency
            here is the median of timed runs that copy the inputs in and the outputs out
            (:func:`tuner.app.run.time_runs`, as ``tune``, ``bench`` and ``run`` print them).
        baseline_latency_ms: the latency of ``baseline``, or None: on a CPU the 0-trial
            fallback build timed in the same interleaved rounds as the tuned build; elsewhere
            (or when nothing was tuned) TVM's default build; for bf16/int8 the tuned fp32 build.
        baseline: what ``baseline_latency_ms`` is, in words.
        untuned_latency_ms: TVM's default build (no schedules), timed apart, or None.
        peer, peer_latency_ms: the fastest peer runtime timed with the tuned build (CPU, where
            ONNX Runtime or OpenVINO is installed; OpenVINO at f32 through its
            INFERENCE_PRECISION_HINT) and its latency, or None.
        warning: the sentence saying the tuned build is slower than its baseline and why, or None.
        max_error: the tuned output's largest relative difference from ``reference`` (for
            bf16/int8: from fp32), or None.
        ok: whether the output agrees with the reference (bf16/int8: is finite); True when not
            verified.
    """

    job_id: int
    job_name: str
    state: str
    reason: str
    trials: int
    elapsed_s: float
    errors: dict[str, int]
    tasks: int
    device: str
    precision: str
    artifact: Path | None = None
    metadata: Path | None = None
    latency_ms: float | None = None
    baseline_latency_ms: float | None = None
    baseline: str | None = None
    max_error: float | None = None
    reference: str | None = None
    ok: bool = True
    untuned_latency_ms: float | None = None
    peer: str | None = None
    peer_latency_ms: float | None = None
    warning: str | None = None

    @property
    def ratio_to_baseline(self) -> float | None:
        """``latency_ms / baseline_latency_ms``: the tuned build's latency as a multiple of its
        baseline's, lower is better (how every output writes a ratio), or None where either is
        unknown."""
        if self.latency_ms is None or not self.baseline_latency_ms:
            return None
        return self.latency_ms / self.baseline_latency_ms

    @property
    def ratio_to_peer(self) -> float | None:
        """``latency_ms / peer_latency_ms`` (lower is better), or None without a peer."""
        if self.latency_ms is None or not self.peer_latency_ms:
            return None
        return self.latency_ms / self.peer_latency_ms

    @property
    def speedup(self) -> float | None:
        """``baseline_latency_ms / latency_ms`` (higher is better: the inverse of
        :attr:`ratio_to_baseline`, kept for existing callers), or None where either is unknown."""
        if self.latency_ms is None or self.baseline_latency_ms is None or self.latency_ms <= 0:
            return None
        return self.baseline_latency_ms / self.latency_ms


@dataclass(frozen=True, kw_only=True)
class CompileResult:
    """What :func:`compile_model` did.

    Attributes:
        artifact: the artifact written, or None when its output failed the check (then
            nothing is written and ``ok`` is False).
        metadata: the artifact's metadata file, or None.
        operators: how many operators got each kind of schedule (``tuned``, ``same-arch``,
            ``foreign``, ``fallback``, ``tvm-default``).
        compile_s: seconds the compile took.
        max_error: the output's largest relative difference from the untuned build, or None
            (not checked).
        ok: whether the output passed the check (True when not checked).
        warnings: what the command line prints as warnings (stale records, rejected records).
    """

    artifact: Path | None
    metadata: Path | None
    operators: dict[str, int]
    compile_s: float
    max_error: float | None
    ok: bool
    warnings: list[str] = field(default_factory=list)


def _db_text(db: str | Path | None) -> str:
    # As the command line: the argument, else $NIGHTSHIFT_DB / $NIGHTSHIFT_DB_FILE, else ./nightshift.db.
    return str(db) if db is not None else environment_db() or DEFAULT_DB


@contextlib.contextmanager
def _shown(progress: bool) -> Iterator[tuple[Any, Status]]:
    """A stderr console and its status spinner when ``progress``, else (None, a silent status)."""
    if not progress:
        yield None, no_status
        return
    from rich.console import Console

    console = Console(stderr=True)
    yield console, console.status


def _load_model(options: ModelOptions, status: Status):
    from tuner.app.model import load as load_model

    loaded = load_model(options, status=status)
    if loaded.quantization is not None and loaded.fp32_spec is not None:
        logger.info("%s", loaded.quantization.describe(loaded.fp32_spec.name))
    return loaded


def tune(
    model: str,
    *,
    device: str = "cpu",
    trials: int | None = None,
    time_budget: str | float | None = None,
    db: str | Path | None = None,
    output: str | Path | None = None,
    job: str | None = None,
    precision: str = "fp32",
    layout: str = "auto",
    batch_size: int = 1,
    dtype: str = "float32",
    seq_len: int | None = None,
    image_size: int | None = None,
    num_cores: int | None = None,
    target_arch: str | None = None,
    trials_per_batch: int = 16,
    build_timeout: float = 60.0,
    timing: str | None = None,
    seed: int = 0,
    strategy: str = "evolutionary",
    cost_model: str = "pretrained",
    scheduler: str = "gradient",
    fresh: bool = False,
    skip_after: int = 512,
    rerank_top: int = 4,
    measurer: str = "ray",
    ray_address: str | None = None,
    verify: bool = True,
    accuracy_inputs: int = 8,
    calibration: int | None = None,
    quantize_ops: str | None = None,
    progress: bool = True,
) -> TuneResult:
    """Run (or resume) a tuning job, then compile, check and time the model and write its artifact.

    The options are ``tune``'s (``docs/reference.md``), with ``-`` as ``_``; ``time_budget`` is
    a duration (``"45m"``, ``"2h"``) or seconds, ``db`` a URL or SQLite file (default:
    ``$NIGHTSHIFT_DB``, else ``./nightshift.db``), ``output`` an ``X.so`` or a folder.
    ``measurer="inline"`` times in this process without Ray (a laptop). With ``"ray"``, a Ray
    this process already runs (``ray.init()``) is used and left running; a local cluster the
    job starts is shut down after it. ``progress`` shows the job's live view and each long
    step on stderr; nothing goes to stdout.

    Raises:
        UserInputError: a bad option (its subclasses: an unknown model or device), an output
            or database that cannot be written, checked before any work.
        DatabaseError: the database cannot be reached.
        KeyboardInterrupt: the job was interrupted; everything measured is saved, and the
            same call with the same ``job`` resumes it.
    """
    from tuner.app.tune import TuneOptions, check_options, check_tuned, gpu_absent, prepare, run_job
    from tuner.config import parse_duration
    from tuner.measure.submit import check_address, is_jobs_address

    check_address(ray_address)
    if is_jobs_address(ray_address):
        raise UserInputError(f"ray_address {ray_address}: submitting to a cluster's Jobs API is the command line's "
                             "(tune --ray-address http://HEAD:8265); from Python, run on a node of the cluster "
                             "with ray_address='auto'")  # fmt: skip
    options = TuneOptions(
        model=ModelOptions(model=model, device=device, target_arch=target_arch, num_cores=num_cores,
                           batch_size=batch_size, dtype=dtype, seq_len=seq_len, image_size=image_size,
                           layout=layout, precision=precision,
                           calibration=calibration, quantize_ops=quantize_ops),
        db=_db_text(db), job=job,
        time_budget_s=None if time_budget is None else parse_duration(time_budget, what="time_budget"),
        trials=trials, trials_per_batch=trials_per_batch, build_timeout_s=build_timeout, timing=timing, seed=seed,
        strategy=strategy, cost_model=cost_model, scheduler=scheduler, fresh=fresh, skip_after=skip_after,
        rerank_top=rerank_top,
        ray_address=ray_address,
        measurer=measurer, output=None if output is None else Path(output), verify=verify,
        accuracy_inputs=accuracy_inputs,
    )  # fmt: skip
    db_url = check_options(options, output_option="output")
    with _shown(progress) as (console, status):
        loaded = _load_model(options.model, status)
        prepared = prepare(options, loaded, db_url, status=status)
        on_event = None
        view = None
        if console is not None:
            from tuner.progress import LiveView

            view = on_event = LiveView(console)
        try:
            summary = run_job(prepared, on_event=on_event, status=status)
        finally:
            if view is not None:
                view.close()
        logger.info("job %s (#%d) %s: %s; %d trials in %.0f s", summary.name, summary.job_id, summary.state,
                    summary.reason, summary.trials, summary.elapsed_s)  # fmt: skip
        result: dict[str, Any] = dict(
            job_id=summary.job_id, job_name=summary.name, state=summary.state, reason=summary.reason,
            trials=summary.trials, elapsed_s=summary.elapsed_s, errors=dict(summary.errors),
            tasks=len(prepared.tasks), device=prepared.device.name, precision=str(loaded.precision),
        )  # fmt: skip
        if not options.verify:
            return TuneResult(**result)
        if gpu_absent(prepared):
            logger.warning("no %s on this machine to check the tuned model on; compile it on a machine with the GPU "
                           "(tuner.compile_model or nightshift compile)", prepared.device.name)  # fmt: skip
            return TuneResult(**result)
        checked = check_tuned(prepared, summary, status=status)
    if checked.verified is not None:
        v = checked.verified
        fallback = v.fallback_latency_s
        base_s, base = (fallback, "fallback build (0 trials)") if fallback else (v.base_latency_s, "untuned TVM build")
        peer = v.peers.peer if v.peers is not None else None
        result |= dict(latency_ms=v.tuned_latency_s * 1e3, baseline_latency_ms=base_s * 1e3, baseline=base,
                       untuned_latency_ms=v.base_latency_s * 1e3, max_error=v.check.max_error,
                       reference=v.check.reference, peer=v.peers.peer_label if peer is not None else None,
                       peer_latency_ms=None if peer is None else peer * 1e3)  # fmt: skip
    elif checked.reduced is not None:
        r = checked.reduced
        result |= dict(latency_ms=r.tuned_latency_s * 1e3, baseline_latency_ms=r.reference_latency_s * 1e3,
                       baseline="fp32 build", max_error=r.accuracy.max_rel_error, reference="fp32 build")
    warning = checked.slower_warning()
    if warning is not None:
        logger.warning("%s", warning)
    if not checked.ok:
        logger.warning("the tuned model's output differs from the %s's (max relative difference %s)",
                       result.get("reference"), result.get("max_error"))  # fmt: skip
    return TuneResult(**result, artifact=checked.artifact, metadata=checked.metadata, ok=checked.ok, warning=warning)


def compile_model(
    model: str,
    *,
    output: str | Path,
    device: str = "cpu",
    db: str | Path | None = None,
    policy: str = "same-arch",
    verify: str = "auto",
    precision: str = "fp32",
    layout: str = "auto",
    batch_size: int = 1,
    dtype: str = "float32",
    seq_len: int | None = None,
    image_size: int | None = None,
    num_cores: int | None = None,
    target_arch: str | None = None,
    calibration: int | None = None,
    quantize_ops: str | None = None,
    progress: bool = True,
) -> CompileResult:
    """Compile a model with the database's best schedules into an artifact (``nightshift compile``).

    ``policy``: ``same-arch`` (records of another device of the same architecture may stand
    in) or ``device``; ``verify``: check the output against the untuned build (``auto``: where
    that build is cheap, ``on``, ``off``). The database must exist (``db`` as in :func:`tune`).
    An output that fails the check is not written (``ok`` False, ``artifact`` None).

    Raises:
        UserInputError: a bad option, an unknown model (:class:`~tuner.errors.UnknownModelError`),
            an output that cannot be written, no database there.
    """
    from tuner.app.compile import compile_artifact
    from tuner.app.inputs import check_output, open_existing

    if policy not in ("same-arch", "device"):
        raise UserInputError(f"policy must be same-arch or device, got {policy!r}")
    if verify not in ("auto", "on", "off"):
        raise UserInputError(f"verify must be auto, on or off, got {verify!r}")
    path = Path(output)
    check_output(path, "output", artifact=True)
    options = ModelOptions(model=model, device=device, target_arch=target_arch, num_cores=num_cores,
                           batch_size=batch_size, dtype=dtype, seq_len=seq_len, image_size=image_size,
                           layout=layout, precision=precision,
                           calibration=calibration, quantize_ops=quantize_ops)  # fmt: skip
    with _shown(progress) as (_console, status):
        loaded = _load_model(options, status)
        database = open_existing(_db_text(db))
        r = compile_artifact(loaded, database, path, policy=policy, verify=verify, status=status)
    warnings = []
    if r.stale:
        from tuner.compile import retune_hint

        warnings.append(retune_hint(r.stale))
    if r.rejected:
        warnings.append(f"{len(r.rejected)} record(s) rejected by the trace allow-list")
    for w in warnings:
        logger.warning("%s", w)
    return CompileResult(artifact=r.artifact, metadata=r.metadata, operators=r.counts(), compile_s=r.compiled.compile_s,
                         max_error=None if r.verification is None else r.verification.max_error, ok=r.ok,
                         warnings=warnings)  # fmt: skip


def load(path: str | Path, *, num_cores: int | None = None) -> Artifact:
    """Load an artifact (``tune -o``, :func:`tune`'s ``output``) with TVM's runtime alone.

    Run it with ``.run([array, ...])`` (numpy in, a list of numpy arrays out; the inputs are
    checked against the metadata's shapes, dtypes and index bounds); ``.inputs`` and
    ``.metadata`` say what it takes. ``num_cores``: CPU threads (default: those it was tuned on).

    Raises:
        UserInputError: no artifact there, its files incomplete, its device not on this machine.
    """
    from tuner.artifact import load_artifact

    return load_artifact(Path(path), threads=num_cores)


def random_inputs(artifact: Artifact | Mapping[str, Any], seed: int = 0) -> list[np.ndarray]:
    """Random inputs of an artifact's own shapes and dtypes (``nightshift run --random-input``):
    of a loaded :class:`~tuner.artifact.Artifact`, or of its metadata."""
    from tuner.app.run import random_inputs as make

    metadata = artifact if isinstance(artifact, Mapping) else artifact.metadata
    return make(metadata, seed=seed)


def latency(artifact: Artifact, inputs: Sequence[np.ndarray] | None = None, *, rounds: int = 100) -> LatencyStats:
    """Time ``rounds`` runs of a loaded artifact (after one warm-up) on ``inputs`` (default:
    :func:`random_inputs`): percentiles, mean and spread, throughput (``nightshift run --rounds``).

    Raises:
        UserInputError: ``rounds`` below 1, or inputs that do not match the artifact.
    """
    if rounds < 1:
        raise UserInputError(f"rounds must be a positive count, got {rounds}")
    arrays = list(inputs) if inputs is not None else random_inputs(artifact)
    return LatencyStats.of(artifact.time(arrays, rounds))
