"""The search-strategy protocol: propose candidates of one space, receive results by id."""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from tvm.s_tir import Schedule

from cost_models import CostModel, StoreFeatures, extract_features
from search_spaces import InvalidPointError, Point, SearchSpace

logger = logging.getLogger(__name__)

# Random draws per wanted point before a strategy concludes the unseen part of the space is
# (nearly) empty and lists it instead (only for spaces small enough to list).
_SAMPLE_TRIES = 8
# Largest knob grid the strategies list exhaustively when sampling stops finding new points.
MAX_ENUMERATE = 4096
# Candidates whose features a strategy keeps (a few kB each): the measured parents it ranks
# again at every proposal, and the batch it hands to the job.
_FEATURE_CACHE = 256


@dataclass(frozen=True)
class Candidate:
    """One proposed schedule.

    Attributes:
        id: the point's canonical JSON (``Point.to_json``): stable across processes, so the
            database's records name the same candidate and a resumed job can ``tell`` them.
        point: the knob values.
        schedule: the point applied once (post-processed, ready to build). The job builds
            this object; it never applies the point again.
    """

    id: str
    point: Point
    schedule: Schedule


@dataclass(frozen=True)
class Proposal:
    """A batch of candidates, with the cost-model features the strategy computed for them.

    ``features`` has one entry per candidate, in order: its rows of TVM's per-store features
    (``StoreFeatures.candidate``) where the strategy extracted them to rank it, None where it
    did not; the job extracts only the missing ones, so no candidate is featurized twice.
    None when the strategy featurized none of them. ``seconds`` says where the proposal's
    time went (``sample``, ``apply``, ``features``, ``predict``), for the job's events.
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

    Subclasses implement :meth:`_propose`. Every strategy takes the same keyword-only
    options; the ones it has no use for it ignores by design, so the job can create any of
    them the same way: ``seed``; ``storage_url`` and ``study_name`` name where a strategy
    that keeps state outside the process (Optuna's studies) stores it, so an interrupted job
    resumes it.
    """

    #: The name the registry knows the strategy by.
    name: ClassVar[str] = ""

    def __init__(self, space: SearchSpace, *, seed: int = 0, storage_url: str | None = None,
                 study_name: str | None = None) -> None:  # fmt: skip
        self.space = space
        self.seed = seed
        self.storage_url = storage_url
        self.study_name = study_name
        self.rng = np.random.default_rng(seed)
        self.results: dict[str, Result] = {}
        self.pending: dict[str, Point] = {}
        self._seconds: dict[str, float] = {}
        self._features: OrderedDict[str, np.ndarray] = OrderedDict()

    # --- the protocol ------------------------------------------------------------------------

    def propose(self, n: int, model: CostModel | None = None) -> Proposal:
        """Up to ``n`` new valid candidates (see the class contract).

        Raises:
            ValueError: ``n`` is not positive.
        """
        if n <= 0:
            raise ValueError(f"batch size must be positive, got {n}")
        self._seconds = {}
        proposal = self._propose(n, model)
        for c in proposal.candidates:
            self.pending[c.id] = c.point
        features = proposal.features
        if features is None:
            features = [self._features.get(c.id) for c in proposal.candidates]
            if all(f is None for f in features):
                features = None
        return dataclasses.replace(proposal, features=features, seconds=dict(self._seconds))

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
        if missing:
            with self._timed("features"):
                got = extract_features(self.space.mod, self.space.target, [c.schedule for c in missing])
            for j, c in enumerate(missing):
                self._features[c.id] = got.candidate(j)
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
        try:
            with self._timed("apply"):
                return Candidate(point.to_json(), point, self.space.apply(point))
        except InvalidPointError:
            return None

    def _fresh(self, n: int, exclude: set[str] = frozenset()) -> list[Candidate]:  # type: ignore[assignment]
        """Up to ``n`` uniformly drawn valid candidates, unseen and not in ``exclude``.

        When draws keep landing on seen points and the space is small enough, the rest of it
        is listed and drawn from, so a nearly exhausted space still gives its last points.
        """
        out: dict[str, Candidate] = {}
        misses = 0
        while len(out) < n and misses < _SAMPLE_TRIES * n:
            try:
                with self._timed("sample"):
                    p = self.space.sample(self.rng)
            except RuntimeError:
                break
            key = p.to_json()
            if self._is_seen(key) or key in exclude or key in out:
                misses += 1
                continue
            cand = self._apply(p)
            if cand is not None:
                out[key] = cand
        if len(out) < n and self.space.grid_size() <= MAX_ENUMERATE:
            rest = [p for p in self._unseen_grid() if p.to_json() not in exclude and p.to_json() not in out]
            for i in self.rng.permutation(len(rest)):
                if len(out) >= n:
                    break
                cand = self._apply(rest[int(i)])
                if cand is not None:
                    out[cand.id] = cand
        return list(out.values())

    def _unseen_grid(self) -> list[Point]:
        """Every unseen point of the knob grid (validity not checked), in grid order."""
        out = []
        for s in range(self.space.num_sketches):
            for values in itertools.product(*(k.choices for k in self.space.knobs(s))):
                p = Point(s, tuple(values))
                if not self._is_seen(p.to_json()):
                    out.append(p)
        return out

