"""Conformance suite: every registered search strategy obeys the SearchStrategy contract.

Adding a strategy to the registry adds it here. The spaces are real (TVM's sketches of a
small matmul, the x86 conv template on a small conv, the dozen-point space of a relu); the
latencies told to the strategies are synthetic, computed from the knob values: a stand-in
for timing, because these tests are about the strategies, not the machine.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import search_tasks  # tests/search is on sys.path (pytest's rootdir-relative "prepend" import mode)
from tvm.s_tir import Schedule

from search_spaces import Point, SearchSpace
from tuner import search
from tuner.graph.keys import program_hash
from tuner.search import Result, SearchStrategy
from tuner.search import base as search_base

STRATEGIES = search.strategies()
# Spaces every strategy is run on: (space kind, task).
SPACES = [("sketch", "matmul"), ("x86-conv2d-nchw", "conv")]
# Strategies that must find better points than uniform sampling on a smooth objective
# (grid walks in a fixed order and random is the baseline itself).
LEARNERS = ["evolutionary", "optuna-tpe", "optuna-cmaes"]


def make(name: str, space: SearchSpace, seed: int = 0, **kwargs) -> SearchStrategy:
    try:
        return search.create(name, space, seed=seed, **kwargs)
    except ValueError as err:
        # Only grid refuses a space, and only one too large to list.
        assert name == "grid" and "grid points" in str(err), err
        pytest.skip(f"{name} does not search a space of {space.grid_size()} points")


def synthetic_sec(space: SearchSpace, point: Point) -> float:
    """A deterministic 'latency' from the knob values: smooth, one optimum per sketch (each
    knob's best value is at ~60% of its domain), sketches offset. A stand-in for timing."""
    total = 1.0 + 0.2 * point.sketch
    for knob, value in zip(space.knobs(point.sketch), point.decisions, strict=True):
        if len(knob) > 1:
            x = knob.index(value) / (len(knob) - 1)
            total += (x - 0.6) ** 2
    return 1e-3 * total


def run(strategy: SearchStrategy, budget: int, batch: int) -> list[str]:
    """Propose and tell ``budget`` candidates, ``batch`` at a time; the ids in order."""
    ids: list[str] = []
    while len(ids) < budget:
        prop = strategy.propose(min(batch, budget - len(ids)))
        if not prop.candidates:
            break
        for c in prop.candidates:
            strategy.tell(c.id, Result(synthetic_sec(strategy.space, c.point)))
            ids.append(c.id)
    return ids


@pytest.fixture(params=STRATEGIES)
def name(request) -> str:
    return request.param


@pytest.fixture(params=SPACES, ids=["-".join(s) for s in SPACES])
def space(request) -> SearchSpace:
    return search_tasks.space(*request.param)


def test_proposes_valid_unseen_distinct_points(name, space):
    strategy = make(name, space, seed=3)
    told: set[str] = set()
    for n in (4, 1, 2, 3):
        built = space.built.copy()
        prop = strategy.propose(n)
        ids = [c.id for c in prop.candidates]
        # Each point is built (a sketch replayed, a template applied) at most once: the
        # schedule made while validating a sample is the one the candidate carries.
        twice = [i for i in ids if space.built[i] - built[i] > 1]
        assert not twice, f"{len(twice)} candidates built more than once"
        assert 1 <= len(ids) <= n
        assert len(set(ids)) == len(ids), "a batch repeats a point"
        assert not set(ids) & told, "a point measured before was proposed again"
        for c in prop.candidates:
            assert c.id == c.point.to_json()
            assert space.check(c.point) is None, space.check(c.point)
            assert isinstance(c.schedule, Schedule)
        if prop.features is not None:
            assert len(prop.features) == len(ids)
        for c in prop.candidates:
            # Failures are results too: they must not be proposed again either.
            result = Result(None, "build") if len(told) % 3 == 0 else Result(synthetic_sec(space, c.point))
            strategy.tell(c.id, result)
            told.add(c.id)
    assert strategy.seen == told


def test_points_told_from_records_are_never_proposed(name, space):
    rng = np.random.default_rng(0)
    # Earlier jobs' records: a resumed job tells them before proposing.
    recorded = {space.sample(rng).to_json() for _ in range(12)}
    strategy = make(name, space, seed=1)
    for cid in sorted(recorded):
        strategy.tell(cid, Result(synthetic_sec(space, Point.from_json(cid))))
    proposed = run(strategy, 16, 8)
    assert proposed and not set(proposed) & recorded


def test_suggested_points_come_first_once_and_seen_ones_are_dropped(name, space):
    rng = np.random.default_rng(2)
    points: dict[str, Point] = {}
    while len(points) < 6:
        point = space.sample(rng)
        try:
            space.apply(point)
        except Exception:  # an invalid sample: suggestions come from measured, valid points
            continue
        points.setdefault(point.to_json(), point)
    ordered = list(points.values())
    strategy = make(name, space, seed=4)
    told = ordered[0].to_json()
    strategy.tell(told, Result(synthetic_sec(space, ordered[0])))
    strategy.suggest([*ordered, ordered[2]])  # one told already, one twice
    assert [c.id for c in strategy.propose(3).candidates] == [p.to_json() for p in ordered[1:4]]
    second = [c.id for c in strategy.propose(5).candidates]
    assert second[:2] == [p.to_json() for p in ordered[4:6]]
    assert len(second) == 5 and not set(second[2:]) & set(points), "then the strategy's own points"
    assert not set(run(strategy, 8, 4)) & set(points), "each suggestion is proposed once"


def test_exhausts_a_tiny_space(name):
    space = search_tasks.space("sketch", "relu")
    valid = {p.to_json() for p in space.enumerate()}
    assert 2 < len(valid) <= 64
    strategy = make(name, space, seed=0)
    ids = run(strategy, 10 * len(valid), 5)
    assert sorted(ids) == sorted(valid), "every valid point exactly once"
    assert strategy.propose(3).candidates == []


def test_rebuild_from_records_gives_the_same_state(name, space):
    first = make(name, space, seed=5)
    records = [(cid, first.results[cid]) for cid in run(first, 12, 4)]
    again = make(name, space, seed=5)
    for cid, result in records:
        again.tell(cid, result)
    assert again.seen == first.seen
    assert again.best(3) == first.best(3)
    assert not {c.id for c in again.propose(4).candidates} & first.seen


def test_deterministic_given_a_seed(name, space):
    a = run(make(name, space, seed=11), 12, 4)
    b = run(make(name, space, seed=11), 12, 4)
    assert a == b


@pytest.mark.parametrize("learner", LEARNERS)
def test_improves_over_random_on_a_smooth_objective(learner):
    space = search_tasks.space("x86-conv2d-nchw", "conv")
    seeds = range(4)

    def best_of(name: str) -> float:
        out = []
        for seed in seeds:
            strategy = make(name, space, seed=seed)
            out.append(min(synthetic_sec(space, Point.from_json(cid)) for cid in run(strategy, 32, 8)))
        return float(np.mean(out))

    optimum = min(synthetic_sec(space, p) for p in space.enumerate())
    random_gap = best_of("random") - optimum
    learned_gap = best_of(learner) - optimum
    assert random_gap > 0
    assert learned_gap < 0.7 * random_gap, (learner, learned_gap, random_gap)


def test_create_by_name_or_instance():
    space = search_tasks.space("sketch", "matmul")
    strategy = search.create("random", space, seed=1)
    assert search.create(strategy) is strategy
    with pytest.raises(ValueError, match="unknown search strategy"):
        search.create("annealing", space)
    with pytest.raises(ValueError, match="options"):
        search.create(strategy, space)
    with pytest.raises(TypeError):
        search.create("evolutionary", space, populaton=8)
    with pytest.raises(ValueError, match="grid points"):
        search.create("grid", space)
    with pytest.raises(ValueError, match="positive"):
        strategy.propose(0)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 16])
