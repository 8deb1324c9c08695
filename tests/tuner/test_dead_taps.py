"""Cutting a dilated conv's taps that read only padding (tuner.graph.dead_taps)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

from tuner.graph.dead_taps import live_taps, prune_dead_taps, tap_bands
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
    ("shape", "weight_shape", "attrs", "kernels"),
    [
        ((1, 8, 9, 9), (4, 8, 3, 3), {"padding": 10, "dilation": 10}, [(1, 1)]),  # the atrous case: a 1x1 conv
        ((1, 8, 4, 12), (4, 8, 3, 3), {"padding": 5, "dilation": 5}, [(1, 2), (1, 3), (1, 2)]),  # 1 row band
        ((1, 8, 9, 9), (8, 1, 3, 3), {"padding": 10, "dilation": 10, "groups": 8}, [(1, 1)]),  # depthwise
        # strided, 5 taps: bands of 2, 1 and 2 positions reading taps 2-3, 2 and 1-2 of each axis
        ((1, 8, 10, 10), (4, 8, 5, 5), {"padding": 12, "dilation": 6, "strides": 2},
         [(2, 2), (2, 1), (2, 2), (1, 2), (1, 1), (1, 2), (2, 2), (2, 1), (2, 2)]),
        # the 33x33 map at dilation 24: corners read 2x2 taps, edges 2x1, the centre one tap
        ((1, 4, 33, 33), (4, 4, 3, 3), {"padding": 24, "dilation": 24},
         [(2, 2), (2, 1), (2, 2), (1, 2), (1, 1), (1, 2), (2, 2), (2, 1), (2, 2)]),
        ((1, 8, 9, 9), (4, 8, 3, 3), {"dilation": 2}, [(3, 3)]),  # every tap live: kept
        # 25% of the work reads padding: below MIN_SAVING, kept whole
        ((1, 8, 20, 20), (4, 8, 3, 3), {"padding": 4, "dilation": 4}, [(3, 3)]),
        ((1, 8, 3, 3), (4, 8, 3, 3), {"padding": 1}, [(3, 3)]),  # undilated: its border is not a region
    ],
)  # fmt: skip
def test_a_cut_conv_computes_what_the_whole_one_did(shape, weight_shape, attrs, kernels):
    mod = _conv_module(shape, weight_shape, **attrs)
    cut = prune_dead_taps(mod)
    convs = conv_calls(cut)
    assert [tuple(int(v) for v in c.args[1].ty.shape.values[2:]) for c in convs] == kernels
    if kernels == [tuple(weight_shape[2:])]:
        assert cut.same_as(mod) or tvm_ffi.structural_equal(cut, mod)
    for conv, kernel in zip(convs, kernels, strict=True):  # a one-tap axis is written without its dilation
        assert [int(d) for d in conv.attrs.dilation] == [
            attrs.get("dilation", 1) if k > 1 else 1 for k in kernel]
    x = np.random.default_rng(1).standard_normal(shape).astype("float32")
    np.testing.assert_allclose(_run(cut, x), _run(mod, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("dilation", "saving"), [(12, 1 - (75 / 99) ** 2), (24, 1 - (51 / 99) ** 2)])
def test_the_atrous_pyramids_regions_skip_the_padding_reads(dilation, saving):
    """Dilation 12 and 24 on a 33x33 map: the regions do only the multiply-adds that read data."""
    bands = tap_bands(33, 33, 3, 1, dilation, dilation)
    macs = sum(len(b.outputs) * len(b.taps) for b in bands)
    assert 1 - (macs / 99) ** 2 == pytest.approx(saving)
    lo, hi = sorted((dilation, 33 - dilation))
    assert [b.outputs for b in bands] == [range(0, lo), range(lo, hi), range(hi, 33)]
    for b in bands:  # every window lies inside the input: no padding left to read
        assert 0 <= b.start < b.stop <= 33


def test_a_position_that_reads_only_padding_has_no_bands():
    assert tap_bands(4, 6, 3, 1, 1, 4) == []


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
