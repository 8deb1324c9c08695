"""Building candidates on any CPU of a Ray cluster and timing them on a device actor.

The pipeline, driven by one engine thread per measurer:

    submit -> build (Ray task, any CPU, build timeout) -> bytes in Ray's object store
           -> device actor (pinned by the device's Ray resource; checks, then times)

Builds run as soon as a CPU is free; up to ``timing_depth`` built candidates are queued at
the device actor, so the next artifact's transfer overlaps the current timing and the device
never waits for the driver. On a CPU node the actor stops that node's builds while it times
(see ``tuner.measure.pause``), so a timing never shares its cores with a build.

Every fault ends as a ``Measurement`` with an error class: a build that raises, runs past its
timeout or crashes its process; a candidate that crashes the actor (the actor restarts), hangs
(the actor is killed and restarts) or gives a wrong answer; a node that disappears (builds
are retried elsewhere by Ray, timings in flight are re-queued or marked ``LOST``).
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import ray
import tvm
from ray.exceptions import (
    NodeDiedError,
    ObjectLostError,
    OwnerDiedError,
    RayActorError,
    RayError,
    TaskCancelledError,
    WorkerCrashedError,
)

from tuner.device import Device
from tuner.errors import NightshiftError, UserInputError
from tuner.measure.builder import build_task
from tuner.measure.cuda import gpu_archs, reference_module
from tuner.measure.pause import pausable
from tuner.measure.results import BuildResult, ErrorClass, Measurement, RunResult
from tuner.measure.runner import ArgSpec, CandidateRunner, Reference, TimingConfig
from tuner.tasks import Task

logger = logging.getLogger(__name__)


class MeasureError(NightshiftError):
    """The measurement infrastructure itself failed (not a candidate)."""


@dataclass(frozen=True, kw_only=True)
class MeasureConfig:
    """Limits and timing policy of one measurer.

    Attributes:
        build_timeout_s: wall time a build may take (time stopped for a timing included).
        run_timeout_s: time the device actor may spend on one candidate.
        timing: how a candidate is timed.
        max_builds_in_flight: concurrent builds; default: every CPU of the cluster.
        timing_depth: candidates queued at the device actor at once (2 overlaps transfers).
        pause_builds: stop the device node's builds while timing; default: for CPU devices.
        device_wait_s: how long timings wait for a device actor that restarts or whose node
            is gone before the candidates are marked ``LOST``.
        build_retries: Ray retries of a build whose worker or node died.
        build_start_timeout_s: how long a build may wait for a CPU and a worker process (a
            cold worker imports TVM for seconds) before ``build_timeout_s`` starts counting.
    """

    build_timeout_s: float = 60.0
    run_timeout_s: float = 60.0
    timing: TimingConfig = field(default_factory=TimingConfig)
    max_builds_in_flight: int | None = None
    timing_depth: int = 2
    pause_builds: bool | None = None
    device_wait_s: float = 60.0
    build_retries: int = 1
    build_start_timeout_s: float = 300.0


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


def device_resource(device: Device) -> str:
    """The Ray custom resource a node offers for each device of this kind it has.

    ``nightshift_cpu_<llvm mcpu>`` for CPUs, ``nightshift_cuda_<sm_XX>`` for GPUs; a node joins
    as a worker for the device with ``ray start --resources '{"<name>": 1}'``.
    """
    arch = re.sub(r"[^A-Za-z0-9_]", "_", device.arch)
    return f"nightshift_{device.kind}_{arch}"


def local_device_resources() -> dict[str, float]:
    """The device resources of this machine: its CPU and each CUDA GPU TVM sees."""
    from tuner.device import parse_device
    from tuner.measure.worker import gpu_resources

    # gpu_archs loads TVM's CUDA runtime library, without which TVM sees no GPU.
    return {device_resource(parse_device("cpu")): 1.0} | gpu_resources(gpu_archs())


def connect(address: str | None = None, *, num_cpus: int | None = None,
            resources: dict[str, float] | None = None) -> None:
    """Join the Ray cluster at ``address`` (``auto``, ``ray://...``) or start a local one.

    A local cluster offers this machine's device resources (``local_device_resources``) plus
    ``resources``. Does nothing if Ray is already initialized.
    """
    if ray.is_initialized():
        return
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                              "logging_level": logging.WARNING}
    if address:
        ray.init(address=address, **kwargs)
    else:
        # "local", not None: with None, Ray joins the newest cluster a `ray start` on this
        # machine recorded in /tmp/ray (another user's), and then refuses our resources.
        ray.init(address="local", num_cpus=num_cpus, resources=local_device_resources() | (resources or {}),
                 **kwargs)  # fmt: skip
    logger.info("Ray cluster: %s", ray.cluster_resources())


def worker_command(device: Device, head: str = "HEAD_IP:6379", num_cpus: int | None = None) -> str:
    """The ``ray start`` command that makes a machine a worker for ``device``."""
    cpus = f" --num-cpus {num_cpus}" if num_cpus else ""
    gpus = " --num-gpus 1" if device.kind == "cuda" else ""
    return f"ray start --address {head}{cpus}{gpus} --resources '{{\"{device_resource(device)}\": 1}}'"


@dataclass(eq=False)
class _Cand:
    id: int
    task_key: str
    entry: str
    mod_json: str
    time: bool
    future: Future | None
    args: list[ArgSpec] | None = None
    build: BuildResult | None = None
    artifact: Any = None
    deadline: float = 0.0
    attempts: int = 0
    stage: int = 0  # build stream items received: start time, artifact, metadata


@dataclass
class _RefState:
    cand: _Cand
    artifact: Any = None
    error: str | None = None


class RayMeasurer:
    """Builds candidates as Ray tasks and checks and times them on one device actor.

    ``submit`` is thread-safe and returns one future per candidate; results arrive as they
    complete. The device actor takes the device's Ray resource (one unit), so two measurers
    for the same device share it one at a time: ``close`` a measurer when done (or use it as a
    context manager).

    Raises:
        UserInputError: no node of the cluster offers the device's resource.
    """

    def __init__(self, device: Device, config: MeasureConfig | None = None) -> None:
        self.device = device
        self.config = config or MeasureConfig()
        self.resource = device_resource(device)
        if ray.cluster_resources().get(self.resource, 0) < 1:
            raise UserInputError(
                f"no node of the Ray cluster offers device resource {self.resource!r}; start a "
                f"worker for it with: {worker_command(device)}"
            )
        self._build = ray.remote(build_task).options(
            num_cpus=1, num_returns="streaming", max_retries=self.config.build_retries, retry_exceptions=False
        )
        threads = int(device.target_config.get("num-cores", 1))
        pause = self.config.pause_builds if self.config.pause_builds is not None else device.kind == "cpu"
        options: dict[str, Any] = {
            "num_cpus": 0, "max_restarts": -1, "max_task_retries": 0,
            "resources": {self.resource: 1},
            # Ray sets OMP_NUM_THREADS=1 in workers and TVM's thread pool would follow it;
            # the runtime-only import proves the device side needs no compiler.
            "runtime_env": {"env_vars": {"TVM_NUM_THREADS": str(threads), "TVM_USE_RUNTIME_LIB": "1"}},
        }  # fmt: skip
        if device.kind == "cuda":
            options["num_gpus"] = 1
        # With num_gpus=1 Ray exposes one GPU to the actor as device 0.
        self._actor = ray.remote(CandidateRunner).options(**options).remote(
            device.kind, 0, pause_builds=pause, pause_lease_s=self.config.run_timeout_s
        )
        self._ids = iter(range(1 << 62))
        self._cv = threading.Condition()
        self._incoming: deque[_Cand] = deque()
        self._closing = False
        # Engine-thread state.
        self._to_build: deque[_Cand] = deque()
        self._building: dict[Any, _Cand] = {}
        self._to_time: deque[_Cand] = deque()
        self._timing: deque[tuple[Any, _Cand]] = deque()
        self._head_deadline = 0.0
        self._refs: dict[str, _RefState] = {}
        self._actor_refs: set[str] = set()
        self._ping: Any = None  # an info() call that tells when the actor is up again
        self._ping_after = 0.0
        self._down_since: float | None = time.monotonic()
        # The candidate the actor was on when it died, with the verdict it gets if the
        # actor's node is still there once the actor is back ("crash" or "timeout").
        self._suspect: tuple[_Cand, str, str] | None = None
        self._actor_node: str | None = None
        self._best: dict[str, float] = {}
        self._cpus = 1
        self._cpus_checked = 0.0
        self.stats = MeasureStats()
        self._thread = threading.Thread(target=self._loop, name="nightshift-measure", daemon=True)
        self._thread.start()

    # ----- public API -----

    def submit(self, task: Task, mods: Sequence[tvm.IRModule], *, time_them: bool = True) -> list[Future]:
        """Queue candidates of ``task``; each future resolves to a ``Measurement``."""
        entry = _entry(task.mod)
        cands = [
            _Cand(next(self._ids), task.workload_key, entry, tvm.ir.save_json(m), time_them, Future())
            for m in mods
        ]
        ref = None
        if time_them and task.workload_key not in self._refs:
            # On CUDA the reference is the task under TVM's default GPU schedule (tuner.measure.cuda).
            ref_mod = reference_module(task.mod, self.device.target)
            ref = _Cand(next(self._ids), task.workload_key, entry, tvm.ir.save_json(ref_mod), False, None,
                        args=_arg_specs(task.mod))
            self._refs[task.workload_key] = _RefState(ref)
        with self._cv:
            if self._closing:
                raise MeasureError("the measurer is closed")
            if self.stats.first_submit is None:
                self.stats.first_submit = time.monotonic()
            self.stats.candidates += len(cands)
            if ref is not None:
                self._incoming.append(ref)
            self._incoming.extend(cands)
            self._cv.notify_all()
        return [c.future for c in cands if c.future is not None]

    def measure(self, task: Task, mods: Sequence[tvm.IRModule]) -> list[Measurement]:
        """Build, check and time candidates of ``task``; one ``Measurement`` each, in order."""
        return [f.result() for f in self.submit(task, mods)]

    def build(self, task: Task, mods: Sequence[tvm.IRModule]) -> list[BuildResult]:
        """Only build candidates (no timing), in parallel across the cluster."""
        return [f.result().build for f in self.submit(task, mods, time_them=False)]

    def reset_stats(self) -> None:
        """Start counting anew (e.g. per batch or per benchmark phase)."""
        with self._cv:
            self.stats = MeasureStats()

    def actor_info(self) -> dict[str, Any]:
        """Where the device actor runs (node id, pid, runtime-only)."""
        return ray.get(self._actor.info.remote(), timeout=self.config.device_wait_s)

    @contextlib.contextmanager
    def pausable(self) -> Iterator[None]:
        """Let the device actor stop this (driver) process while it times, e.g. during search."""
        try:
            node_id = ray.get_runtime_context().get_node_id()
        except Exception:  # a ray:// client driver is not on any node: nothing to pause
            node_id = None
        with pausable(node_id, with_children=False):  # its children are Ray's own processes
            yield

    def close(self) -> None:
        """Stop the engine, mark unfinished candidates ``LOST`` and release the device."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        self._thread.join(timeout=30)
        with contextlib.suppress(RayError):
            ray.kill(self._actor, no_restart=True)

    def __enter__(self) -> RayMeasurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- engine -----

    def _loop(self) -> None:
        try:
            while True:
                with self._cv:
                    while not self._closing and not self._incoming and not self._busy():
                        self._cv.wait()
                    if self._closing:
                        break
                    while self._incoming:
                        c = self._incoming.popleft()
                        (self._to_build.appendleft if c.future is None else self._to_build.append)(c)
                self._step()
        except Exception as err:  # an engine bug must not leave callers waiting forever
            logger.exception("measurement engine failed")
            self._fail_all(MeasureError(f"measurement engine failed: {err}"))
            return
        self._fail_all(None)

    def _busy(self) -> bool:
        return bool(self._to_build or self._building or self._to_time or self._timing or self._ping
                    or self._suspect)

    def _step(self) -> None:
        self._launch_builds()
        self._dispatch_timings()
        waitables = list(self._building) + [r for r, _ in self._timing]
        if self._ping is not None:
            waitables.append(self._ping)
        now = time.monotonic()
        if not waitables:
            time.sleep(0.05)  # waiting for the next ping to the device actor
            return
        deadlines = [c.deadline for c in self._building.values()]
        if self._timing:
            deadlines.append(self._head_deadline)
        timeout = min([0.5, *(max(d - now, 0.0) for d in deadlines)])
        ready, _ = ray.wait(waitables, num_returns=1, timeout=timeout)
        if ready:
            ready, _ = ray.wait(waitables, num_returns=len(waitables), timeout=0)
        for ref in ready:
            if ref in self._building:
                self._on_build_item(ref, self._building.pop(ref))
            elif self._ping is not None and ref == self._ping:
                self._on_ping()
            elif any(r == ref for r, _ in self._timing):  # not dropped by an actor failure
                self._on_timed(ref)
        self._check_deadlines()

    def _cap(self) -> int:
        if self.config.max_builds_in_flight:
            return self.config.max_builds_in_flight
        if time.monotonic() - self._cpus_checked > 5.0:
            self._cpus = max(int(ray.cluster_resources().get("CPU", 1)), 1)
            self._cpus_checked = time.monotonic()
        return self._cpus

    def _launch_builds(self) -> None:
        cap = self._cap()
        while self._to_build and len(self._building) < cap:
            c = self._to_build.popleft()
            stream = self._build.remote(c.mod_json, self.device.target_config)
            c.deadline = time.monotonic() + self.config.build_start_timeout_s
            self._building[stream] = c

    def _on_build_item(self, stream: Any, c: _Cand) -> None:
        try:
            ref = next(stream)
            item = ray.get(ref) if c.stage < 2 else ref  # never fetch the artifact's bytes here
        except StopIteration:
            item = RayError("the build stream ended early")
        except (NodeDiedError, ObjectLostError, OwnerDiedError) as err:
            item = BuildResult(None, 0.0, ErrorClass.LOST, f"build lost with its node: {_short(err)}")
        except WorkerCrashedError as err:
            item = BuildResult(None, 0.0, ErrorClass.BUILD_ERROR, f"build process crashed: {_short(err)}")
        except TaskCancelledError:
            return
        except RayError as err:
            item = BuildResult(None, 0.0, ErrorClass.BUILD_ERROR, _short(err))
        if isinstance(item, RayError):
            item = BuildResult(None, 0.0, ErrorClass.BUILD_ERROR, str(item))
        if c.stage == 0 and not isinstance(item, BuildResult):  # started: the timeout counts from now
            c.stage = 1
            c.deadline = time.monotonic() + self.config.build_timeout_s
            self._building[stream] = c
            return
        if c.stage == 1 and isinstance(item, BuildResult) and item.ok:  # built; the bytes come next
            c.stage = 2
            c.build = item
            self._building[stream] = c
            return
        if c.stage == 2:
            c.artifact = item
            meta = c.build
        else:
            meta = item
        if not isinstance(meta, BuildResult):
            meta = BuildResult(None, 0.0, ErrorClass.BUILD_ERROR, f"unexpected build stream item {type(meta)}")
        c.build = meta
        self.stats.build_s += meta.build_sec
        if meta.ok:
            self.stats.built += 1
        if c.future is None:  # a task's reference build
            state = self._refs[c.task_key]
            if meta.ok:
                state.artifact = c.artifact
            else:
                state.error = f"reference: {meta.error_msg}"
            return
        if not meta.ok or not c.time:
            self._finish(c, RunResult(error_class=meta.error_class, error_msg=meta.error_msg) if not meta.ok
                         else RunResult())  # fmt: skip
            return
        self._to_time.append(c)

    def _dispatch_timings(self) -> None:
        now = time.monotonic()
        if self._down_since is not None:
            # The actor starts, restarts or has no node: time nothing until a ping returns.
            if self._ping is None and now >= self._ping_after:
                self._ping = self._actor.info.remote()
            if (self._to_time or self._suspect) and now - self._down_since > self.config.device_wait_s:
                if self._suspect is not None:
                    c, _, msg = self._suspect
                    self._suspect = None
                    self._finish(c, RunResult(error_class=ErrorClass.LOST,
                                              error_msg=f"device actor did not come back after: {msg}"))
                reason = "device node lost" if not self._device_alive() else "device actor did not come back"
                while self._to_time:
                    self._finish(self._to_time.popleft(), RunResult(
                        error_class=ErrorClass.LOST,
                        error_msg=f"{reason} within {self.config.device_wait_s:.0f} s ({self.resource})"))
            return
        while len(self._timing) < self.config.timing_depth:
            c = next((c for c in self._to_time if self._ref_ready(c.task_key)), None)
            if c is None:
                return
            self._to_time.remove(c)
            state = self._refs[c.task_key]
            if state.error is not None:
                self._finish(c, RunResult(error_class=ErrorClass.RUN_ERROR, error_msg=state.error))
                continue
            reference = Reference([state.artifact], c.entry, state.cand.args or [])
            ref = self._actor.measure.remote(c.task_key, c.artifact, c.entry, self.config.timing, reference,
                                             self._best.get(c.task_key))
            self._timing.append((ref, c))
            if len(self._timing) == 1:
                self._head_deadline = now + self._budget(c)

    def _on_ping(self) -> None:
        ping, self._ping = self._ping, None
        try:
            info = ray.get(ping)
        except RayError:
            self._ping_after = time.monotonic() + 0.2
            return
        self._down_since = None
        self._settle_suspect()
        self._actor_node = info.get("node_id")

    def _settle_suspect(self) -> None:
        """Blame the candidate the actor died on, unless its node died (then it is LOST)."""
        if self._suspect is None:
            return
        c, kind, msg = self._suspect
        self._suspect = None
        if not self._node_alive(self._actor_node):
            cls, msg = ErrorClass.LOST, f"device node lost while timing ({msg})"
        elif kind == "crash":
            cls, msg = ErrorClass.RUN_CRASH, f"candidate crashed the device process: {msg}"
        else:
            cls = ErrorClass.RUN_TIMEOUT
        logger.warning("candidate %d: %s", c.id, msg[:200])
        self._finish(c, RunResult(error_class=cls, error_msg=msg))

    def _ref_ready(self, key: str) -> bool:
        state = self._refs[key]
        return state.artifact is not None or state.error is not None

    def _budget(self, c: _Cand) -> float:
        budget = self.config.run_timeout_s
        if c.task_key not in self._actor_refs:
            budget += self.config.run_timeout_s  # the actor may first compute the reference
        return budget

    def _on_timed(self, ref: Any) -> None:
        index = next(i for i, (r, _) in enumerate(self._timing) if r == ref)
        _, c = self._timing[index]
        del self._timing[index]
        try:
            run: RunResult = ray.get(ref)
        except RayActorError as err:
            self._timing.insert(index, (ref, c))
            self._on_actor_failure("crash", err)
            return
        self._actor_refs.add(c.task_key)
        self._actor_node = run.node_id or self._actor_node
        self.stats.device_busy_s += run.busy_s
        if run.ok:
            self.stats.timed += 1
            med = run.median
            if not run.early_stopped and med is not None and med < self._best.get(c.task_key, float("inf")):
                self._best[c.task_key] = med
        self._finish(c, run)
        if index == 0 and self._timing:
            self._head_deadline = time.monotonic() + self._budget(self._timing[0][1])

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        for ref, c in list(self._building.items()):
            if now > c.deadline:
                del self._building[ref]
                with contextlib.suppress(RayError):
                    ray.cancel(ref, force=True)
                timeout = self.config.build_timeout_s
                c.build = BuildResult(None, timeout, ErrorClass.BUILD_TIMEOUT, f"build exceeded {timeout:.0f} s")
                if c.future is None:
                    self._refs[c.task_key].error = f"reference: {c.build.error_msg}"
                else:
                    self._finish(c, RunResult(error_class=ErrorClass.BUILD_TIMEOUT, error_msg=c.build.error_msg))
        if self._timing and now > self._head_deadline:
            # A hung candidate: only killing the actor's process stops it; Ray restarts it.
            with contextlib.suppress(RayError):
                ray.kill(self._actor, no_restart=False)
            self._on_actor_failure("timeout", None)

    def _on_actor_failure(self, kind: str, err: BaseException | None) -> None:
        inflight = list(self._timing)
        self._timing.clear()
        self._actor_refs.clear()
        self._down_since = time.monotonic()
        self._ping = None
        head = inflight[0][1]
        # Right after the failure a crash and a lost node look the same; the verdict waits
        # until the actor is back (node alive: the candidate's fault) or the device is gone.
        msg = _short(err) if err is not None else f"run exceeded {self._budget(head):.0f} s"
        self._settle_suspect()
        self._suspect = (head, kind, msg)
        # The others never ran: time them again on the restarted actor (at most twice).
        for _, c in reversed(inflight[1:]):
            c.attempts += 1
            if c.attempts > 2:
                self._finish(c, RunResult(error_class=ErrorClass.LOST, error_msg="device actor failed repeatedly"))
            else:
                self._to_time.appendleft(c)

    def _node_alive(self, node_id: str | None) -> bool:
        if node_id is None:
            return self._device_alive()
        try:
            return any(n.get("NodeID") == node_id and n.get("Alive") for n in ray.nodes())
        except RayError:
            return False

    def _device_alive(self) -> bool:
        try:
            return any(n.get("Alive") and n.get("Resources", {}).get(self.resource, 0) > 0 for n in ray.nodes())
        except RayError:
            return False

    def _finish(self, c: _Cand, run: RunResult) -> None:
        build = c.build or BuildResult(None, 0.0)
        m = Measurement(build, run)
        with self._cv:
            self.stats.last_done = time.monotonic()
            if m.error_class is not None:
                key = str(m.error_class)
                self.stats.errors[key] = self.stats.errors.get(key, 0) + 1
        if c.future is not None and not c.future.done():
            c.future.set_result(m)

    def _fail_all(self, err: BaseException | None) -> None:
        for stream in self._building:  # builds nobody will read any more
            with contextlib.suppress(RayError):
                ray.cancel(stream, force=True)
        cands = [*self._to_build, *self._building.values(), *self._to_time, *(c for _, c in self._timing)]
        if self._suspect is not None:
            cands.append(self._suspect[0])
        with self._cv:
            cands += list(self._incoming)
            self._incoming.clear()
        for c in cands:
            if c.future is None or c.future.done():
                continue
            if err is None:
                c.future.set_result(Measurement(c.build or BuildResult(None, 0.0),
                                                RunResult(error_class=ErrorClass.LOST, error_msg="measurer closed")))
            else:
                c.future.set_exception(err)


def _short(err: BaseException, limit: int = 1000) -> str:
    text = f"{type(err).__name__}: {err}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _entry(mod: tvm.IRModule) -> str:
    func = mod["main"]
    if func.attrs and "global_symbol" in func.attrs:
        return str(func.attrs["global_symbol"])
    return "main"


def _arg_specs(mod: tvm.IRModule) -> list[ArgSpec]:
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    return [
        ArgSpec(tuple(int(d) for d in info.shape), str(info.dtype))
        for info in ArgInfo.from_prim_func(mod["main"])
    ]
