import numpy as np
import pytest
import tvm
from tvm import relax

from tuner.errors import UnknownModelError
from tuner.frontends import load_model

torch = pytest.importorskip("torch", reason="the torch extra is not installed")


def test_torch_factory_imports_and_matches_pytorch():
    spec = load_model("tests.frontends.torch_models:small_cnn", batch_size=2)
    assert [(i.shape, i.dtype) for i in spec.inputs] == [((2, 3, 16, 16), "float32")]
    ex = tvm.compile(spec.bound(), target=tvm.target.Target({"kind": "llvm"}))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    x = spec.random_inputs()[0]
    got = vm["main"](tvm.runtime.tensor(x))
    got = (got[0] if not isinstance(got, tvm.runtime.Tensor) else got).numpy()
    from tests.frontends.torch_models import small_cnn

    module, _ = small_cnn(batch_size=2)
    with torch.no_grad():
        want = module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("spec", "match"), [
    ("tests.frontends.torch_models:nope", "cannot import"),
    ("tests.frontends.torch_models:not_a_factory", "must return"),
    ("no_such_pkg_abc:f", "cannot import"),
])  # fmt: skip
def test_bad_factories(spec, match):
    with pytest.raises(UnknownModelError, match=match):
        load_model(spec)
