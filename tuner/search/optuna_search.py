"""``optuna-tpe`` and ``optuna-cmaes``: Optuna's samplers over the space's knobs, ask/tell."""

from __future__ import annotations

import logging
import math
from typing import Any, ClassVar

import optuna
import sqlalchemy as sa
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import TrialState

from cost_models import CostModel
from search_spaces import Point, SearchSpace
from tuner.search.base import Candidate, Proposal, Result, SearchStrategy

logger = logging.getLogger(__name__)

# Asks per wanted candidate before the rest of a batch is filled with uniform samples: in a
# small discrete space a sampler keeps suggesting points it has already seen.
_ASKS_PER_CANDIDATE = 8
# The user attribute that names a trial's point (its candidate id).
_POINT_ATTR = "nightshift_point"
# PostgreSQL schema of the studies (see optuna_storage).
_PG_SCHEMA = "optuna"


def optuna_storage(url: str | None) -> optuna.storages.BaseStorage | None:
    """Optuna's RDB storage beside the tuning database at ``url`` (None: in memory).

    Optuna and Nightshift both record their schema revision in alembic's ``alembic_version``
    table, so they cannot share one namespace: on PostgreSQL the studies live in the same
    database under the schema ``optuna``; a SQLite file ``X.db`` gets ``X.optuna.db`` beside it.
    """
    if url is None:
        return None
    u = sa.make_url(url)
    if u.get_backend_name() == "sqlite":
        if not u.database or u.database == ":memory:":
            return None
        base = u.database[:-3] if u.database.endswith(".db") else u.database
        return optuna.storages.RDBStorage(u.set(database=f"{base}.optuna.db").render_as_string(hide_password=False))
    engine = sa.create_engine(u)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f"CREATE SCHEMA IF NOT EXISTS {_PG_SCHEMA}"))
    finally:
        engine.dispose()
    return optuna.storages.RDBStorage(
        u.render_as_string(hide_password=False),
        engine_kwargs={"connect_args": {"options": f"-csearch_path={_PG_SCHEMA}"}},
    )


class _OptunaSearch(SearchStrategy):
    """Optuna ask/tell over the space: a ``sketch`` parameter plus one parameter per knob of
    every sketch (``<sketch>:<knob index>:<name>``, the index into the knob's domain), a
    fixed search space so relative samplers see every trial. The objective is the log of
    the measured latency, minimized; failures are ``FAIL`` trials. With ``storage_url`` the
    study (named ``study_name``) lives in the database, so an interrupted job resumes it:
    records replayed through ``tell`` complete the trials the killed job left running and
    are not added twice.
    """

    #: Whether knobs are integer indices (CMA-ES needs numbers) or categorical.
    numeric: ClassVar[bool] = False

    def __init__(self, space: SearchSpace, **kwargs: Any) -> None:
        super().__init__(space, **kwargs)
        # Optuna logs every trial at INFO; a job makes thousands.
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.distributions: dict[str, BaseDistribution] = {"sketch": self._dist(space.num_sketches)}
        for s in range(space.num_sketches):
            for i, k in enumerate(space.knobs(s)):
                self.distributions[self._param(s, i)] = self._dist(len(k))
        self.study = optuna.create_study(
            study_name=self.study_name, storage=optuna_storage(self.storage_url), sampler=self._sampler(),
            direction="minimize", load_if_exists=True,
        )  # fmt: skip
        # Trials already in a stored study, by point: replayed records must not be added twice.
        self._stored: dict[str, tuple[int, TrialState]] = {}
        for t in self.study.get_trials(deepcopy=False):
            if _POINT_ATTR in t.user_attrs:
                self._stored[t.user_attrs[_POINT_ATTR]] = (t.number, t.state)
        self._asked: dict[str, int] = {}
        if self._stored:
            logger.info("study %s resumed with %d trials", self.study_name, len(self._stored))

    def _sampler(self) -> optuna.samplers.BaseSampler:
        raise NotImplementedError

    def _dist(self, n: int) -> BaseDistribution:
        return IntDistribution(0, n - 1) if self.numeric else CategoricalDistribution(list(range(n)))

    @staticmethod
    def _param(sketch: int, knob: int) -> str:
        return f"{sketch}:{knob}"

    def _point(self, params: dict[str, Any]) -> Point:
        s = int(params["sketch"])
        return Point(s, tuple(k.choices[int(params[self._param(s, i)])] for i, k in enumerate(self.space.knobs(s))))

    def _params(self, point: Point) -> dict[str, int]:
        # Knobs of the other sketches do not matter to the point; 0 keeps every trial on the
        # full search space, which relative samplers (CMA-ES) need.
        out = {name: 0 for name in self.distributions}
        out["sketch"] = point.sketch
        for i, (k, v) in enumerate(zip(self.space.knobs(point.sketch), point.decisions, strict=True)):
            out[self._param(point.sketch, i)] = k.index(v)
        return out

    def _propose(self, n: int, model: CostModel | None) -> Proposal:
        out: dict[str, Candidate] = {}
        for _ in range(_ASKS_PER_CANDIDATE * n):
            if len(out) >= n:
                break
            trial = self.study.ask(self.distributions)
            point = self._point(trial.params)
            key = point.to_json()
            known = self.results.get(key)
            if known is not None or key in out or key in self.pending:
                # A repeat: tell the sampler what it already knows (or that it is in flight).
                if known is not None and known.ok:
                    self.study.tell(trial, math.log(known.sec))  # type: ignore[arg-type]
                else:
                    self.study.tell(trial, state=TrialState.FAIL)
                continue
            cand = self._apply(point)
            if cand is None:
                self.study.tell(trial, state=TrialState.FAIL)
                continue
            trial.set_user_attr(_POINT_ATTR, key)
            self._asked[key] = trial.number
            out[key] = cand
        if len(out) < n:
            for cand in self._fresh(n - len(out), exclude=set(out)):
                out[cand.id] = cand
        return Proposal(list(out.values()))

    def _on_result(self, candidate_id: str, point: Point, result: Result) -> None:
        value = math.log(result.sec) if result.ok else None  # type: ignore[arg-type]
        state = TrialState.COMPLETE if value is not None else TrialState.FAIL
        number = self._asked.pop(candidate_id, None)
        if number is None:
            stored = self._stored.get(candidate_id)
            if stored is not None and stored[1].is_finished():
                return
            number = stored[0] if stored is not None else None
        if number is not None:
            self.study.tell(number, value, state=state)
            return
        try:
            params = self._params(point)
        except ValueError:
            return  # a record of another space version: not a point of this one
        self.study.add_trial(optuna.trial.create_trial(
            state=state, value=value, params=params, distributions=self.distributions,
            user_attrs={_POINT_ATTR: candidate_id},
        ))  # fmt: skip


class OptunaTPESearch(_OptunaSearch):
    """Optuna's tree-structured Parzen estimator over categorical knob indices."""

    name = "optuna-tpe"

    def _sampler(self) -> optuna.samplers.BaseSampler:
        return optuna.samplers.TPESampler(seed=self.seed, multivariate=True)


class OptunaCmaEsSearch(_OptunaSearch):
    """Optuna's CMA-ES over knob indices as integers (CMA-ES needs numeric parameters)."""

    name = "optuna-cmaes"
    numeric = True

    def _sampler(self) -> optuna.samplers.BaseSampler:
        return optuna.samplers.CmaEsSampler(seed=self.seed, warn_independent_sampling=False)
