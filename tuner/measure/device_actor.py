"""The timing actor of one device (node x device), shared by every job on the cluster.

One detached, named actor per unit of a device resource on a node (``device-<resource>-<node
id>-<k>``), so two identical machines each time candidates, and two jobs on one device talk
to the same actor: its calls take turns in the order they arrive, and a job's run timeout
counts from the moment its call starts (the first item of the call's stream), never while
it waits behind another job's timings.

The actor describes the device as its own node sees it (CPU model, ISA flags, cores; GPU name
and SM), so records are keyed by the fingerprint of the node that timed.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from tuner.measure.quiet import LeaseTimeout
from tuner.measure.results import ErrorClass, RunResult
from tuner.measure.runner import CandidateRunner, Reference, TimingConfig

logger = logging.getLogger(__name__)

# While more calls wait, a timing keeps the node's lease for them up to this long, so that a
# queue of built candidates (a measurer sends a batch of them at once, see
# ``MeasureConfig.timing_batch``) is timed back to back rather than each after a round of
# builds; builds wait meanwhile (paused, their timeout stopped).
_LINGER_MAX_S = 5.0
# A call that runs this many times its run timeout (plus a margin) was abandoned by a driver
# that died: the actor ends its own process so that Ray restarts it for the other jobs.
_ABANDONED_FACTOR = 3.0
_ABANDONED_MARGIN_S = 30.0


class _Turns:
    """A first-come, first-served lock: the device's calls run one at a time in arrival order."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._next = 0
        self._serving = 0

    @property
    def waiting(self) -> int:
        """Calls waiting for their turn (the one running excluded)."""
        with self._cv:
            return max(self._next - self._serving - 1, 0)

    def __enter__(self) -> None:
        with self._cv:
            ticket = self._next
            self._next += 1
            while self._serving != ticket:
                self._cv.wait()

    def __exit__(self, *exc: object) -> None:
        with self._cv:
            self._serving += 1
            self._cv.notify_all()


