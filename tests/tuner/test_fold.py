"""Numpy constant folding gives TVM's FoldConstant's values, without building anything."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from tuner.graph.fold import fold_constants


def _calls(mod: tvm.IRModule) -> list[str]:
    return [b.value.op.name for blk in mod["main"].body.blocks for b in blk.bindings
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)]


def _weights_module(rng: np.random.Generator) -> tvm.IRModule:
    """A conv whose weights go through batch-norm arithmetic and a blocked re-layout."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 32, 8, 8), "float32"))
    w = relax.const(rng.standard_normal((32, 32, 3, 3)).astype("float32"))
    var = relax.const(rng.uniform(0.5, 2.0, 32).astype("float32"))
    gamma = relax.const(rng.standard_normal(32).astype("float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            std = bb.emit(relax.op.sqrt(relax.op.add(var, relax.const(1e-5, "float32"))))
            scale = bb.emit(relax.op.divide(gamma, std))
            scale4 = bb.emit(relax.op.reshape(scale, (32, 1, 1, 1)))
            wt = bb.emit(relax.op.multiply(w, scale4))
            blocked = bb.emit(relax.op.layout_transform(
                wt, lambda o, i, h, ww: (o // 16, i // 16, h, ww, i % 16, o % 16)))
            back = bb.emit(relax.op.layout_transform(
                blocked, lambda oo, io, h, ww, ii, oi: (oo * 16 + oi, io * 16 + ii, h, ww)))
            y = bb.emit(relax.op.nn.conv2d(x, back, padding=1))
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    return bb.get()


def _run(mod: tvm.IRModule, x: np.ndarray) -> np.ndarray:
    target = tvm.target.Target({"kind": "llvm"})
    ex = tvm.compile(mod, target=target)
    return relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


def test_weight_arithmetic_is_folded_to_tvms_values() -> None:
    rng = np.random.default_rng(0)
    mod = _weights_module(rng)
    folded = fold_constants(mod)
    assert _calls(folded) == ["relax.nn.conv2d", "relax.nn.relu"]
    reference = relax.transform.FoldConstant()(mod)
    x = rng.standard_normal((1, 32, 8, 8)).astype("float32")
    np.testing.assert_allclose(_run(folded, x), _run(reference, x), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_run(folded, x), _run(mod, x), rtol=1e-5, atol=1e-5)


def test_calls_on_runtime_values_are_kept() -> None:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(x, relax.const(np.ones(4, "float32"))))
        bb.emit_func_output(out)
    assert _calls(fold_constants(bb.get())) == ["relax.add"]


@pytest.mark.parametrize("model", ["resnet18"])
def test_zoo_model_has_no_constant_batch_norm_arithmetic_left(model: str) -> None:
    from tuner.frontends import load_model

    mod = load_model(model).bound()
    left = _calls(mod)
    assert "relax.sqrt" not in left and "relax.expand_dims" not in left


@pytest.mark.parametrize("axis_scale", [False, True])
def test_a_qdq_weight_dequantize_is_folded_to_tvms_values(axis_scale: bool) -> None:
    """int8 weights with per-tensor or per-channel (axis 0) scales and zero points, as QDQ
    models store them: numpy gives what TVM's FoldConstant (its legalized dequantize) gives."""
    rng = np.random.default_rng(3)
    q = relax.const(rng.integers(-127, 128, (8, 4)).astype("int8"))
    scale = relax.const(rng.uniform(0.01, 0.1, 8 if axis_scale else ()).astype("float32"))
    zero = relax.const(rng.integers(-3, 4, 8 if axis_scale else ()).astype("int8"))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            w = bb.emit(relax.op.dequantize(q, scale, zero, axis=0))
            out = bb.emit_output(relax.op.matmul(x, w))
        bb.emit_func_output(out)
    mod = bb.get()
    folded = fold_constants(mod)
    assert "relax.dequantize" not in _calls(folded)
    want = relax.transform.FoldConstant()(mod)
    np.testing.assert_array_equal(_matmul_weight(folded), _matmul_weight(want))


def _matmul_weight(mod: tvm.IRModule) -> np.ndarray:
    bindings = {b.var: b.value for blk in mod["main"].body.blocks for b in blk.bindings}
    call = next(v for v in bindings.values() if isinstance(v, relax.Call) and v.op.name == "relax.matmul")
    w = call.args[1]
    return bindings.get(w, w).value.numpy()
