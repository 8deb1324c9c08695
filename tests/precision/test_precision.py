"""--precision: the CPU check, precision-keyed workloads, the bf16 pass, accuracy reporting."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.ir.expr import Constant

from tuner.compile import compile_model
from tuner.device import host_cpu_info, parse_device
from tuner.errors import UserInputError
from tuner.frontends import load_model
from tuner.graph.keys import workload_key
from tuner.graph.tasks import extract_tasks
from tuner.precision import (
    BF16_ARITHMETIC_ENV,
    UnsupportedPrecisionError,
    apply_precision,
    bf16_arithmetic,
    check_device,
    describe,
    missing_feature,
)
from tuner.precision.accuracy import compare, measure_accuracy
from tuner.precision.bf16 import bf16_summary, pack_weight, to_bf16

HAS_BF16 = "avx512_bf16" in host_cpu_info()["isa_flags"] or "amx_bf16" in host_cpu_info()["isa_flags"]
needs_bf16 = pytest.mark.skipif(not HAS_BF16, reason="this CPU has no AVX512_BF16 (or AMX-BF16)")
BIN = Path(sys.executable).parent


def _llvm(mcpu: str) -> tvm.target.Target:
    return tvm.target.Target({"kind": "llvm", "mcpu": mcpu})


def test_missing_feature_names_what_the_target_lacks():
    assert missing_feature("bf16", _llvm("haswell")) == "avx512bf16"
    # int8 runs on AVX2 (vpmaddubsw on 8 lanes), not on a CPU without it.
    assert missing_feature("int8", _llvm("haswell")) is None
    assert missing_feature("int8", _llvm("haswell"), host_flags=["avx"]) == "avx512vnni"
    assert missing_feature("int8", _llvm("sandybridge")) == "avx512vnni"
    assert missing_feature("bf16", _llvm("sapphirerapids")) is None
    assert missing_feature("int8", _llvm("cascadelake")) is None
    # The target has it, the host's flags do not (a hypervisor hiding it): still missing.
    assert missing_feature("bf16", _llvm("sapphirerapids"), host_flags=["avx512f"]) == "avx512bf16"
    assert missing_feature("fp32", _llvm("haswell")) is None


def test_int8_weights_are_7_bits_where_the_dot_product_adds_pairs_in_int16():
    """VNNI and AMX add uint8 x int8 products in int32; AVX2's vpmaddubsw adds pairs of them in
    int16 first, which 8-bit weights can saturate: a float model is quantized with 7-bit
    weights (reduce_range) for such a CPU."""
    from tuner.precision import int8_weight_bits

    assert int8_weight_bits(_llvm("haswell")) == int8_weight_bits(_llvm("znver3")) == 7
    assert int8_weight_bits(_llvm("cascadelake")) == int8_weight_bits(_llvm("sapphirerapids")) == 8
    assert int8_weight_bits(_llvm("znver4")) == 8


def test_check_device_refuses_a_cpu_without_the_feature():
    with pytest.raises(UnsupportedPrecisionError, match="avx512bf16"):
        check_device("bf16", parse_device("cpu", target_arch="haswell"))
    check_device("fp32", parse_device("cpu", target_arch="haswell"))


def _cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = os.environ | {"COLUMNS": "200", "NO_COLOR": "1"} | (env or {})
    env.pop("NIGHTSHIFT_DB", None)
    return subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=300)  # fmt: skip


def test_cli_exits_2_naming_the_missing_feature(tmp_path):
    proc = _cli("tune", "--model", "tiny", "--precision", "bf16", "--target-arch", "haswell", "--trials", "4",
                "--db", str(tmp_path / "t.db"), cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "avx512bf16" in lines[0], proc.stderr
    assert not (tmp_path / "t.db").exists(), "refused before touching the database"


def test_int8_on_a_float_model_says_it_needs_a_qdq_model():
    with pytest.raises(UserInputError, match="quantized \\(QDQ\\)"):
        apply_precision(load_model("tiny").bound(), "int8")


def test_precision_is_part_of_every_workload_key():
    mod = load_model("tiny").bound()
    target = parse_device("cpu").target
    fp32 = {t.workload_key: t for t in extract_tasks(mod, target)}
    bf16 = {t.workload_key: t for t in extract_tasks(mod, target, precision="bf16")}
    assert fp32 and bf16 and not set(fp32) & set(bf16)
    # fp32 keys are the plain structural hash (records from before precisions stay valid).
    assert all(workload_key(t.mod) == k for k, t in fp32.items())
    # An operator identical in both precisions (an fp32 epilogue) still gets one key per precision.
    task = next(iter(fp32.values()))
    keys = {workload_key(task.mod, p) for p in ("fp32", "bf16", "int8")}
    assert len(keys) == 3


def test_bf16_pass_casts_convs_and_matmuls_and_packs_weights():
    mod = to_bf16(load_model("tiny").bound())
    convs, packed = [], []

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == "relax.nn.conv2d":
            convs.append(expr)
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == "relax.call_tir":
            packed.append(expr)

    relax.analysis.post_order_visit(mod["main"].body, visit)
    assert len(convs) == 2 and len(packed) == 1
    for call in convs:
        assert [str(a.ty.dtype) for a in call.args] == ["bfloat16", "bfloat16"]
        assert str(call.ty.dtype) == "float32"
        assert isinstance(call.args[1], Constant)  # converted once, at compile time
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    p = pack_weight(w)  # 3 columns: one block
    assert p.shape == (1, 2, 3, 2) and p.dtype == ml_dtypes.bfloat16
    assert all(float(p[0, k // 2, n, k % 2]) == w[k, n] for k in range(4) for n in range(3))
    w = (np.arange(4 * 192) % 97).astype(np.float32).reshape(4, 192)  # exact in bf16
    p = pack_weight(w)  # blocks of 64 columns, each a contiguous stream along K
    assert p.shape == (3, 2, 64, 2)
    assert all(float(p[n // 64, k // 2, n % 64, k % 2]) == w[k, n] for k in range(4) for n in range(192))


def test_accuracy_compare():
    ref = [[np.array([[1.0, 3.0, 2.0], [0.5, 0.1, 0.2]], dtype=np.float32)]]
    got = [[np.array([[1.0, 2.9, 3.1], [0.5, 0.1, 0.2]], dtype=np.float32)]]
    acc = compare(ref, got)
    assert acc.rows == 2 and acc.top1_agreement == 0.5
    assert acc.max_rel_error == pytest.approx(1.1 / 3.0)
    assert compare(ref, ref).max_rel_error == 0.0 and compare(ref, ref).top1_agreement == 1.0


@needs_bf16
def test_bf16_model_runs_within_tolerance_of_fp32():
    """The whole tiny model in bf16 (fallback schedules), against its fp32 build: bf16 keeps
    8 bits of mantissa, so outputs agree to about 1e-2 of their scale; the stated tolerance
    is 3e-2."""
    spec, device = load_model("tiny"), parse_device("cpu")
    fp32 = compile_model(spec, device, None)
    bf16 = compile_model(spec, device, None, precision="bf16")
    acc = measure_accuracy(spec, device, fp32, bf16, num_inputs=4)
    assert 0.0 < acc.max_rel_error < 3e-2, acc
    assert acc.top1_agreement is not None and acc.top1_agreement >= 0.75


def test_bf16_arithmetic_is_the_dot_product_where_it_does_more_flops_than_fp32_fmas(monkeypatch):
    """AMX tiles and AMD's vdpbf16ps do more flops than fp32 FMAs; an Intel core's vdpbf16ps
    does half (Emerald Rapids, benchmarks/dot_rate.c): there bf16 is computed on FMAs. The
    environment chooses instead, and a wrong value is a clear error."""
    monkeypatch.delenv(BF16_ARITHMETIC_ENV)
    spr, zen4, zen5 = _llvm("sapphirerapids"), _llvm("znver4"), _llvm("znver5")
    spr_no_amx = tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids", "mattr": ["-amx-tile", "-amx-bf16"]})
    cooperlake = _llvm("cooperlake")
    assert [bf16_arithmetic(t) for t in (spr, zen4, zen5, spr_no_amx, cooperlake)] == ["bf16"] * 3 + ["fp32"] * 2
    assert bf16_arithmetic(tvm.target.Target({"kind": "cuda", "arch": "sm_90"})) == "bf16"
    monkeypatch.setenv(BF16_ARITHMETIC_ENV, "bf16")
    assert bf16_arithmetic(spr_no_amx) == "bf16"
    monkeypatch.setenv(BF16_ARITHMETIC_ENV, "fp16")
    with pytest.raises(UserInputError, match="use bf16 or fp32"):
        bf16_arithmetic(zen4)


@needs_bf16
def test_bf16_on_fp32_fmas_rounds_the_weights_and_keeps_fp32_operators(monkeypatch):
    """Where bf16 is computed on FMAs, conv2d and matmul stay float32 operators (the float32
    templates' tasks, no dot-product kernel) on weights rounded to bf16 at compile time, and
    the model's outputs are within bf16's tolerance of fp32's, closer than the dot
    products' (whose activations are rounded too)."""
    monkeypatch.setenv(BF16_ARITHMETIC_ENV, "fp32")
    spec, device = load_model("tiny"), parse_device("cpu")
    bound = spec.bound()
    mod = apply_precision(bound, "bf16", device.target)
    calls = []

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name in (
                "relax.nn.conv2d", "relax.matmul"):  # fmt: skip
            calls.append(expr)

    relax.analysis.post_order_visit(mod["main"].body, visit)
    assert calls and all(str(a.ty.dtype) == "float32" for c in calls for a in c.args)
    weights = [c.args[1].value.numpy() for c in calls if isinstance(c.args[1], Constant)]
    assert weights and all(np.array_equal(w, w.astype(ml_dtypes.bfloat16).astype(np.float32)) for w in weights)
    assert f"computed on fp32 FMAs ({BF16_ARITHMETIC_ENV}=fp32)" in describe(bound, "bf16", device.target)
    tasks = extract_tasks(bound, device.target, precision="bf16")
    assert tasks and not [t for t in tasks if "bfloat16" in t.mod.script() or "_dot" in t.name]
    fp32 = compile_model(spec, device, None)
    on_fmas = compile_model(spec, device, None, precision="bf16")
    monkeypatch.setenv(BF16_ARITHMETIC_ENV, "bf16")
    on_dots = compile_model(spec, device, None, precision="bf16")
    fmas = measure_accuracy(spec, device, fp32, on_fmas, num_inputs=4)
    dots = measure_accuracy(spec, device, fp32, on_dots, num_inputs=4)
    assert 0.0 < fmas.max_rel_error < 3e-2 and fmas.max_rel_error <= dots.max_rel_error, (fmas, dots)


def _two_convs() -> tvm.IRModule:
    """conv 3x3 16->32 (pad 1) + relu, conv 3x3 32->16 (stride 2, pad 1): blocks of 16."""
    rng = np.random.default_rng(5)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 8, 8), "float32"))
    w1, w2 = (relax.const(rng.normal(0, 0.2, s).astype("float32")) for s in [(32, 16, 3, 3), (16, 32, 3, 3)])
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(x, w1, padding=1)))
            out = bb.emit_output(relax.op.nn.conv2d(y, w2, strides=2, padding=1))
        bb.emit_func_output(out)
    return bb.get()


