"""Padding poorly divided conv channels to whole vector blocks (tuner.graph.layout.channel_pad)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from tuner.graph.layout.channel_pad import pad_channels, padded_channels
from tuner.graph.layout.plan import LayoutPlan, channel_block, conv_calls
from tuner.graph.layout.rewrites import prepare
from tuner.graph.tasks import extract_tasks


@pytest.mark.parametrize(
    ("channels", "block", "padded"),
    [(58, 16, 64), (116, 16, 128), (58, 8, 64), (116, 8, 120), (232, 16, 240), (120, 16, 128), (72, 16, 80),
     (24, 16, None), (40, 16, None), (64, 16, None), (120, 8, None), (8, 16, None), (20, 16, None), (1, 16, None)],
)  # fmt: skip
def test_which_channel_counts_are_padded(channels, block, padded):
    """Padded to whole blocks where that is at most an eighth more work: ShuffleNet-V2's 58 and
    116, MNASNet's 120 and 72 on 16 lanes; not 24 or 40 (a third and a fifth more)."""
    assert padded_channels(channels, block) == padded


@pytest.mark.parametrize(
    ("channels", "block", "want"),
    [(3, 16, 3), (16, 16, 16), (48, 16, 16), (24, 16, 8), (120, 16, 8), (72, 16, 8), (40, 16, 8), (58, 16, 2),
     (116, 16, 4), (20, 16, 4), (120, 8, 8), (12, 16, 12)],
)  # fmt: skip
def test_channel_block_is_a_power_of_two_past_one_block(channels, block, want):
    """Past one block, a conv's channel block is a power of two (120 channels: 8, not 15)."""
    assert channel_block(channels, block) == want


def _shuffle_unit(rng: np.random.Generator) -> tvm.IRModule:
    """ShuffleNet-V2's pattern with 58-channel branches: conv+bias+ReLU, a depthwise conv, a
    residual add, a concatenation, the channel shuffle, a split, a depthwise conv on a split
    half (its input padded in front of it), global pooling feeding a dense layer."""

    def const(*shape: int) -> relax.Constant:
        return relax.const(rng.standard_normal(shape).astype("float32") * 0.3)

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 24, 8, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            b1 = bb.emit(relax.op.nn.relu(relax.op.add(relax.op.nn.conv2d(x, const(58, 24, 1, 1)), const(1, 58, 1, 1))))
            b2 = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(x, const(58, 24, 1, 1))))
            b2 = bb.emit(relax.op.nn.conv2d(b2, const(58, 1, 3, 3), padding=1, groups=58))
            b2 = bb.emit(relax.op.add(b2, const(1, 58, 1, 1)))
            b2 = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(b2, const(58, 58, 1, 1))))
            b2 = bb.emit(relax.op.add(b2, b1))
            cat = bb.emit(relax.op.concat([b1, b2], axis=1))
            shuffled = bb.emit(relax.op.reshape(relax.op.permute_dims(relax.op.reshape(cat, (1, 2, 58, 8, 8)),
                                                                      [0, 2, 1, 3, 4]), (1, 116, 8, 8)))  # fmt: skip
            half = bb.emit(relax.TupleGetItem(bb.emit(relax.op.split(shuffled, [58], axis=1)), 1))
            y = bb.emit(relax.op.nn.conv2d(half, const(58, 1, 3, 3), padding=1, groups=58))
            y = bb.emit(relax.op.nn.conv2d(relax.op.nn.relu(y), const(32, 58, 1, 1)))
            y = bb.emit(relax.op.add(y, relax.op.nn.conv2d(half, const(32, 58, 1, 1))))
            pooled = bb.emit(relax.op.mean(y, axis=[2, 3]))
            out = bb.emit_output(relax.op.matmul(pooled, const(32, 10)))
        bb.emit_func_output(out)
    return bb.get()


