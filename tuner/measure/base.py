"""The measurement seam: what a tuning job needs from whatever builds and times its candidates.

A :class:`Measurer` takes candidates of a task (scheduled TVM modules), builds them, checks
each against the task's reference output and times it on the device; every candidate ends as
a :class:`~tuner.measure.results.Measurement`, failures included (failures are data). Two
implementations, chosen by name with :func:`tuner.measure.create`:

- ``"ray"`` (:class:`~tuner.measure.ray_measure.RayMeasurer`, the default for jobs): builds
  as Ray tasks on any CPU of a cluster, timings on one actor per device, build and run
  timeouts, crashes and hangs of a candidate isolated in their processes.
- ``"inline"`` (:class:`~tuner.measure.inline.InlineMeasurer`): builds and times in this
  process, one candidate after another, with no Ray. For tests that are not about Ray and for
  a laptop without Ray; a candidate that crashes the process or hangs takes the job with it.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from tuner.errors import NightshiftError
from tuner.measure.runner import TimingConfig

if TYPE_CHECKING:
    import tvm

    from tuner.device import Device
    from tuner.graph.tasks import Task
    from tuner.measure.results import Measurement

MeasurerName = Literal["ray", "inline"]
#: Slack of a timing's lease wait over the build timeout (see ``MeasureConfig.lease_wait_s``).
LEASE_MARGIN_S = 30.0
MEASURERS: tuple[str, ...] = ("ray", "inline")
#: Set in every Ray worker of a job (the job's runtime environment, and the device actors' own).
#: tvm_ffi imports torch in each process and, for a torch without the C DLPack exchange API
#: (torch 2.11 has none, 2.13 has it), JIT-compiles an add-on with torch's C++ extension (with
#: nvcc on a CUDA torch) in every cold worker at once; Nightshift hands TVM no torch tensor.
WORKER_ENV: dict[str, str] = {"TVM_FFI_DISABLE_TORCH_C_DLPACK": "1"}


class MeasureError(NightshiftError):
    """The measurement infrastructure itself failed (not a candidate)."""


@dataclass(frozen=True, kw_only=True)
class MeasureConfig:
    """Limits and timing policy of one measurer.

    Attributes:
        build_timeout_s: time a build may run, from when it holds its CPU (and its node's
            lease, see ``quiet_builds``) until its artifact is ready.
        run_timeout_s: time the device actor may spend on one candidate.
        timing: how a candidate is timed.
        max_builds_in_flight: concurrent builds; default: every CPU of the cluster.
        timing_depth: candidates queued at each device actor at once (2 overlaps transfers).
        timing_batch: on a device whose timings make its node's builds wait (a CPU node that
            builds too, with no core to spare), built candidates are sent in batches of this
            many, timed back to back under one hold of the node: fewer switches between builds
            and timings, each of which leaves cores idle while the running build stages end.
            A batch goes early when no build is left in flight or its oldest candidate has
            waited ``timing_batch_wait_s``. 1: no batching.
        quiet_builds: keep builds and this node's search off a CPU device's node while it times
            (a per-node lease, see ``tuner.measure.quiet``); default: for CPU devices.
        device_wait_s: how long timings wait for a device actor that restarts or whose node
            is gone before the candidates are marked ``LOST``.
        build_retries: Ray retries of a build whose worker or node died.
        build_start_timeout_s: how long a build may wait for a CPU and a worker process (a
            cold worker imports TVM for seconds) before ``build_timeout_s`` starts counting.
        node_scan_s: how often, while it has work, the measurer looks for nodes that joined the
            cluster with the device's resource; their device actors take timings once they
            answer with the fingerprint the measurer times on.
        lease_wait_s: how long a CPU timing waits for its node's lease (the builds and
            searches holding the node) before the candidate is recorded as
            ``LEASE_TIMEOUT``; default: ``build_timeout_s`` + ``LEASE_MARGIN_S`` (a build
            holds the node for one stage at most).
        result_margin_s: slack of a job's wait for a candidate's result over the measurer's
            own bounds (see ``candidate_wait``).
    """

    build_timeout_s: float = 60.0
    run_timeout_s: float = 60.0
    timing: TimingConfig = field(default_factory=TimingConfig)
    max_builds_in_flight: int | None = None
    timing_depth: int = 2
    timing_batch: int = 8
    timing_batch_wait_s: float = 5.0
    quiet_builds: bool | None = None
    device_wait_s: float = 60.0
    build_retries: int = 1
    build_start_timeout_s: float = 300.0
    node_scan_s: float = 5.0
    lease_wait_s: float | None = None
    result_margin_s: float = 60.0

    def lease_wait(self) -> float:
        """How long a CPU timing waits for its node's lease (``lease_wait_s``)."""
        return self.lease_wait_s if self.lease_wait_s is not None else self.build_timeout_s + LEASE_MARGIN_S

    def candidate_wait(self) -> float:
        """The longest a measurer may take over one candidate by its own bounds (a CPU, the
        build, the node's lease, the reference and the timing), plus ``result_margin_s``: a
        job that waits this long for the next result of a batch gives up on the rest."""
        own = self.build_start_timeout_s + self.build_timeout_s + self.lease_wait() + 2 * self.run_timeout_s
        return own + self.result_margin_s


