"""Proposal work on any CPU of the Ray cluster: points sampled, applied and featurized by Ray
tasks, so the driver keeps only the strategy's bookkeeping.

A strategy decides which points to try (mutations, crossovers, draws: microseconds each);
what costs is TVM's part: replaying a sketch, running the postprocessors, extracting the
per-store features (10-50 ms per point on a 2-core machine). :class:`Applier` sends lists of
points to :func:`apply_points` tasks, as many at once as the cluster has CPUs; each task
rebuilds the space from the task's module (once per worker process: spaces are cached by
their spec) and returns, per point, what the job needs of its schedule: the scheduled
module, the trace as MetaSchedule's JSON, the program hash and the features. Nothing comes
back as a TVM ``Schedule``: the driver never replays a point.

Each task holds its node's shared CPU lease while it works (``tuner.measure.quiet``), like a
build: on a node that times CPU candidates, no timing runs beside it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm

from tuner.errors import NightshiftError

logger = logging.getLogger(__name__)

# Spaces a worker process keeps (a sketch space takes seconds to build).
_WORKER_SPACES = 8
_spaces: OrderedDict[str, Any] = OrderedDict()


@dataclass(frozen=True)
class SpaceSpec:
    """What rebuilds a task's space on a worker: the module, the target, the kind and seed
    (``search_spaces.create``'s arguments)."""

    mod_json: str
    target_config: dict[str, Any]
    kind: str
    seed: int

    @property
    def key(self) -> str:
        text = json.dumps([self.mod_json, self.target_config, self.kind, self.seed], sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    @staticmethod
    def of(space: Any, target_config: dict[str, Any], seed: int) -> SpaceSpec:
        """The spec of ``space``, created with ``target_config`` and ``seed``."""
        return SpaceSpec(tvm.ir.save_json(space.mod), dict(target_config), space.kind, seed)


@dataclass(frozen=True)
class Applied:
    """A point applied on a worker: its schedule's module (TVM JSON), trace (MetaSchedule's
    trace JSON, as ``Trace.as_json``), program hash and per-store feature rows."""

    point: str
    mod_json: str
    trace_json: Any
    program_hash: str
    features: np.ndarray
    #: The Ray node that applied it.
    node_id: str = ""


def trace_json(sch: Any) -> Any:
    """A schedule's trace as plain JSON, exactly as a ``TuningRecord`` stores it."""
    from tvm.s_tir import meta_schedule as ms

    from tuner.trace_json import record_as_json

    return record_as_json(ms.database.TuningRecord(sch.trace, ms.database.Workload(sch.mod)))[0]


def _space(spec: SpaceSpec) -> Any:
    """The space of ``spec``, built once per worker process."""
    import search_spaces

    key = spec.key
    space = _spaces.get(key)
    if space is None:
        target = tvm.target.Target(spec.target_config)
        space = search_spaces.create(tvm.ir.load_json(spec.mod_json), target, kind=spec.kind, seed=spec.seed)
        _spaces[key] = space
        if len(_spaces) > _WORKER_SPACES:
            _spaces.popitem(last=False)
    _spaces.move_to_end(key)
    return space


def apply_points(spec: SpaceSpec, points: Sequence[str] = (), seeds: Sequence[int] = ()) -> list[Applied | str]:
    """The Ray task body: apply ``points`` (point JSON), or sample one point per seed of
    ``seeds``, and featurize them; one ``Applied`` or an error line per point or seed.

    Sampling is ``space.sample(np.random.default_rng(seed))``: the same seed gives the same
    point on any worker.
    """
    import ray

    from cost_models import extract_features
    from search_spaces import InvalidPointError, Point
    from tuner.graph.keys import program_hash
    from tuner.measure.quiet import cpu_work

    node_id = ray.get_runtime_context().get_node_id()
    with cpu_work(node_id):
        space = _space(spec)
        made: list[tuple[str, Any] | str] = []
        for text in points:
            try:
                made.append((text, space.apply(Point.from_json(text))))
            except InvalidPointError as err:
                made.append(str(err))
        for seed in seeds:
            try:
                p = space.sample(np.random.default_rng(int(seed)))
            except RuntimeError as err:
                made.append(str(err))
                continue
            made.append((p.to_json(), space.apply(p)))
        ok = [m for m in made if not isinstance(m, str)]
        feats = extract_features(space.mod, space.target, [sch for _, sch in ok])
        out: list[Applied | str] = []
        j = 0
        for m in made:
            if isinstance(m, str):
                out.append(m)
                continue
            text, sch = m
            out.append(Applied(text, tvm.ir.save_json(sch.mod), trace_json(sch), program_hash(sch.mod),
                               feats.candidate(j), node_id))  # fmt: skip
            j += 1
    return out


class RemoteApplyError(NightshiftError):
    """The Ray tasks that apply points failed (not a point: the tasks themselves)."""


class Applier:
    """Applies and samples points of one space as Ray tasks (see the module docstring).

    A list is cut into as many chunks as the cluster has CPUs (at most ``max_tasks``), each
    one Ray task; results come back in order. Thread-safe as far as Ray is.
    """

    def __init__(self, spec: SpaceSpec, *, max_tasks: int | None = None) -> None:
        import ray

        self.spec = spec
        self._ref = ray.put(spec)  # shipped once, not with every task
        self._task = ray.remote(apply_points).options(num_cpus=1, max_retries=2)
        self.max_tasks = max_tasks

    def _parallelism(self) -> int:
        import ray

        if self.max_tasks:
            return self.max_tasks
        return max(int(ray.cluster_resources().get("CPU", 1)), 1)

    def _run(self, points: Sequence[str], seeds: Sequence[int]) -> list[Applied | str]:
        import ray

        items: list[tuple[str, Any]] = [("p", p) for p in points] + [("s", int(s)) for s in seeds]
        if not items:
            return []
        k = min(self._parallelism(), len(items))
        chunks = [items[i::k] for i in range(k)]  # strided: every task gets a share of both
        refs = [self._task.remote(self._ref, [v for t, v in c if t == "p"], [v for t, v in c if t == "s"])
                for c in chunks]  # fmt: skip
        try:
            got = ray.get(refs)
        except ray.exceptions.RayError as err:
            last = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
            raise RemoteApplyError(f"applying points of the {self.spec.kind} space in Ray tasks: {last}") from err
        out: list[Applied | str] = [""] * len(items)
        for i, (chunk, res) in enumerate(zip(chunks, got, strict=True)):
            # Within a chunk the task answers its points first, then its seeds.
            order = sorted(range(len(chunk)), key=lambda n, chunk=chunk: chunk[n][0] != "p")
            for n, r in zip(order, res, strict=True):
                out[i + n * k] = r
        return out

    def apply(self, points: Sequence[str]) -> list[Applied | str]:
        """Each point (JSON) applied and featurized, or why it is invalid.

        Raises:
            RemoteApplyError: a task failed (e.g. a worker that cannot build the space).
        """
        return self._run(points, [])

    def sample(self, seeds: Sequence[int]) -> list[Applied | str]:
        """One point sampled per seed, applied and featurized, or why none was found.

        Raises:
            RemoteApplyError: a task failed.
        """
        return self._run([], seeds)