def _run(mod: tvm.IRModule, target: tvm.target.Target, x: np.ndarray) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def test_padding_is_carried_forward_and_cut_where_it_must_be():
    rng = np.random.default_rng(0)
    mod = _shuffle_unit(rng)
    padded, count = pad_channels(mod, ["NCHW16c"] * len(conv_calls(mod)))
    # The three 58-channel convs and both depthwise convs; the last two write 32 (whole blocks).
    assert count == 5
    convs = conv_calls(padded)
    assert len(convs) == len(conv_calls(mod))
    assert [int(c.ty.shape.values[1]) for c in convs] == [64, 64, 64, 64, 64, 32, 32]
    # The last conv reads a split half of 58 channels: padded in front of it, read as 64.
    assert [int(c.args[1].ty.shape.values[1]) for c in convs] == [24, 24, 1, 64, 1, 64, 64]
    script = padded.script()
    assert script.count("channel_cut") >= 1 and "channel_pad" in script
    # NCHW plans leave the graph alone.
    assert pad_channels(mod, ["NCHW"] * 7) == (mod, 0)


@pytest.mark.parametrize("plan", [LayoutPlan("NCHW16c"), LayoutPlan("NCHW8c"), LayoutPlan("NCHW", ("NCHW16c",) * 3),
                                  LayoutPlan("NCHW16c", ("NCHW",) * 6)])  # fmt: skip
def test_padded_plans_compute_what_nchw_computes(cpu_device, plan):
    rng = np.random.default_rng(1)
    mod = _shuffle_unit(rng)
    x = rng.uniform(-1, 1, (1, 24, 8, 8)).astype("float32")
    want = _run(mod, cpu_device.target, x)
    got = _run(prepare(mod, cpu_device.target, plan), cpu_device.target, x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def test_padded_convs_are_tuned_in_whole_blocks(cpu_device):
    """The 58-channel convs' tasks are NCHW16c (64 channels), not NCHW2c."""
    mod = _shuffle_unit(np.random.default_rng(2))
    layouts = {t.layout for t in extract_tasks(mod, cpu_device.target, LayoutPlan("NCHW16c")) if t.layout}
    assert "NCHW2c" not in layouts and "NCHW16c" in layouts


def _hard_swish_unit(rng: np.random.Generator) -> tvm.IRModule:
    """MobileNet-V3's pattern on 120 channels: conv, hard-swish as ONNX writes it (x * min(max(x
    + 3, 0), 6) / 6, scalars of no rank), a depthwise conv, hard-swish again, a 1x1 conv to 24 and its bias."""

    def const(*shape: int) -> relax.Constant:
        return relax.const(rng.standard_normal(shape).astype("float32") * 0.3)

    def scalar(value: float) -> relax.Constant:
        return relax.const(np.float32(value))

    def hard_swish(bb: relax.BlockBuilder, x: relax.Expr) -> relax.Var:
        gate = relax.op.minimum(relax.op.maximum(relax.op.add(x, scalar(3.0)), scalar(0.0)), scalar(6.0))
        return bb.emit(relax.op.divide(relax.op.multiply(x, bb.emit(gate)), scalar(6.0)))

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 24, 8, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = hard_swish(bb, bb.emit(relax.op.add(relax.op.nn.conv2d(x, const(120, 24, 1, 1)), const(1, 120, 1, 1))))
            y = hard_swish(bb, bb.emit(relax.op.nn.conv2d(y, const(120, 1, 5, 5), padding=2, groups=120)))
            y = bb.emit(relax.op.nn.conv2d(y, const(24, 120, 1, 1)))
            out = bb.emit_output(relax.op.add(y, const(1, 24, 1, 1)))
        bb.emit_func_output(out)
    return bb.get()


def test_padding_is_carried_through_scalar_operands(cpu_device):
    """Hard-swish's scalar arithmetic keeps the padding: no cut and re-pad around it."""
    rng = np.random.default_rng(3)
    mod = _hard_swish_unit(rng)
    padded, count = pad_channels(mod, ["NCHW16c"] * len(conv_calls(mod)))
    assert count == 2
    assert [int(c.ty.shape.values[1]) for c in conv_calls(padded)] == [128, 128, 24]
    assert "channel_cut" not in padded.script()
    x = rng.uniform(-1, 1, (1, 24, 8, 8)).astype("float32")
    want = _run(mod, cpu_device.target, x)
    got = _run(prepare(mod, cpu_device.target, LayoutPlan("NCHW16c")), cpu_device.target, x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
