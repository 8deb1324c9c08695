"""Fixtures of the measurement tests: measurers on the local cluster, a multi-node cluster."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import workloads  # tests/measure is on sys.path (pytest's rootdir-relative "prepend" import mode)


@pytest.fixture
def node(ray_cluster) -> str:
    """This node's id, with its lease actor started and the lease lookups' cache cleared."""
    import ray

    from tuner.measure import quiet

    node_id = ray.get_runtime_context().get_node_id()
    ray.get(quiet.ensure(node_id).state.remote())
    quiet._lookups.clear()
    return node_id


@pytest.fixture(scope="module")
def task():
    """A 64^3 float32 matmul task."""
    return workloads.matmul_task()


@pytest.fixture
def make_measurer(ray_cluster, cpu_device):
    """Build RayMeasurers on the local cluster; each is closed after the test."""
    from tuner.measure.ray_measure import RayMeasurer

    made = []

    def make(config=None, device=None):
        m = RayMeasurer(device or cpu_device, config)
        made.append(m)
        return m

    yield make
    for m in made:
        m.close()


@pytest.fixture
def multinode(request, cpu_device) -> Iterator:
    """A real multi-node Ray cluster (``ray.cluster_utils.Cluster``), the driver connected to it.

    Indirect parameters update the head's arguments (e.g. ``num_cpus``, ``_system_config``).
    A Cluster cannot coexist with a ``ray.init`` local cluster in one process: the current
    connection is shut down first and, if there was one, a local cluster is restored after,
    so the session-wide ``ray_cluster`` fixture keeps working in any test order.
    """
    import ray
    from ray.cluster_utils import Cluster

    from tuner.measure.ray_measure import connect

    had_local = ray.is_initialized()
    ray.shutdown()
    head = {"num_cpus": 1, "include_dashboard": False} | getattr(request, "param", {})
    cluster = Cluster(initialize_head=True, head_node_args=head)
    connect(cluster.address)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        if had_local:
            connect(num_cpus=2)
