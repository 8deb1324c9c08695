"""The measurer on a real multi-node Ray cluster (``ray.cluster_utils.Cluster``).

Every node is a real raylet on this machine with its own resources. Two nodes offering the
same device resource stand for two identical machines; nodes without it only build.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time

import psutil
import pytest
import ray
import workloads

from tuner.measure.base import MeasureConfig, device_resource
from tuner.measure.ray_measure import RayMeasurer
from tuner.measure.results import ErrorClass
from tuner.measure.runner import TimingConfig

FAST = TimingConfig(repeat=3, min_repeat_ms=5, max_remeasure=1)


def _alive(node_id: str) -> bool:
    return any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes())


def test_identical_devices_share_one_job_and_two_jobs_take_turns(multinode, cpu_device, task):
    """Two nodes with the same device: one job times on both; two jobs at once both finish
    with no candidate blamed for the other's time, keyed by the timing nodes' fingerprint."""
    res = {device_resource(cpu_device): 1}
    devices = [multinode.add_node(num_cpus=1, resources=res) for _ in range(2)]
    multinode.wait_for_nodes()
    config = MeasureConfig(timing=FAST, build_timeout_s=120, run_timeout_s=20, device_wait_s=150)
    m1, m2 = RayMeasurer(cpu_device, config), RayMeasurer(cpu_device, config)
    try:
        assert {i["node_id"] for i in m1.devices_info()} == {n.node_id for n in devices}
        assert m1.device.fingerprint == m2.device.fingerprint == cpu_device.fingerprint
        out: dict[str, list] = {}

        def job(name: str, m: RayMeasurer, tiles: tuple[int, ...]) -> None:
            out[name] = m.measure(task, [workloads.tiled(task, t) for t in tiles])

        threads = [threading.Thread(target=job, args=("a", m1, (4, 8, 16, 32, 64, 2))),
                   threading.Thread(target=job, args=("b", m2, (8, 16, 32, 4, 64, 2)))]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        results = out["a"] + out["b"]
        assert len(results) == 12
        for r in results:
            assert r.error_class is None, r.error_msg
            assert r.run.device_fingerprint == cpu_device.fingerprint
        assert {r.run.node_id for r in results} == {n.node_id for n in devices}, "a device node never timed"
    finally:
        m1.close()
        m2.close()


# Objects under 100 kB live in their owner's memory (the driver's), never lost with a node;
# a CUDA library is larger. This cluster keeps every artifact in the build node's store.
@pytest.mark.parametrize("multinode", [{"num_cpus": 0, "_system_config": {"max_direct_call_object_size": 1024}}],
                         indirect=True)
def test_lost_artifact_is_lost_for_that_candidate_only(multinode, cpu_device, task):
    """Artifacts whose only copy was on a build node that died are LOST; the batch completes."""
    from tuner.measure import quiet

    device_node = multinode.add_node(num_cpus=0, resources={device_resource(cpu_device): 1})
    builder = multinode.add_node(num_cpus=1)
    multinode.wait_for_nodes()
    # No retries: Ray would otherwise rebuild a lost artifact from its lineage.
    config = MeasureConfig(timing=FAST, build_timeout_s=120, run_timeout_s=20, device_wait_s=150,
                           timing_depth=1, build_retries=0)  # fmt: skip
    with RayMeasurer(cpu_device, config) as m:
        assert m.measure(task, [workloads.tiled(task, 8)])[0].error_class is None
        before = m.stats.built  # the task's reference and that candidate
        held = quiet.TimingLease(device_node.node_id)
        held.acquire()  # the device waits: built artifacts queue up
        try:
            futures = m.submit(task, [workloads.tiled(task, t) for t in (4, 16, 32)])
            deadline = time.monotonic() + 300
            # All three built before the node dies: a build still running would die with it.
            while m.stats.built < before + 3 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert m.stats.built == before + 3
            multinode.remove_node(builder, allow_graceful=False)
            while _alive(builder.node_id) and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            held.release()
        results = [f.result(timeout=300) for f in futures]
    assert all(r.error_class in (None, ErrorClass.LOST) for r in results), [r.error_msg for r in results]
    lost = [r for r in results if r.error_class is ErrorClass.LOST]
    # One call at a time goes to the device (timing_depth=1): its artifact is copied to the
    # device node with the call; the others existed only on the dead builder.
    assert lost, "every queued artifact outlived its build node: something copied them off it"
    assert all("lost" in (r.error_msg or "") for r in lost)


@pytest.mark.parametrize("multinode", [{"num_cpus": 0}], indirect=True)
def test_builds_that_never_get_a_cpu_are_lost_not_timed_out(multinode, cpu_device, task):
    """A cluster whose only build node is gone: the builds wait for a CPU, then come back LOST
    (measured again later), never blamed on the candidate as a build timeout."""
    multinode.add_node(num_cpus=0, resources={device_resource(cpu_device): 1})
    multinode.wait_for_nodes()
    config = MeasureConfig(timing=FAST, build_timeout_s=60, run_timeout_s=20, device_wait_s=30,
                           build_start_timeout_s=5, max_builds_in_flight=2)  # fmt: skip
    with RayMeasurer(cpu_device, config) as m:
        start = time.monotonic()
        results = m.measure(task, [workloads.tiled(task, t) for t in (4, 16)])
        assert time.monotonic() - start < 60
    assert [r.error_class for r in results] == [ErrorClass.LOST] * 2, [r.error_msg for r in results]
    assert all("never ran" in (r.error_msg or "") for r in results)


def test_lost_device_node_marks_candidates_lost_without_hanging(multinode, cpu_device, task):
    device_node = multinode.add_node(num_cpus=1, resources={device_resource(cpu_device): 1})
    multinode.wait_for_nodes()
    config = MeasureConfig(timing=FAST, build_timeout_s=60, run_timeout_s=10, device_wait_s=5)
    with RayMeasurer(cpu_device, config) as m:
        assert m.measure(task, [workloads.tiled(task, 8)])[0].error_class is None
        multinode.remove_node(device_node, allow_graceful=False)
        # Actor calls go worker to worker: until the cluster knows the node is dead, its
        # actor process may still answer. Time new candidates once it is known dead.
        deadline = time.monotonic() + 60
        while _alive(device_node.node_id) and time.monotonic() < deadline:
            time.sleep(0.2)
        start = time.monotonic()
        results = m.measure(task, [workloads.tiled(task, t) for t in (4, 16, 32)])
        assert time.monotonic() - start < 120
    assert [r.error_class for r in results] == [ErrorClass.LOST] * 3


def _kill_one(prefix: str) -> bool:
    """SIGKILL one process whose title starts with ``prefix`` (Ray names a busy worker
    ``ray::<task>``); True if one was found."""
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if cmd.startswith(prefix) and p.info["pid"] != os.getpid():
            os.kill(p.info["pid"], signal.SIGKILL)
            return True
    return False


def test_job_goes_on_through_killed_builds_actor_and_node_one_record_each(multinode, cpu_device, tmp_path):
    """A tuning job while its build processes crash, its device actor is killed and a build
    node dies: it finishes, and the database holds exactly one record per candidate."""
    from tuner.db import TuningDatabase
    from tuner.job import TuneConfig, TuningJob

    multinode.add_node(num_cpus=1, resources={device_resource(cpu_device): 1})
    doomed = multinode.add_node(num_cpus=1)
    multinode.wait_for_nodes()
    db_path = tmp_path / "t.db"
    db = TuningDatabase(f"sqlite:///{db_path}")
    measure = MeasureConfig(timing=FAST, build_timeout_s=120, run_timeout_s=20, device_wait_s=150)
    job = TuningJob([workloads.matmul_task()], cpu_device, db,
                    TuneConfig(trials=16, batch_size=4, seed=0, measure=measure), model_name="faults")  # fmt: skip
    faults: list[str] = []

    def inject() -> None:
        deadline = time.monotonic() + 300
        while job.measurer is None or job.done == 0:  # the first batch is in
            if time.monotonic() > deadline:
                return
            time.sleep(0.1)
        pid = job.measurer.actor_info()["pid"]
        os.kill(pid, signal.SIGKILL)
        faults.append("actor")
        while not _kill_one("ray::build_task") and time.monotonic() < deadline:
            time.sleep(0.05)
        faults.append("build")
        multinode.remove_node(doomed, allow_graceful=False)
        faults.append("node")

    injector = threading.Thread(target=inject)
    injector.start()
    summary = job.run()
    injector.join(timeout=300)
    assert faults == ["actor", "build", "node"]
    assert summary.trials == 16
    with sqlite3.connect(db_path) as conn:
        rows = conn.execute("SELECT point, error_class FROM records WHERE job_id = ?", (summary.job_id,)).fetchall()
    assert len(rows) == 16 and len({p for p, _ in rows}) == 16
    classes = {e for _, e in rows}
    assert classes <= {None, "lost", "build_error", "run_crash", "run_error"}, classes
    assert None in classes, "no candidate was timed"


def test_device_node_that_joins_mid_job_times_its_candidates_one_record_each(multinode, cpu_device, tmp_path):
    """A node offering the device that joins while a job runs gets the job's timings; the
    database holds exactly one record per candidate."""
    from tuner.db import TuningDatabase
    from tuner.job import TuneConfig, TuningJob
    from tuner.measure import device_actor, quiet

    resource = device_resource(cpu_device)
    first = multinode.add_node(num_cpus=0, resources={resource: 1})
    multinode.wait_for_nodes()
    db_path = tmp_path / "t.db"
    measure = MeasureConfig(timing=FAST, build_timeout_s=120, run_timeout_s=20, device_wait_s=150, node_scan_s=0.5)
    job = TuningJob([workloads.matmul_task()], cpu_device, TuningDatabase(f"sqlite:///{db_path}"),
                    TuneConfig(trials=16, batch_size=4, seed=0, measure=measure), model_name="join")  # fmt: skip
    out: dict = {}

    def measured(node_id: str) -> int:
        try:
            actor = ray.get_actor(device_actor.actor_name(resource, node_id, 0), namespace=quiet.NAMESPACE)
            return int(ray.get(actor.info.remote(), timeout=30)["measured"])
        except (ValueError, ray.exceptions.RayError):  # not started yet
            return 0

    # The job runs in a thread: a Cluster adds nodes from the main thread only.
    runner = threading.Thread(target=lambda: out.update(summary=job.run()))
    runner.start()
    deadline = time.monotonic() + 300
    while (job.measurer is None or job.done == 0) and time.monotonic() < deadline:
        time.sleep(0.1)
    # The first device is held from now on: only the node that joins can time, so the job
    # goes on only if the measurer picks that node up.
    held = quiet.TimingLease(first.node_id)
    held.acquire()
    try:
        before = measured(first.node_id)
        joined = multinode.add_node(num_cpus=0, resources={resource: 1}).node_id
        while measured(joined) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        held.release()
    runner.join(timeout=300)
    summary = out["summary"]
    assert summary.trials == 16
    assert measured(joined) >= 2, "the node that joined timed no candidate of the job"
    assert measured(first.node_id) > before, "the first device stopped timing once another joined"
    with sqlite3.connect(db_path) as conn:
        rows = conn.execute("SELECT point, error_class FROM records WHERE job_id = ?", (summary.job_id,)).fetchall()
    assert len(rows) == 16 and len({p for p, _ in rows}) == 16
    assert {e for _, e in rows} == {None}, rows


def test_ray_address_is_joined_and_a_running_ray_is_reused(multinode, monkeypatch, caplog):
    """With no address passed, connect() joins the cluster RAY_ADDRESS names (as Ray's own
    tools do) and says so, instead of starting a local one; a Ray already initialized in this
    process (a notebook's ray.init) is used as it is. Neither is the caller's to shut down."""
    from tuner.measure.ray_measure import connect, starts_local

    ray.shutdown()  # the fixture joined by address; now only the variable names the cluster
    monkeypatch.setenv("RAY_ADDRESS", multinode.address)
    assert not starts_local()
    with caplog.at_level("WARNING", logger="tuner.measure.ray_measure"):
        assert connect() is False
    assert f"using the Ray cluster at {multinode.address} (RAY_ADDRESS)" in caplog.text
    assert ray.get_runtime_context().gcs_address == multinode.address
    assert [n["NodeID"] for n in ray.nodes()] == [multinode.head_node.node_id]  # no node of our own
    monkeypatch.delenv("RAY_ADDRESS")
    assert not starts_local() and connect() is False  # initialized: reused, not a second cluster
    assert ray.get_runtime_context().gcs_address == multinode.address
