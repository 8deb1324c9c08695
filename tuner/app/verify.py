"""Checking a tuned model after its job: compile it with the database's best schedules, run it
beside a reference, time it, and say how it compares. The results come back as data
(:class:`Verified`, :class:`VerifiedReduced`) for the caller to show and to write as an artifact.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tuner.app.model import Status, no_status

if TYPE_CHECKING:
    from tuner.app.run import LatencyStats
    from tuner.artifact import Verification
    from tuner.bench import ClosingComparison
    from tuner.compile import Compiled
    from tuner.db import TuningDatabase
    from tuner.device import Device
    from tuner.frontends.model import ModelSpec
    from tuner.graph.layout.plan import LayoutPlan
    from tuner.precision import Precision
    from tuner.precision.accuracy import Accuracy

logger = logging.getLogger(__name__)

#: Trials per task below which a slower tuned build is put down to too short a search: four
#: batches of the default 16. A task's search starts from random candidates, and a few batches
#: pass before its cost model ranks them well enough to beat the fallback schedule (a rule of
#: thumb, not a measured threshold).
TRIALS_PER_TASK_HINT = 64


def slower_reason(ratio: float, *, trials: int, tasks: int, spread: float) -> str:
    """Why a tuned build came out ``ratio`` (> 1) times its baseline's latency, for the warning
    that says so: based on the trials a task the job actually ran, and on the timing's
    ``spread`` (IQR over median)."""
    per_task = trials / max(tasks, 1)
    if per_task < TRIALS_PER_TASK_HINT:
        return (f"{trials} trials is too few for {tasks} tasks ({per_task:.1f} a task; about "
                f"{TRIALS_PER_TASK_HINT} a task reach the fallback's speed): resume the job with "
                f"--trials {TRIALS_PER_TASK_HINT * tasks} or a --time-budget")
    if ratio - 1 <= spread:
        return (f"the difference is within the timing's spread (IQR {spread:.0%} of the median): time it again "
                "with nightshift bench --rounds 50")
    return (f"after {per_task:.0f} trials a task the search found nothing faster than the fallback schedules "
            "for some operators; nightshift bench --rounds 50 confirms it, nightshift db coverage shows which")


@dataclass(kw_only=True)
class Verified:
    """A float model's tuned build, checked and timed.

    Attributes:
        base: TVM's untuned build (its default loops, an extra line, not the baseline);
            ``base_latency_s`` its median latency, ``base_stats`` its runs (timed apart).
        tuned: the build with the database's best schedules; ``tuned_latency_s`` its median
            latency, ``tuned_stats`` its runs (timed interleaved with the fallback build and
            the peer when ``peers`` is set).
        tuned_outputs: its outputs on the check's input.
        untuned_error: the largest relative difference from the untuned build's outputs.
        check: the verification that decides (against ONNX Runtime for ONNX models where it
            is installed, else against the untuned build).
        peers: the fallback build and the fastest quick peer timed interleaved with the tuned
            build (CPU only), or None: the baselines the tuned build is judged against.
    """

    base: Compiled
    base_latency_s: float
    tuned: Compiled
    tuned_latency_s: float
    tuned_outputs: Any
    untuned_error: float
    check: Verification
    peers: ClosingComparison | None
    base_stats: LatencyStats | None = None
    tuned_stats: LatencyStats | None = None

    @property
    def fallback_latency_s(self) -> float | None:
        """The 0-trial fallback build's median latency, timed with the tuned build (None: not timed)."""
        return None if self.peers is None else self.peers.fallback

    @property
    def ok(self) -> bool:
        """Whether the tuned build's outputs agree with the reference and the peer."""
        return self.check.ok and (self.peers is None or self.peers.agree)


@dataclass(kw_only=True)
class VerifiedReduced:
    """A reduced-precision model's build beside its fp32 build: latency (medians; ``*_stats``
    their runs) and accuracy."""

    reference: Compiled
    reference_latency_s: float
    tuned: Compiled
    tuned_latency_s: float
    accuracy: Accuracy
    precision: Precision
    reference_stats: LatencyStats | None = None
    tuned_stats: LatencyStats | None = None

    @property
    def ok(self) -> bool:
        """Whether the reduced build's outputs are finite."""
        import numpy as np

        return bool(np.isfinite(self.accuracy.max_rel_error))


