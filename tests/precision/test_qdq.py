"""int8 from a QDQ model written by onnxruntime's quantize_static, against ONNX Runtime's own
int8 execution of the same file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tuner.compile import compile_model
from tuner.db import TuningDatabase
from tuner.device import host_cpu_info, parse_device
from tuner.frontends import load_model
from tuner.graph.layout.plan import LayoutPlan
from tuner.graph.tasks import extract_tasks
from tuner.measure.verify import arg_specs
from tuner.precision.accuracy import run_outputs
from tuner.precision.qdq import ACTIVATION_MATMUL, qdq_as_elementwise, quantize_weight, to_int8

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")


def _small_model(path: Path, classes: int = 32) -> None:
    """conv 3x3 (3->16) + relu, conv 3x3 (16->16) + relu, global pool, matmul (16->classes) + add."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = {
        "w1": rng.normal(0, 0.3, (16, 3, 3, 3)), "b1": rng.normal(0, 0.1, 16),
        "w2": rng.normal(0, 0.1, (16, 16, 3, 3)), "b2": rng.normal(0, 0.1, 16),
        "wf": rng.normal(0, 0.3, (16, classes)), "bf": rng.normal(0, 0.1, classes),
    }  # fmt: skip
    node = helper.make_node
    nodes = [
        node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]), node("Relu", ["c1"], ["r1"]),
        node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]), node("Relu", ["c2"], ["r2"]),
        node("GlobalAveragePool", ["r2"], ["p"]), node("Flatten", ["p"], ["f"]),
        node("MatMul", ["f", "wf"], ["m"], name="fc"), node("Add", ["m", "bf"], ["y"]),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, classes])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


class _Calibration(quantization.CalibrationDataReader):
    def __init__(self, shape: tuple[int, ...] = (1, 3, 16, 16), seed: int = 1) -> None:
        rng = np.random.default_rng(seed)
        self._it = iter([{"x": rng.uniform(-1, 1, shape).astype(np.float32)} for _ in range(8)])

    def get_next(self):
        return next(self._it, None)


def _output_step(path: Path) -> float:
    """One step of the model's output, which is quantized (uint8) then dequantized: its scale."""
    return next(float(onnx.numpy_helper.to_array(t)) for t in onnx.load(str(path)).graph.initializer
                if t.name == "y_scale")  # fmt: skip


def _has_vnni() -> bool:
    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    return any(f in flags for f in ("avx512_vnni", "avx_vnni", "amx_int8"))


def _quantize(tmp_path: Path, exclude: list[str], classes: int = 32) -> Path:
    src, out = tmp_path / f"fp32_{classes}.onnx", tmp_path / f"qdq{len(exclude)}_{classes}.onnx"
    _small_model(src, classes)
    # Without VNNI, ONNX Runtime's u8s8 kernels use vpmaddubsw, whose int16 pair sums saturate
    # with full-range int8 weights (its docs say so), and it stops being an exact reference:
    # 7-bit weights (reduce_range) keep every pair sum in range.
    quantization.quantize_static(
        str(src), str(out), _Calibration(), quant_format=quantization.QuantFormat.QDQ, per_channel=True,
        activation_type=quantization.QuantType.QUInt8, weight_type=quantization.QuantType.QInt8,
        nodes_to_exclude=exclude, reduce_range=not _has_vnni(),
    )  # fmt: skip
    return out


@pytest.mark.parametrize("classes", [32, 30])
def test_int8_matches_onnx_runtime_int8(tmp_path, classes):
    """The whole model against ONNX Runtime's int8; 30 classes (not whole vectors) pack the
    matmul's weight with two zero columns, sliced off after it (ResNet-50's 1000 classes)."""
    path = _quantize(tmp_path, [], classes)
    spec = load_model(str(path))
    report = to_int8(spec.bound())
    assert report.rewritten == {"conv2d": 2, "matmul": 1, ACTIVATION_MATMUL: 0} and not report.unhandled
    device = parse_device("cpu")
    tasks = extract_tasks(spec.bound(), device.target, precision="int8")
    packed = [a.shape for t in tasks if "matmul_u8s8" in t.mod.script() for a in arg_specs(t.mod) if a.dtype == "int8"]
    assert packed == [(1, 4, 32, 4)], packed
    int8 = compile_model(spec, device, None, precision="int8")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    step = _output_step(path)
    for seed in range(3):
        x = spec.random_inputs(seed=seed)
        want = session.run(None, {"x": x[0]})[0]
        got = run_outputs(int8.executable, device, x)[0]
        # Integer sums are exact; only the float requantize may round the other way.
        assert np.max(np.abs(got - want)) <= step * 1.001, (seed, np.max(np.abs(got - want)), step)
        assert np.mean(got == want) > 0.9


