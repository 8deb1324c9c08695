"""Channel-moving chains gathered in one pass (tuner.graph.layout.channel_moves)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from tests.tuner.test_channel_pad import _run, _shuffle_unit
from tuner.graph.layout.plan import LayoutPlan
from tuner.graph.layout.rewrites import prepare
from tuner.graph.tasks import extract_tasks


def _calls(mod: tvm.IRModule) -> list[str]:
    names: list[str] = []

    def visit(expr: relax.Expr) -> None:
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == "relax.call_tir":
            names.append(str(expr.args[0].name_hint))

    relax.analysis.post_order_visit(mod["main"].body, visit)
    return names


@pytest.mark.parametrize("plan", [LayoutPlan("NCHW16c"), LayoutPlan("NCHW8c")])
def test_the_channel_shuffle_becomes_gathers_between_blocked_convs(cpu_device, plan):
    """The shuffle unit's transforms, cuts, concatenation, reshapes, transpose and split are
    gone: each tensor a conv reads is gathered from the blocked convs' outputs directly."""
    rng = np.random.default_rng(3)
    mod = _shuffle_unit(rng)
    prepared = prepare(mod, cpu_device.target, plan)
    names = _calls(prepared)
    assert sum(n.startswith("channel_gather") for n in names) == 2
    assert not [n for n in names if n.startswith(("concatenate", "transpose", "split", "reshape", "channel_cut"))]
    # The graph's own input and output transforms are all that is left of the layout changes.
    assert sum(n.startswith("layout_transform") for n in names) <= 3
    x = rng.uniform(-1, 1, (1, 24, 8, 8)).astype("float32")
    want, got = _run(mod, cpu_device.target, x), _run(prepared, cpu_device.target, x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    # The gathers are tasks of the model like any other operator.
    assert any("channel_gather" in t.name for t in extract_tasks(mod, cpu_device.target, plan))


def test_a_chain_that_moves_pixels_is_left_alone(cpu_device):
    """A transpose of the spatial axes with a split is not a channel move: kept as it is."""
    rng = np.random.default_rng(4)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 6, 6), "float32"))
    w = relax.const(rng.standard_normal((16, 16, 1, 1)).astype("float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w))
            t = bb.emit(relax.op.permute_dims(y, [0, 1, 3, 2]))
            parts = bb.emit(relax.op.split(t, 2, axis=1))
            z = bb.emit(relax.op.nn.conv2d(bb.emit(relax.TupleGetItem(parts, 1)), relax.const(
                rng.standard_normal((16, 8, 1, 1)).astype("float32"))))  # fmt: skip
            out = bb.emit_output(z)
        bb.emit_func_output(out)
    mod = bb.get()
    prepared = prepare(mod, cpu_device.target, LayoutPlan("NCHW16c"))
    assert not [n for n in _calls(prepared) if n.startswith("channel_gather")]
    xv = rng.uniform(-1, 1, (1, 16, 6, 6)).astype("float32")
    np.testing.assert_allclose(_run(prepared, cpu_device.target, xv), _run(mod, cpu_device.target, xv), rtol=1e-4,
                               atol=1e-4)  # fmt: skip
