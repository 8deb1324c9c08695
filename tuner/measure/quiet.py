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

Holders are processes of the node, identified by pid and start time: a holder that dies
(a crashed build, a killed actor) is dropped at once, so nothing waits for a dead process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import psutil

logger = logging.getLogger(__name__)

NAMESPACE = "nightshift"
_POLL_S = 0.02
_LOOKUP_TTL_S = 5.0
_lookups: dict[str, tuple[float, Any]] = {}


def holder() -> tuple[int, float]:
    """This process as a lease holder: (pid, start time)."""
    return os.getpid(), psutil.Process().create_time()


def _alive(h: tuple[int, float]) -> bool:
    try:
        return psutil.Process(h[0]).create_time() == h[1]
    except psutil.Error:
        return False


class NodeQuiet:
    """The lease of one node: shared for CPU work, exclusive for a CPU timing.

    An asyncio actor: every wait is a coroutine, so any number of builds and timings can
    wait at once. Timings take turns in the order they ask; while one waits or runs, no
    shared lease is granted (timings are short; builds wait at most for the queued ones).
    """

    def __init__(self) -> None:
        self._shared: dict[tuple[int, float], int] = {}
        self._timing: tuple[int, float] | None = None
        self._waiting: list[tuple[int, float]] = []
        self._timing_cores: set[int] = set()
        self._released_at = 0.0
        self.stats = {"shared_grants": 0, "timings": 0, "timing_wait_s": 0.0, "shared_wait_s": 0.0, "pinned": 0}

    def _purge(self) -> None:
        for h in [h for h in self._shared if not _alive(h)]:
            del self._shared[h]
        if self._timing is not None and not _alive(self._timing):
            self._timing = None
        self._waiting = [h for h in self._waiting if _alive(h)]

    def set_timing_cores(self, cores: list[int]) -> None:
        """The cores a device actor times on; builds are kept to the others where any remain."""
        self._timing_cores = set(cores)

    async def acquire_shared(self, who: tuple[int, float]) -> dict[str, Any]:
        """Wait until no timing runs or waits, then hold a shared lease.

        Returns ``{"cores": [...]}`` instead (no lease held) when the node has cores that no
        timing uses: the caller pins itself to them and needs no lease.
        """
        spare = sorted(set(os.sched_getaffinity(0)) - self._timing_cores) if self._timing_cores else []
        if spare:
            self.stats["pinned"] += 1
            return {"cores": spare, "waited_s": 0.0}
        start = time.monotonic()
        while True:
            self._purge()
            # A timing that asks while builds wait goes after them if a timing ended since
            # they began to wait: builds and timings alternate, neither starves.
            if self._timing is None and (not self._waiting or self._released_at > start):
                self._shared[who] = self._shared.get(who, 0) + 1
                self.stats["shared_grants"] += 1
                waited = time.monotonic() - start
                self.stats["shared_wait_s"] += waited
                return {"cores": None, "waited_s": waited}
            await asyncio.sleep(_POLL_S)

    def timing_pending(self) -> bool:
        """Whether a timing holds the node or waits for it (shared holders should pause)."""
        return self._timing is not None or bool(self._waiting)

    def release_shared(self, who: tuple[int, float]) -> None:
        """Return one shared lease of ``who``."""
        n = self._shared.get(who, 0) - 1
        if n > 0:
            self._shared[who] = n
        else:
            self._shared.pop(who, None)

    async def acquire_timing(self, who: tuple[int, float]) -> dict[str, Any]:
        """Wait for the running shared leases (and earlier timings) to end, then hold the node."""
        start = time.monotonic()
        if self._timing == who:
            return {"waited_s": 0.0, "shared_waited": 0}
        self._waiting.append(who)
        seen: set[tuple[int, float]] = set()
        try:
            while True:
                self._purge()
                others = {h for h in self._shared if h != who}
                seen |= others
                if self._timing is None and not others and self._waiting and self._waiting[0] == who:
                    self._timing = who
                    waited = time.monotonic() - start
                    self.stats["timings"] += 1
                    self.stats["timing_wait_s"] += waited
                    return {"waited_s": waited, "shared_waited": len(seen)}
                await asyncio.sleep(_POLL_S)
        finally:
            with contextlib.suppress(ValueError):
                self._waiting.remove(who)

    def release_timing(self, who: tuple[int, float]) -> None:
        """Return the exclusive lease."""
        if self._timing == who:
            self._timing = None
            self._released_at = time.monotonic()

    def state(self) -> dict[str, Any]:
        """Holders and counters, for tests and logs."""
        self._purge()
        return {"shared": len(self._shared), "timing": self._timing is not None, "waiting": len(self._waiting),
                "timing_cores": sorted(self._timing_cores), **self.stats}


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