def test_evolutionary_random_share_works_at_every_batch_size(n):
    from tuner.search.evolutionary import EvolutionarySearch

    strategy = EvolutionarySearch(search_tasks.space("sketch", "matmul"), seed=0, epsilon=0.2)
    shares = [strategy.random_share(n) for _ in range(200)]
    assert all(0 <= s <= n for s in shares)
    if n == 1:
        # A batch of one is a random point one time in five, on average.
        assert 0.1 < np.mean(shares) < 0.3
    else:
        assert min(shares) >= 1 and max(shares) < n
    assert strategy.random_share(n, evolved=False) == n


def test_evolutionary_breeds_from_the_best_told_points():
    space = search_tasks.space("x86-conv2d-nchw", "conv")
    strategy = search.create("evolutionary", space, seed=2, epsilon=0.0)
    best = min(space.enumerate(), key=lambda p: synthetic_sec(space, p))
    strategy.tell(best.to_json(), Result(synthetic_sec(space, best)))
    prop = strategy.propose(8)
    # Without a model the children of the best measured point come first: each differs
    # from it in one knob (a mutation) or takes every value from it or from a fresh sample.
    diffs = [sum(a != b for a, b in zip(c.point.decisions, best.decisions, strict=True)) for c in prop.candidates]
    assert len(prop.candidates) == 8
    assert sum(d == 1 for d in diffs) >= 4, diffs


