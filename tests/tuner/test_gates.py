"""Squeeze-excitation gates: the gate conv's function ends at its activation, the broadcast
multiply runs as a function of its own, and the model computes what it computed before."""

import numpy as np
import pytest
import tvm
from tvm import relax

from tuner.graph.gates import MIN_EXPANSION, gate_vars
from tuner.graph.layout.plan import LayoutPlan
from tuner.graph.layout.rewrites import prepare
from tuner.graph.tasks import extract_tasks


def _run(mod: tvm.IRModule, target: tvm.target.Target, inputs: list[np.ndarray]) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(x) for x in inputs]).numpy()


def _se_block(channels: int = 32, size: int = 6, sigmoid: bool = False, gate_from_input: bool = False) -> tvm.IRModule:
    """MobileNet-V3's block: depthwise conv, squeeze-excitation (mean, conv, ReLU, conv,
    hard sigmoid or sigmoid, multiply), project conv. ``gate_from_input``: the scale is the
    mean of the input itself, with no conv between (not a gate)."""
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, channels, size, size), "float32"))

    def const(*shape: int) -> relax.Expr:
        return relax.const((rng.standard_normal(shape) * 0.3).astype("float32"))

    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(x, const(channels, 1, 3, 3), padding=1, groups=channels)))
            p = bb.emit(relax.op.mean(y, axis=[2, 3], keepdims=True))
            if gate_from_input:
                g = p
            else:
                s = bb.emit(relax.op.nn.relu(relax.op.add(relax.op.nn.conv2d(p, const(8, channels, 1, 1)),
                                                          const(1, 8, 1, 1))))  # fmt: skip
                g = bb.emit(relax.op.add(relax.op.nn.conv2d(s, const(channels, 8, 1, 1)), const(1, channels, 1, 1)))
                if sigmoid:
                    g = bb.emit(relax.op.sigmoid(g))
                else:
                    g = bb.emit(relax.op.divide(relax.op.clip(relax.op.add(g, relax.const(3.0)), 0, 6),
                                                relax.const(6.0)))  # fmt: skip
            z = bb.emit(relax.op.multiply(y, g))
            out = bb.emit_output(relax.op.nn.conv2d(z, const(channels, channels, 1, 1)))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("layout", ["NCHW", "NCHW8c", "NCHW16c"])
@pytest.mark.parametrize("sigmoid", [False, True])
def test_gate_multiply_is_a_function_of_its_own(cpu_device, layout, sigmoid):
    mod = _se_block(sigmoid=sigmoid)
    tasks = extract_tasks(mod, cpu_device.target, LayoutPlan(layout))
    names = [t.name for t in tasks]
    assert "gate_multiply" in names, names
    # No conv's function multiplies: the gate conv ends at its activation.
    assert not [n for n in names if "conv2d" in n and "multiply" in n], names
    inputs = [np.random.default_rng(1).uniform(-1, 1, (1, 32, 6, 6)).astype("float32")]
    want = _run(mod, cpu_device.target, inputs)
    got = _run(prepare(mod, cpu_device.target, LayoutPlan(layout)), cpu_device.target, inputs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_scale_not_computed_by_a_conv_is_not_a_gate(cpu_device):
    """The mean of the block's own feature map is a reduction, not a conv's output: its
    multiply legalizes as TVM does."""
    tasks = extract_tasks(_se_block(gate_from_input=True), cpu_device.target, LayoutPlan("NCHW"))
    assert "gate_multiply" not in [t.name for t in tasks]


def test_a_gate_on_a_small_map_stays_fused(cpu_device):
    """A gate broadcast over fewer than MIN_EXPANSION positions is left to FuseOps."""
    size = 1
    assert size * size < MIN_EXPANSION
    tasks = extract_tasks(_se_block(size=size), cpu_device.target, LayoutPlan("NCHW"))
    assert "gate_multiply" not in [t.name for t in tasks]


def test_gate_vars_follow_elementwise_ops_back_to_a_conv():
    func = _se_block()["main"]
    gates = gate_vars(func)
    bound = {b.var: b.value for block in func.body.blocks for b in block.bindings}
    # The hard sigmoid's output is a gate; the mean (a reduction of the block's feature map)
    # is not. The feature map itself, a ReLU of a conv, is conv-derived too: which operand a
    # multiply broadcasts is the legalization's to see (MIN_EXPANSION).
    multiply = next(v for v in bound.values() if isinstance(v, relax.Call) and v.op.name == "relax.multiply")
    assert multiply.args[1] in gates
    mean = next(k for k, v in bound.items() if isinstance(v, relax.Call) and v.op.name == "relax.mean")
    assert mean not in gates
