"""Sampled points build and compute what the unscheduled operator computes."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from conftest import space, target, task

import search_spaces
from tuner.device import host_cpu_info
from tuner.frontends import load_model
from tuner.graph.tasks import extract_tasks
from tuner.measure.verify import check_point, reference, sweep_tasks


@pytest.mark.parametrize(("kind", "task_name"), [("sketch", "matmul"), ("sketch", "conv"), ("sketch", "relu"),
                                                 ("x86-conv2d-nchw", "conv"),
                                                 ("x86-conv2d-nchwc", "conv_nchwc"),
                                                 ("x86-conv2d-nchwc", "conv_nchwc_first"),
                                                 ("x86-conv2d-nchwc", "conv_nchwc_bare"),
                                                 ("x86-conv2d-nchwc", "group_conv_nchwc"),
                                                 ("x86-conv2d-nchwc", "group_conv_nchwc_wide_s2"),
                                                 ("sketch", "group_conv_nchwc"),
                                                 ("sketch", "separable_resize"),
                                                 ("x86-dense", "dense"), ("x86-dense", "batch_matmul"),
                                                 ("x86-dense", "dense_packed"), ("sketch", "dense_packed"),
                                                 ("x86-softmax", "softmax"), ("x86-layer-norm", "layer_norm"),
                                                 ("x86-row-taps", "row_taps"),
                                                 ("x86-depthwise-conv2d-nchw", "depthwise"),
                                                 ("x86-depthwise-conv2d-nchw", "depthwise_s2"),
                                                 ("x86-depthwise-conv2d-nchwc", "depthwise_nchwc"),
                                                 ("x86-depthwise-conv2d-nchwc", "depthwise_nchwc_s2"),
                                                 ("x86-depthwise-conv2d-nchwc", "depthwise_nchwc16"),
                                                 ("x86-depthwise-conv2d-nchwc", "depthwise_nchwc12"),
                                                 ("x86-depthwise-conv2d-nchwc", "depthwise_nchwc6"),
                                                 ("x86-conv2d-nchwc-dot", "conv_nchwc_bf16"),
                                                 ("x86-conv2d-nchwc-dot", "conv_nchwc_bf16_s2"),
                                                 ("x86-conv2d-nchwc-dot", "conv_nchwc_u8"),
                                                 ("x86-conv2d-nchwc-dot", "conv_nchwc_u8_residual"),
                                                 ("x86-conv2d-nchwc-dot", "conv_padded_output_u8"),
                                                 ("x86-dense-vnni", "dense_u8s8"),
                                                 ("x86-dense-amx-bf16", "dense_bf16"),
                                                 ("x86-dense-amx-int8", "dense_u8s8"),
                                                 ("x86-conv2d-amx", "conv_nchwc_bf16"),
                                                 ("x86-conv2d-amx", "conv_nchwc_u8"),
                                                 ("x86-conv2d-amx", "conv_nchwc_bf16_wide"),
                                                 ("x86-conv2d-amx", "conv_nchwc_u8_wide"),
                                                 ("x86-conv2d-nchwc-dot", "conv_nchwc_bf16_wide"),
                                                 ("x86-conv2d-nchwc-dot", "conv_nchwc_u8_wide"),
                                                 ("x86-conv2d-winograd", "conv_winograd"),
                                                 ("x86-conv2d-winograd", "conv_winograd_m2_bare"),
                                                 ("x86-conv2d-winograd", "conv_winograd_bf16"),
                                                 ("x86-conv2d-winograd", "conv_winograd_bf16_dot")])  # fmt: skip
def test_sampled_points_match_the_reference(kind, task_name):
    if kind in ("x86-conv2d-nchwc-dot", "x86-dense-vnni") or task_name.endswith("_dot"):
        feature = "avx512_bf16" if "bf16" in task_name else "avx512_vnni"
        if feature not in host_cpu_info()["isa_flags"]:
            pytest.skip(f"this CPU has no {feature}")
    elif "amx" in kind:
        feature = "amx_bf16" if "bf16" in task_name else "amx_int8"
        if feature not in host_cpu_info()["isa_flags"]:
            pytest.skip(f"this CPU has no {feature}")
    elif kind not in search_spaces.applicable_kinds(task(task_name), target("llvm")):
        # Only a 12-channel block under AVX2's 8 lanes: over one vector, not whole vectors.
        assert task_name == "depthwise_nchwc12", task_name
        pytest.skip("a block above the vector lanes must be whole vectors; the sketch space takes it")
    sp = space(kind, task_name, "llvm")
    ref = reference(task(task_name), target("llvm"))
    rng = np.random.default_rng(4)
    for _ in range(4):
        check = check_point(sp, sp.sample(rng), ref)
        assert check.error is None, (check.point.to_json(), check.error, check.detail)


def test_a_wrong_schedule_is_caught():
    """The comparison fails when the outputs differ (so passing it means something)."""
    sp = space("sketch", "matmul", "llvm")
    ref = reference(task("matmul"), target("llvm"))
    ref.outputs[-1][0, 0] += 1.0
    check = check_point(sp, sp.sample(np.random.default_rng(0)), ref)
    assert check.error == "wrong"


@pytest.mark.slow
def test_every_task_of_the_tiny_model():
    tgt = target("llvm")
    tasks = extract_tasks(load_model("tiny").bound(), tgt)
    results = sweep_tasks("tiny", tasks, tgt, points=2)
    assert {r.task for r in results} == {t.name for t in tasks}
    for r in results:
        assert r.reference_error is None
        assert r.checks and all(c.error is None for c in r.checks), [(c.point.to_json(), c.detail) for c in r.checks]


@functools.cache
def _zoo_tasks(name: str) -> list:
    return extract_tasks(load_model(name).bound(), target("llvm"))


@pytest.mark.slow
@pytest.mark.parametrize("model", ["resnet50", "mobilenet_v2", "bert-base"])
def test_full_sweep_every_zoo_task(model, request):
    """Every task of the model, every applicable space kind: 3 points each build and match."""
    if "slow" not in request.config.getoption("markexpr", ""):
        pytest.skip("builds hundreds of kernels: run with -m slow")
    results = sweep_tasks(model, _zoo_tasks(model), target("llvm"), points=3)
    failed = [(r.task, r.kind, c.point.to_json(), c.error, c.detail) for r in results for c in r.checks if c.error]
    assert not [r for r in results if r.reference_error]
    assert not failed
    assert {"sketch"} <= {r.kind for r in results}
    assert search_spaces.kinds()