def test_evolutionary_crossover_mixes_parents_of_one_sketch():
    from tuner.search.evolutionary import EvolutionarySearch

    space = search_tasks.space("sketch", "matmul")
    strategy = EvolutionarySearch(space, seed=4)
    rng = np.random.default_rng(1)
    a = space.sample(rng)
    b = next(p for p in (space.sample(rng) for _ in range(100)) if p.sketch == a.sketch and p != a)
    for _ in range(20):
        child = strategy._crossover(a, b)
        if child is None:
            continue
        assert child.sketch == a.sketch
        assert all(x in (y, z) for x, y, z in zip(child.decisions, a.decisions, b.decisions, strict=True))


@pytest.mark.parametrize("name", ["optuna-tpe", "optuna-cmaes"])
def test_optuna_study_resumes_from_the_database(name, db_url, tmp_path):
    """A killed job's study is in the tuning database itself (SQLite and PostgreSQL): the
    rerun loads it, replaying the stored records completes the trials left running instead
    of adding them again, and the trials still running are proposed again as themselves."""
    import optuna
    import sqlalchemy as sa

    from tuner.db import migrate

    url = db_url
    space = search_tasks.space("x86-conv2d-nchw", "conv")
    first = make(name, space, seed=0, storage_url=url, study_name="job/conv")
    done = run(first, 8, 4)
    killed = first.propose(4).candidates  # asked, never measured: the job was killed here
    assert len(killed) == 4
    assert not list(tmp_path.glob("*.optuna.db"))  # no sibling file (the studies' old place)
    engine = sa.create_engine(url)
    tables = set(sa.inspect(engine).get_table_names())
    engine.dispose()
    assert {"studies", "trials", "records", migrate.VERSION_TABLE} <= tables  # one database, one schema

    again = make(name, space, seed=0, storage_url=url, study_name="job/conv")
    # One RDBStorage (one engine) per database, under Optuna's per-study cache.
    assert again.study._storage._backend is first.study._storage._backend
    assert len(again.study.trials) >= len(done) + len(killed)
    before = len(again.study.trials)
    for cid in done:
        again.tell(cid, first.results[cid])
    finished = killed[0]
    again.tell(finished.id, Result(synthetic_sec(space, finished.point)))
    assert len(again.study.trials) == before, "replayed records were added twice"
    states = {t.user_attrs.get("nightshift_point"): t.state for t in again.study.trials}
    assert states[finished.id] == optuna.trial.TrialState.COMPLETE
    resumed = again.propose(4).candidates
    assert [c.id for c in resumed[:3]] == [c.id for c in killed[1:]]
    assert not {c.id for c in resumed} & set(done)
    for c in resumed:
        again.tell(c.id, Result(synthetic_sec(space, c.point)))
    points = [t.user_attrs["nightshift_point"] for t in again.study.trials if "nightshift_point" in t.user_attrs]
    assert len(points) == len(set(points)) == len(done) + len(killed) + 1, "a point got a second trial"
    assert all(t.state.is_finished() for t in again.study.trials)
    assert again.study.best_value <= min(math.log(first.results[c].sec) for c in done)