def _one_conv(rng: np.random.Generator, x_shape: tuple[int, ...], w_shape: tuple[int, ...],
              relu_input: bool = False, **attrs) -> tvm.IRModule:  # fmt: skip
    """relu(conv2d(x, w, **attrs)) with random weights; ``relu_input``: relu(x) first."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(x_shape, "float32"))
    w = relax.const(rng.normal(0, 0.2, w_shape).astype("float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            data = relax.op.nn.relu(x) if relu_input else x
            out = bb.emit_output(relax.op.nn.relu(relax.op.nn.conv2d(data, w, **attrs)))
        bb.emit_func_output(out)
    return bb.get()


def _run(mod: tvm.IRModule, target: tvm.target.Target, x: np.ndarray) -> np.ndarray:
    """``mod``'s main on ``x``, built for ``target`` (untuned) and run on this CPU."""
    with target:
        ex = relax.build(mod, target=target)
    return relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


def test_bf16_convs_take_packed_weights_in_the_blocked_layout():
    """In NCHW16c a bf16 conv is conv2d_NCHWc_dot with OIHW8i16o2i weights (what
    vdpbf16ps reads), its padding outside its function: written by the function that makes
    its input (the first conv's by the input's cast and layout transform, the second's by
    the first conv, tuner.graph.pad_fusion). On an AMX CPU a conv with 32 input channels reads
    them in one block of 32 (OIHW16i16o2i weights: a whole tile row,
    tuner.graph.layout.plan.wide_blocks), which the first conv writes. It computes what fp32 does."""
    from tuner.graph.layout.plan import LayoutPlan, wide_blocks
    from tuner.graph.layout.rewrites import prepare
    from tuner.measure.verify import arg_specs

    mod, target = _two_convs(), parse_device("cpu").target
    plan = LayoutPlan("NCHW16c")
    amx = wide_blocks(target).get("bfloat16") == 32
    tasks = extract_tasks(mod, target, plan, precision="bf16")
    dot = [t for t in tasks if "conv2d_NCHWc_dot" in t.mod.script()]
    padding = [t.name for t in tasks if "_pad_NCHWc" in t.name]
    assert len(dot) == 2 and len(padding) == 2 and not [t for t in tasks if t.name.startswith("pad")], padding
    packed = []
    for t in dot:
        weights = [a.shape for a in arg_specs(t.mod) if len(a.shape) == 7 and a.dtype == "bfloat16"]
        packed.append(weights[0][-6:])
        assert "data_pad" not in t.mod.script()
    # (input chunks, kh, kw, pairs, 16 outputs, 2): 16 -> 32 reads one chunk of 16; 32 -> 16
    # two of 16, or one of 32 on AMX
    assert sorted(packed) == sorted([(1, 3, 3, 8, 16, 2), (1, 3, 3, 16, 16, 2) if amx else (2, 3, 3, 8, 16, 2)])
    x = np.random.default_rng(0).uniform(-1, 1, (1, 16, 8, 8)).astype("float32")
    want = _run(mod, target, x)
    got = _run(prepare(apply_precision(mod, "bf16"), target, plan), target, x)
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < 3e-2