def test_a_chain_the_pass_does_not_handle_stays_fp32_and_is_reported(tmp_path):
    spec = load_model(str(_quantize(tmp_path, ["fc"])))
    report = to_int8(spec.bound())
    assert report.rewritten == {"conv2d": 2, "matmul": 0, ACTIVATION_MATMUL: 0}
    # ONNX Runtime still quantizes fc's input (Flatten's output) but leaves its weight fp32.
    assert report.unhandled == ["matmul: weight not int8 x per-channel scale"]
    assert "1 left in fp32" in report.describe()


def _attention_model(path: Path) -> None:
    """Attention's two matmuls of activations: softmax(x @ x^T) @ x over 2 heads."""
    from onnx import TensorProto, helper

    node = helper.make_node
    nodes = [
        node("Transpose", ["x"], ["xt"], perm=[0, 1, 3, 2]), node("MatMul", ["x", "xt"], ["s"], name="scores"),
        node("Softmax", ["s"], ["p"], axis=-1), node("MatMul", ["p", "x"], ["y"], name="context"),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes, "attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 32, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 32, 64])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def test_matmuls_of_two_activations_run_exactly_on_bf16_dots(tmp_path):
    """Attention's matmuls, both operands quantized activations, as ``(qa - za) @ (qb - zb)``
    on bf16 dot products: the integer sums ONNX Runtime's int8 kernels make, exactly."""
    src, path = tmp_path / "attention.onnx", tmp_path / "attention_qdq.onnx"
    _attention_model(src)
    quantization.quantize_static(
        str(src), str(path), _Calibration((1, 2, 32, 64), seed=3), quant_format=quantization.QuantFormat.QDQ,
        activation_type=quantization.QuantType.QUInt8, weight_type=quantization.QuantType.QInt8,
    )  # fmt: skip
    spec = load_model(str(path))
    without = to_int8(spec.bound())
    assert without.rewritten[ACTIVATION_MATMUL] == 0
    assert without.unhandled == ["matmul: two activations, and no bf16 dot product on the target"] * 2
    report = to_int8(spec.bound(), bf16_dots=True)
    assert report.rewritten[ACTIVATION_MATMUL] == 2 and not report.unhandled, report.describe()
    flags = host_cpu_info()["isa_flags"]
    if "avx512_bf16" not in flags and "amx_bf16" not in flags:
        pytest.skip("this CPU has no AVX512_BF16 (or AMX-BF16): the matmuls stay fp32 here")
    device = parse_device("cpu")
    tasks = extract_tasks(spec.bound(), device.target, precision="int8")
    # The second operand packed [batch..., N/b, K/2, b, 2], as a bf16 weight is.
    packed = sorted(a.shape for t in tasks if "matmul_bf16" in t.mod.script() for a in arg_specs(t.mod)
                    if a.dtype == "bfloat16" and len(a.shape) == 6)  # fmt: skip
    assert packed == [(1, 2, 1, 16, 64, 2), (1, 2, 1, 32, 32, 2)], packed
    int8 = compile_model(spec, device, None, precision="int8")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for seed in range(3):
        x = spec.random_inputs(seed=seed)
        want = session.run(None, {"x": x[0]})[0]
        got = run_outputs(int8.executable, device, x)[0]
        # Exact integer sums; the float scaling and softmax between them may round the other way.
        err = np.abs(got - want)
        assert np.max(err) <= 0.02 * np.max(np.abs(want)), (seed, np.max(err), np.max(np.abs(want)))
        assert np.median(err) <= 1e-5 * np.max(np.abs(want)), (seed, np.median(err))


def test_quantize_weight_recovers_int8_values_exactly():
    rng = np.random.default_rng(2)
    q = rng.integers(-127, 128, size=(8, 4, 3, 3)).astype(np.int8)
    q[:, 0, 0, 0] = 127  # the max-abs element, as symmetric quantization writes it
    scale = rng.uniform(1e-3, 1e-1, 8).astype(np.float32)
    w = q.astype(np.float32) * scale[:, None, None, None]
    got = quantize_weight(w, 0)
    assert got is not None
    assert np.array_equal(got[0], q) and np.allclose(got[1], scale, rtol=1e-6)
    assert quantize_weight(rng.normal(size=(8, 4, 3, 3)).astype(np.float32), 0) is None


def test_quantize_weight_recovers_reduced_range_weights():
    """7-bit weights (onnxruntime's reduce_range: [-64, 63]) are on an int8 grid too; the
    grid found may be finer than theirs, but its products are the same weights."""
    rng = np.random.default_rng(3)
    q = rng.integers(-64, 64, size=(8, 16)).astype(np.int8)
    q[:4, 0], q[4:, 0] = 63, -64  # per channel, the peak is 63 steps or 64
    scale = rng.uniform(1e-3, 1e-1, 8).astype(np.float32)
    w = q.astype(np.float32) * scale[:, None]
    got = quantize_weight(w, 0)
    assert got is not None
    values, scales = got
    assert np.abs(values.astype(np.int32)).max() <= 127
    assert np.allclose(values.astype(np.float64) * scales[:, None], w, rtol=1e-6, atol=0)


def test_int8_convs_read_uint8_in_the_blocked_layout(tmp_path):
    """Both convs become uint8 x int8 convs in a blocked layout with OIHW{i/4}i16o4i weights
    (what vpdpbusd reads). conv2 reads relu's output (zero point 0), its input padded (18x18)
    by conv1's function (tuner.graph.pad_fusion). conv1 reads the model's input (3 channels, a
    zero point other than 0): a fourth zero-weight channel, the border padded with the zero
    point before it, the zero point's sum taken out after it. Quantize/dequantize follow the
    layout (no transform around them), and the model still matches ONNX Runtime's int8."""
    path = _quantize(tmp_path, [])
    spec = load_model(str(path))
    device = parse_device("cpu")
    plan = LayoutPlan("NCHW16c")
    tasks = extract_tasks(spec.bound(), device.target, plan, precision="int8")
    # per task, the shape of its first parameter of each dtype (data, weight)
    dot = {t.name: {a.dtype: a.shape for a in reversed(arg_specs(t.mod))}
           for t in tasks if "conv2d_NCHWc_dot" in t.mod.script()}  # fmt: skip
    assert len(dot) == 2 and not [t for t in tasks if "data_pad" in t.mod.script()], [t.name for t in tasks]
    [(conv1, params1)] = [(n, p) for n, p in dot.items() if p["int8"] == (1, 1, 3, 3, 1, 16, 4)]
    assert params1["uint8"] == (1, 1, 18, 18, 4) and "subtract" in conv1, (conv1, params1)
    [(conv2, params2)] = [(n, p) for n, p in dot.items() if p["int8"] == (1, 1, 3, 3, 4, 16, 4)]
    assert params2["uint8"] == (1, 1, 18, 18, 16), params2
    # conv1's function writes conv2's padded input; the quantize after conv2 is in its task.
    assert "_pad_NCHWc" in conv1 and "round" in conv2, dot
    assert not [t.name for t in tasks if t.name.startswith("pad_")], [t.name for t in tasks]
    assert sum("layout_transform" in t.name for t in tasks) <= 2, [t.name for t in tasks]
    # TVM's default build, and the fallback schedules of an empty database: on a VNNI CPU
    # MetaSchedule tensorizes those with dot_16x4_vnni (TVM's own failed LLVM's verifier).
    empty = TuningDatabase(str(tmp_path / "empty.db"))
    builds = [compile_model(spec, device, db, plan=plan, precision="int8") for db in (None, empty)]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    step = _output_step(path)
    for seed in range(3):
        x = spec.random_inputs(seed=seed)
        for int8 in builds:
            got = run_outputs(int8.executable, device, x)[0]
            assert np.max(np.abs(got - session.run(None, {"x": x[0]})[0])) <= step * 1.001, seed


def test_a_max_pool_before_a_quantize_runs_on_the_quantized_values():
    """quantize(max_pool(x)) becomes max_pool(quantize(x)): the pool reads uint8, and the
    result is the same bit for bit (a quantize is monotone; the pool's border stays lowest)."""
    import tvm
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 9, 9), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            pooled = bb.emit(relax.op.nn.max_pool2d(x, (3, 3), (2, 2), (1, 1, 1, 1)))
            q = bb.emit(relax.op.quantize(pooled, relax.const(0.02, "float32"), relax.const(3, "uint8"),
                                          out_dtype="uint8"))  # fmt: skip
            out = bb.emit_output(q)
        bb.emit_func_output(out)
    mod = bb.get()
    rewritten = qdq_as_elementwise(mod)
    [pool] = [b.value for b in rewritten["main"].body.blocks[0].bindings
              if isinstance(b.value, relax.Call) and b.value.op.name == "relax.nn.max_pool2d"]  # fmt: skip
    assert str(pool.args[0].ty.dtype) == "uint8"

    def run(m: tvm.IRModule, data: np.ndarray) -> np.ndarray:
        ex = relax.build(relax.transform.LegalizeOps()(m), target="llvm")
        return relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(data)).numpy()

    # values below the zero point's floor and above the uint8 range, and many half steps
    data = np.random.default_rng(0).uniform(-1, 6, (1, 16, 9, 9)).astype("float32")
    data.flat[::7] = np.round(data.flat[::7] / 0.02) * 0.02 + 0.01
    data[:, :4] -= 7  # four channels below the range: their pooled values are 0
    want = run(mod, data)
    assert want.min() == 0 and want.max() == 255
    np.testing.assert_array_equal(run(rewritten, data), want)


