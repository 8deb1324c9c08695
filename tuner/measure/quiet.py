"""Keeping a CPU node quiet while it times: a per-node lease that Ray schedules, no signals.

Every node that times CPU candidates runs one small ``NodeQuiet`` actor (named after the
node, in the ``nightshift`` namespace, pinned to the node). Processes that burn CPU on the
node hold a *shared* lease while they do (a build while it compiles, a driver while it
searches); the device actor takes the *exclusive* lease for a timing. Once a timing asks, no
new shared lease is granted; the timing starts when the shared ones running are returned. So
a timing never shares its cores with a build, and a build never stops half-way: its timeout
counts only the time it ran. A long piece of work returns its lease between its stages when a
timing waits (``CpuWork.pause``), so a timing waits for the stage in progress, not the whole
build.

When the device actor times on fewer cores than the node offers, it registers its cores and
builds are pinned to the others (``os.sched_setaffinity``) without waiting for any lease.

No wait is unbounded and no lease outlives its holder's work:

- every grant is a lease of its own (an id the caller draws), returned in ``finally`` by the
  block that took it; a caller that gives up, is cancelled or raises while it waits withdraws
  its request (``abandon``), and a grant that lands after that is returned at once;
- a holder renews its leases from a daemon thread (``_RENEW_S``); the actor drops a lease
  whose renewals stopped for ``LEASE_TTL_S`` (a block that never ended: a leaked lease) and,
  at once, the leases and requests of processes that died;
- every acquire takes a bound: past it the caller gets no lease and the holders (pid, task,
  age) it waited for, for its log line (a timing records the candidate as ``LEASE_TIMEOUT``).

Processes are told apart by pid and start time in clock ticks since boot
(``/proc/<pid>/stat``), never by a wall-clock start time: psutil's ``create_time()`` adds the
boot time as of the call, which moves when the system clock is stepped, and a holder whose
recorded time no longer matched was dropped as dead on every poll (a timing that waited so
was never granted, and its device actor hung).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tuner.errors import NightshiftError

logger = logging.getLogger(__name__)

NAMESPACE = "nightshift"
_POLL_S = 0.02
_LOOKUP_TTL_S = 5.0
#: A lease not renewed for this long is dropped: its block ended without returning it.
LEASE_TTL_S = 30.0
_RENEW_S = 2.0
#: How long CPU work waits for its node before it works without the lease (logged).
SHARED_WAIT_S = 600.0
#: How long a timing waits for its node by default (the device actor is given its bound).
TIMING_WAIT_S = 120.0
# Slack of a caller's own wait over the actor's bound: the call's transfer and scheduling.
_CALL_SLACK_S = 30.0
_lookups: dict[str, tuple[float, Any]] = {}

Holder = tuple[int, int]


class LeaseTimeout(NightshiftError):
    """A timing did not get its node's lease within its bound; ``holders`` held or wanted it."""

    def __init__(self, message: str, holders: list[str]) -> None:
        super().__init__(message)
        self.holders = holders


def _start_ticks(pid: int) -> int | None:
    """Process ``pid``'s start in clock ticks since boot (fixed for its life), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        if os.path.isdir("/proc"):
            return None
        import psutil  # no procfs (not Linux): the wall-clock start time, to the second

        try:
            return round(psutil.Process(pid).create_time())
        except psutil.Error:
            return None
    # The command name (field 2) may hold spaces and parentheses: count from its last ')'.
    return int(stat[stat.rindex(b")") + 2 :].split()[19])


def holder() -> Holder:
    """This process as a lease holder: (pid, start in clock ticks since boot)."""
    pid = os.getpid()
    start = _start_ticks(pid)
    assert start is not None  # this process is alive
    return pid, start


def _alive(pid: int, start: int) -> bool:
    return _start_ticks(pid) == start


def _task_label() -> str:
    """What this process works for, for the lease actor's log lines: actor, task or driver."""
    try:
        import ray

        ctx = ray.get_runtime_context()
        if ctx.worker.mode != ray.WORKER_MODE:  # a driver (its task calls would log warnings)
            return "driver"
        name = ctx.get_actor_name() or ctx.get_task_name()
        task_id = ctx.get_task_id()
    except Exception:  # no Ray here, or a context without a task: the pid says enough
        return "no task"
    if not task_id:
        return "driver"
    return f"{name or 'task'} {task_id[:16]}"