def test_a_strided_1x1_conv_on_amx_reads_a_wide_copy_of_its_pixels():
    """ResNet's downsampling (1x1, stride 2, 32 -> 16 channels here) on AMX: a copy of every
    other pixel in one block of 32 (subsample_NCHWc), then a stride-1 conv with
    OIHW16i16o2i weights; elsewhere the strided conv reads its NCHW16c input. Computes what
    fp32 does, on the host's target."""
    from tuner.graph.layout.plan import LayoutPlan, wide_blocks
    from tuner.graph.layout.rewrites import prepare
    from tuner.measure.verify import arg_specs

    rng = np.random.default_rng(6)
    mod, plan = _one_conv(rng, (1, 32, 8, 8), (16, 32, 1, 1), relu_input=True, strides=2), LayoutPlan("NCHW16c")
    for arch in ("sapphirerapids", "znver4"):
        tasks = extract_tasks(mod, parse_device("cpu", target_arch=arch).target, plan, precision="bf16")
        [conv] = [t for t in tasks if "conv2d_NCHWc_dot" in t.name]
        shapes = [a.shape for a in arg_specs(conv.mod)]
        if arch == "sapphirerapids":
            assert any(t.name.startswith("subsample_NCHWc") for t in tasks), [t.name for t in tasks]
            assert (1, 1, 4, 4, 32) in shapes and (1, 1, 1, 1, 16, 16, 2) in shapes, shapes
        else:
            assert not any("subsample" in t.name for t in tasks) and (1, 2, 8, 8, 16) in shapes, shapes
    target = parse_device("cpu").target
    assert any(t.name.startswith("subsample_NCHWc") for t in extract_tasks(mod, target, plan, precision="bf16")) == (
        "bfloat16" in wide_blocks(target))
    data = rng.uniform(-1, 1, (1, 32, 8, 8)).astype("float32")
    want = _run(mod, target, data)
    got = _run(prepare(apply_precision(mod, "bf16"), target, plan), target, data)
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < 3e-2


