"""``--model torchvision:NAME``, ``timm:NAME`` and ``hf:NAME``: built with random weights, imported
through torch.export, and the same numbers as PyTorch eager. Small inputs and configs keep it quick."""

import importlib.util
import pickle
import sys

import numpy as np
import pytest
import tvm
from tvm import relax

from tuner.errors import UnknownModelError, UserInputError
from tuner.frontends import load_model
from tuner.frontends.ecosystem import _calibrated, _hf_model_type, is_ecosystem_model, load_ecosystem, model_names

torch = pytest.importorskip("torch", reason="the torch extra is not installed")


def _needs(package, extra):
    # Not importorskip: torchvision's wheel fails at import beside the CPU torch build, which the
    # frontend works around (tuner.frontends.ecosystem._import_torchvision); only absence skips.
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed (the {extra} extra)")


def _tvm_matches_torch(spec, rtol=1e-4, atol=1e-5):
    """Compile ``spec`` with TVM's default schedules and compare it with its torch module on the
    spec's own random inputs."""
    ex = tvm.compile(spec.bound(), target=tvm.target.Target({"kind": "llvm"}))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    inputs = spec.random_inputs()
    got = vm["main"](*(tvm.runtime.tensor(x) for x in inputs))
    got = (got if isinstance(got, tvm.runtime.Tensor) else got[0]).numpy()
    with torch.no_grad():
        want = spec.torch_module(*(torch.from_numpy(x) for x in inputs)).numpy()
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    return got


@pytest.mark.slow
def test_torchvision_model_matches_pytorch():
    _needs("torchvision", "vision")
    spec = load_model("torchvision:squeezenet1_1", image_size=64)
    assert spec.name == "torchvision-squeezenet1_1"
    assert [(i.shape, i.dtype) for i in spec.inputs] == [((1, 3, 64, 64), "float32")]
    assert spec.num_parameters == 1_235_496  # torchvision's squeezenet1_1
    assert _tvm_matches_torch(spec).shape == (1, 1000)


def test_hf_model_from_its_config_matches_pytorch():
    _needs("transformers", "hf")
    tiny = {"n_layer": 1, "n_embd": 64, "n_head": 2, "vocab_size": 1000}
    spec = load_ecosystem("hf:gpt2", batch_size=2, seq_len=8, hf_config=tiny)
    assert [(i.name, i.shape, i.dtype) for i in spec.inputs] == [
        ("input_ids", (2, 8), "int64"), ("attention_mask", (2, 8), "int64")]  # fmt: skip
    # Seeded: the same weights every time.
    again = load_ecosystem("hf:gpt2", batch_size=2, seq_len=8, hf_config=tiny)
    for a, b in zip(spec.torch_module.parameters(), again.torch_module.parameters(), strict=True):
        assert torch.equal(a, b)
    assert _tvm_matches_torch(spec, atol=1e-4).shape == (2, 8, 64)


def _sensitivity(module, shape):
    """How far the output moves for another random input, relative to its size."""
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        a, b = (module(torch.rand(shape, generator=gen) * 2 - 1) for _ in range(2))
    return float((a - b).abs().max() / a.abs().max())


def test_timm_takes_its_default_input_size():
    _needs("timm", "vision")
    spec = load_model("timm:test_efficientnet")  # timm's own tiny test network, 160x160
    assert [i.shape for i in spec.inputs] == [(1, 3, 160, 160)]
    assert not spec.torch_module.training
    # Its batch norms measured: the output depends on the input, so an output check means something.
    assert _sensitivity(spec.torch_module, (1, 3, 160, 160)) > 1e-2


def test_calibrated_batch_norms_keep_a_deep_random_network_input_dependent():
    def build():
        torch.manual_seed(0)
        layers = []
        for _ in range(12):  # GoogLeNet's init: weights of std 0.01, statistics mean 0, variance 1
            conv = torch.nn.Conv2d(8, 8, 3, padding=1)
            torch.nn.init.trunc_normal_(conv.weight, std=0.01)
            layers += [conv, torch.nn.BatchNorm2d(8), torch.nn.ReLU()]
        return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 1), *layers, torch.nn.AdaptiveAvgPool2d(1),
                                   torch.nn.Flatten(), torch.nn.Linear(8, 4)).eval()  # fmt: skip

    shape = (1, 3, 16, 16)
    assert _sensitivity(build(), shape) < 1e-6  # as built: the output is the last bias
    calibrated = _calibrated(build(), shape)
    assert not calibrated.training
    assert _sensitivity(calibrated, shape) > 1e-2
    again = _calibrated(build(), shape)  # seeded: the same statistics every time
    norms = [(a, b) for a, b in zip(calibrated.modules(), again.modules(), strict=True)
             if isinstance(a, torch.nn.BatchNorm2d)]  # fmt: skip
    assert norms and all(torch.equal(a.running_var, b.running_var) for a, b in norms)
    assert all(a.momentum == 0.1 for a, _ in norms)  # the module's own momentum back in place


