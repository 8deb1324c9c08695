"""The measurer on a real multi-node Ray cluster (``ray.cluster_utils.Cluster``).

Every node is a real raylet on this machine with its own resources: the head only builds,
one node offers the host CPU's device resource, another a different device's.
"""

from __future__ import annotations

import time

import workloads

from tuner.measure.ray_measure import MeasureConfig, RayMeasurer, device_resource
from tuner.measure.results import ErrorClass
from tuner.measure.runner import TimingConfig

FAST = TimingConfig(repeat=3, min_repeat_ms=5, max_remeasure=1)


def _node_id(cluster_node) -> str:
    return cluster_node.node_id


def _alive(node_id: str) -> bool:
    import ray

    return any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes())


def test_timings_land_on_the_device_node_and_builds_spread(multinode, cpu_device, task):
    device_node = multinode.add_node(num_cpus=1, resources={device_resource(cpu_device): 1})
    other = multinode.add_node(num_cpus=1, resources={"nightshift_cuda_sm_90": 1})
    multinode.wait_for_nodes()
    with RayMeasurer(cpu_device, MeasureConfig(timing=FAST, build_timeout_s=60)) as m:
        results = m.measure(task, [workloads.tiled(task, t) for t in (4, 8, 16, 32, 64, 8, 16, 32)])
    for r in results:
        assert r.error_class is None, r.error_msg
        assert r.run.node_id == _node_id(device_node)
    build_nodes = {r.build.node_id for r in results}
    assert build_nodes <= {_node_id(n) for n in (multinode.head_node, device_node, other)}
    assert len(build_nodes) >= 2, "builds did not spread over the cluster's CPUs"


def test_lost_build_node_mid_batch_is_retried_elsewhere(multinode, cpu_device, task):
    multinode.add_node(num_cpus=1, resources={device_resource(cpu_device): 1})
    doomed = multinode.add_node(num_cpus=2)
    multinode.wait_for_nodes()
    config = MeasureConfig(timing=FAST, build_timeout_s=120, device_wait_s=20)
    with RayMeasurer(cpu_device, config) as m:
        m.measure(task, [workloads.tiled(task, 8)])  # every node's workers are up
        # Unrolled builds take seconds: some are on the doomed node when it goes.
        futures = m.submit(task, [workloads.unrolled(task, t) for t in (4, 8, 16, 32, 4, 8)])
        time.sleep(2.0)
        multinode.remove_node(doomed, allow_graceful=False)
        start = time.monotonic()
        results = [f.result(timeout=240) for f in futures]
        assert time.monotonic() - start < 240
    # Builds in flight on the doomed node are rebuilt elsewhere or marked LOST. One it had
    # finished (or finishes as its raylet dies: the worker reports to the driver directly) is
    # a valid result: every result without an error was checked against the reference.
    for r in results:
        assert r.error_class in (None, ErrorClass.LOST), r.error_msg
    assert sum(r.error_class is None for r in results) >= 4


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