def _request(task: str | None = None) -> dict[str, Any]:
    """A new lease request of this process: its id, the process and what it works for."""
    pid, start = holder()
    return {"id": uuid.uuid4().hex, "pid": pid, "start": start, "task": task or _task_label()}


@dataclass
class _Entry:
    """A lease granted or a timing waiting for one."""

    id: str
    kind: str  # "shared" or "timing"
    pid: int
    start: int
    task: str
    since: float
    renewed: float

    def describe(self, now: float) -> str:
        return f"{self.kind} lease of pid {self.pid} ({self.task}), {now - self.since:.0f} s"


class NodeQuiet:
    """The lease of one node: shared for CPU work, exclusive for a CPU timing.

    An asyncio actor: every wait is a coroutine, so any number of builds and timings can
    wait at once. Timings take turns in the order they ask; while one waits or runs, no
    shared lease is granted (timings are short; builds wait at most for the queued ones).
    Every acquire returns by its bound, granted or not; see the module for how leases end.
    """

    def __init__(self) -> None:
        self._leases: dict[str, _Entry] = {}
        self._waiting: dict[str, _Entry] = {}  # timings, in the order they asked
        self._abandoned: dict[str, float] = {}  # requests withdrawn before they were served
        self._timing_cores: set[int] = set()
        self._released_at = 0.0
        self.stats = {"shared_grants": 0, "timings": 0, "timing_wait_s": 0.0, "shared_wait_s": 0.0, "pinned": 0,
                      "timeouts": 0, "expired": 0}  # fmt: skip

    def _purge(self) -> None:
        now = time.monotonic()
        for e in list(self._leases.values()):
            if not _alive(e.pid, e.start):
                del self._leases[e.id]
            elif now - e.renewed > LEASE_TTL_S:
                del self._leases[e.id]
                self.stats["expired"] += 1
                logger.warning("dropped the %s: not renewed for %.0f s", e.describe(now), now - e.renewed)
        for e in list(self._waiting.values()):
            if not _alive(e.pid, e.start):
                del self._waiting[e.id]
        self._abandoned = {k: t for k, t in self._abandoned.items() if now - t < 2 * LEASE_TTL_S}

    def _timing(self) -> _Entry | None:
        return next((e for e in self._leases.values() if e.kind == "timing"), None)

    def _holders(self, *, but: str | None = None) -> list[str]:
        now = time.monotonic()
        held = [e.describe(now) for e in self._leases.values() if e.id != but]
        return held + [f"waiting: {e.describe(now)}" for e in self._waiting.values() if e.id != but]

    def _grant(self, req: dict[str, Any], kind: str) -> None:
        now = time.monotonic()
        self._leases[req["id"]] = _Entry(req["id"], kind, req["pid"], req["start"], req["task"], now, now)

    def set_timing_cores(self, cores: list[int]) -> None:
        """The cores a device actor times on; builds are kept to the others where any remain."""
        self._timing_cores = set(cores)

    async def acquire_shared(self, req: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        """Wait until no timing runs or waits, then grant lease ``req["id"]`` (shared).

        Args:
            req: the request (``_request``): lease id, pid, start ticks, task.
            timeout_s: the longest wait; None: no bound (in-process use only).

        Returns:
            ``{"lease": id, "cores": None, "waited_s"}``; or, where the node has cores no
            timing uses, ``{"lease": None, "cores": [...]}`` (no lease: the caller pins itself
            to them); or, past the bound or withdrawn, ``{"lease": None, "cores": None,
            "holders": [...]}``.
        """
        spare = sorted(set(os.sched_getaffinity(0)) - self._timing_cores) if self._timing_cores else []
        if spare:
            self.stats["pinned"] += 1
            return {"lease": None, "cores": spare, "waited_s": 0.0}
        start = time.monotonic()
        while True:
            self._purge()
            waited = time.monotonic() - start
            if req["id"] in self._abandoned:
                return {"lease": None, "cores": None, "waited_s": waited, "holders": []}
            # A timing that asks while builds wait goes after them if a timing ended since
            # they began to wait: builds and timings alternate, neither starves.
            if self._timing() is None and (not self._waiting or self._released_at > start):
                self._grant(req, "shared")
                self.stats["shared_grants"] += 1
                self.stats["shared_wait_s"] += waited
                return {"lease": req["id"], "cores": None, "waited_s": waited}
            if timeout_s is not None and waited >= timeout_s:
                self.stats["timeouts"] += 1
                return {"lease": None, "cores": None, "waited_s": waited, "holders": self._holders()}
            await asyncio.sleep(_POLL_S)

    def timing_pending(self) -> bool:
        """Whether a timing holds the node or waits for it (shared holders should pause)."""
        return self._timing() is not None or bool(self._waiting)

    async def acquire_timing(self, req: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        """Wait for the running shared leases (but the caller's own) and earlier timings to
        end, then grant lease ``req["id"]`` (exclusive).

        Returns ``{"lease": id, "waited_s", "shared_waited"}``, or past the bound (or
        withdrawn) ``{"lease": None, "waited_s", "holders": [...]}``.
        """
        start = time.monotonic()
        me = (req["pid"], req["start"])
        self._waiting[req["id"]] = _Entry(req["id"], "timing", req["pid"], req["start"], req["task"], start, start)
        seen: set[str] = set()
        try:
            while True:
                self._purge()
                waited = time.monotonic() - start
                # Checked on every poll: a request dropped from the queue ends its wait here
                # instead of polling for ever.
                if req["id"] not in self._waiting or req["id"] in self._abandoned:
                    return {"lease": None, "waited_s": waited, "holders": []}
                others = [e for e in self._leases.values() if e.kind == "shared" and (e.pid, e.start) != me]
                seen |= {e.id for e in others}
                if self._timing() is None and not others and next(iter(self._waiting)) == req["id"]:
                    self._grant(req, "timing")
                    self.stats["timings"] += 1
                    self.stats["timing_wait_s"] += waited
                    return {"lease": req["id"], "waited_s": waited, "shared_waited": len(seen)}
                if timeout_s is not None and waited >= timeout_s:
                    self.stats["timeouts"] += 1
                    return {"lease": None, "waited_s": waited, "holders": self._holders(but=req["id"])}
                await asyncio.sleep(_POLL_S)
        finally:
            self._waiting.pop(req["id"], None)

    def renew(self, lease_ids: list[str]) -> list[str]:
        """Renew the holder's leases; returns those the actor no longer has (dropped)."""
        now = time.monotonic()
        gone = []
        for lease_id in lease_ids:
            e = self._leases.get(lease_id)
            if e is None:
                gone.append(lease_id)
            else:
                e.renewed = now
        return gone

    def release(self, lease_id: str) -> None:
        """Return lease ``lease_id`` (either kind; unknown ids are ignored)."""
        e = self._leases.pop(lease_id, None)
        if e is not None and e.kind == "timing":
            self._released_at = time.monotonic()

    def abandon(self, lease_id: str) -> None:
        """The caller gave up request ``lease_id`` (cancelled, raised, timed out): withdraw it,
        or return the lease if it was granted meanwhile."""
        self._abandoned[lease_id] = time.monotonic()
        self._waiting.pop(lease_id, None)
        self.release(lease_id)

    def state(self) -> dict[str, Any]:
        """Holders and counters, for tests and logs."""
        self._purge()
        timing = self._timing()
        return {"shared": sum(e.kind == "shared" for e in self._leases.values()), "timing": timing is not None,
                "waiting": len(self._waiting), "holders": self._holders(), "timing_cores": sorted(self._timing_cores),
                **self.stats}  # fmt: skip


def actor_name(node_id: str) -> str:
    """The name of node ``node_id``'s lease actor."""
    return f"quiet-{node_id}"


def ensure(node_id: str) -> Any:
    """Node ``node_id``'s lease actor, started on that node if none runs yet.

    Detached: every job on the cluster shares it, whichever job started it.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return ray.remote(NodeQuiet).options(
        name=actor_name(node_id), namespace=NAMESPACE, get_if_exists=True, lifetime="detached",
        num_cpus=0, max_restarts=-1, max_concurrency=1000,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote()  # fmt: skip


def lookup(node_id: str) -> Any | None:
    """Node ``node_id``'s lease actor, or None where nothing times on the node (cached a while)."""
    import ray

    now = time.monotonic()
    cached = _lookups.get(node_id)
    if cached is not None and now - cached[0] < _LOOKUP_TTL_S:
        return cached[1]
    try:
        handle = ray.get_actor(actor_name(node_id), namespace=NAMESPACE)
    except ValueError:
        handle = None
    _lookups[node_id] = (now, handle)
    return handle


class _Renewals:
    """The daemon thread that renews every lease this process holds (one per process)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, Any] = {}  # lease id -> its lease actor
        self._thread: threading.Thread | None = None

    def add(self, lease_id: str, handle: Any) -> None:
        with self._lock:
            self._held[lease_id] = handle
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="nightshift-lease-renewal", daemon=True)
                self._thread.start()

    def remove(self, lease_id: str) -> None:
        with self._lock:
            self._held.pop(lease_id, None)

    def _run(self) -> None:
        while True:
            time.sleep(_RENEW_S)
            with self._lock:
                held = list(self._held.items())
            for lease_id, handle in held:
                try:
                    handle.renew.remote([lease_id])
                except Exception as err:  # the actor restarts: the lease went with it
                    logger.debug("lease %s not renewed: %s", lease_id, err)


_renewals = _Renewals()


def _acquire(handle: Any, kind: str, wait_s: float) -> dict[str, Any]:
    """Ask lease actor ``handle`` for a lease of ``kind``, waiting at most ``wait_s``.

    A granted lease is renewed from now on. Whatever ends the wait early (a cancel, an
    exception, the caller's own timeout) withdraws the request, so no grant is left behind.
    """
    import ray

    req = _request()
    ref = getattr(handle, f"acquire_{kind}").remote(req, wait_s)
    try:
        grant = ray.get(ref, timeout=wait_s + _CALL_SLACK_S)
    except BaseException:
        with contextlib.suppress(Exception):
            handle.abandon.remote(req["id"])
        raise
    if grant.get("lease"):
        _renewals.add(grant["lease"], handle)
    return grant


def _release(handle: Any, lease_id: str) -> None:
    from ray.exceptions import RayError

    _renewals.remove(lease_id)
    with contextlib.suppress(RayError):
        handle.release.remote(lease_id)


class CpuWork:
    """The hold ``cpu_work`` yields: a shared lease of the node, a pinning to the cores no
    timing uses, or nothing (no timing on the node, or the lease not had in time). Used by
    one thread."""

    def __init__(self, lease: Any = None, grant: dict[str, Any] | None = None, *,
                 wait_s: float = SHARED_WAIT_S) -> None:  # fmt: skip
        self._lease = lease
        self._id: str | None = None
        self._wait_s = wait_s
        self._affinity: set[int] | None = None
        self.waited_s = 0.0
        if grant is not None:
            self._take(grant)

    def _take(self, grant: dict[str, Any]) -> None:
        self.waited_s += float(grant["waited_s"])
        if grant["cores"]:  # pinned where no timing runs: no lease to hold or return
            if self._affinity is None:
                self._affinity = os.sched_getaffinity(0)
            os.sched_setaffinity(0, grant["cores"])
            self._lease = None
            return
        self._id = grant.get("lease")
        if self._id is None:
            logger.warning("no node lease after %.0f s (%s); working without it", grant["waited_s"],
                           "; ".join(grant.get("holders") or ["request withdrawn"]))  # fmt: skip
            self._lease = None

    def timing_pending(self) -> bool:
        """Whether a timing waits for (or holds) the node: call ``pause`` at the next stage."""
        if self._lease is None:
            return False
        import ray
        from ray.exceptions import RayError

        try:
            return bool(ray.get(self._lease.timing_pending.remote(), timeout=_CALL_SLACK_S))
        except RayError:
            return False

    def pause(self) -> float:
        """Return the lease, let the waiting timings run, hold it again; the seconds it took."""
        if self._lease is None or self._id is None:
            return 0.0
        from ray.exceptions import RayError

        start = time.monotonic()
        _release(self._lease, self._id)
        self._id = None
        try:
            self._take(_acquire(self._lease, "shared", self._wait_s))
        except RayError as err:  # the lease actor restarts: work as if the node were idle
            logger.warning("node lease unavailable (%s); working without it", err)
            self._lease = None
        return time.monotonic() - start

    def close(self) -> None:
        """Return the lease or the pinning."""
        if self._affinity is not None:
            os.sched_setaffinity(0, self._affinity)
            self._affinity = None
        if self._lease is not None and self._id is not None:
            _release(self._lease, self._id)
        self._lease, self._id = None, None


@contextlib.contextmanager
def cpu_work(node_id: str | None, *, wait_s: float = SHARED_WAIT_S) -> Iterator[CpuWork]:
    """Hold a shared lease of node ``node_id`` while the block burns CPU there.

    Yields the hold (``waited_s``: the seconds waited for the lease; ``pause`` between stages
    of long work). Where the node times on part of its cores only, the process is pinned to
    the others for the block instead. Where nothing times on the node (no lease actor), it
    runs at once; where the lease is not had within ``wait_s``, it runs without it (logged
    with the holders).
    """
    from ray.exceptions import RayError

    lease = lookup(node_id) if node_id else None
    if lease is None:
        yield CpuWork()
        return
    try:
        grant = _acquire(lease, "shared", wait_s)
    except RayError as err:  # the lease actor restarts: work as if the node were idle
        logger.warning("node lease unavailable (%s); working without it", err)
        yield CpuWork()
        return
    work = CpuWork(lease, grant, wait_s=wait_s)
    try:
        yield work
    finally:
        work.close()


class TimingLease:
    """The device actor's side: hold node ``node_id`` exclusively around each CPU timing.

    Args:
        node_id: the node timed on.
        timing_cores: the cores the timings use, where fewer than the process may use.
        wait_s: how long ``acquire`` waits by default.
    """

    def __init__(self, node_id: str, timing_cores: list[int] | None = None, *,
                 wait_s: float = TIMING_WAIT_S) -> None:  # fmt: skip
        self.handle = ensure(node_id)
        self.wait_s = wait_s
        self._id: str | None = None
        if timing_cores and set(timing_cores) != set(os.sched_getaffinity(0)):
            self.handle.set_timing_cores.remote(timing_cores)

    def acquire(self, wait_s: float | None = None) -> dict[str, Any]:
        """Wait until the node's CPU work is done; returns the wait and how many it waited for.

        Raises:
            LeaseTimeout: not granted within ``wait_s`` (default: the lease's); says who held
                the node.
        """
        wait = self.wait_s if wait_s is None else wait_s
        try:
            grant = _acquire(self.handle, "timing", wait)
        except TimeoutError as err:  # the lease actor did not answer in time (GetTimeoutError)
            raise LeaseTimeout(f"the node's lease actor did not answer within {wait:.0f} s", []) from err
        if not grant.get("lease"):
            holders = list(grant.get("holders") or [])
            raise LeaseTimeout(f"node lease not granted within {grant['waited_s']:.0f} s; held by: "
                               + ("; ".join(holders) or "no one (request dropped)"), holders)  # fmt: skip
        self._id = grant["lease"]
        return grant

    def release(self) -> None:
        """Let the node's CPU work go on."""
        if self._id is not None:
            _release(self.handle, self._id)
            self._id = None