def test_studies_of_an_earlier_nightshift_are_not_lost_silently(db_url, tmp_path, caplog):
    """Studies where an earlier Nightshift kept them (a sibling file, a PostgreSQL schema)
    are named in a warning when the database's storage is opened."""
    import optuna
    import sqlalchemy as sa

    from tuner.search.optuna_search import optuna_storage

    if db_url.startswith("sqlite"):
        old, where = f"sqlite:///{tmp_path / 'tuning.optuna.db'}", str(tmp_path / "tuning.optuna.db")
    else:
        engine = sa.create_engine(db_url)
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE SCHEMA optuna"))
        engine.dispose()
        old = optuna.storages.RDBStorage(db_url, engine_kwargs={"connect_args": {"options": "-csearch_path=optuna"}})
        where = "schema 'optuna'"
    optuna.create_study(study_name="old", storage=old).optimize(lambda t: t.suggest_int("k", 0, 3), n_trials=1)
    caplog.set_level(logging.WARNING, logger="tuner.search.optuna_search")
    optuna_storage(db_url)
    assert any(where in r.getMessage() and "no longer read" in r.getMessage() for r in caplog.records)


def test_proposes_with_a_trained_cost_model(name, monkeypatch):
    """With a model trained on measured points, proposals still obey the contract (the
    evolutionary strategy ranks its pool with it)."""
    import cost_models

    space = search_tasks.space("x86-conv2d-nchw", "conv")
    warm = make("random", space, seed=7)
    cands = warm.propose(24).candidates
    feats = cost_models.extract_features(space.mod, space.target, [c.schedule for c in cands])
    model = cost_models.create("xgb", seed=0)
    model.update(feats, np.array([1.0 / synthetic_sec(space, c.point) for c in cands]), np.zeros(len(cands)))
    strategy = make(name, space, seed=7)
    for c in cands:
        strategy.tell(c.id, Result(synthetic_sec(space, c.point)))
    featurized: list[str] = []
    real = search_base.extract_features

    def counting(mod, target, schedules):
        featurized.extend(program_hash(s.mod) for s in schedules)
        return real(mod, target, schedules)

    monkeypatch.setattr(search_base, "extract_features", counting)
    prop = strategy.propose(6, model)
    ids = [c.id for c in prop.candidates]
    assert 1 <= len(ids) <= 6 and len(set(ids)) == len(ids)
    assert not set(ids) & {c.id for c in cands}
    assert all(space.is_valid(c.point) for c in prop.candidates)
    # Features are extracted once per candidate, and the ones the strategy extracted come
    # with the proposal (the job extracts only the rest).
    assert len(featurized) == len(set(featurized)), "a candidate was featurized twice"
    if name == "evolutionary":
        assert prop.features is not None, "the ranked candidates' features were not handed over"
    if prop.features is not None:
        assert len(prop.features) == len(ids)
        for c, rows in zip(prop.candidates, prop.features, strict=True):
            if rows is not None:
                again = cost_models.extract_features(space.mod, space.target, [c.schedule]).candidate(0)
                np.testing.assert_allclose(rows, again, rtol=1e-5)
