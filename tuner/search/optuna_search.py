"""``optuna-tpe`` and ``optuna-cmaes``: Optuna's samplers over the space's knobs, ask/tell."""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import optuna
import sqlalchemy as sa
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import TrialState

from cost_models import CostModel
from search_spaces import Point, SearchSpace
from tuner.errors import DatabaseError
from tuner.search.base import Candidate, Proposal, Result, SearchStrategy

logger = logging.getLogger(__name__)

# Asks per wanted candidate before the rest of a batch is filled with uniform samples: in a
# small discrete space a sampler keeps suggesting points it has already seen.
_ASKS_PER_CANDIDATE = 8
# The user attribute that names a trial's point (its candidate id).
_POINT_ATTR = "nightshift_point"
# Attempts at opening Optuna's storage: processes opening a database at once race to create
# its tables and version rows (Optuna does not serialize that), and the losers' second try
# finds them made.
_OPEN_ATTEMPTS = 5
# Where earlier Nightshifts kept the studies: a sibling SQLite file, a PostgreSQL schema.
_LEGACY_SUFFIX = ".optuna.db"
_LEGACY_PG_SCHEMA = "optuna"

# One storage (one engine, one connection pool) per database URL in a process: a job makes a
# strategy per task and space, all on the same database.
_storages: dict[str, optuna.storages.RDBStorage] = {}
_storages_lock = threading.Lock()


def optuna_storage(url: str | None) -> optuna.storages.BaseStorage | None:
    """Optuna's RDB storage in the tuning database at ``url``, shared by every caller in
    the process (None: in memory).

    The studies' tables (``studies``, ``trials``, ``trial_params``... and ``version_info``)
    sit beside Nightshift's in the same SQLite file or PostgreSQL database and schema; no
    name clashes. Optuna keeps its schema revision in alembic's ``alembic_version`` and
    Nightshift in its own table, so the database is opened as a tuning database first
    (``tuner.db.migrate.check``: created if empty, an older Nightshift's revision moved out
    of ``alembic_version``, an outdated schema refused with the command that upgrades it).

    Raises:
        DatabaseError: the database cannot be opened, its Nightshift schema is unusable, or
            Optuna refuses its tables (an older Optuna's: the message says how to upgrade).
    """
    if url is None:
        return None
    from tuner.db.url import database_url

    u = database_url(url)
    if u.get_backend_name() == "sqlite" and u.database in (None, "", ":memory:"):
        return None
    key = u.render_as_string(hide_password=False)
    with _storages_lock:
        storage = _storages.get(key)
        if storage is None:
            storage = _storages[key] = _open_storage(u)
        return storage


def _open_storage(u: sa.URL) -> optuna.storages.RDBStorage:
    from tuner.db import migrate
    from tuner.db.store import _SQLITE_BUSY_TIMEOUT_S, create_engine
    from tuner.db.url import redact

    engine = create_engine(u)
    try:
        migrate.check(engine, u, create=True)
        legacy = _legacy_studies(engine, u)
    finally:
        engine.dispose()
    if legacy is not None:
        logger.warning("%s holds Optuna studies of an older Nightshift, which are no longer read: a resumed job "
                       "rebuilds its studies from the database's records (CHANGELOG.md, 2026-11-24, says how to "
                       "copy them in)",
                       legacy)  # fmt: skip
    if u.get_backend_name() == "sqlite":
        # Nightshift's own writers hold the file's write lock for a whole batch.
        kwargs: dict[str, Any] = {"connect_args": {"timeout": _SQLITE_BUSY_TIMEOUT_S}}
    else:
        kwargs = {"connect_args": {"connect_timeout": 10}, "pool_pre_ping": True}
    attempt = 1
    while True:
        try:
            return optuna.storages.RDBStorage(u.render_as_string(hide_password=False), engine_kwargs=kwargs)
        except sa.exc.DBAPIError as err:
            if attempt == _OPEN_ATTEMPTS:
                raise DatabaseError(f"cannot open Optuna's studies in {redact(u)}: {err.orig}") from err
            logger.debug("opening Optuna's studies in %s lost a race (%s); again", redact(u), err.orig)
            time.sleep(random.uniform(0.05, 0.2) * attempt)
            attempt += 1
        except RuntimeError as err:  # Optuna's word for a schema it does not know
            raise DatabaseError(f"Optuna's studies in {redact(u)}: {err}") from err


def _legacy_studies(engine: sa.Engine, u: sa.URL) -> str | None:
    """Where an older Nightshift kept the studies of this database, if they are there."""
    if u.get_backend_name() == "sqlite":
        assert u.database is not None
        base = u.database[:-3] if u.database.endswith(".db") else u.database
        path = Path(base + _LEGACY_SUFFIX)
        return str(path) if path.is_file() else None
    with engine.connect() as conn:
        inspector = sa.inspect(conn)
        if _LEGACY_PG_SCHEMA not in inspector.get_schema_names():
            return None
        if "studies" not in inspector.get_table_names(schema=_LEGACY_PG_SCHEMA):
            return None
    return f"schema {_LEGACY_PG_SCHEMA!r} of the database"


class _OptunaSearch(SearchStrategy):
    """Optuna ask/tell over the space: a ``sketch`` parameter plus one parameter per knob of
    every sketch (``<sketch>:<knob index>:<name>``, the index into the knob's domain), a
    fixed search space so relative samplers see every trial. The objective is the log of
    the measured latency, minimized; failures are ``FAIL`` trials. With ``storage_url`` the
    study (named ``study_name``) lives in the tuning database, so an interrupted job resumes
    it: records replayed through ``tell`` complete the trials the killed job left running and
    are not added twice, and the trials still running after that (the batches in flight at
    the kill) are proposed again first, as themselves, so no point gets a second trial.
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
        # Trials an interrupted run left running, oldest first (see _resume_running).
        self._running = [(key, number) for key, (number, state) in sorted(self._stored.items(), key=lambda kv: kv[1])
                         if state == TrialState.RUNNING]  # fmt: skip
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

    def _resume_running(self, out: dict[str, Candidate], n: int) -> None:
        """Into ``out``, up to ``n`` points of trials a killed run left running and no
        replayed record finished: measured now, as those trials."""
        while self._running and len(out) < n:
            key, number = self._running.pop(0)
            if key in self.results or key in self.pending:
                continue  # finished by a replayed record (or proposed since)
            cand = self._apply(Point.from_json(key))
            if cand is None:  # a point of another version of the space
                self.study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
                continue
            self._asked[key] = number
            out[key] = cand

    def _propose(self, n: int, model: CostModel | None) -> Proposal:
        out: dict[str, Candidate] = {}
        self._resume_running(out, n)
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
            # Finished already only if another process shares the study (two jobs of one
            # model, device and seed under different names): its result stands.
            self.study.tell(number, value, state=state, skip_if_finished=True)
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