def verify(spec: ModelSpec, device: Device, db: TuningDatabase, *, source: str | None = None,
           plan: LayoutPlan | None = None, status: Status = no_status) -> Verified:  # fmt: skip
    """Compile untuned and tuned, run both on the same input, check and time them.

    Beside the untuned build, the tuned one is timed interleaved with the zero-trial fallback
    build and the faster of ONNX Runtime and OpenVINO (f32: ``INFERENCE_PRECISION_HINT=f32``)
    where installed (``tuner.bench``).
    """
    from tuner.app.run import LatencyStats
    from tuner.artifact import Verification, onnx_reference, scaled_error
    from tuner.compile import compile_model, time_model

    inputs = spec.random_inputs(seed=0)
    with status("compiling and running the untuned model"):
        base = compile_model(spec, device, None, plan=plan)
        base_out, base_samples = time_model(base, device, inputs)
    with status("compiling and running the tuned model"):
        tuned = compile_model(spec, device, db, plan=plan)
        tuned_out, tuned_samples = time_model(tuned, device, inputs)
    base_stats, tuned_stats = LatencyStats.of(base_samples), LatencyStats.of(tuned_samples)
    worst = scaled_error(base_out, tuned_out)
    check = Verification("untuned TVM build", worst)
    if source is not None and source.lower().endswith(".onnx"):
        reference = onnx_reference(source, inputs, int(device.target_config.get("num-cores", 1)))
        if reference is not None:
            check = Verification(reference[0], scaled_error(reference[1], tuned_out))
    peers = None
    if device.kind == "cpu":
        from tuner.bench import QUICK_PEERS, BenchConfig, closing_comparison

        with status("timing the tuned build against the fallback build and a peer"):
            peers = closing_comparison(spec, device, db, tuned, source=source or spec.name,
                                       config=BenchConfig(rounds=5, peers=QUICK_PEERS, plan=plan))  # fmt: skip
        # The figures that count are those timed interleaved with the fallback build and the peer.
        tuned_stats = peers.tuned_stats or tuned_stats
    return Verified(base=base, base_latency_s=base_stats.median_ms / 1e3, tuned=tuned,
                    tuned_latency_s=tuned_stats.median_ms / 1e3, tuned_outputs=tuned_out, untuned_error=worst,
                    check=check, peers=peers, base_stats=base_stats, tuned_stats=tuned_stats)  # fmt: skip


def verify_reduced(spec: ModelSpec, device: Device, db: TuningDatabase, *, plan: LayoutPlan | None,
                   precision: Precision, num_inputs: int, fp32_spec: ModelSpec | None = None,
                   status: Status = no_status) -> VerifiedReduced:  # fmt: skip
    """Compile the reduced-precision model and its fp32 build (the database's records of each)
    and measure latency and accuracy against fp32 (:mod:`tuner.precision.accuracy`).
    ``fp32_spec``: the float model a QDQ ``spec`` was quantized from, the reference when given."""
    from tuner.app.run import LatencyStats
    from tuner.compile import compile_model, time_model
    from tuner.precision.accuracy import measure_accuracy

    inputs = spec.random_inputs(seed=0)
    with status("compiling and running the fp32 model"):
        ref = compile_model(fp32_spec or spec, device, db, plan=plan)
        ref_stats = LatencyStats.of(time_model(ref, device, inputs)[1])
    with status(f"compiling and running the {precision} model"):
        tuned = compile_model(spec, device, db, plan=plan, precision=precision)
        tuned_stats = LatencyStats.of(time_model(tuned, device, inputs)[1])
    with status(f"measuring accuracy on {num_inputs} inputs"):
        acc = measure_accuracy(spec, device, ref, tuned, num_inputs=num_inputs)
    return VerifiedReduced(reference=ref, reference_latency_s=ref_stats.median_ms / 1e3, tuned=tuned,
                           tuned_latency_s=tuned_stats.median_ms / 1e3, accuracy=acc, precision=precision,
                           reference_stats=ref_stats, tuned_stats=tuned_stats)  # fmt: skip

