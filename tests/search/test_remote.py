"""Proposal work as Ray tasks (``tuner.search.remote``): the same candidates as in this
process, spread over the cluster's CPUs, and kept off a node's cores while it times."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest
import search_tasks  # tests/search is on sys.path (pytest's rootdir-relative "prepend" import mode)
import tvm_ffi

import cost_models
from search_spaces import Point
from tuner import search
from tuner.search import Result
from tuner.search.base import Candidate
from tuner.search.remote import Applier, SpaceSpec

SEED = 1  # search_tasks.space builds every space with search_spaces.create's default seed


def applier_for(kind: str, name: str, **kwargs) -> Applier:
    space = search_tasks.space(kind, name)
    return Applier(SpaceSpec.of(space, dict(search_tasks.target().export()), SEED), **kwargs)


@pytest.mark.parametrize("kind", ["sketch", "x86-conv2d-nchw"])
def test_ray_tasks_give_what_this_process_gives(ray_cluster, kind):
    """Applied by Ray tasks or here: the same module, trace, program hash and features; an
    invalid point is an error line; a seed samples the same point on any worker."""
    space = search_tasks.space(kind, "conv")
    applier = applier_for(kind, "conv")
    rng = np.random.default_rng(5)
    points = [space.sample(rng) for _ in range(5)]
    bad = Point(points[0].sketch, tuple(99999 for _ in points[0].decisions))
    got = applier.apply([p.to_json() for p in points] + [bad.to_json()])
    assert isinstance(got[-1], str) and got[-1]
    local = [Candidate(p.to_json(), p, space.apply(p)) for p in points]
    feats = cost_models.extract_features(space.mod, space.target, [c.schedule for c in local])
    for j, (c, a) in enumerate(zip(local, got[:-1], strict=True)):
        assert not isinstance(a, str), a
        remote = Candidate(a.point, Point.from_json(a.point), applied=a)
        assert remote.id == c.id
        assert tvm_ffi.structural_equal(remote.mod, c.mod)
        assert remote.trace_json == c.trace_json
        assert remote.program_hash == c.program_hash
        np.testing.assert_allclose(a.features, feats.candidate(j), rtol=1e-5)
    seeds = [3, 4, 3]
    sampled = applier.sample(seeds)
    assert [a.point for a in sampled] == [space.sample(np.random.default_rng(s)).to_json() for s in seeds]


@pytest.mark.parametrize("name", search.strategies())
def test_strategies_with_an_applier_keep_the_contract(ray_cluster, name):
    """Every strategy, its TVM work in Ray tasks: valid, unseen, distinct candidates, every
    one with its features, and no point applied in this process."""
    space = search_tasks.space("sketch", "matmul")
    try:
        strategy = search.create(name, space, seed=2, applier=applier_for("sketch", "matmul"))
    except ValueError:
        pytest.skip(f"{name} does not search a space of {space.grid_size()} points")
    told: set[str] = set()
    built = space.built.copy()
    for n in (4, 3):
        prop = strategy.propose(n)
        ids = [c.id for c in prop.candidates]
        assert 1 <= len(ids) <= n and len(set(ids)) == len(ids) and not set(ids) & told
        assert prop.features is not None and all(f is not None for f in prop.features)
        for c in prop.candidates:
            assert c.schedule is None and c.applied is not None
            assert space.check(c.point) is None
            strategy.tell(c.id, Result(1e-3 * (1 + len(told))))
            told.add(c.id)
    # space.check above built the candidates here (for the assertion); nothing else did.
    assert sum((space.built - built).values()) <= len(told)
    assert strategy.applier is not None, "the strategy fell back to this process"


def test_a_failing_applier_falls_back_to_this_process(ray_cluster, caplog):
    """A space the workers cannot build (here: a kind no worker knows) must not end the job:
    the strategy says so and applies points itself."""
    space = search_tasks.space("sketch", "matmul")
    spec = SpaceSpec.of(space, dict(search_tasks.target().export()), SEED)
    broken = Applier(SpaceSpec(spec.mod_json, spec.target_config, "no-such-kind", SEED))
    strategy = search.create("random", space, seed=0, applier=broken)
    prop = strategy.propose(3)
    assert len(prop.candidates) == 3 and all(c.schedule is not None for c in prop.candidates)
    assert strategy.applier is None
    assert "applying points in this process" in caplog.text


@pytest.fixture
def two_nodes() -> Iterator:
    """A real two-node Ray cluster (``ray.cluster_utils.Cluster``): a head without CPUs
    (the driver's node) and two nodes with one CPU each; the local cluster is restored after."""
    import ray
    from ray.cluster_utils import Cluster

    from tuner.measure.ray_measure import connect

    had_local = ray.is_initialized()
    ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    nodes = [cluster.add_node(num_cpus=1) for _ in range(2)]
    cluster.wait_for_nodes()
    connect(cluster.address)
    try:
        yield cluster, nodes
    finally:
        ray.shutdown()
        cluster.shutdown()
        if had_local:
            connect(num_cpus=2)


def test_proposal_work_spreads_over_nodes_and_waits_for_a_timing(two_nodes):
    """On two nodes the points are applied on both, none on the driver's (it has no CPU);
    while timings hold the nodes' leases, no proposal work runs."""
    from tuner.measure import quiet

    _, nodes = two_nodes
    # The nodes time CPU candidates: each has its lease actor (as a device actor starts it).
    held = [quiet.TimingLease(n.node_id) for n in nodes]
    space = search_tasks.space("sketch", "matmul")
    applier = applier_for("sketch", "matmul")
    rng = np.random.default_rng(0)
    points = list({p.to_json(): p for p in (space.sample(rng) for _ in range(12))})
    got = applier.apply(points)
    assert all(not isinstance(a, str) for a in got)
    assert {a.node_id for a in got} == {n.node_id for n in nodes}, "the work did not spread over both nodes"

    # Timings hold both nodes: no proposal work runs until they are done.
    for lease in held:
        lease.acquire()
    done = threading.Event()
    out: list = []

    def work() -> None:
        out.extend(applier_for("sketch", "matmul").apply(points[:6]))
        done.set()

    thread = threading.Thread(target=work)
    try:
        thread.start()
        assert not done.wait(8.0), "proposal work ran beside a timing"
    finally:
        for lease in held:
            lease.release()
    assert done.wait(300)
    thread.join()
    assert len(out) == 6 and all(not isinstance(a, str) for a in out)


@pytest.mark.parametrize("propose_on", ["driver", "cluster"])
def test_a_job_stores_records_that_replay_to_the_measured_program(ray_cluster, cpu_device, tmp_path, propose_on):
    """Wherever the points were applied, each stored record's trace replays (as TVM's
    compiler replays it) to the very program that was built and timed."""
    import json
    import sqlite3

    from tvm.s_tir import meta_schedule as ms

    from tuner.db import TuningDatabase
    from tuner.graph.keys import trace_program_hash
    from tuner.job import TuneConfig, TuningJob

    db_path = tmp_path / "t.db"
    db = TuningDatabase(f"sqlite:///{db_path}")
    task = search_tasks.task("matmul")
    config = TuneConfig(trials=8, batch_size=4, seed=0, strategy="evolutionary", propose_on=propose_on)
    summary = TuningJob([task], cpu_device, db, config, model_name="t").run()
    db.close()
    assert summary.trials == 8
    with sqlite3.connect(db_path) as conn:
        rows = conn.execute("SELECT record_json, program_hash FROM records").fetchall()
    assert len(rows) == 8
    workload = ms.database.Workload(task.mod)
    for record_json, stored_hash in rows:
        record = ms.database.TuningRecord.from_json(json.loads(record_json), workload)
        assert trace_program_hash(record.trace, task.mod) == stored_hash