@dataclass
class MeasureStats:
    """Counters of a measurer since its creation or its last ``reset_stats``."""

    candidates: int = 0
    built: int = 0
    timed: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    build_s: float = 0.0
    device_busy_s: float = 0.0
    first_submit: float | None = None
    last_done: float | None = None

    def finished(self, m: Measurement) -> None:
        """Count a candidate's end: the time of the last result, and its error class."""
        self.last_done = time.monotonic()
        if m.error_class is not None:
            key = str(m.error_class)
            self.errors[key] = self.errors.get(key, 0) + 1

    @property
    def wall_s(self) -> float:
        """From the first submission to the last result."""
        if self.first_submit is None or self.last_done is None:
            return 0.0
        return self.last_done - self.first_submit

    @property
    def device_idle_fraction(self) -> float:
        """Share of the wall time the device actor was not checking or timing a candidate."""
        return 1.0 - self.device_busy_s / self.wall_s if self.wall_s > 0 else 1.0




class Lease(Protocol):
    """Exclusive use of the device's cores for a timing outside the measurer (re-ranking)."""

    def acquire(self) -> dict[str, Any]: ...

    def release(self) -> None: ...


@runtime_checkable
class Measurer(Protocol):
    """Builds, checks and times candidates; the contract every implementation keeps.

    ``device`` is the device as the timing side sees it: builds target it and records are keyed
    by its fingerprint. ``submit`` is thread-safe and returns one future per candidate, in
    order; each future resolves to a ``Measurement`` (never raises for a candidate's fault;
    it may raise :class:`MeasureError` when the infrastructure itself fails). ``stats`` counts
    since creation or ``reset_stats``. ``close`` ends the measurer: unfinished candidates
    resolve as ``LOST``; it may be called more than once.
    """

    device: Device
    stats: MeasureStats

    def submit(self, task: Task, mods: Sequence[tvm.IRModule], *, time_them: bool = True) -> list[Future]:
        """Queue candidates of ``task``; ``time_them=False`` only builds them."""
        ...

    def cpu_work(self) -> contextlib.AbstractContextManager[None]:
        """Hold the block as CPU work (the driver's search), kept apart from timings."""
        ...

    def alive(self) -> bool:
        """Whether the infrastructure answers and still offers the device."""
        ...

    def timing_lease(self) -> Lease | None:
        """A lease for timing on the device from this process (re-ranking), or None where this
        process cannot time for the device (it runs on another node)."""
        ...

    def reset_stats(self) -> None:
        """Start counting anew."""
        ...

    def close(self) -> None:
        """Stop; unfinished candidates resolve as ``LOST``."""
        ...


def device_resource(device: Device) -> str:
    """The Ray custom resource a node offers for each device of this kind it has.

    ``nightshift_cpu_<llvm mcpu>`` for CPUs, ``nightshift_cuda_<sm_XX>`` for GPUs; a node joins
    as a worker for the device with ``ray start --resources '{"<name>": 1}'``.
    """
    arch = re.sub(r"[^A-Za-z0-9_]", "_", device.arch)
    return f"nightshift_{device.kind}_{arch}"
