"""Building candidates on any CPU of a Ray cluster and timing them on the device actors.

The pipeline, driven by one engine thread per measurer:

    submit -> build (Ray task, any CPU, build timeout) -> bytes in Ray's object store
           -> a device actor (one per node x device, shared by jobs; checks, then times)

Builds run as soon as a CPU is free; up to ``timing_depth`` built candidates are queued at
each device actor, so the next artifact's transfer overlaps the current timing and the device
never waits for the driver. On a CPU node a timing holds the node's lease and builds hold it
shared (see ``tuner.measure.quiet``), so a timing never shares its cores with a build; a build
lets a waiting timing go first between its stages, and where the timings' node also builds
they are sent in batches (``timing_batch``) timed under one hold, so the node switches
between building and timing a few times per batch of candidates, not twice per candidate.

Every fault ends as a ``Measurement`` with an error class, for that candidate only: a build
that raises, runs past its timeout or crashes its process; a lost artifact; a candidate that
crashes the actor (the actor restarts), hangs (the actor is killed and restarts) or gives a
wrong answer; any other error of a call; a node that disappears (builds are retried
elsewhere by Ray, timings in flight go to another device or are marked ``LOST``); a CPU timing
whose node's lease stays taken past ``MeasureConfig.lease_wait_s`` (``LEASE_TIMEOUT``, logged
with the holders).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
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

from tuner.cuda_runtime import gpu_archs, gpu_identity
from tuner.device import Device
from tuner.errors import CudaToolchainError, UserInputError
from tuner.graph.tasks import Task
from tuner.measure import device_actor
from tuner.measure.base import WORKER_ENV, MeasureConfig, MeasureError, MeasureStats, device_resource
from tuner.measure.builder import BuildPause, build_task
from tuner.measure.builder import arg_specs as _arg_specs
from tuner.measure.builder import entry_name as _entry
from tuner.measure.cuda import reference_module
from tuner.measure.results import BuildResult, ErrorClass, Measurement, RunResult
from tuner.measure.runner import ArgSpec, Reference

logger = logging.getLogger(__name__)


#: Ray's own variable for its memory monitor (see :func:`connect`).
MEMORY_MONITOR_ENV = "RAY_memory_monitor_refresh_ms"


def local_device_resources() -> dict[str, float]:
    """The device resources of this machine: its CPU and each CUDA GPU TVM sees."""
    from tuner.device import parse_device
    from tuner.measure.worker import gpu_resources

    # gpu_archs loads TVM's CUDA runtime library, without which TVM sees no GPU.
    return {device_resource(parse_device("cpu")): 1.0} | gpu_resources(gpu_archs())


def env_address() -> str | None:
    """The cluster ``RAY_ADDRESS`` names, as Ray's own tools take it when no address is passed.

    Raises:
        UserInputError: it is a Ray Client (``ray://``) or Jobs API (``http://``) address, which
            ``ray.init`` cannot join for Nightshift (``--ray-address`` says what to do instead).
    """
    import os

    from tuner.measure.submit import is_jobs_address

    address = os.environ.get("RAY_ADDRESS", "").strip() or None
    if address is not None and (address.startswith("ray://") or is_jobs_address(address)):
        # A Ray Client address cannot carry the streaming builds (tuner.measure.submit); its
        # head's Jobs API can.
        jobs = address if is_jobs_address(address) else f"http://{address[6:].split(':')[0] or 'HEAD'}:8265"
        raise UserInputError(
            f"RAY_ADDRESS={address}: Nightshift joins a cluster with ray.init, which cannot use a Ray Client "
            f"or Jobs API address; pass --ray-address {jobs} to submit the job to the cluster, or unset "
            "RAY_ADDRESS to tune on a local cluster"
        )
    return address


def starts_local(address: str | None = None) -> bool:
    """Whether :func:`connect` with ``address`` would start a local cluster (which its caller
    then shuts down): Ray is not initialized in this process, and neither ``address`` nor
    ``RAY_ADDRESS`` names a cluster."""
    return not ray.is_initialized() and not address and env_address() is None


def _no_device_node(resource: str, device: Device) -> str:
    """Why no node can time ``device``, and what to do, for the cluster this process joined."""
    if _local_head() and resource in local_device_resources():
        # A notebook's plain ``ray.init()`` on a machine that has the device: the local cluster
        # lacks our resource, and a worker command with HEAD_IP:PORT is not what that user needs.
        return (f"the Ray cluster this process started (ray.init()) does not offer device resource {resource!r}; "
                "start it with tuner.measure.ray_measure.connect() instead of ray.init() (or "
                "ray.init(resources=local_device_resources()) from the same module), or call ray.shutdown() "
                "and let tune start its own")
    return f"no node of the Ray cluster offers device resource {resource!r}; start a worker for it with: " \
        f"{worker_command(device)}"


def _local_head() -> bool:
    """Whether this process's Ray cluster was started by ``ray.init()`` in this process."""
    # Ray's private node object is the only place that says so; a Ray without it gets the
    # general wording.
    node = getattr(ray._private.worker, "_global_node", None)
    return bool(getattr(node, "ray_init_cluster", False))


def connect(address: str | None = None, *, num_cpus: int | None = None,
            resources: dict[str, float] | None = None) -> bool:
    """Join the Ray cluster at ``address`` (``auto``, ``HOST:PORT``) or start a local one.

    With no ``address``, ``RAY_ADDRESS`` is honoured as Ray's own tools do: its cluster is
    joined, and one warning line says so. If Ray is already initialized in this process (a
    notebook's ``ray.init()``), that connection is used as it is.

    A local cluster offers this machine's device resources (``local_device_resources``) plus
    ``resources``. It listens on 127.0.0.1 only (GCS, raylet, workers, the metrics agent) and
    requires Ray's token, whatever ``RAY_AUTH_MODE`` says: whoever reaches its ports runs code
    as this user. The token is ``RAY_AUTH_TOKEN``, else the file Ray reads
    (``RAY_AUTH_TOKEN_PATH``, default ``~/.ray/auth_token``), created or tightened to 0600.

    Returns:
        True if this call started a local cluster: the caller owns it and shuts it down
        (``ray.shutdown()``); False if it joined a cluster or found Ray initialized, which
        must be left running.

    Raises:
        UserInputError: ``RAY_ADDRESS`` is an address ``ray.init`` cannot join (see :func:`env_address`).
    """
    if ray.is_initialized():
        logger.debug("Ray is already initialized in this process: using its cluster")
        return False
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                              "logging_level": logging.WARNING, "runtime_env": {"env_vars": dict(WORKER_ENV)}}
    if not address:
        address = env_address()
        if address is not None:
            # A warning, so it shows without -v: the job runs somewhere else than a plain
            # `tune` would put it, because of a variable set perhaps long ago.
            logger.warning("using the Ray cluster at %s (RAY_ADDRESS)", address)
    if address:
        ray.init(address=address, **kwargs)
        logger.info("Ray cluster: %s", ray.cluster_resources())
        return False
    import os
    import secrets
    import stat
    from pathlib import Path

    from ray._private import services
    from ray._private.authentication import authentication_token_setup as ray_auth

    mode = os.environ.get(ray_auth.AUTH_MODE_ENV_VAR)
    if mode is not None and mode.lower() != "token":
        logger.warning("%s=%s ignored: the local Ray cluster always requires its token", ray_auth.AUTH_MODE_ENV_VAR,
                       mode)  # fmt: skip
    if not os.environ.get("RAY_AUTH_TOKEN"):
        # Ray writes the token it generates with the umask (0644 here): any local user could read it.
        token_file = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or ray_auth._get_default_token_path())
        token_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            if stat.S_IMODE(token_file.stat().st_mode) & 0o077:
                token_file.chmod(0o600)
        else:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))  # Ray's own format: 256 random bits in hex
    # Sets RAY_AUTH_MODE=token for this process and the cluster it starts, and refreshes the
    # configuration Ray has cached from the environment.
    ray_auth._enable_token_auth()
    # ray.init turns a 127.0.0.1 node address into the machine's LAN address, and Ray 2.60 has
    # no option to keep it; kept, every server of the node listens on the loopback interface
    # only. tests/measure/test_local_cluster.py fails if a Ray upgrade changes this.
    resolve = services.resolve_ip_for_localhost
    services.resolve_ip_for_localhost = lambda host: host
    try:
        # "local", not None: with None, Ray joins the newest cluster a `ray start` on this
        # machine recorded in /tmp/ray (another user's), and then refuses our resources.
        device_resources = local_device_resources()
        # Ray counts GPUs through NVML, which a container or VM may not expose even where
        # TVM's CUDA runtime sees the GPUs: offer as many as TVM sees (CUDA_VISIBLE_DEVICES
        # applies to both), so the device actors' num_gpus=1 can be granted.
        gpus = sum(int(v) for k, v in device_resources.items() if k.startswith("nightshift_cuda_"))
        if gpus:
            kwargs["num_gpus"] = gpus
        if MEMORY_MONITOR_ENV not in os.environ:  # a user's own setting of Ray's variable stands
            # Ray's memory monitor kills the newest worker above 95% of the memory the machine
            # reports; a VM whose memory grows as it is used (the GPU servers we verify on)
            # reports far less than it gives. A job's processes are bounded (a build per core,
            # an actor per device); a real out-of-memory kill is still a worker crash, a record.
            kwargs["_system_config"] = {"memory_monitor_refresh_ms": 0}
        with _quiet_auth_notice(ray_auth.logger):
            ray.init(address="local", num_cpus=num_cpus, resources=device_resources | (resources or {}),
                     _node_ip_address="127.0.0.1", **kwargs)  # fmt: skip
    finally:
        services.resolve_ip_for_localhost = resolve
    logger.info("Ray cluster: %s", ray.cluster_resources())
    return True


