"""Bilinear resizes legalized as two one-axis passes compute what TVM's resize2d computes."""

import numpy as np
import pytest
import tvm
from tvm import relax

from tuner.graph.layout.plan import LayoutPlan
from tuner.graph.layout.rewrites import prepare
from tuner.graph.separable_resize import source_coordinates


def _run(mod: tvm.IRModule, target: tvm.target.Target, inputs: list[np.ndarray]) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(x) for x in inputs]).numpy()


def _resize_model(shape: tuple[int, ...], size: tuple[int, int], conv: bool = False, **attrs) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = x
            if conv:  # a segmentation head: a 1x1 conv to the classes, then the upsampling
                w = np.random.default_rng(1).standard_normal((5, shape[1], 1, 1)).astype("float32")
                y = bb.emit(relax.op.nn.conv2d(x, relax.const(w)))
            out = bb.emit_output(relax.op.image.resize2d(y, size, **attrs))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize(("shape", "size", "mode"), [
    ((1, 3, 5, 7), (17, 23), "half_pixel"),          # upsampling: width first
    ((1, 3, 20, 4), (5, 30), "half_pixel"),          # height shrinks: height first
    ((1, 3, 9, 9), (4, 5), "half_pixel"),            # downsampling
    ((1, 3, 5, 7), (17, 23), "align_corners"),
    ((1, 3, 5, 7), (17, 23), "asymmetric"),
    ((1, 3, 5, 7), (1, 23), "pytorch_half_pixel"),   # one output row reads row 0
    ((1, 3, 6, 6), (6, 12), "half_pixel"),           # one axis keeps its size
    ((2, 3, 4, 4), (9, 9), "half_pixel"),            # batch 2
])  # fmt: skip
def test_separable_resize_matches_tvm(cpu_device, shape, size, mode):
    mod = _resize_model(shape, size, coordinate_transformation_mode=mode)
    prepared = prepare(mod, cpu_device.target, LayoutPlan("NCHW"))
    script = prepared.script()
    assert "resize_cols" in script or "resize_rows" in script
    inputs = [np.random.default_rng(0).uniform(-1, 1, shape).astype("float32")]
    want = _run(mod, cpu_device.target, inputs)
    got = _run(prepared, cpu_device.target, inputs)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=5e-7)


def test_segmentation_head_in_a_blocked_plan(cpu_device):
    """conv -> bilinear upsampling (DeepLab's head) under the CPU's blocked layout."""
    mod = _resize_model((1, 8, 9, 9), (40, 40), conv=True)
    prepared = prepare(mod, cpu_device.target, LayoutPlan.for_target(cpu_device.target))
    assert "resize_cols" in prepared.script()
    inputs = [np.random.default_rng(2).uniform(-1, 1, (1, 8, 9, 9)).astype("float32")]
    want = _run(mod, cpu_device.target, inputs)
    np.testing.assert_allclose(_run(prepared, cpu_device.target, inputs), want, rtol=0, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("attrs", [{"method": "nearest_neighbor"}, {"method": "cubic"},
                                   {"coordinate_transformation_mode": "tf_half_pixel_for_nn"}])
def test_other_resizes_stay_tvms(cpu_device, attrs):
    mod = _resize_model((1, 2, 4, 4), (8, 8), **attrs)
    prepared = prepare(mod, cpu_device.target, LayoutPlan("NCHW"))
    assert "resize_cols" not in prepared.script() and "resize_rows" not in prepared.script()
    inputs = [np.random.default_rng(3).uniform(-1, 1, (1, 2, 4, 4)).astype("float32")]
    np.testing.assert_allclose(_run(prepared, cpu_device.target, inputs), _run(mod, cpu_device.target, inputs))


def test_source_coordinates_of_an_upsampling():
    """x2 with half pixels: output 0 sits at -0.25 (both neighbours clamp to 0), output 1 at
    0.25 between inputs 0 and 1, the last at 3.25 past the edge (clamped to 3)."""
    lo, hi, t = source_coordinates(4, 8, "half_pixel")
    assert lo.tolist() == [0, 0, 0, 1, 1, 2, 2, 3]
    assert hi.tolist() == [0, 1, 1, 2, 2, 3, 3, 3]
    np.testing.assert_allclose(t, [0.75, 0.25, 0.75, 0.25, 0.75, 0.25, 0.75, 0.25])