class DeviceActor(CandidateRunner):
    """A ``CandidateRunner`` run as the shared timing actor of one device of one node.

    Threaded (``max_concurrency`` > 1): ``info`` answers while a candidate is timed, and calls
    of several jobs wait their turn inside the actor.

    Args:
        kind: ``cpu`` or ``cuda``.
        target_config: the target the candidates are built for; a CPU actor replaces its
            ``num-cores`` with its node's physical cores, the threads it times with.
        quiet: on a CPU device, take the node's exclusive lease around every timing (see
            ``tuner.measure.quiet``).
    """

    def __init__(self, kind: str, target_config: dict[str, Any], *, quiet: bool = True) -> None:
        import ray

        from tuner.device import Device, host_cpu_info, parse_device
        from tuner.memory import small_pages

        self.node_id = ray.get_runtime_context().get_node_id()
        if kind == "cpu":
            info = host_cpu_info()
            cores = int(info["cores"])
            # TVM's thread pool reads this when the first kernel runs, which is later.
            os.environ["TVM_NUM_THREADS"] = str(cores)
            # Candidates' arguments pass through numpy: time them on the pages a model runs on.
            small_pages()
            config = dict(target_config) | {"num-cores": cores}
            self.device = Device("cpu", 0, config, dict(info) | {"cores": cores, "mcpu": config.get("mcpu")})
        super().__init__(kind, 0)
        if kind != "cpu":
            # With num_gpus=1 Ray shows the actor its GPU as device 0.
            self.device = parse_device("cuda:0", target_arch=target_config.get("arch"))
        if quiet and kind == "cpu":
            from tuner.measure.quiet import TimingLease

            allowed = sorted(os.sched_getaffinity(0))
            self._timing_cores = allowed[:cores] if cores < len(allowed) else None
            self.lease: TimingLease | None = TimingLease(self.node_id, self._timing_cores)
        else:
            self._timing_cores = None
            self.lease = None
        self._held_since: float | None = None
        # Every check and timing runs on this one thread. TVM's CPU thread pool is per calling
        # thread: on the actor's own threads (up to max_concurrency) each call made another
        # pool whose workers spin-yield between kernels, 64 pools of busy threads on one node.
        self._timer = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="nightshift-timing", initializer=self._pin_timing_thread)
        self._timing_threads: set[int] = set()
        self._turns = _Turns()
        self._current: tuple[float, float] | None = None
        self._measured = 0
        self._best: dict[str, float] = {}  # task -> best median timed here
        threading.Thread(target=self._watch, name="nightshift-abandoned", daemon=True).start()

    def info(self) -> dict[str, Any]:
        """Where the actor runs, the device as its node sees it (fingerprint included) and how
        many candidates it has measured since it started."""
        d = self.device
        return super().info() | {
            "fingerprint": d.fingerprint, "measured": self._measured,
            # Threads that ran checks and timings: one, so TVM keeps one thread pool.
            "timing_threads": len(self._timing_threads),
            # Builds on this node wait for its timings (no spare cores to pin them to).
            "builds_wait": self.lease is not None and self._timing_cores is None,
            "device": {"kind": d.kind, "index": d.index, "target_config": d.target_config,
                       "description": d.description},
        }  # fmt: skip

    def measure_stream(
        self,
        task_key: str,
        artifact: bytes,
        entry: str,
        timing: TimingConfig,
        reference: Reference | None,
        best_sec: float | None,
        run_timeout_s: float,
        lease_wait_s: float | None = None,
    ) -> Iterator[float | RunResult]:
        """Wait for the device's turn and, on a CPU, for the node's lease; say so (the start
        time, from which the caller's run timeout counts); then check and time the candidate.

        A CPU timing that does not get the node's lease within ``lease_wait_s`` (default: the
        lease's) is not timed: its result is ``LEASE_TIMEOUT``, naming who held the node.
        """
        with self._turns:
            try:
                grant = self._hold(lease_wait_s)
            except LeaseTimeout as err:
                logger.warning("candidate of %s not timed: %s", task_key[:60], err)
                yield time.time()
                yield RunResult(error_class=ErrorClass.LEASE_TIMEOUT, error_msg=str(err),
                                device_fingerprint=self.device.fingerprint)  # fmt: skip
                return
            self._current = (time.monotonic(), run_timeout_s)
            # A measurer sends a batch with the best it knew when it sent it; the actor knows
            # the best of the candidates it timed since (on this device, for any job).
            known = [b for b in (best_sec, self._best.get(task_key)) if b]
            try:
                yield time.time()
                run = self._timer.submit(self._measure, task_key, artifact, entry, timing, reference,
                                         min(known, default=None)).result()  # fmt: skip
                if run.ok and not run.early_stopped and run.median is not None:
                    self._best[task_key] = min(run.median, self._best.get(task_key, run.median))
            finally:
                self._current = None
                self._measured += 1
                self._let_go()
        yield dataclasses.replace(run, device_fingerprint=self.device.fingerprint,
                                  quiet_wait_s=grant.get("waited_s", 0.0), builds_waited=grant.get("shared_waited", 0))

    def _measure(self, *args: Any) -> RunResult:
        self._timing_threads.add(threading.get_ident())
        return self.measure(*args)

    def _pin_timing_thread(self) -> None:
        if self._timing_cores:
            # TVM's pool threads, started by the first timing on this thread, inherit it.
            os.sched_setaffinity(0, self._timing_cores)

    def _hold(self, wait_s: float | None) -> dict[str, Any]:
        if self.lease is None:
            return {}
        if self._held_since is not None:  # kept from the call before
            return {"waited_s": 0.0, "shared_waited": 0}
        grant = self.lease.acquire(wait_s)
        self._held_since = time.monotonic()
        return grant

    def _let_go(self) -> None:
        if self.lease is None or self._held_since is None:
            return
        if self._turns.waiting and time.monotonic() - self._held_since < _LINGER_MAX_S:
            return  # the next call is queued: keep the node quiet for it
        self._held_since = None
        self.lease.release()

    def _watch(self) -> None:
        while True:
            time.sleep(1.0)
            current = self._current
            if current is not None:
                start, timeout = current
                if time.monotonic() - start > _ABANDONED_FACTOR * timeout + _ABANDONED_MARGIN_S:
                    logger.error("a call ran %.0f s (run timeout %.0f s): restarting", time.monotonic() - start,
                                 timeout)  # fmt: skip
                    os._exit(1)


def actor_name(resource: str, node_id: str, unit: int) -> str:
    """The name of the timing actor of unit ``unit`` of ``resource`` on node ``node_id``."""
    return f"device-{resource}-{node_id}-{unit}"


def ensure(resource: str, node_id: str, unit: int, kind: str, target_config: dict[str, Any], *,
           quiet: bool) -> Any:  # fmt: skip
    """The timing actor of one device, started on its node if none runs yet (detached, shared)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from tuner.measure.base import WORKER_ENV
    from tuner.measure.quiet import NAMESPACE

    options: dict[str, Any] = {
        "name": actor_name(resource, node_id, unit), "namespace": NAMESPACE, "get_if_exists": True,
        "lifetime": "detached", "num_cpus": 0, "max_restarts": -1, "max_task_retries": 0, "max_concurrency": 64,
        "resources": {resource: 1},
        "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False),
        # The runtime-only import proves the device side needs no compiler.
        "runtime_env": {"env_vars": {"TVM_USE_RUNTIME_LIB": "1", **WORKER_ENV}},
    }  # fmt: skip
    if kind == "cuda":
        options["num_gpus"] = 1
    return ray.remote(DeviceActor).options(**options).remote(kind, target_config, quiet=quiet)