@pytest.mark.slow
def test_int8_on_a_float_model_quantizes_it_first_and_reuses_the_file(tmp_path):
    """``--precision int8`` on a zoo model: onnxruntime quantizes it (calibration count shown),
    the file is cached by content, and a second command reuses it, so the tasks (and their
    workload keys) are the same."""
    from tuner.precision import int8_weight_bits

    device = parse_device("cpu")
    host = host_cpu_info()
    if missing_feature("int8", device.target, list(host["isa_flags"])) is not None:
        pytest.skip("this CPU has no int8 dot product (VNNI, AVX-512BW or AVX2)")
    bits = "" if int8_weight_bits(device.target) == 8 else "-w7"
    env = {"NIGHTSHIFT_CACHE": str(tmp_path / "cache")}
    runs = [_cli("nightshift", "tasks", "--model", "tiny", "--precision", "int8", "--calibration", "3",
                 cwd=tmp_path, env=env) for _ in range(2)]  # fmt: skip
    for proc in runs:
        assert proc.returncode == 0, (proc.stdout, proc.stderr)
    out = " ".join((runs[0].stdout + runs[0].stderr).split())
    assert "is a float model; quantized with onnxruntime's quantize_static" in out, out
    assert "calibrated on 3 random inputs" in out
    assert "int8: rewrote 2 conv2d, 1 matmul" in out
    files = list((tmp_path / "cache" / "quantized").glob(f"*-cal3-conv-gemm-matmul{bits}/tiny-int8{bits}.onnx"))
    assert len(files) == 1
    tasks = [[line for line in r.stdout.splitlines() if "fused_" in line] for r in runs]
    assert tasks[0] and tasks[0] == tasks[1]