@contextlib.contextmanager
def _quiet_auth_notice(auth_logger: logging.Logger) -> Iterator[None]:
    """Ray's notice that token authentication is on, kept out of a throwaway local cluster's
    start unless this module logs at DEBUG (``-v``).

    Nightshift turns token auth on itself (above), and Ray 2.60 then says nothing; should
    another Ray version announce it again ("Token authentication is enabled for this Ray
    cluster. Set RAY_AUTH_MODE=disabled to opt out"), the hint to opt out is wrong for a
    cluster that always requires its token. Only the level of Ray's own logger for it
    changes, and only while the local cluster starts.
    """
    if logger.isEnabledFor(logging.DEBUG):
        yield
        return
    level = auth_logger.level
    auth_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        auth_logger.setLevel(level)


def worker_command(device: Device, head: str = "HEAD_IP:PORT", num_cpus: int | None = None) -> str:
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
    stage: int = 0  # build stream items received: start (node id), (pauses,) metadata, artifact
    node_id: str | None = None  # the node that builds it, once started
    waiting: bool = True  # its deadline is a wait for a CPU (start or pause), not a compilation
    ready_at: float = 0.0  # when it joined the candidates to time


@dataclass
class _RefState:
    cand: _Cand
    artifact: Any = None
    error: str | None = None


