import pytest

from tuner.errors import UnknownModelError
from tuner.frontends import load_model


def test_light_resnet50_imports(light_resnet50):
    spec = load_model(str(light_resnet50))
    assert spec.name == "light_resnet50"
    assert [(i.shape, i.dtype) for i in spec.inputs] == [((1, 3, 224, 224), "float32")]
    assert spec.params == {}


def test_missing_onnx_file(tmp_path):
    with pytest.raises(UnknownModelError, match="not found"):
        load_model(str(tmp_path / "nope.onnx"))


def test_corrupt_onnx_file(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07this is not a protobuf" * 10)
    with pytest.raises(UnknownModelError, match="not a valid ONNX model"):
        load_model(str(bad))


def test_torch_factory_errors():
    with pytest.raises(UnknownModelError):
        load_model("no_such_package_xyz.module:factory")