def test_a_requantize_chain_stays_float_between_its_quantizes():
    """quantize -> dequantize -> relu -> quantize (ONNX Runtime's QDQ around a conv's output):
    no uint8 in the middle, no ReLU (the last quantize's clip at zero point 0 does it), no
    zero point added; the same values as TVM's own legalization of the chain."""
    import tvm
    from tvm import relax

    def qparams(scale: float, zero: int) -> tuple[relax.Constant, relax.Constant]:
        return relax.const(scale, "float32"), relax.const(zero, "uint8")

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 6, 6), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            q1 = bb.emit(relax.op.quantize(x, *qparams(0.03, 97), out_dtype="uint8"))
            d1 = bb.emit(relax.op.dequantize(q1, *qparams(0.03, 97), out_dtype="float32"))
            r = bb.emit(relax.op.nn.relu(d1))
            out = bb.emit_output(relax.op.quantize(r, *qparams(0.02, 0), out_dtype="uint8"))
        bb.emit_func_output(out)
    mod = bb.get()
    rewritten = qdq_as_elementwise(mod)
    ops = [b.value for b in rewritten["main"].body.blocks[0].bindings if isinstance(b.value, relax.Call)]
    casts = [c for c in ops if c.op.name == "relax.astype"]
    assert len(casts) == 1 and not [c for c in ops if c.op.name in ("relax.nn.relu", "relax.add")], rewritten

    def run(m: tvm.IRModule, data: np.ndarray) -> np.ndarray:
        ex = relax.build(relax.transform.LegalizeOps()(m), target="llvm")
        return relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(data)).numpy()

    data = np.random.default_rng(1).uniform(-4, 6, (1, 16, 6, 6)).astype("float32")
    # The chain in float32 as the graph states it, but multiplying by the scales' reciprocals
    # as qdq_as_elementwise does (ties to even, as TVM rounds): the folds are exact.
    inv = {s: np.float32(1 / s) for s in (0.03, 0.02)}
    q1 = np.clip(np.rint(data * inv[0.03]) + 97, 0, 255).astype(np.uint8)
    r = np.maximum((q1.astype(np.float32) - 97) * np.float32(0.03), 0)
    want = np.clip(np.rint(r * inv[0.02]), 0, 255).astype(np.uint8)
    assert want.min() == 0 and want.max() == 237  # (255 - 97) * 0.03 / 0.02: the first clip shows
    # fold_scales: one multiply by 0.03 / 0.02 = 1.5 instead of two, and the first clip's
    # lower bound dropped (-97 * 1.5 is below the second clip's 0); its upper one (158 * 1.5
    # = 237 < 255) stays. Every odd value of the first round is a tie of the second: which
    # way it rounds follows the product's last bit, so the reference folds the same way.
    once = np.minimum(np.rint(data * inv[0.03]), 158) * (np.float32(0.03) * inv[0.02])
    folded = np.clip(np.rint(once), 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(run(rewritten, data), folded)
    assert np.abs(folded.astype(int) - want).max() <= 1
    # TVM's own legalization divides: a value a tie away may round the other way, by one step.
    assert np.abs(run(mod, data).astype(int) - want).max() <= 1


def test_a_clip_the_next_clip_makes_idle_is_dropped_and_only_then():
    """clip(round(clip(y, l1, h1) * k), 0, 255): the inner bound goes where the outer one
    does its work (l1 * k <= 0, h1 * k >= 255), bit for bit; where it does not, it stays."""
    import tvm
    from tvm import relax

    from tuner.precision.qdq import fold_scales

    def chain(l1: float, h1: float, k: float) -> tvm.IRModule:
        bb = relax.BlockBuilder()
        y = relax.Var("y", relax.TensorType((4, 64), "float32"))
        with bb.function("main", [y]):
            with bb.dataflow():
                f32 = lambda v: relax.const(v, "float32")  # noqa: E731
                inner = bb.emit(relax.op.minimum(relax.op.maximum(y, f32(l1)), f32(h1)))
                scaled = bb.emit(relax.op.round(relax.op.multiply(inner, f32(k))))
                out = bb.emit_output(relax.op.minimum(relax.op.maximum(scaled, f32(0.0)), f32(255.0)))
            bb.emit_func_output(out)
        return bb.get()

    def run(m: tvm.IRModule, data: np.ndarray) -> np.ndarray:
        ex = relax.build(relax.transform.LegalizeOps()(m), target="llvm")
        return relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(data)).numpy()

    def clips(m: tvm.IRModule) -> int:
        return sum(isinstance(b.value, relax.Call) and b.value.op.name in ("relax.maximum", "relax.minimum")
                   for b in m["main"].body.blocks[0].bindings)  # fmt: skip

    data = np.random.default_rng(3).uniform(-300, 300, (4, 64)).astype("float32")
    data.flat[::5] = np.rint(data.flat[::5]) + 0.5
    # (l1, h1, k): both bounds idle; only the lower; neither (h1 * k = 237, l1 * k > 0)
    for (l1, h1, k), left in (((-126.0, 129.0, 1.98), 2), ((-97.0, 158.0, 1.5), 3), ((10.0, 158.0, 1.5), 4)):
        mod = chain(l1, h1, k)
        folded = fold_scales(mod)
        assert clips(folded) == left, (l1, h1, k, folded)
        np.testing.assert_array_equal(run(folded, data), run(mod, data))