@dataclass(eq=False)
class _Call:
    """One candidate's call on a device actor: a stream of its start time, then its result."""

    stream: Any
    cand: _Cand
    started: bool = False
    deadline: float = float("inf")


@dataclass(eq=False)
class _Dev:
    """The engine's view of one device actor (one device of one node)."""

    node_id: str
    name: str
    actor: Any
    fingerprint: str | None = None
    calls: list[_Call] = field(default_factory=list)
    down_since: float | None = None
    ping: Any = None
    ping_after: float = 0.0
    refs: set[str] = field(default_factory=set)  # tasks whose reference output the actor holds
    dead: bool = False  # its node is gone: calls queued for it would wait forever
    batch: bool = False  # its timings make builds wait: send them in batches (timing_batch)
    # The candidate whose call ran when the actor died, with the verdict it gets if the node
    # is still there once the actor is back ("crash" or "timeout") and the message.
    suspect: tuple[_Cand, str, str] | None = None


class RayMeasurer:
    """Builds candidates as Ray tasks and checks and times them on the device's timing actors.

    Every node that offers the device's Ray resource has one shared timing actor per unit of
    it (``tuner.measure.device_actor``); a measurer times on every actor whose device has the
    fingerprint it was asked for (or, if none has, the most common one), so identical nodes
    share a job's timings, and two measurers (two jobs) on one device take turns at its actor.
    Nodes that join later are found while the measurer works (``MeasureConfig.node_scan_s``)
    and time too once their actor answers with that fingerprint; a node that leaves is dropped.
    ``device`` is the device as the timing nodes see it: builds target it and records are
    keyed by its fingerprint. ``submit`` is thread-safe and returns one future per candidate.

    Raises:
        UserInputError: no node of the cluster offers the device's resource.
        MeasureError: no device actor started within ``device_wait_s``.
    """

    def __init__(self, device: Device, config: MeasureConfig | None = None) -> None:
        self.config = config or MeasureConfig()
        self.resource = device_resource(device)
        nodes = _device_nodes(self.resource)
        if not nodes:
            raise UserInputError(_no_device_node(self.resource, device))
        self._build = ray.remote(build_task).options(
            num_cpus=1, num_returns="streaming", max_retries=self.config.build_retries, retry_exceptions=False
        )
        quiet = self.config.quiet_builds if self.config.quiet_builds is not None else device.kind == "cpu"
        self._actor_args = (device.kind, device.target_config, quiet)
        devs = [self._start_actor(node_id, unit) for node_id, units in nodes for unit in range(units)]
        infos = self._infos(devs)
        self._devs, self.device = _choose(device, devs, infos)
        builds = _build_nodes()
        for d, info in zip(devs, infos, strict=True):
            d.batch = bool(info and info.get("builds_wait")) and d.node_id in builds
        # Actors answered and used or set aside (another fingerprint); those that did not
        # answer are asked again by the next scan.
        self._known = {d.name for d, info in zip(devs, infos, strict=True) if info is not None}
        self._joining: dict[Any, _Dev] = {}  # info() call -> actor of a node that joined
        self._scanned = time.monotonic()
        self._measure = "measure_stream"
        self._ids = iter(range(1 << 62))
        self._cv = threading.Condition()
        self._incoming: deque[_Cand] = deque()
        self._closing = False
        # Engine-thread state.
        self._to_build: deque[_Cand] = deque()
        self._building: dict[Any, _Cand] = {}
        self._to_time: deque[_Cand] = deque()
        self._refs: dict[str, _RefState] = {}
        self._best: dict[str, float] = {}
        self._cpus = 1
        self._cpus_checked = 0.0
        self._nodes_checked = 0.0
        self.stats = MeasureStats()
        self._thread = threading.Thread(target=self._loop, name="nightshift-measure", daemon=True)
        self._thread.start()

    def _start_actor(self, node_id: str, unit: int) -> _Dev:
        kind, target_config, quiet = self._actor_args
        name = device_actor.actor_name(self.resource, node_id, unit)
        actor = device_actor.ensure(self.resource, node_id, unit, kind, target_config, quiet=quiet)
        return _Dev(node_id, name, actor)

    def _infos(self, devs: list[_Dev]) -> list[dict[str, Any] | None]:
        refs = [d.actor.info.remote() for d in devs]
        # A cold actor imports TVM first, like a cold build worker.
        wait = max(self.config.device_wait_s, self.config.build_start_timeout_s)
        deadline = time.monotonic() + wait
        out: list[dict[str, Any] | None] = []
        for ref in refs:
            try:
                out.append(ray.get(ref, timeout=max(deadline - time.monotonic(), 0.1)))
            except (RayError, TimeoutError) as err:
                logger.warning("a device actor did not answer: %s", _short(err, 300))
                out.append(None)
        if not any(out):
            raise MeasureError(f"no timing actor for {self.resource} started within {wait:.0f} s")
        return out

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
        """Where the first device actor runs (node id, pid, runtime-only, fingerprint)."""
        return ray.get(self._devs[0].actor.info.remote(), timeout=self.config.device_wait_s)

    def devices_info(self) -> list[dict[str, Any]]:
        """``actor_info`` of every device actor this measurer times on."""
        return ray.get([d.actor.info.remote() for d in self._devs], timeout=self.config.device_wait_s)

    @contextlib.contextmanager
    def cpu_work(self) -> Iterator[None]:
        """Hold this node's shared CPU lease for the block (the driver's search), so that no
        timing on this node runs beside it (see ``tuner.measure.quiet``)."""
        from tuner.measure.quiet import cpu_work

        try:
            node_id = ray.get_runtime_context().get_node_id()
        except Exception:  # a driver outside the cluster is on no node: nothing to keep apart
            node_id = None
        with cpu_work(node_id):
            yield

    def alive(self) -> bool:
        """Whether the Ray cluster answers and still offers the device."""
        try:
            return ray.is_initialized() and self.resource in ray.cluster_resources()
        except Exception:
            return False

    def timing_lease(self) -> Any | None:
        """The driver's node's :class:`~tuner.measure.quiet.TimingLease`, if one of this
        measurer's device actors times there; else None (said in the log)."""
        from tuner.measure.quiet import TimingLease

        try:
            here = ray.get_runtime_context().get_node_id()
            nodes = {info["node_id"] for info in self.devices_info()}
        except Exception as err:  # a lost actor or cluster: nothing to time with
            logger.warning("no timing lease on the driver's node: %s", err)
            return None
        if here not in nodes:
            logger.info("no device actor of this measurer times on the driver's node")
            return None
        return TimingLease(here, wait_s=self.config.lease_wait())

    def close(self) -> None:
        """Stop the engine and mark unfinished candidates ``LOST``; the device actors stay for
        other jobs (they are the cluster's, not this measurer's)."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        self._thread.join(timeout=30)

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
        return bool(self._to_build or self._building or self._to_time
                    or any(d.calls or d.ping or d.suspect for d in self._devs))  # fmt: skip

    def _step(self) -> None:
        self._scan_nodes()
        self._launch_builds()
        self._dispatch_timings()
        waitables = list(self._building)
        for d in self._devs:
            waitables += [call.stream for call in d.calls]
            if d.ping is not None:
                waitables.append(d.ping)
        waitables += list(self._joining)
        now = time.monotonic()
        if not waitables:
            time.sleep(0.05)  # waiting for the next ping to a device actor
            return
        deadlines = [c.deadline for c in self._building.values()]
        deadlines += [call.deadline for d in self._devs for call in d.calls]
        timeout = min([0.5, *(max(t - now, 0.0) for t in deadlines)])
        # fetch_local=False: waiting on a build's stream must not pull its artifact's bytes
        # to this node; they go from the build node's store to the device actor only.
        ready, _ = ray.wait(waitables, num_returns=1, timeout=timeout, fetch_local=False)
        if ready:
            ready, _ = ray.wait(waitables, num_returns=len(waitables), timeout=0, fetch_local=False)
        for ref in ready:
            if ref in self._building:
                self._on_build_item(ref, self._building.pop(ref))
                continue
            if ref in self._joining:
                self._on_join(ref, self._joining.pop(ref))
                continue
            for d in self._devs:
                if d.ping is not None and ref == d.ping:
                    self._on_ping(d)
                    break
                call = next((call for call in d.calls if call.stream == ref), None)
                if call is not None:  # not dropped by an actor failure
                    self._on_call_item(d, call)
                    break
        self._check_deadlines()
        self._check_nodes()

    def _scan_nodes(self) -> None:
        """Start (or find) the device actors of nodes that joined with the device's resource
        and ask them who they are; ``_on_join`` adds those with the chosen fingerprint."""
        now = time.monotonic()
        if now - self._scanned < self.config.node_scan_s:
            return
        self._scanned = now
        try:
            nodes = _device_nodes(self.resource)
        except RayError:
            return
        asked = {d.name for d in self._joining.values()}
        for node_id, units in nodes:
            for unit in range(units):
                name = device_actor.actor_name(self.resource, node_id, unit)
                if name in self._known or name in asked:
                    continue
                try:
                    d = self._start_actor(node_id, unit)
                    self._joining[d.actor.info.remote()] = d
                except RayError as err:  # the node left again: the next scan will not list it
                    logger.warning("device actor on joining node %s did not start: %s", node_id[:12], _short(err))

    def _on_join(self, ref: Any, d: _Dev) -> None:
        try:
            info = ray.get(ref)
        except RayError as err:  # gone again or failing: asked again at the next scan if listed
            logger.warning("device actor %s did not answer: %s", d.name, _short(err, 300))
            return
        self._known.add(d.name)
        d.fingerprint = info["fingerprint"]
        if d.fingerprint != self.device.fingerprint:
            logger.info("device node %s joined with fingerprint %s, not %s: not used", d.node_id[:12],
                        d.fingerprint, self.device.fingerprint)  # fmt: skip
            return
        d.batch = bool(info.get("builds_wait")) and d.node_id in _build_nodes()
        self._devs.append(d)
        logger.info("device node %s joined: timing on %d device actor(s)", d.node_id[:12],
                    sum(not x.dead for x in self._devs))  # fmt: skip

    def _check_nodes(self) -> None:
        """Fail the calls of devices whose node died: a restarting actor that cannot come back
        (its node is gone) would hold them forever."""
        now = time.monotonic()
        watched = [d for d in self._devs if not d.dead and (d.calls or d.down_since is not None)]
        if not watched or now - self._nodes_checked < 2.0:
            return
        self._nodes_checked = now
        try:
            alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        except RayError:
            return
        for d in watched:
            if d.node_id not in alive:
                self._device_lost(d)

    def _device_lost(self, d: _Dev) -> None:
        """The device's node is gone: what ran there is LOST, what waited goes elsewhere."""
        logger.warning("device node %s is gone; its timings go to the other devices", d.node_id[:12])
        d.dead = True
        d.ping = None
        self._on_actor_failure(d, "crash", NodeDiedError(f"node {d.node_id} died"))
        self._settle_suspect(d)

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
            c.waiting = True
            self._building[stream] = c

    def _on_build_item(self, stream: Any, c: _Cand) -> None:
        try:
            ref = next(stream)
            item = ray.get(ref) if c.stage < 2 else ref  # never fetch the artifact's bytes here
        except StopIteration:
            item = BuildResult(None, 0.0, ErrorClass.BUILD_ERROR, "the build stream ended early")
        except (NodeDiedError, ObjectLostError, OwnerDiedError) as err:
            item = BuildResult(None, 0.0, ErrorClass.LOST, f"build lost with its node: {_short(err)}")
        except WorkerCrashedError as err:
            item = BuildResult(None, 0.0, ErrorClass.BUILD_ERROR, f"build process crashed: {_short(err)}")
        except TaskCancelledError:
            return
        except Exception as err:  # any other fault is this candidate's build error, never the job's
            item = BuildResult(None, 0.0, ErrorClass.BUILD_ERROR, _short(err))
        if c.stage == 0 and not isinstance(item, BuildResult):  # started: the timeout counts from now
            c.stage = 1
            c.node_id = item if isinstance(item, str) else None
            c.deadline = time.monotonic() + self.config.build_timeout_s
            c.waiting = False
            self._building[stream] = c
            return
        if c.stage == 1 and isinstance(item, BuildPause):
            # Paused for a timing of its node: the timeout counts only the time it runs.
            left = self.config.build_start_timeout_s if item.paused else self.config.build_timeout_s - item.ran_s
            c.deadline = time.monotonic() + left
            c.waiting = item.paused
            self._building[stream] = c
            return
        if c.stage == 1 and isinstance(item, BuildResult) and item.ok:  # built; the bytes come next
            c.stage = 2
            c.build = item
            self._building[stream] = c
            return
        if c.stage == 2 and not isinstance(item, BuildResult):
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
        c.ready_at = time.monotonic()
        self._to_time.append(c)

    def _dispatch_timings(self) -> None:
        now = time.monotonic()
        for d in self._devs:
            if d.down_since is not None and d.ping is None and now >= d.ping_after and not d.dead:
                d.ping = d.actor.info.remote()
        up = [d for d in self._devs if d.down_since is None and not d.dead]
        if not up:
            # Every actor starts, restarts or has no node: time nothing until a ping returns.
            oldest = min(d.down_since or now for d in self._devs)
            if self._to_time and now - oldest > self.config.device_wait_s:
                reason = "device node lost" if not self._device_alive() else "device actor did not come back"
                while self._to_time:
                    self._finish(self._to_time.popleft(), RunResult(
                        error_class=ErrorClass.LOST,
                        error_msg=f"{reason} within {self.config.device_wait_s:.0f} s ({self.resource})"))
        for d in self._devs:
            if d.suspect is not None and d.down_since is not None and now - d.down_since > self.config.device_wait_s:
                c, _, msg = d.suspect
                d.suspect = None
                self._finish(c, RunResult(error_class=ErrorClass.LOST,
                                          error_msg=f"device actor did not come back after: {msg}"))
        ready = [c for c in self._to_time if self._ref_ready(c.task_key)]
        due = bool(ready) and self._batch_due(ready)
        for c in ready:
            # A device that makes builds wait starts a batch only when it is due; one in a
            # batch takes more while it holds the node (its actor keeps the hold for them).
            takers = [d for d in up if len(d.calls) < self._depth(d) and (due or d.calls or not d.batch)]
            if not takers:
                return
            d = min(takers, key=lambda d: len(d.calls))
            self._to_time.remove(c)
            state = self._refs[c.task_key]
            if state.error is not None:
                self._finish(c, RunResult(error_class=ErrorClass.RUN_ERROR, error_msg=state.error))
                continue
            reference = Reference([state.artifact], c.entry, state.cand.args or [])
            # Back-pressure 1: the actor goes on only once this driver has read the start, so
            # a candidate that kills the actor at once is known to have been running.
            stream = d.actor.measure_stream.options(
                num_returns="streaming", _generator_backpressure_num_objects=1
            ).remote(c.task_key, c.artifact, c.entry, self.config.timing, reference, self._best.get(c.task_key),
                     self._budget(d, c), self.config.lease_wait())  # fmt: skip
            d.calls.append(_Call(stream, c))

    def _depth(self, d: _Dev) -> int:
        return max(self.config.timing_batch, self.config.timing_depth) if d.batch else self.config.timing_depth

    def _batch_due(self, ready: list[_Cand]) -> bool:
        """Whether the ready candidates make a batch: enough, no more coming, or waited long."""
        if len(ready) >= self.config.timing_batch or not (self._to_build or self._building):
            return True
        return time.monotonic() - min(c.ready_at for c in ready) >= self.config.timing_batch_wait_s

    def _on_call_item(self, d: _Dev, call: _Call) -> None:
        c = call.cand
        try:
            item = ray.get(next(call.stream))
        except StopIteration:
            item = RayError("the device actor's stream ended early")
        except RayActorError as err:
            self._on_actor_failure(d, "crash", err)
            return
        except (ObjectLostError, OwnerDiedError, NodeDiedError) as err:  # its artifact is gone
            d.calls.remove(call)
            self._finish(c, RunResult(error_class=ErrorClass.LOST, error_msg=f"artifact lost: {_short(err)}",
                                      node_id=d.node_id))
            return
        except Exception as err:  # any other fault of the call: this candidate's run error only
            if not self._node_alive(d.node_id):  # unless its device's node is gone
                self._device_lost(d)
                return
            item = err
        if not call.started and isinstance(item, float):
            call.started = True
            call.deadline = time.monotonic() + self._budget(d, c)
            return
        d.calls.remove(call)
        if not isinstance(item, RunResult):
            msg = _short(item) if isinstance(item, BaseException) else f"unexpected item {type(item)}"
            self._finish(c, RunResult(error_class=ErrorClass.RUN_ERROR, error_msg=msg, node_id=d.node_id))
            return
        run = item
        if run.error_class == ErrorClass.LEASE_TIMEOUT:
            logger.warning("candidate %d not timed on %s: %s", c.id, d.name, (run.error_msg or "")[:500])
            self._finish(c, dataclasses.replace(run, node_id=d.node_id))
            return
        d.refs.add(c.task_key)
        self.stats.device_busy_s += run.busy_s
        if run.ok:
            self.stats.timed += 1
            med = run.median
            if not run.early_stopped and med is not None and med < self._best.get(c.task_key, float("inf")):
                self._best[c.task_key] = med
        self._finish(c, run)

    def _on_ping(self, d: _Dev) -> None:
        ping, d.ping = d.ping, None
        try:
            ray.get(ping)
        except Exception:  # still down (any error): ping again a little later
            d.ping_after = time.monotonic() + 0.2
            return
        d.down_since = None
        self._settle_suspect(d)

    def _settle_suspect(self, d: _Dev) -> None:
        """Blame the candidate the actor died on, unless its node died (then it is LOST)."""
        if d.suspect is None:
            return
        c, kind, msg = d.suspect
        d.suspect = None
        if not self._node_alive(d.node_id):
            cls, msg = ErrorClass.LOST, f"device node lost while timing ({msg})"
        elif kind == "crash":
            cls, msg = ErrorClass.RUN_CRASH, f"candidate crashed the device process: {msg}"
        else:
            cls = ErrorClass.RUN_TIMEOUT
        logger.warning("candidate %d: %s", c.id, msg[:200])
        self._finish(c, RunResult(error_class=cls, error_msg=msg, node_id=d.node_id))

    def _ref_ready(self, key: str) -> bool:
        state = self._refs[key]
        return state.artifact is not None or state.error is not None

    def _budget(self, d: _Dev, c: _Cand) -> float:
        budget = self.config.run_timeout_s
        if c.task_key not in d.refs:
            budget += self.config.run_timeout_s  # the actor may first compute the reference
        return budget

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        for ref, c in list(self._building.items()):
            if now > c.deadline:
                del self._building[ref]
                with contextlib.suppress(RayError):
                    ray.cancel(ref, force=True)
                timeout = self.config.build_timeout_s
                c.build = BuildResult(None, timeout, ErrorClass.BUILD_TIMEOUT, f"build exceeded {timeout:.0f} s")
                if c.waiting:
                    # It never got a CPU (every build node busy or gone): says nothing of the
                    # candidate, so it is measured again later.
                    msg = f"build waited {self.config.build_start_timeout_s:.0f} s for a CPU and never ran"
                    c.build = BuildResult(None, 0.0, ErrorClass.LOST, msg)
                elif c.node_id is not None and not self._node_alive(c.node_id):
                    # A stream whose node died may never say so: the candidate is not to
                    # blame (a timeout is never retried, LOST is).
                    c.build = BuildResult(None, 0.0, ErrorClass.LOST, f"build lost with its node {c.node_id[:12]}")
                if c.future is None:
                    self._refs[c.task_key].error = f"reference: {c.build.error_msg}"
                else:
                    self._finish(c, RunResult(error_class=c.build.error_class, error_msg=c.build.error_msg))
        for d in self._devs:
            if any(call.started and now > call.deadline for call in d.calls):
                # A hung candidate: only killing the actor's process stops it; Ray restarts it.
                with contextlib.suppress(RayError):
                    ray.kill(d.actor, no_restart=False)
                self._on_actor_failure(d, "timeout", None)

    def _on_actor_failure(self, d: _Dev, kind: str, err: BaseException | None) -> None:
        inflight = list(d.calls)
        d.calls.clear()
        d.refs.clear()
        d.down_since = time.monotonic()
        d.ping = None
        running = next((call for call in inflight if call.started), None)
        # Right after the failure a crash and a lost node look the same; the verdict waits
        # until the actor is back (node alive: the candidate's fault) or the device is gone.
        self._settle_suspect(d)
        if running is not None:
            msg = _short(err) if err is not None else f"run exceeded {self._budget(d, running.cand):.0f} s"
            d.suspect = (running.cand, kind, msg)
        # The others never ran (another job's candidate may have been the one): time them
        # again on a device that is up (at most twice).
        for call in reversed(inflight):
            if call is running:
                continue
            c = call.cand
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
            self.stats.finished(m)
        if c.future is not None and not c.future.done():
            c.future.set_result(m)

    def _fail_all(self, err: BaseException | None) -> None:
        for stream in self._building:  # builds nobody will read any more
            with contextlib.suppress(RayError):
                ray.cancel(stream, force=True)
        cands = [*self._to_build, *self._building.values(), *self._to_time]
        for d in self._devs:
            cands += [call.cand for call in d.calls]
            if d.suspect is not None:
                cands.append(d.suspect[0])
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


