"""Cutting a dilated conv's taps that read only padding (tuner.graph.dead_taps)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

from tuner.graph.dead_taps import live_taps, prune_dead_taps
from tuner.graph.layout.plan import conv_calls


@pytest.mark.parametrize(
    ("size", "dilation", "expected"),
    [(33, 36, range(1, 2)), (33, 24, range(0, 3)), (33, 12, range(0, 3)), (5, 5, range(1, 2)), (5, 4, range(0, 3))],
)  # fmt: skip
def test_live_taps_of_a_3_tap_axis_padded_by_its_dilation(size, dilation, expected):
    """DeepLab's atrous pyramid on a 33x33 map: dilation 36 leaves the centre tap alone."""
    assert live_taps(size, size, 3, 1, dilation, dilation) == expected


def _conv_module(shape, weight_shape, **attrs) -> tvm.IRModule:
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.const(rng.standard_normal(weight_shape).astype("float32"))
            out = bb.emit_output(relax.op.nn.relu(relax.op.nn.conv2d(x, w, **attrs)))
        bb.emit_func_output(out)
    return bb.get()


def _run(mod: tvm.IRModule, x: np.ndarray) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


@pytest.mark.parametrize(
    ("shape", "weight_shape", "attrs", "kernel"),
    [
        ((1, 8, 9, 9), (4, 8, 3, 3), {"padding": 10, "dilation": 10}, (1, 1)),  # the atrous case: a 1x1 conv
        ((1, 8, 4, 12), (4, 8, 3, 3), {"padding": 5, "dilation": 5}, (1, 3)),  # one axis only
        ((1, 8, 9, 9), (8, 1, 3, 3), {"padding": 10, "dilation": 10, "groups": 8}, (1, 1)),  # depthwise
        ((1, 8, 10, 10), (4, 8, 5, 5), {"padding": 12, "dilation": 6, "strides": 2}, (3, 3)),  # strided, 5 taps
        ((1, 8, 9, 9), (4, 8, 3, 3), {"padding": 4, "dilation": 4}, (3, 3)),  # every tap live: kept
    ],
)  # fmt: skip
def test_a_cut_conv_computes_what_the_whole_one_did(shape, weight_shape, attrs, kernel):
    mod = _conv_module(shape, weight_shape, **attrs)
    cut = prune_dead_taps(mod)
    (conv,) = conv_calls(cut)
    assert tuple(int(v) for v in conv.args[1].ty.shape.values[2:]) == kernel
    if kernel == tuple(weight_shape[2:]):
        assert cut.same_as(mod) or tvm_ffi.structural_equal(cut, mod)
    else:  # a one-tap axis is written without its dilation
        assert [int(d) for d in conv.attrs.dilation] == [
            attrs["dilation"] if k > 1 else 1 for k in kernel]
    x = np.random.default_rng(1).standard_normal(shape).astype("float32")
    np.testing.assert_allclose(_run(cut, x), _run(mod, x), rtol=1e-5, atol=1e-5)


def test_a_conv_whose_weight_is_an_input_is_left_alone():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 9, 9), "float32"))
    w = relax.Var("w", relax.TensorType((4, 8, 3, 3), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.conv2d(x, w, padding=10, dilation=10))
        bb.emit_func_output(out)
    mod = bb.get()
    assert tvm_ffi.structural_equal(prune_dead_taps(mod), mod)