def test_a_cached_zoo_model_is_reused_without_exporting_it_again(tmp_path, monkeypatch):
    """The quantized file of a zoo model is found by what its export is made of: the second
    call exports nothing, and other weights give another file."""
    pytest.importorskip("onnxruntime.quantization")
    pytest.importorskip("torch")
    import tuner.bench
    from tuner.precision.quantize import quantized_model

    exports = []
    real = tuner.bench.peer_model

    def counting(*args, **kwargs):  # the real export, counted
        exports.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(tuner.bench, "peer_model", counting)
    spec = load_model("tiny")
    first = quantized_model(spec, "tiny", 2, directory=tmp_path)
    assert quantized_model(spec, "tiny", 2, directory=tmp_path) == first
    assert exports == ["tiny"]
    key = sorted(spec.params)[0]
    spec.params[key] = spec.params[key] + 1
    other = quantized_model(spec, "tiny", 2, directory=tmp_path)
    assert other != first and other.exists() and exports == ["tiny", "tiny"]


def test_quantize_ops_narrows_what_is_quantized_and_keys_the_cached_file(tmp_path):
    """``--quantize-ops Gemm,MatMul`` (``op_types``): the tiny model's convs stay float32 and
    its dense layer (a Gemm in ONNX) becomes integer, in a file of its own beside the default
    recipe's (Conv, Gemm, MatMul) and ``all``'s."""
    pytest.importorskip("onnxruntime.quantization")
    pytest.importorskip("torch")
    from tuner.precision.qdq import ACTIVATION_MATMUL, to_int8
    from tuner.precision.quantize import DEFAULT_OPS, parse_ops, quantized_model

    assert parse_ops(None) == parse_ops("") == DEFAULT_OPS == ("Conv", "Gemm", "MatMul")
    assert parse_ops("all") is None
    assert parse_ops(" MatMul, Conv,MatMul") == ("Conv", "MatMul")
    with pytest.raises(UserInputError, match="ONNX operator types"):
        parse_ops("matmul")
    spec = load_model("tiny")
    default = quantized_model(spec, "tiny", 2, directory=tmp_path, weight_bits=8)
    every = quantized_model(spec, "tiny", 2, op_types=None, directory=tmp_path, weight_bits=8)
    matmul = quantized_model(spec, "tiny", 2, op_types=("Gemm", "MatMul"), directory=tmp_path, weight_bits=8)
    assert len({default, every, matmul}) == 3 and all(p.exists() for p in (default, every, matmul))
    # Their job names differ; the default keeps the plain name.
    assert [p.name for p in (default, every, matmul)] == ["tiny-int8.onnx", "tiny-int8-all.onnx",
                                                          "tiny-int8-gemm-matmul.onnx"]  # fmt: skip
    for path in (default, every):
        assert to_int8(load_model(str(path)).bound()).rewritten == {"conv2d": 2, "matmul": 1, ACTIVATION_MATMUL: 0}
    assert to_int8(load_model(str(matmul)).bound()).rewritten == {"conv2d": 0, "matmul": 1, ACTIVATION_MATMUL: 0}


