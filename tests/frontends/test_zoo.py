"""Tests of the built-in model zoo: topology, parameter counts, shapes, and a real run."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tvm
from tvm import relax

from tuner.errors import UnknownModelError
from tuner.frontends.model import ModelSpec
from tuner.frontends.zoo import ZOO, build_zoo_model, zoo_names

LLVM = tvm.target.Target({"kind": "llvm"})

# Output shape of each model for batch size b.
OUTPUT_SHAPES = {
    "resnet18": lambda b: (b, 1000),
    "resnet50": lambda b: (b, 1000),
    "mobilenet_v2": lambda b: (b, 1000),
    "bert-base": lambda b: (b, 128, 768),
    "tiny": lambda b: (b, 10),
}


def _model(name: str, batch_size: int = 1) -> ModelSpec:
    return _cached_model(name, batch_size)


@functools.lru_cache(maxsize=4)
def _cached_model(name: str, batch_size: int) -> ModelSpec:
    # Building BERT draws 109M random numbers (2 s, 440 MB): build each model once per session.
    return build_zoo_model(name, batch_size=batch_size)


def _shape(ty: relax.TensorType) -> tuple[int, ...]:
    return tuple(int(d) for d in ty.shape.values)


def _calls(spec: ModelSpec, op_name: str) -> list[relax.Call]:
    found: list[relax.Call] = []

    def visit(expr: relax.Expr) -> None:
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", None) == op_name:
            found.append(expr)

    relax.analysis.post_order_visit(spec.mod["main"].body, visit)
    return found


def test_registry_lists_every_model() -> None:
    assert zoo_names() == sorted(OUTPUT_SHAPES)
    assert set(ZOO) == set(OUTPUT_SHAPES)


@pytest.mark.parametrize(
    ("name", "count"),
    [
        ("resnet18", 11_689_512),
        ("resnet50", 25_557_032),
        ("mobilenet_v2", 3_504_872),
        ("bert-base", 108_891_648),  # no pooler
        ("tiny", 898),
    ],
)
def test_parameter_count_matches_pytorch(name: str, count: int) -> None:
    spec = _model(name)
    assert spec.num_parameters == count


def test_running_stats_are_arguments_but_not_counted() -> None:
    spec = _model("resnet18")
    stats = [k for k in spec.params if k.endswith(("running_mean", "running_var"))]
    assert len(stats) == 2 * 20  # 17 conv BNs + 3 downsample BNs
    assert sum(v.size for v in spec.params.values()) == spec.num_parameters + sum(spec.params[k].size for k in stats)


@pytest.mark.parametrize("name", sorted(OUTPUT_SHAPES))
@pytest.mark.parametrize("batch_size", [1, 2])
def test_output_shape(name: str, batch_size: int) -> None:
    spec = _model(name, batch_size)
    main = spec.mod["main"]
    assert main.attrs["global_symbol"] == "main"
    assert _shape(main.ret_ty) == OUTPUT_SHAPES[name](batch_size)
    assert str(main.ret_ty.dtype) == "float32"
    # main's trailing arguments are exactly params, in order, with matching shapes.
    args = list(main.params)[-len(spec.params) :]
    assert [v.name for v in args] == list(spec.params)
    for var, value in zip(args, spec.params.values(), strict=True):
        assert _shape(var.ty) == value.shape
        assert str(var.ty.dtype) == str(value.dtype)


def test_resnet50_convolutions() -> None:
    spec = _model("resnet50")
    convs = _calls(spec, "relax.nn.conv2d")
    assert len(convs) == 53  # stem + 16 bottlenecks x 3 + 4 downsample projections
    weights = [_shape(c.args[1].ty) for c in convs]
    stem = convs[0]
    assert weights[0] == (64, 3, 7, 7)
    assert [int(s) for s in stem.attrs.strides] == [2, 2]
    assert [int(p) for p in stem.attrs.padding] == [3, 3, 3, 3]
    assert weights[1] == (64, 64, 1, 1)  # layer1.0.conv1
    assert weights[-1] == (2048, 512, 1, 1)  # layer4.2.conv3
    # v1.5: the stride-2 convs of the main path are 3x3; downsample projections are 1x1.
    strided = {weights[i] for i, c in enumerate(convs) if int(c.attrs.strides[0]) == 2}
    assert strided == {
        (64, 3, 7, 7),
        (128, 128, 3, 3),
        (256, 256, 3, 3),
        (512, 512, 3, 3),
        (512, 256, 1, 1),
        (1024, 512, 1, 1),
        (2048, 1024, 1, 1),
    }
    assert len(_calls(spec, "relax.nn.batch_norm")) == 53
    assert len(_calls(spec, "relax.nn.max_pool2d")) == 1
    assert len(_calls(spec, "relax.nn.adaptive_avg_pool2d")) == 1
    assert spec.params["fc.weight"].shape == (1000, 2048)


def test_batch_norm_is_inference_mode() -> None:
    calls = _calls(_model("resnet18"), "relax.nn.batch_norm")
    assert len(calls) == 20
    assert not any(bool(c.attrs.training) for c in calls)


def test_mobilenet_v2_uses_depthwise_convs() -> None:
    convs = _calls(_model("mobilenet_v2"), "relax.nn.conv2d")
    assert len(convs) == 52
    depthwise = [c for c in convs if int(c.attrs.groups) > 1]
    assert len(depthwise) == 17
    assert all(int(c.attrs.groups) == _shape(c.args[1].ty)[0] for c in depthwise)
    assert len(_calls(_model("mobilenet_v2"), "relax.clip")) == 35  # ReLU6


def test_bert_inputs_and_seq_len() -> None:
    spec = build_zoo_model("bert-base", batch_size=2, seq_len=16)
    data = spec.mod["main"].params[0]
    assert data.name == "input_ids"
    assert _shape(data.ty) == (2, 16)
    assert str(data.ty.dtype) == "int64"
    assert _shape(spec.mod["main"].ret_ty) == (2, 16, 768)
    assert len(_calls(spec, "relax.nn.softmax")) == 12
    assert len(_calls(spec, "relax.nn.layer_norm")) == 25


def test_params_are_deterministic_and_well_scaled() -> None:
    a, b = build_zoo_model("resnet18"), _model("resnet18")
    assert all(np.array_equal(a.params[k], b.params[k]) for k in a.params)
    he = np.sqrt(2 / (512 * 9))  # 512x512x3x3 convs
    assert abs(a.params["layer4.1.conv1.weight"].std() - he) < 1e-3 * he
    # The conv closing each residual branch is shrunk by 1/sqrt(blocks) (8 in ResNet-18).
    assert abs(a.params["layer4.1.conv2.weight"].std() - he / np.sqrt(8)) < 1e-3 * he
    assert abs(a.params["fc.weight"].std() - np.sqrt(2 / 512)) < 1e-2 * np.sqrt(2 / 512)
    assert np.all(a.params["bn1.weight"] == 1)
    assert np.all(a.params["bn1.running_var"] == 1)
    assert np.all(a.params["fc.bias"] == 0)


def test_float16_constructs() -> None:
    spec = build_zoo_model("resnet18", dtype="float16")
    assert str(spec.mod["main"].ret_ty.dtype) == "float16"
    assert all(v.dtype == np.float16 for v in spec.params.values())
    assert spec.num_parameters == 11_689_512


def test_unknown_name_lists_known_models() -> None:
    with pytest.raises(UnknownModelError) as info:
        build_zoo_model("resnet1000")
    for name in zoo_names():
        assert name in str(info.value)


def _run(spec: ModelSpec) -> np.ndarray:
    ex = tvm.compile(spec.bound(), target=LLVM)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(x) for x in spec.random_inputs()]).numpy()


def test_tiny_compiles_and_runs() -> None:
    spec = _model("tiny")
    out = _run(spec)
    assert out.shape == (1, 10)
    assert np.all(np.isfinite(out))
    assert out.std() > 0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "options", "shape"),
    [
        ("resnet18", {"image_size": 64}, (1, 1000)),
        ("resnet50", {"image_size": 64}, (1, 1000)),
        ("mobilenet_v2", {"image_size": 64}, (1, 1000)),
        ("bert-base", {"seq_len": 16}, (1, 16, 768)),
    ],
)
def test_big_models_run_finite(
    request: pytest.FixtureRequest, name: str, options: dict[str, int], shape: tuple[int, ...]
) -> None:
    # Nothing in the repo deselects slow tests by default; compile these only when asked.
    if "slow" not in request.config.getoption("markexpr", ""):
        pytest.skip("compiles a large model: run with -m slow")
    out = _run(build_zoo_model(name, **options))
    assert out.shape == shape
    assert np.all(np.isfinite(out))
    assert out.std() > 0
