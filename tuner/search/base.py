"""The search-strategy protocol: propose candidates of one space, receive results by id."""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import functools
import itertools
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import tvm
from tvm.s_tir import Schedule

from cost_models import CostModel, StoreFeatures, extract_features
from search_spaces import InvalidPointError, Point, SearchSpace
from tuner.search.remote import Applied, Applier, RemoteApplyError, trace_json

logger = logging.getLogger(__name__)

# Random draws per wanted point before a strategy concludes the unseen part of the space is
# (nearly) empty and lists it instead (only for spaces small enough to list).
_SAMPLE_TRIES = 8
# Largest knob grid the strategies list exhaustively when sampling stops finding new points.
MAX_ENUMERATE = 4096
# Candidates whose features a strategy keeps (a few kB each): the measured parents it ranks
# again at every proposal, and the batch it hands to the job.
_FEATURE_CACHE = 256
# Candidates applied by Ray tasks a strategy keeps (tens of kB each, the module's JSON): the
# measured parents the evolutionary strategy asks for at every proposal.
_REMOTE_CACHE = 64


@dataclass(frozen=True)
class Candidate:
    """One proposed schedule.

    Attributes:
        id: the point's canonical JSON (``Point.to_json``): stable across processes, so the
            database's records name the same candidate and a resumed job can ``tell`` them.
        point: the knob values.
        schedule: the point applied once (post-processed, ready to build), where it was
            applied in this process; None where a Ray task applied it (``applied``).
        applied: what a Ray task made of the point (``tuner.search.remote``), else None.

    The job reads :attr:`mod`, :attr:`trace_json` and :attr:`program_hash`, which either form
    gives; it never applies the point again.
    """

    id: str
    point: Point
    schedule: Schedule | None = None
    applied: Applied | None = None

    def __post_init__(self) -> None:
        if (self.schedule is None) == (self.applied is None):
            raise ValueError("a candidate has a schedule or a remote application, exactly one")

    @functools.cached_property
    def mod(self) -> tvm.IRModule:
        """The scheduled module, ready to build."""
        if self.schedule is not None:
            return self.schedule.mod
        return tvm.ir.load_json(self.applied.mod_json)  # type: ignore[union-attr]

    @property
    def trace_json(self) -> Any:
        """The schedule's trace as MetaSchedule's JSON (``Trace.as_json``)."""
        if self.schedule is not None:
            return trace_json(self.schedule)
        return self.applied.trace_json  # type: ignore[union-attr]

    @functools.cached_property
    def program_hash(self) -> str:
        """``tuner.graph.tasks.program_hash`` of the scheduled module."""
        if self.applied is not None:
            return self.applied.program_hash
        from tuner.graph.keys import program_hash

        return program_hash(self.mod)


@dataclass(frozen=True)
class Proposal:
    """A batch of candidates, with the cost-model features the strategy computed for them.

    ``features`` has one entry per candidate, in order: its rows of TVM's per-store features
    (``StoreFeatures.candidate``) where the strategy extracted them to rank it, None where it
    did not; the job extracts only the missing ones, so no candidate is featurized twice.
    None when the strategy featurized none of them. ``seconds`` says where the proposal's
    time went (``sample``, ``apply``, ``features``, ``predict``; ``remote``: waiting for the
    applier's Ray tasks), for the job's events.
    """

    candidates: list[Candidate]
    features: list[np.ndarray | None] | None = None
    seconds: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Result:
    """What became of a candidate: its measured latency, or why it has none."""

    sec: float | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.sec is not None and self.sec > 0