def test_7_bit_weights_are_a_recipe_of_their_own_that_avx2_sums_exactly(tmp_path):
    """``weight_bits=7`` quantizes with reduce_range into a file of its own (its job name
    too), whose weights AVX2's int8 dot product sums exactly; the 8-bit file's it would
    saturate, and the rewrite for such a target says so and keeps its matmul off it."""
    pytest.importorskip("onnxruntime.quantization")
    pytest.importorskip("torch")
    from search_spaces.x86.intrin import AVX2_DOT, exact_for
    from tuner.precision.qdq import to_int8
    from tuner.precision.quantize import quantized_model

    spec = load_model("tiny")
    full = quantized_model(spec, "tiny", 2, directory=tmp_path, weight_bits=8)
    seven = quantized_model(spec, "tiny", 2, directory=tmp_path, weight_bits=7)
    assert (full.name, seven.name) == ("tiny-int8.onnx", "tiny-int8-w7.onnx")
    assert seven.parent.name.endswith("-conv-gemm-matmul-w7")

    def weights(path: Path) -> list[np.ndarray]:
        import onnx
        from onnx import numpy_helper

        model = onnx.load(str(path))
        return [numpy_helper.to_array(t) for t in model.graph.initializer if t.data_type == onnx.TensorProto.INT8
                and len(t.dims) >= 2]  # fmt: skip

    assert weights(seven) and max(int(np.abs(w).max()) for w in weights(seven)) <= 64
    assert max(int(np.abs(w).max()) for w in weights(full)) == 127
    assert all(exact_for(AVX2_DOT, w, 1) for w in weights(seven))  # ONNX Conv weights: OIHW, Gemm: [N, K]
    for path, saturating in ((seven, 0), (full, 3)):
        rewrite = to_int8(load_model(str(path)).bound(), pair_limit=True)
        assert rewrite.rewritten["conv2d"] == 2 and rewrite.saturating == saturating, rewrite.describe()
    assert "reduce_range=True" in to_int8(load_model(str(full)).bound(), pair_limit=True).describe()
    # On an AVX2 target (extraction builds nothing: any host), the 7-bit file's convs and
    # matmul are on the dot product; the 8-bit file's stay off it, exact in int32.
    haswell = tvm.target.Target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})
    for path, on_dot in ((seven, 3), (full, 0)):
        names = [t.name for t in extract_tasks(load_model(str(path)).bound(), haswell, precision="int8")]
        assert sum("conv2d_NCHWc_dot" in n or "matmul_u8s8" in n for n in names) == on_dot, names


@pytest.mark.slow
def test_compiling_registers_the_intrinsics_that_records_replay():
    """A database record of a dot-product template replays ``tensorize`` by the intrinsic's
    name: compiling registers Nightshift's intrinsics first, in a process that has not tuned
    (a fresh one here; in this test process a template's schedule may have registered them)."""
    code = (
        "from tvm.s_tir import TensorIntrin\n"
        "from tuner.compile import compile_model\n"
        "from tuner.device import parse_device\n"
        "from tuner.frontends import load_model\n"
        "compile_model(load_model('tiny'), parse_device('cpu'), None)\n"
        "for name in ('dot_16x4_vnni_local', 'dot_16x2_bf16_avx512_local'):\n"
        "    TensorIntrin.get(name)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def _residual_block() -> tvm.IRModule:
    """conv 3x3 + relu = y; conv 1x1 (y) + y, relu = z; conv 1x1 (z) + conv 1x1 (z): y is
    read by a conv (in bf16) and by a residual add (in fp32), as ResNet's block outputs are,
    z by two convs, as a stage's first block reads its input (conv and downsample)."""
    rng = np.random.default_rng(6)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 8, 8), "float32"))
    w1, w2, w3, w4 = (relax.const(rng.normal(0, 0.2, s).astype("float32"))
                      for s in [(16, 16, 3, 3), (16, 16, 1, 1), (16, 16, 1, 1), (16, 16, 1, 1)])  # fmt: skip
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(x, w1, padding=1)))
            z = bb.emit(relax.op.nn.relu(relax.op.add(relax.op.nn.conv2d(y, w2), y)))
            out = bb.emit_output(relax.op.add(relax.op.nn.conv2d(z, w3), relax.op.nn.conv2d(z, w4)))
        bb.emit_func_output(out)
    return bb.get()