class CpuWork:
    """The hold ``cpu_work`` yields: a shared lease of the node, a pinning to the cores no
    timing uses, or nothing (no timing on the node). Used by one thread."""

    def __init__(self, lease: Any = None, who: tuple[int, float] | None = None,
                 grant: dict[str, Any] | None = None) -> None:  # fmt: skip
        self._lease, self._who = lease, who
        self._affinity: set[int] | None = None
        self.waited_s = 0.0
        if grant is not None:
            self._take(grant)

    def _take(self, grant: dict[str, Any]) -> None:
        if grant["cores"]:  # pinned where no timing runs: no lease to hold or return
            if self._affinity is None:
                self._affinity = os.sched_getaffinity(0)
            os.sched_setaffinity(0, grant["cores"])
            self._lease = None
        self.waited_s += float(grant["waited_s"])

    def timing_pending(self) -> bool:
        """Whether a timing waits for (or holds) the node: call ``pause`` at the next stage."""
        if self._lease is None:
            return False
        import ray
        from ray.exceptions import RayError

        try:
            return bool(ray.get(self._lease.timing_pending.remote()))
        except RayError:
            return False

    def pause(self) -> float:
        """Return the lease, let the waiting timings run, hold it again; the seconds it took."""
        if self._lease is None:
            return 0.0
        import ray
        from ray.exceptions import RayError

        start = time.monotonic()
        try:
            # Calls of one caller run in order: the release lands before the new request.
            self._lease.release_shared.remote(self._who)
            self._take(ray.get(self._lease.acquire_shared.remote(self._who)))
        except RayError as err:  # the lease actor restarts: work as if the node were idle
            logger.warning("node lease unavailable (%s); working without it", err)
            self._lease = None
        return time.monotonic() - start

    def close(self) -> None:
        """Return the lease or the pinning."""
        if self._affinity is not None:
            os.sched_setaffinity(0, self._affinity)
            self._affinity = None
        if self._lease is not None:
            from ray.exceptions import RayError

            with contextlib.suppress(RayError):
                self._lease.release_shared.remote(self._who)
            self._lease = None


@contextlib.contextmanager
def cpu_work(node_id: str | None) -> Iterator[CpuWork]:
    """Hold a shared lease of node ``node_id`` while the block burns CPU there.

    Yields the hold (``waited_s``: the seconds waited for the lease; ``pause`` between stages
    of long work). Where the node times on part of its cores only, the process is pinned to
    the others for the block instead. Where nothing times on the node (no lease actor), it
    runs at once.
    """
    import ray
    from ray.exceptions import RayError

    lease = lookup(node_id) if node_id else None
    if lease is None:
        yield CpuWork()
        return
    me = holder()
    try:
        grant = ray.get(lease.acquire_shared.remote(me))
    except RayError as err:  # the lease actor restarts: work as if the node were idle
        logger.warning("node lease unavailable (%s); working without it", err)
        yield CpuWork()
        return
    work = CpuWork(lease, me, grant)
    try:
        yield work
    finally:
        work.close()


class TimingLease:
    """The device actor's side: hold node ``node_id`` exclusively around each CPU timing."""

    def __init__(self, node_id: str, timing_cores: list[int] | None = None) -> None:
        self.handle = ensure(node_id)
        self.me = holder()
        if timing_cores and set(timing_cores) != set(os.sched_getaffinity(0)):
            self.handle.set_timing_cores.remote(timing_cores)

    def acquire(self) -> dict[str, Any]:
        """Wait until the node's CPU work is done; returns the wait and how many it waited for."""
        import ray

        return ray.get(self.handle.acquire_timing.remote(self.me))

    def release(self) -> None:
        """Let the node's CPU work go on."""
        self.handle.release_timing.remote(self.me)