def _device_nodes(resource: str) -> list[tuple[str, int]]:
    """(node id, units of ``resource``) of every live node that offers it."""
    return sorted(
        (n["NodeID"], int(n["Resources"][resource]))
        for n in ray.nodes()
        if n.get("Alive") and n.get("Resources", {}).get(resource, 0) >= 1
    )


def _build_nodes() -> set[str]:
    """Live nodes that offer CPUs, where builds run."""
    try:
        return {n["NodeID"] for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0}
    except RayError:
        return set()


def _choose(device: Device, devs: list[_Dev], infos: list[dict[str, Any] | None]) -> tuple[list[_Dev], Device]:
    """The actors to time on: those whose device has ``device``'s fingerprint, or else those of
    the most common fingerprint; and that device, as its nodes describe it."""
    groups: dict[str, list[tuple[_Dev, dict[str, Any]]]] = {}
    for d, info in zip(devs, infos, strict=True):
        if info is None:
            continue
        d.fingerprint = info["fingerprint"]
        groups.setdefault(info["fingerprint"], []).append((d, info))
    fp = device.fingerprint if device.fingerprint in groups else max(groups, key=lambda k: (len(groups[k]), k))
    if fp != device.fingerprint:
        logger.info("no timing node has device %s's fingerprint %s: timing on %d node(s) with %s", device.name,
                    device.fingerprint, len(groups[fp]), fp)  # fmt: skip
    others = [d.name for k, g in groups.items() if k != fp for d, _ in g]
    if others:
        logger.info("device actors of other fingerprints not used: %s", others)
    chosen = groups[fp]
    spec = chosen[0][1]["device"]
    timing_device = Device(spec["kind"], device.index, spec["target_config"], spec["description"])
    return [d for d, _ in chosen], timing_device


