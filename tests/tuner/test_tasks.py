import pytest

from tuner.frontends import load_model
from tuner.graph.keys import workload_key
from tuner.graph.tasks import extract_tasks


@pytest.mark.slow
def test_light_resnet50_tasks(cpu_device, light_resnet50):
    spec = load_model(str(light_resnet50))
    tasks = extract_tasks(spec.bound(), cpu_device.target)
    convs = [t for t in tasks if "conv2d" in t.name]
    assert len(convs) >= 15
    # Identical workloads are one task: ResNet-50 repeats its bottleneck convs.
    assert any(t.weight > 1 for t in convs)
    assert len({t.workload_key for t in tasks}) == len(tasks)
    # Heaviest first; total work is ResNet-50's ~4.1 GMAC = ~8.2 GFLOP.
    costs = [t.weight * t.flops for t in tasks]
    assert costs == sorted(costs, reverse=True)
    assert 7e9 < sum(costs) < 9e9


def test_tiny_tasks_and_stable_keys(cpu_device):
    spec = load_model("tiny")
    a = extract_tasks(spec.bound(), cpu_device.target)
    b = extract_tasks(load_model("tiny").bound(), cpu_device.target)
    assert [t.workload_key for t in a] == [t.workload_key for t in b]
    assert all(workload_key(t.mod) == t.workload_key for t in a)
    assert any(t.name.startswith("fused_conv2d") and t.flops > 0 for t in a)
