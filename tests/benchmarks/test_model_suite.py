"""benchmarks/model_suite.py: the onnx test graphs' weights made input-dependent."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.benchmarks.bench_scripts import load_script

onnx = pytest.importorskip("onnx", reason="the bench extra is not installed")
ort = pytest.importorskip("onnxruntime", reason="the bench extra is not installed")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _filled(name: str, shape: list[int]) -> tuple[onnx.NodeProto, onnx.TensorProto]:
    """A weight written as the "light" test graphs write theirs: one value for every element."""
    shape_init = numpy_helper.from_array(np.array(shape, np.int64), f"{name}__SHAPE")
    value = helper.make_tensor("value", TensorProto.FLOAT, [1], [0.02])
    return helper.make_node("ConstantOfShape", [f"{name}__SHAPE"], [name], value=value), shape_init


def _light_graph(path: Path, ir_version: int | None = None) -> Path:
    """Conv, batch norm, ReLU, pooling, Gemm and Softmax, every weight one value, the shape
    inputs also listed as graph inputs (old IR files do; IR 3, the light graphs' own, must)."""
    weights = {"w": [8, 3, 3, 3], "scale": [8], "bias": [8], "mean": [8], "var": [8], "fc": [4, 8], "fc_b": [4]}
    filled = [_filled(n, s) for n, s in weights.items()]
    nodes = [f[0] for f in filled] + [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["b"]),
        helper.make_node("Relu", ["b"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fc", "fc_b"], ["g"], transB=1),
        helper.make_node("Softmax", ["g"], ["y"]),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])]
    inputs += [helper.make_tensor_value_info(f[1].name, TensorProto.INT64, [len(f[1].dims) and f[1].dims[0]])
               for f in filled]  # fmt: skip
    graph = helper.make_graph(nodes, "light", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                              initializer=[f[1] for f in filled])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9 if ir_version == 3 else 13)])
    if ir_version is not None:
        model.ir_version = ir_version
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _outputs(path: Path) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path))
    rng = np.random.default_rng(0)
    return [session.run(None, {"x": rng.uniform(-1, 1, (1, 3, 8, 8)).astype(np.float32)})[0] for _ in range(2)]


@pytest.mark.parametrize("ir_version", [None, 3])
def test_seeded_weights_make_a_light_graphs_output_depend_on_its_input(tmp_path, ir_version):
    suite = load_script("model_suite")
    light = _light_graph(tmp_path / "light.onnx", ir_version)
    a, b = _outputs(light)
    np.testing.assert_array_equal(a, b)  # one value per weight: every input gives the same output

    seeded = suite.seeded_weights(light, tmp_path / "seeded.onnx")
    model = onnx.load(str(seeded))
    onnx.checker.check_model(model)  # IR 3: every initializer listed as a graph input too
    assert "ConstantOfShape" not in {n.op_type for n in model.graph.node}
    weight_names = {"w", "scale", "bias", "mean", "var", "fc", "fc_b"}
    assert model.graph.input[0].name == "x"
    assert {i.name for i in model.graph.input[1:]} == (weight_names if ir_version == 3 else set())
    weights = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert weights["w"].shape == (8, 3, 3, 3) and weights["fc"].shape == (4, 8)
    assert (weights["var"] > 0).all() and (weights["scale"] > 0).all()
    a, b = _outputs(seeded)
    assert np.abs(a - b).max() > 1e-3 * np.abs(a).max()

    again = suite.seeded_weights(light, tmp_path / "again.onnx")  # seeded: the same file every time
    assert again.read_bytes() == seeded.read_bytes()