class SearchStrategy(abc.ABC):
    """Proposes candidates of one search space (one task, one space kind) and learns from
    their results.

    Contract:
      - ``propose(n, model)`` returns at most ``n`` candidates, all valid points of the space,
        pairwise distinct and never proposed or told before (so a point measured by this job
        or any earlier one is never measured again). Fewer than ``n`` (possibly none) means
        the unseen part of the space is smaller than ``n`` or could not be found.
      - ``tell(id, result)`` records the result of a candidate by its id. Ids need not come
        from ``propose``: a resumed job, or a job seeded from earlier ones, replays the stored
        records of the task (their point JSON and latency) through ``tell`` before proposing.
        The whole state of a strategy is what it was told plus its seed, so rebuilding it from
        the database is ``tell`` over the records, nothing else. Telling an id twice keeps
        the first result.
      - Deterministic: the same space, seed, sequence of calls and model predictions give the
        same proposals.
      - The cost model is read (``predict``, ``num_samples``), never updated: training is the
        job's.
      - Not thread-safe: one strategy per task and space, used by one thread.
      - ``suggest(points)`` queues points that ``propose`` gives first, ahead of the strategy's
        own, each once (a seen or invalid one is dropped): a job seeded from records timed in
        the other mode measures their best points again before searching on.

    Subclasses implement :meth:`_propose`, and apply points through :meth:`_apply`,
    :meth:`_apply_many` and :meth:`_fresh` only, so that with an ``applier`` all of TVM's work
    (replays, postprocessors, features) runs as Ray tasks on any CPU of the cluster, many
    points at once. Every strategy takes the same keyword-only options; the ones it has no
    use for it ignores by design, so the job can create any of them the same way: ``seed``;
    ``storage_url`` and ``study_name`` name where a strategy that keeps state outside the
    process (Optuna's studies) stores it, so an interrupted job resumes it; ``applier``
    (``tuner.search.remote.Applier``) applies and samples points of the space in Ray tasks
    (None: in this process).
    """

    #: The name the registry knows the strategy by.
    name: ClassVar[str] = ""

    def __init__(self, space: SearchSpace, *, seed: int = 0, storage_url: str | None = None,
                 study_name: str | None = None, applier: Applier | None = None) -> None:  # fmt: skip
        self.space = space
        self.seed = seed
        self.storage_url = storage_url
        self.study_name = study_name
        self.applier = applier
        # Candidates applied by Ray tasks (or why the point is invalid), by id: the driver has
        # no space cache to ask again.
        self._remote: OrderedDict[str, Candidate | str] = OrderedDict()
        self.rng = np.random.default_rng(seed)
        self.results: dict[str, Result] = {}
        self.pending: dict[str, Point] = {}
        self._seconds: dict[str, float] = {}
        self._features: OrderedDict[str, np.ndarray] = OrderedDict()
        self._suggested: deque[Point] = deque()

    # --- the protocol ------------------------------------------------------------------------

    def propose(self, n: int, model: CostModel | None = None) -> Proposal:
        """Up to ``n`` new valid candidates (see the class contract).

        Raises:
            ValueError: ``n`` is not positive.
        """
        if n <= 0:
            raise ValueError(f"batch size must be positive, got {n}")
        self._seconds = {}
        first = self._take_suggested(n)
        for c in first:
            self.pending[c.id] = c.point
        proposal = self._propose(n - len(first), model) if len(first) < n else Proposal([])
        for c in proposal.candidates:
            self.pending[c.id] = c.point
        own = proposal.features or [self._features.get(c.id) for c in proposal.candidates]
        features: list[np.ndarray | None] | None = [self._features.get(c.id) for c in first] + list(own)
        if all(f is None for f in features):  # type: ignore[union-attr]
            features = None
        return dataclasses.replace(proposal, candidates=first + proposal.candidates, features=features,
                                   seconds=dict(self._seconds))  # fmt: skip

    def suggest(self, points: Sequence[Point]) -> None:
        """Queue ``points`` for :meth:`propose` to give first, in order (see the class contract)."""
        self._suggested.extend(points)

    def tell(self, candidate_id: str, result: Result) -> None:
        """Record the result of the candidate ``candidate_id`` (see the class contract)."""
        point = self.pending.pop(candidate_id, None)
        if candidate_id in self.results:
            return
        self.results[candidate_id] = result
        self._on_result(candidate_id, point or Point.from_json(candidate_id), result)

    @property
    def seen(self) -> set[str]:
        """Ids of every point proposed or told: never proposed again."""
        return set(self.results) | set(self.pending)

    def best(self, k: int = 1) -> list[tuple[float, Point]]:
        """The ``k`` fastest measured points, fastest first."""
        ok = sorted((r.sec, cid) for cid, r in self.results.items() if r.ok)  # type: ignore[type-var]
        return [(sec, Point.from_json(cid)) for sec, cid in ok[:k]]

    # --- for subclasses ----------------------------------------------------------------------

    @abc.abstractmethod
    def _propose(self, n: int, model: CostModel | None) -> Proposal:
        """Candidates for :meth:`propose`: at most ``n``, valid, distinct, not in ``seen``."""

    def _take_suggested(self, n: int) -> list[Candidate]:
        """Up to ``n`` candidates of the queued suggestions, unseen and valid."""
        out: dict[str, Candidate] = {}
        while self._suggested and len(out) < n:
            batch: dict[str, Point] = {}
            while self._suggested and len(out) + len(batch) < n:
                point = self._suggested.popleft()
                key = point.to_json()
                if not self._is_seen(key) and key not in out:
                    batch[key] = point
            for cand in self._apply_many(list(batch.values())):
                if cand is not None:
                    out[cand.id] = cand
        return list(out.values())

    def _on_result(self, candidate_id: str, point: Point, result: Result) -> None:  # noqa: B027
        """Hook: a result arrived (from this job's measurements or a replayed record)."""

    def _is_seen(self, key: str) -> bool:
        return key in self.results or key in self.pending

    @contextlib.contextmanager
    def _timed(self, what: str) -> Iterator[None]:
        """Add the block's seconds to this proposal's ``seconds[what]``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._seconds[what] = self._seconds.get(what, 0.0) + time.perf_counter() - start

    def _featurize(self, candidates: list[Candidate]) -> StoreFeatures:
        """Features of ``candidates``, each extracted once: the ones this strategy extracted
        before are reused (and handed to the job with the proposal)."""
        missing = [c for c in candidates if c.id not in self._features]
        local = [c for c in missing if c.schedule is not None]
        if local:
            with self._timed("features"):
                got = extract_features(self.space.mod, self.space.target, [c.schedule for c in local])
            for j, c in enumerate(local):
                self._features[c.id] = got.candidate(j)
        for c in missing:
            if c.applied is not None:
                self._features[c.id] = c.applied.features
        rows = []
        for c in candidates:
            self._features.move_to_end(c.id)
            rows.append(self._features[c.id])
        while len(self._features) > max(_FEATURE_CACHE, len(candidates)):
            self._features.popitem(last=False)
        return StoreFeatures.from_list(rows)

    def _score(self, model: CostModel | None, candidates: list[Candidate]) -> np.ndarray:
        """The model's predicted scores of ``candidates`` (zeros without a trained model)."""
        if model is None or model.num_samples == 0 or not candidates:
            return np.zeros(len(candidates))
        feats = self._featurize(candidates)
        with self._timed("predict"):
            return np.asarray(model.predict(feats), dtype=float)

    def _apply(self, point: Point) -> Candidate | None:
        """The candidate of ``point`` (applied once), or None if the point is invalid."""
        return self._apply_many([point])[0]

    def _apply_many(self, points: list[Point]) -> list[Candidate | None]:
        """The candidate of each point (None where invalid): with an applier, by Ray tasks in
        parallel (features included); else one after the other in this process."""
        if self.applier is None:
            out: list[Candidate | None] = []
            for point in points:
                try:
                    with self._timed("apply"):
                        out.append(Candidate(point.to_json(), point, self.space.apply(point)))
                except InvalidPointError:
                    out.append(None)
            return out
        keys = [p.to_json() for p in points]
        known = {k: self._remote[k] for k in keys if k in self._remote}
        ask = sorted(set(keys) - set(known))
        if ask:
            got = self._remote_call(self.applier.apply, ask)
            if got is None:
                return self._apply_many(points)
            for key, a in zip(ask, got, strict=True):
                known[key] = self._keep_remote(key, a) or "invalid"
        for key in known:
            if key in self._remote:
                self._remote.move_to_end(key)
        return [c if isinstance(c, Candidate) else None for c in (known[k] for k in keys)]

    def _remote_call(self, call: Any, arg: Any) -> list[Applied | str] | None:
        """``call(arg)`` on the applier; None, and no applier from then on, if its tasks fail:
        the strategy goes on applying points in this process."""
        try:
            with self._timed("remote"):
                return call(arg)
        except RemoteApplyError as err:
            logger.warning("%s; applying points in this process from now on", err)
            self.applier = None
            return None

    def _keep_remote(self, key: str, applied: Applied | str) -> Candidate | None:
        """Remember what a Ray task made of point ``key`` (an invalid point as its reason)."""
        if isinstance(applied, str):
            self._remote[key] = applied
            return None
        cand = Candidate(key, Point.from_json(key), applied=applied)
        self._remote[key] = cand
        self._features[key] = applied.features
        while len(self._remote) > _REMOTE_CACHE:
            self._remote.popitem(last=False)
        return cand

    def _fresh(self, n: int, exclude: set[str] = frozenset()) -> list[Candidate]:  # type: ignore[assignment]
        """Up to ``n`` uniformly drawn valid candidates, unseen and not in ``exclude``.

        When draws keep landing on seen points and the space is small enough, the rest of it
        is listed and drawn from, so a nearly exhausted space still gives its last points.
        """
        out: dict[str, Candidate] = {}
        if self.applier is not None:
            self._fresh_remote(n, exclude, out)
        else:
            self._fresh_local(n, exclude, out)
        if len(out) < n and self.space.grid_size() <= MAX_ENUMERATE:
            rest = [p for p in self._unseen_grid() if p.to_json() not in exclude and p.to_json() not in out]
            order = [rest[int(i)] for i in self.rng.permutation(len(rest))]
            while order and len(out) < n:
                # In slices of what is still wanted: each slice one round of Ray tasks.
                part, order = order[: n - len(out)], order[n - len(out) :]
                for cand in self._apply_many(part):
                    if cand is not None:
                        out[cand.id] = cand
        return list(out.values())

    def _fresh_local(self, n: int, exclude: set[str], out: dict[str, Candidate]) -> None:
        misses = 0
        while len(out) < n and misses < _SAMPLE_TRIES * n:
            try:
                with self._timed("sample"):
                    p = self.space.sample(self.rng)
            except RuntimeError:
                return
            key = p.to_json()
            if self._is_seen(key) or key in exclude or key in out:
                misses += 1
                continue
            cand = self._apply(p)
            if cand is not None:
                out[key] = cand

    def _fresh_remote(self, n: int, exclude: set[str], out: dict[str, Candidate]) -> None:
        """``_fresh``'s draws by Ray tasks: one seed per wanted point (a few more, since some
        land on seen points), all sampled at once, until ``n`` or too many misses."""
        misses = 0
        while len(out) < n and misses < _SAMPLE_TRIES * n:
            want = n - len(out)
            seeds = self.rng.integers(1, 2**31 - 1, size=want + want // 2 + 1)
            got = self._remote_call(self.applier.sample, [int(s) for s in seeds])  # type: ignore[union-attr]
            if got is None:
                self._fresh_local(n, exclude, out)
                return
            if all(isinstance(a, str) for a in got):
                return  # the space has no valid point the sampler can find
            for a in got:
                if isinstance(a, str) or self._is_seen(a.point) or a.point in exclude or a.point in out:
                    misses += 1
                    continue
                cand = self._keep_remote(a.point, a)
                if cand is not None and len(out) < n:
                    out[a.point] = cand

    def _unseen_grid(self) -> list[Point]:
        """Every unseen point of the knob grid (validity not checked), in grid order."""
        out = []
        for s in range(self.space.num_sketches):
            for values in itertools.product(*(k.choices for k in self.space.knobs(s))):
                p = Point(s, tuple(values))
                if not self._is_seen(p.to_json()):
                    out.append(p)
        return out