def _residual_model(path: Path) -> None:
    """conv 1x1 (64->64) + relu, then conv 1x1 (64->64) + relu over it and the residual add
    of its input: ResNet's bottleneck, where a block's input has two readers."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(2)
    weights = {"w1": rng.normal(0, 0.2, (64, 64, 1, 1)), "b1": rng.normal(0, 0.1, 64),
               "w2": rng.normal(0, 0.2, (64, 64, 1, 1)), "b2": rng.normal(0, 0.1, 64)}  # fmt: skip
    node = helper.make_node
    nodes = [
        node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1"), node("Relu", ["c1"], ["r1"]),
        node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2"), node("Relu", ["c2"], ["r2"]),
        node("Add", ["r2", "r1"], ["y"], name="residual"),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes, "residual", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 8, 8])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def test_an_amx_1x1_conv_whose_input_the_residual_reads_too_reads_a_wide_copy(tmp_path):
    """On AMX a stride-1 1x1 uint8 conv whose input something else reads too (the residual
    add) reads a copy of it in blocks of 64 channels (``subsample_NCHWc`` at stride 1: a
    quarter of the tile multiplies of 16-channel blocks, tuner.graph.layout.legalize.SHARED_COPY_GAIN);
    the add reads the original. Extraction builds nothing, so that part runs on any host;
    where the CPU has AMX-INT8 the model is compiled and matches ONNX Runtime's int8."""
    src, path = tmp_path / "fp32.onnx", tmp_path / "qdq.onnx"
    _residual_model(src)
    quantization.quantize_static(
        str(src), str(path), _Calibration((1, 64, 8, 8)), quant_format=quantization.QuantFormat.QDQ,
        per_channel=True, activation_type=quantization.QuantType.QUInt8,
        weight_type=quantization.QuantType.QInt8, reduce_range=not _has_vnni(),
    )  # fmt: skip
    spec = load_model(str(path))
    amx = parse_device("cpu", target_arch="sapphirerapids").target
    tasks = extract_tasks(spec.bound(), amx, precision="int8")
    copies = [arg_specs(t.mod) for t in tasks if t.name.startswith("subsample_NCHWc")]
    assert [[a.shape for a in c] for c in copies] == [[(1, 4, 8, 8, 16), (1, 1, 8, 8, 64)]], [t.name for t in tasks]
    # Each conv reads its data in wide blocks; the first writes 16-channel ones, which the
    # residual add, fused into the second, reads.
    convs = [sorted(a.shape for a in arg_specs(t.mod) if a.dtype == "uint8") for t in tasks
             if "conv2d_NCHWc_dot" in t.mod.script()]  # fmt: skip
    assert convs == [[(1, 1, 8, 8, 64), (1, 4, 8, 8, 16)]] * 2, convs
    if not {"amx_tile", "amx_int8"} <= set(host_cpu_info()["isa_flags"]):
        return
    device = parse_device("cpu")
    int8 = compile_model(spec, device, None, precision="int8")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    step = _output_step(path)
    for seed in range(2):
        x = spec.random_inputs(seed=seed)
        got = run_outputs(int8.executable, device, x)[0]
        assert np.max(np.abs(got - session.run(None, {"x": x[0]})[0])) <= step * 1.001, seed