@pytest.mark.parametrize(("model", "package", "known"), [
    ("torchvision:nope", "torchvision", "mobilenet_v3_large"),
    ("timm:nope_net", "timm", "resnet18"),
    ("hf:nope-base", "transformers", "distilbert"),
])  # fmt: skip
def test_unknown_name_says_how_to_list_the_valid_ones(model, package, known):
    _needs(package, "vision" if package != "transformers" else "hf")
    with pytest.raises(UnknownModelError) as info:
        load_model(model)
    text = str(info.value)
    prefix = model.partition(":")[0]
    assert f"print(model_names('{prefix}'))" in text and "\n" not in text
    # The command it gives works here (a plain `import torchvision` may not: see the frontend).
    assert known in model_names(prefix)


def test_a_close_name_is_suggested():
    _needs("torchvision", "vision")
    with pytest.raises(UnknownModelError, match="did you mean resnet50"):
        load_model("torchvision:resnet05")


def test_detection_models_are_refused_in_one_line():
    _needs("torchvision", "vision")
    with pytest.raises(UnknownModelError, match="detection model"):
        load_model("torchvision:fasterrcnn_resnet50_fpn")


@pytest.mark.parametrize(("model", "module", "extra"), [
    ("timm:resnet18", "timm", "vision"),
    ("hf:gpt2", "transformers", "hf"),
])  # fmt: skip
def test_missing_package_gives_the_install_hint(monkeypatch, model, module, extra):
    # None in sys.modules makes `import module` fail as it does where the package is absent.
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(UnknownModelError, match=rf"needs {module}.*pip install -e '\.\[{extra}\]'"):
        load_model(model)


@pytest.mark.parametrize(("model", "options", "match"), [
    ("hf:gpt2", {"image_size": 64}, "--image-size does not apply"),
    ("torchvision:resnet18", {"seq_len": 8}, "--seq-len does not apply"),
    ("model.onnx", {"seq_len": 8}, "does not apply to an ONNX file"),
    ("resnet50", {"seq_len": 8}, "--seq-len does not apply to zoo model resnet50"),
    ("torchvision:resnet18", {"image_size": 0}, "--image-size must be a positive integer"),
])  # fmt: skip
def test_options_that_do_not_apply_are_refused(model, options, match):
    with pytest.raises(UserInputError, match=match):
        load_model(model, **options)


def test_hf_names_map_to_their_model_type():
    types = ["bert", "distilbert", "gpt2", "roberta", "gpt_neo", "opt", "xlm-roberta"]
    assert _hf_model_type("bert-base-uncased", types) == "bert"
    assert _hf_model_type("distilbert-base-uncased", types) == "distilbert"
    assert _hf_model_type("gpt2", types) == "gpt2"
    assert _hf_model_type("roberta-base", types) == "roberta"
    assert _hf_model_type("xlm-roberta-base", types) == "xlm-roberta"
    assert _hf_model_type("EleutherAI/gpt-neo-125m", types) == "gpt_neo"
    assert _hf_model_type("facebook/opt-125m", types) == "opt"
    assert _hf_model_type("t5-small", types) is None
    assert is_ecosystem_model("hf:gpt2") and not is_ecosystem_model("tests.frontends.torch_models:small_cnn")


def test_export_failure_names_the_cause_and_the_onnx_path():
    from tuner.frontends.pytorch import export_module

    class DataDependent(torch.nn.Module):
        def forward(self, x):
            return x if x.sum() > 0 else -x  # Python control flow on a value: torch.export refuses it

    with pytest.raises(UnknownModelError) as info:
        export_module(DataDependent(), (torch.ones(4),), "dd")
    text = str(info.value)
    assert "\n" not in text and "torch.onnx.export" in text and "--model dd.onnx" in text


def test_the_torch_module_stays_with_the_spec_but_is_not_pickled():
    spec = load_model("tests.frontends.torch_models:small_cnn")
    assert isinstance(spec.torch_module, torch.nn.Module) and not spec.torch_module.training
    copy = pickle.loads(pickle.dumps(spec))
    assert copy.torch_module is None and copy.name == spec.name