def _short(err: BaseException, limit: int = 1000) -> str:
    text = f"{type(err).__name__}: {err}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def identify_gpu_worker(device: Any, timeout_s: float = 120.0) -> Any:
    """``device`` as the Ray node that will time it sees its GPU: name, SM, driver, CUDA.

    The driver may have no GPU (``--target-arch`` cross-builds); the fingerprint must come
    from the node that times, so a probe takes the device's Ray resource and a GPU there, runs
    ``gpu_identity`` with TVM's runtime alone, and the description and per-block limits it
    reports replace the driver's guess.

    Raises:
        CudaToolchainError: the node that offers the resource sees no GPU, or another arch.
    """
    import dataclasses

    import ray
    from ray.exceptions import GetTimeoutError

    resource = device_resource(device)
    offering = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get(resource, 0) >= 1]
    if offering and not any(n["Resources"].get("GPU", 0) >= 1 for n in offering):
        # The probe (and the device actor) ask for a GPU: without one they would wait forever.
        raise CudaToolchainError(
            f"the node(s) offering {resource} offer Ray no GPU (Ray counts GPUs through NVML and "
            "CUDA_VISIBLE_DEVICES; on a node where it finds none, start the worker with --num-gpus N): "
            + "; ".join(f"{n.get('NodeManagerAddress')}: {_resource_text(n['Resources'])}" for n in offering)
        )
    probe = ray.remote(gpu_identity).options(
        num_cpus=0, num_gpus=1, resources={resource: 1},
        runtime_env={"env_vars": {"TVM_USE_RUNTIME_LIB": "1", **WORKER_ENV}},
    )  # fmt: skip
    ref = probe.remote(0)
    try:
        info = ray.get(ref, timeout=timeout_s)
    except GetTimeoutError:
        ray.cancel(ref, force=True)
        total = ray.cluster_resources()
        raise CudaToolchainError(
            f"the GPU probe (one GPU and {resource}) did not run within {timeout_s:.0f} s; free now: "
            f"{_resource_text(ray.available_resources(), keys=total)}; the cluster: {_resource_text(total)}"
        ) from None
    if info is None:
        raise CudaToolchainError(f"the node offering {resource} sees no GPU with TVM's CUDA runtime")
    if info["arch"] != device.arch:
        raise CudaToolchainError(f"the node offering {resource} has a {info['gpu']} ({info['arch']}), "
                                 f"not {device.arch}")
    config = dict(device.target_config)
    for key in ("max_num_threads", "max_shared_memory_per_block", "thread_warp_size"):
        config[key] = info[key]
    logger.info("timing node's GPU: %s", info)
    return dataclasses.replace(device, target_config=config, description=info, present=True)


def _resource_text(resources: dict[str, float], keys: dict[str, float] | None = None) -> str:
    """Ray's CPU, GPU and Nightshift resources, in a line (not its per-node internals); those
    of ``keys`` where given, 0 where ``resources`` lacks one (Ray leaves out what is all taken)."""
    names = [k for k in (keys or resources) if k in ("CPU", "GPU") or k.startswith("nightshift_")]
    return ", ".join(f"{k} {resources.get(k, 0):g}" for k in sorted(names)) or "none"