def test_bf16_rounds_a_shared_activation_once_where_it_is_made():
    """y and z are cast to bf16 once, in their producers' epilogues; the residual add widens
    y's copy inside the next conv's function: no function of its own casts them (the model's
    input is cast, blocked and padded in one), and the bf16-dot template takes the conv with
    the residual."""
    from search_spaces import applicable_kinds
    from tuner.graph.layout.plan import LayoutPlan
    from tuner.graph.layout.rewrites import prepare

    mod, target = _residual_block(), parse_device("cpu").target
    assert "2 activations kept in bf16" in bf16_summary(mod)
    tasks = extract_tasks(mod, target, LayoutPlan("NCHW16c"), precision="bf16")
    names = [t.name for t in tasks]
    assert not [n for n in names if n.startswith("cast")], names
    assert [n for n in names if n.startswith("fused_cast") and "conv2d" not in n] == [
        "fused_cast_layout_transform_pad_NCHWc"], names  # fmt: skip
    # The widening cast is fused in front of the conv that adds the residual.
    residual = [t for t in tasks if t.name.startswith("fused_cast") and "conv2d_NCHWc_dot" in t.name]
    assert len(residual) == 1, names
    spr = tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids"})
    for t in residual:
        assert "x86-conv2d-nchwc-dot" in applicable_kinds(t.mod, spr), t.name
    x = np.random.default_rng(1).uniform(-1, 1, (1, 16, 8, 8)).astype("float32")
    want = _run(mod, target, x)
    got = _run(prepare(apply_precision(mod, "bf16"), target, LayoutPlan("NCHW16c")), target, x)
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < 3e-2


def test_bf16_gives_an_rgb_conv_a_zero_channel_for_the_dot_instruction():
    """A conv over 3 channels (ResNet's stem) reads 4, the fourth zero in data and weights:
    vdpbf16ps adds channel pairs. It becomes a conv2d_NCHWc_dot and computes what fp32 does."""
    from tuner.graph.layout.plan import LayoutPlan, wide_blocks
    from tuner.graph.layout.rewrites import prepare

    rng = np.random.default_rng(8)
    mod = _one_conv(rng, (1, 3, 16, 16), (16, 3, 7, 7), strides=2, padding=3)
    target, plan = parse_device("cpu").target, LayoutPlan("NCHW16c")
    assert "1 conv2d with a zero input channel" in bf16_summary(mod)
    tasks = extract_tasks(mod, target, plan, precision="bf16")
    assert any("conv2d_NCHWc_dot" in t.name for t in tasks), [t.name for t in tasks]
    # On AMX the stem reads a kernel row's 7 taps x 4 channels as one block of 32, which
    # the input's cast, channel pad and layout transform write in one pass.
    amx = "bfloat16" in wide_blocks(target)
    assert any(t.name.endswith("_row_taps") for t in tasks) == amx, [t.name for t in tasks]
    data = rng.uniform(-1, 1, (1, 3, 16, 16)).astype("float32")
    want = _run(mod, target, data)
    got = _run(prepare(apply_precision(mod, "bf16"), target, plan), target, data)
    assert got.shape == want.shape == (1, 16, 8, 8)
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < 3e-2


def test_bf16_keeps_an_activation_that_a_matmul_reads_in_fp32():
    """Only conv inputs are rounded once: BERT's residual stream (a layer-norm output read by
    the projections in bf16 and by the residual add in fp32) stays fp32 for the add, which
    kept its top-1 agreement with fp32 at 99.2% instead of 97.6%."""
    rng = np.random.default_rng(9)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 32), "float32"))
    w = relax.const(rng.normal(0, 0.2, (32, 32)).astype("float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(x))
            out = bb.emit_output(relax.op.add(relax.op.matmul(y, w), y))
        bb.emit_func_output(out)
    summary = bf16_summary(bb.get())
    assert "1 packed matmul" in summary and "kept in bf16" not in summary, summary


def test_bf16_casts_an_activation_that_several_packed_matmuls_read_once():
    """BERT's query, key and value projections read one layer-norm output: one bf16 copy
    (one cast function per layer, not three), and the projections compute what they did."""
    rng = np.random.default_rng(10)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 32), "float32"))
    weights = [relax.const(rng.normal(0, 0.2, (32, 32)).astype("float32")) for _ in range(3)]
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(x))
            q, k, v = (bb.emit(relax.op.matmul(y, w)) for w in weights)
            out = bb.emit_output(relax.op.add(relax.op.add(q, k), v))
        bb.emit_func_output(out)
    mod = bb.get()
    converted = to_bf16(mod)
    casts = [b for b in converted["main"].body.blocks[0].bindings
             if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.astype"]
    assert len(casts) == 1, converted["main"]
    data = rng.standard_normal((4, 32)).astype("float32")
    target = tvm.target.Target("llvm")
    want = _run(mod, target, data)
    got = _run(converted, target, data)
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < 3e-2


def test_bf16_packs_the_second_activation_of_an_attention_matmul():
    """Attention's matmuls of two activations (heads as batch): the second is packed in pairs
    as a weight is, the matmul is the packed one the x86-dense-bf16 template takes, and it
    computes what the float32 model does within bf16's rounding."""
    rng = np.random.default_rng(11)
    bb = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorType((1, 2, 16, 32), "float32"))
    k = relax.Var("k", relax.TensorType((1, 2, 16, 32), "float32"))
    with bb.function("main", [q, k]):
        with bb.dataflow():
            kt = bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))
            scores = bb.emit(relax.op.multiply(relax.op.matmul(q, kt), relax.const(0.125, "float32")))
            out = bb.emit_output(relax.op.matmul(relax.op.nn.softmax(scores), k))
        bb.emit_func_output(out)
    mod = bb.get()
    assert "2 packed activation matmul" in bf16_summary(mod)
    converted = to_bf16(mod)
    packed = [f for f in converted.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    shapes = sorted(tuple(int(d) for d in f.params[1].shape) for f in packed)
    assert shapes == [(1, 2, 1, 8, 32, 2), (1, 2, 1, 16, 16, 2)]  # one block of 32 (16) columns
    data = [rng.standard_normal((1, 2, 16, 32)).astype("float32") for _ in range(2)]
    target = tvm.target.Target("llvm")
    with target:
        want_ex, got_ex = relax.build(mod, target=target), relax.build(converted, target=target)
    want = relax.VirtualMachine(want_ex, tvm.cpu())["main"](*map(tvm.runtime.tensor, data)).numpy()
    got = relax.VirtualMachine(got_ex, tvm.cpu())["main"](*map(tvm.runtime.tensor, data)).numpy()
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < 3e-2


def test_bf16_pads_a_weights_columns_to_whole_vectors_and_slices_them_off():
    """A classifier's 1000 columns (here 40): the packed weight gets zero columns up to
    whole 16-lane vectors (48, in blocks of 16), the output is sliced back to 40 columns,
    and it computes what the float32 model does within bf16's rounding."""
    rng = np.random.default_rng(12)
    w = rng.standard_normal((64, 40)).astype("float32")
    bias = rng.standard_normal(40).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(relax.op.matmul(x, relax.const(w)), relax.const(bias)))
        bb.emit_func_output(out)
    mod = bb.get()
    converted = to_bf16(mod)
    packed = [f for f in converted.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    assert [tuple(int(d) for d in f.params[1].shape) for f in packed] == [(3, 32, 16, 2)]
    assert "strided_slice" in converted.script()
    data = rng.standard_normal((1, 64)).astype("float32")
    target = tvm.target.Target("llvm")
    want, got = _run(mod, target, data), _run(converted, target, data)
    assert got.shape == (1, 40)
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < 3e-2


def test_bf16_leaves_a_matmul_it_cannot_pack_unpacked():
    """Broadcast batch dimensions or columns that are not whole 16-lane vectors: a plain bf16
    matmul summed in float32, as before."""
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType((2, 8, 32), "float32"))
    b = relax.Var("b", relax.TensorType((2, 32, 24), "float32"))
    c = relax.Var("c", relax.TensorType((1, 32, 16), "float32"))
    with bb.function("main", [a, b, c]):
        with bb.dataflow():
            x = bb.emit(relax.op.matmul(a, b))
            out = bb.emit_output(relax.op.matmul(a, c))
        bb.emit_func_output([x, out])
    assert "2 matmul" in bf16_summary(bb.get()) and "packed" not in bf16_summary(bb.get())


@needs_bf16
@pytest.mark.slow
def test_a_bf16_artifact_has_the_metadata_run_reads(tmp_path):
    """``tune --precision bf16 -o`` writes the same metadata as fp32 (plus the precision and its
    accuracy against fp32), so ``nightshift run`` takes the file as it takes an fp32 one."""
    import json

    proc = _cli("tune", "--model", "tiny", "--precision", "bf16", "--trials", "2", "--db", str(tmp_path / "t.db"),
                "-o", str(tmp_path / "t.so"), "--measurer", "inline", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    meta = json.loads((tmp_path / "t.json").read_text())
    assert meta["precision"]["name"] == "bf16" and 0 <= meta["precision"]["max_rel_error"] < 0.05
    assert meta["baselines"]["fp32"]["ratio"] > 0 and meta["latency"]["median_ms"] > 0
    run = _cli("nightshift", "run", str(tmp_path / "t.so"), "--random-input", "--rounds", "5", cwd=tmp_path)
    assert run.returncode == 0 and "latency" in run.stdout, (run.stdout, run.stderr)
