"""Batch norm folding, conv data layouts as a plan, and the chooser over measured layouts."""

import itertools
import json
import math

import numpy as np
import pytest
import tvm
from sqlalchemy import text
from tvm import relax
from tvm.ir.expr import Constant
from tvm.relax.frontend import nn

import search_spaces
from tuner.app.plan import choose_layout
from tuner.db import TuningDatabase
from tuner.frontends import ModelSpec, load_model
from tuner.frontends.zoo import BatchNorm2d
from tuner.graph.layout.choose import choose_from_database, choose_layouts, conv_task_keys, stored_layouts
from tuner.graph.layout.ops import conv2d_nchwc_dot, row_taps
from tuner.graph.layout.packing import pack_dot_weight, row_tap_weight
from tuner.graph.layout.plan import LayoutPlan, auto_layouts, conv_calls, row_taps_fit, vector_lanes
from tuner.graph.layout.rewrites import prepare, simplify_sums
from tuner.graph.tasks import Task, extract_layout_tasks, extract_tasks, operator_count


def _run(mod: tvm.IRModule, target: tvm.target.Target, inputs: list[np.ndarray]) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(x) for x in inputs]).numpy()


def _scaled_error(want: np.ndarray, got: np.ndarray) -> float:
    return float(np.max(np.abs(want.astype(np.float64) - got))) / max(float(np.max(np.abs(want))), 1e-6)


class _ConvBN(nn.Module):
    def __init__(self) -> None:
        self.conv = nn.Conv2D(4, 8, 3, padding=1, bias=False)
        self.bn = BatchNorm2d(8, "float32")

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return nn.op.relu(self.bn(self.conv(x)))


def _conv_bn_spec() -> ModelSpec:
    """conv 3x3 -> batch norm with non-trivial statistics -> relu, weights as params."""
    mod, _ = _ConvBN().export_tvm(spec={"forward": {"x": nn.spec.Tensor((1, 4, 8, 8), "float32")}})
    main = mod["forward"].with_attr("global_symbol", "main")
    rng = np.random.default_rng(3)
    names = [v.name for v in main.params[1:]]  # conv weight, bn weight, bias, mean, var
    shapes = [(8, 4, 3, 3), (8,), (8,), (8,), (8,)]
    values = [rng.standard_normal(s).astype("float32") for s in shapes]
    values[-1] = rng.uniform(0.5, 2.0, 8).astype("float32")  # a variance is positive
    return ModelSpec("conv_bn", tvm.IRModule({"main": main}), dict(zip(names, values, strict=True)))


def test_batch_norm_folds_into_the_conv(cpu_device):
    spec = _conv_bn_spec()
    bound = spec.bound()
    script = bound.script()
    assert "R.nn.batch_norm(" not in script and "R.divide(" not in script and "R.subtract(" not in script
    # The conv task's epilogue is one bias add, not subtract/divide/multiply/add.
    convs = [t for t in extract_tasks(bound, cpu_device.target, LayoutPlan("NCHW")) if t.layout]
    assert [t.name for t in convs] == ["fused_conv2d_add_relu"]
    # Same numbers as batch norm decomposed without folding.
    tensors = {k: tvm.runtime.tensor(v) for k, v in spec.params.items()}
    unfolded = relax.transform.DecomposeOpsForInference()(relax.transform.BindParams("main", tensors)(spec.mod))
    inputs = spec.random_inputs()
    assert _scaled_error(_run(unfolded, cpu_device.target, inputs), _run(bound, cpu_device.target, inputs)) < 1e-5


def test_onnx_style_sums_become_adds_and_convert(cpu_device):
    """ONNX's ``Sum`` (broadcast_to, stack, sum) blocks ConvertLayout; it becomes an add."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 6, 6), "float32"))
    w = relax.const(np.random.default_rng(0).standard_normal((8, 8, 3, 3)).astype("float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv2d(x, w, padding=1))
            parts = [bb.emit(relax.op.broadcast_to(v, relax.ShapeExpr([1, 8, 6, 6]))) for v in (conv, x)]
            stacked = bb.emit(relax.op.stack(relax.Tuple(parts), axis=0))
            out = bb.emit_output(relax.op.sum(stacked, axis=[0]))
        bb.emit_func_output(out)
    mod = bb.get()
    script = simplify_sums(mod).script()
    assert "R.stack(" not in script and "R.broadcast_to(" not in script and "R.add(" in script
    inputs = [np.random.default_rng(1).uniform(-1, 1, (1, 8, 6, 6)).astype("float32")]
    got = _run(prepare(mod, cpu_device.target, LayoutPlan("NCHW8c")), cpu_device.target, inputs)
    assert _scaled_error(_run(mod, cpu_device.target, inputs), got) < 1e-5


@pytest.mark.parametrize(("layout", "depthwise_layout"), [("NHWC", "NCHW"), ("NCHW8c", "NCHW8c"),
                                                        ("NCHW16c", "NCHW16c")])
@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise_convs_take_the_blocked_layout(cpu_device, layout, depthwise_layout, stride):
    """MobileNet's pattern: conv, depthwise conv + ReLU6, conv. The depthwise one joins a
    blocked plan (no transform on either side, ReLU6 fused into it) and stays NCHW under
    NHWC, as does the grouped conv after it (4 channels a group: test_grouped_convs_...)."""
    rng = np.random.default_rng(2)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 6, 6), "float32"))
    shapes = [(16, 8, 1, 1), (16, 1, 3, 3), (16, 4, 3, 3), (8, 16, 1, 1)]
    weights = [relax.const(rng.standard_normal(s).astype("float32")) for s in shapes]
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, weights[0]))
            # ReLU6 as the frontends write it: Relax infers no layout for clip.
            y = bb.emit(relax.op.clip(relax.op.nn.conv2d(y, weights[1], strides=stride, padding=1, groups=16), 0, 6))
            y = bb.emit(relax.op.nn.conv2d(y, weights[2], padding=1, groups=4))
            out = bb.emit_output(relax.op.nn.conv2d(y, weights[3]))
        bb.emit_func_output(out)
    mod = bb.get()
    plan = LayoutPlan(layout)
    assert len(conv_task_keys(mod, cpu_device.target, plan)) == len(conv_calls(mod)) == 4
    tasks = extract_tasks(mod, cpu_device.target, plan)
    layouts = sorted(t.layout for t in tasks if t.layout)
    # A blocked task is named by its output block: the last conv writes 8 channels.
    assert layouts == sorted([layout, depthwise_layout, depthwise_layout, layout.replace("16c", "8c")])
    transforms = [t for t in tasks if "layout_transform" in t.name]
    # Blocked: the model's own input and output only.
    assert len(transforms) <= (4 if layout == "NHWC" else 2)
    if depthwise_layout != "NCHW":
        dw = next(t for t in tasks if "depthwise_conv2d_NCHWc" in t.mod.script())
        assert dw.name.endswith("_maximum_minimum"), dw.name
        assert "x86-depthwise-conv2d-nchwc" in search_spaces.applicable_kinds(dw.mod, cpu_device.target)
    inputs = [rng.uniform(-1, 1, (1, 8, 6, 6)).astype("float32")]
    got = _run(prepare(mod, cpu_device.target, plan), cpu_device.target, inputs)
    assert _scaled_error(_run(mod, cpu_device.target, inputs), got) < 1e-5


@pytest.mark.parametrize(("channels", "groups", "layout", "stride", "blocked"), [
    (16, 4, "NCHW8c", 1, True),     # 4 channels a group, 8 a block: half the block's taps are zero
    (16, 4, "NCHW16c", 2, True),    # 4 a group, 16 a block: the most waste allowed
    (64, 2, "NCHW16c", 2, True),    # two blocks a group
    (16, 8, "NCHW16c", 1, False),   # 2 a group, 16 a block: 8x the work, stays NCHW
    (24, 2, "NCHW8c", 1, False),    # 12 a group: neither divides the other
])  # fmt: skip
def test_grouped_convs_take_the_blocked_layout(cpu_device, channels, groups, layout, stride, blocked):
    """ResNeXt's pattern: conv, grouped 3x3 conv + ReLU, conv. Where the groups line up with
    the block the grouped conv joins the plan (block ``conv2d_NCHWc_grouped``, no transform on
    either side, x86-conv2d-nchwc schedules it); elsewhere it stays NCHW between transforms.
    The output matches the NCHW graph's either way."""
    rng = np.random.default_rng(5)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 9, 9), "float32"))
    shapes = [(channels, 8, 1, 1), (channels, channels // groups, 3, 3), (8, channels, 1, 1)]
    weights = [relax.const(rng.standard_normal(s).astype("float32")) for s in shapes]
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, weights[0]))
            y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(y, weights[1], strides=stride, padding=1, groups=groups)))
            out = bb.emit_output(relax.op.nn.conv2d(y, weights[2]))
        bb.emit_func_output(out)
    mod = bb.get()
    plan = LayoutPlan(layout)
    tasks = extract_tasks(mod, cpu_device.target, plan)
    grouped = [t for t in tasks if "conv2d_NCHWc_grouped" in t.mod.script()]
    transforms = [t for t in tasks if "layout_transform" in t.name]
    if blocked:
        assert len(grouped) == 1 and grouped[0].layout == layout and grouped[0].name.endswith("_relu")
        assert "x86-conv2d-nchwc" in search_spaces.applicable_kinds(grouped[0].mod, cpu_device.target)
        assert len(transforms) == 2
    else:
        assert not grouped and len(transforms) == 4
    inputs = [rng.uniform(-1, 1, (1, 8, 9, 9)).astype("float32")]
    got = _run(prepare(mod, cpu_device.target, plan), cpu_device.target, inputs)
    assert _scaled_error(_run(mod, cpu_device.target, inputs), got) < 1e-5


def test_grouped_weights_pack_block_diagonal():
    """Each packed weight sits at its input lane and output lane; across groups it is zero."""
    from tuner.graph.layout.packing import pack_group_weight

    w = np.random.default_rng(0).standard_normal((16, 4, 3, 3)).astype("float32")
    packed = pack_group_weight(w, 4, 8)  # two blocks of two groups each
    assert packed.shape == (2, 1, 3, 3, 8, 8)
    for oc in range(16):
        for ic in range(oc // 8 * 8, oc // 8 * 8 + 8):  # the input lanes of the output's block
            want = w[oc, ic % 4] if ic // 4 == oc // 4 else np.zeros((3, 3), np.float32)
            np.testing.assert_array_equal(packed[oc // 8, 0, :, :, ic % 8, oc % 8], want)


@pytest.fixture(scope="module")
def tiny():
    spec = load_model("tiny")
    return spec, spec.bound(), spec.random_inputs()


@pytest.mark.parametrize("plan", [LayoutPlan("NHWC"), LayoutPlan("NCHW8c"), LayoutPlan("NCHW16c"),
                                  LayoutPlan("NCHW", ("NCHW4c", "NHWC")), LayoutPlan("NCHW", ("NCHW", "NCHW8c")),
                                  LayoutPlan("NCHW4c", ("NHWC",)), LayoutPlan("NCHW", ("NCHW8c",))])
def test_plans_compute_what_nchw_computes(tiny, cpu_device, plan):
    _spec, bound, inputs = tiny
    want = _run(bound, cpu_device.target, inputs)
    prepared = prepare(bound, cpu_device.target, plan)
    assert _scaled_error(want, _run(prepared, cpu_device.target, inputs)) < 1e-5
    # tiny's convs have 8 channels: a 16-lane request takes the largest divisor, 8; its first
    # conv reads 3 channels, so its input block is 3.
    tasks = extract_tasks(bound, cpu_device.target, plan)
    expected = [plan.layout_of(i).replace("NCHW16c", "NCHW8c") for i in range(2)]
    assert sorted(t.layout for t in tasks if t.layout) == sorted(expected)
    # Each layout is its own workload: keys differ from the NCHW tasks' wherever layouts do.
    nchw = {t.workload_key for t in extract_tasks(bound, cpu_device.target, LayoutPlan("NCHW")) if t.layout}
    changed = [t for t in tasks if t.layout and t.layout != "NCHW"]
    assert changed and not {t.workload_key for t in changed} & nchw


def test_blocked_conv_task_is_topi_conv2d_nchwc(tiny, cpu_device):
    """The interface with the NCHWc schedule template: TOPI's block and iteration names."""
    _spec, bound, _ = tiny
    tasks = [t for t in extract_tasks(bound, cpu_device.target, LayoutPlan("NCHW8c")) if t.layout]
    assert {t.layout for t in tasks} == {"NCHW8c"}
    for t in tasks:
        sch = tvm.s_tir.Schedule(t.mod)
        block_rv = sch.get_sblock("conv2d_NCHWc")
        block = sch.get(block_rv)
        names = ["n", "oc_chunk", "oh", "ow", "oc_block", "ic", "kh", "kw"]
        assert [str(sch.get(loop).loop_var) for loop in sch.get_loops(block_rv)] == names
        assert [str(v.var) for v in block.iter_vars] == [f"v_{n}" for n in names]
        assert [int(v.iter_type) for v in block.iter_vars] == [0] * 5 + [2] * 3  # spatial, then reduce
        sch.get_sblock("data_pad")  # padded 3x3 convs
        # Weights were re-laid-out at compile time: the task reads OIHW{i}i{o}o constants.
        assert len(t.mod["main"].params[1].shape) == 6
    # The first conv (3 input channels) reads 3-channel blocks.
    first = next(t for t in tasks if int(t.mod["main"].params[0].shape[-1]) == 3)
    assert first.flops > 0


def test_default_plan_follows_the_vector_width(cpu_device):
    lanes = vector_lanes(cpu_device.target)
    plan = LayoutPlan.for_target(cpu_device.target)
    assert plan.default == (f"NCHW{lanes}c" if lanes >= 8 else "NCHW")
    assert LayoutPlan.for_target(tvm.target.Target({"kind": "cuda", "arch": "sm_90"})).is_identity
    assert LayoutPlan.parse("NCHWc", cpu_device.target).default == f"NCHW{lanes}c"
    assert LayoutPlan.parse("auto", cpu_device.target) == plan
    with pytest.raises(ValueError, match="NCHW<block>c"):
        LayoutPlan("NCHWc")
    with pytest.raises(ValueError, match="one block size"):
        LayoutPlan("NCHW8c", ("NCHW4c",))


def test_compiler_looks_up_the_extracted_tasks(tiny, cpu_device, tmp_path):
    """extract_tasks and compile_model share the plan: every task is a function the compiler
    asks the database for, and the compiled model computes what the NCHW build does."""
    from tuner.compile import compile_model, run_model
    from tuner.db import TuningDatabase

    spec, bound, inputs = tiny
    plan = LayoutPlan("NCHW", ("NCHW8c", "NHWC"))
    keys = {t.workload_key for t in extract_tasks(bound, cpu_device.target, plan)}
    compiled = compile_model(spec, cpu_device, TuningDatabase(str(tmp_path / "empty.db")), plan=plan)
    assert set(compiled.decisions) == keys
    got, _ = run_model(compiled, cpu_device, inputs, budget_s=0.1)
    assert _scaled_error(_run(bound, cpu_device.target, inputs), got[0]) < 1e-5


def _brute_force(conv_seconds, transform):
    best = None
    for combo in itertools.product(*[sorted(c) for c in conv_seconds]):
        cost = sum(conv_seconds[i][x] for i, x in enumerate(combo))
        prev = "NCHW"
        for i, x in enumerate([*combo, "NCHW"]):
            cost += transform(i, prev, x) if prev != x else 0.0
            prev = x
        if best is None or cost < best[0]:
            best = (cost, combo)
    return best


def test_chooser_finds_the_chain_optimum():
    # Conv 1 is faster blocked, but not by enough to pay for a switch in and out alone;
    # convs 3-4 are. The optimum blocks convs 1-4, conv 2 included although NCHW is faster
    # for it alone: neither the per-conv (greedy) choice nor one layout everywhere.
    conv_seconds = [
        {"NCHW": 1.0, "NCHW16c": 1.3},
        {"NCHW": 1.0, "NCHW16c": 0.8},
        {"NCHW": 1.0, "NCHW16c": 1.1},
        {"NCHW": 2.0, "NCHW16c": 1.4, "NHWC": 1.3},
        {"NCHW": 2.0, "NCHW16c": 1.4},
        {"NCHW": 1.0},
    ]

    def transform(i: int, src: str, dst: str) -> float:
        assert src != dst
        return 0.4

    choice = choose_layouts(conv_seconds, transform)
    cost, combo = _brute_force(conv_seconds, transform)
    assert choice.plan.layouts == combo == ("NCHW", "NCHW16c", "NCHW16c", "NCHW16c", "NCHW16c", "NCHW")
    assert choice.seconds == pytest.approx(cost) == pytest.approx(1 + 0.8 + 1.1 + 1.4 + 1.4 + 1 + 2 * 0.4)
    # Cheap transforms: each conv takes its own fastest layout.
    cheap = choose_layouts(conv_seconds, lambda i, a, b: 0.01)
    assert cheap.plan.layouts == ("NCHW", "NCHW16c", "NCHW", "NHWC", "NCHW16c", "NCHW")
    # Dear transforms: everything stays in the input's layout.
    dear = choose_layouts(conv_seconds, lambda i, a, b: 10.0)
    assert dear.plan.is_identity


def test_chooser_reads_measurements_per_layout(tiny, cpu_device):
    """Fed by workload keys, as the database stores them: the plan follows the timings."""
    _spec, bound, _ = tiny
    target = cpu_device.target
    keys = {layout: conv_task_keys(bound, target, LayoutPlan(layout)) for layout in ("NCHW", "NCHW8c")}
    assert len(keys["NCHW"]) == len(conv_calls(bound)) == 2
    task_keys = {t.workload_key for t in extract_tasks(bound, target, LayoutPlan("NCHW8c"))}
    assert set(keys["NCHW8c"]) <= task_keys
    # Conv 1 is much faster blocked, conv 0 slightly slower: only conv 1 switches.
    timings = {keys["NCHW"][0]: 1e-3, keys["NCHW8c"][0]: 1.1e-3, keys["NCHW"][1]: 1e-3, keys["NCHW8c"][1]: 1e-4}
    choice = choose_from_database(bound, target, timings.get, ["NCHW", "NCHW8c"])
    assert choice.plan.layouts == ("NCHW", "NCHW8c")


@pytest.mark.slow
def test_resnet50_conv_tasks_carry_no_batch_norm(cpu_device, request):
    """ResNet-50: 24 conv tasks whose epilogue is bias (+ residual) (+ relu), all blocked."""
    if "slow" not in request.config.getoption("markexpr", ""):
        pytest.skip("extracts ResNet-50's tasks: run with -m slow")
    plan = LayoutPlan(f"NCHW{vector_lanes(cpu_device.target)}c")
    tasks = extract_tasks(load_model("resnet50").bound(), cpu_device.target, plan)
    convs = [t for t in tasks if t.layout]
    assert len(convs) == 24 and {t.layout for t in convs} == {plan.default}
    assert not [t.name for t in convs if "subtract" in t.name or "divide" in t.name or "multiply" in t.name]
    assert 8.1e9 < sum(t.weight * t.flops for t in tasks) < 8.24e9  # the BN epilogue's FLOPs are gone


def test_gelu_on_cpu_uses_fast_erf_and_matches_exact_gelu() -> None:
    import math

    from tuner.graph.layout.rewrites import prepare

    target = tvm.target.Target({"kind": "llvm"})
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 256), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.gelu(x))
        bb.emit_func_output(out)
    mod = prepare(bb.get(), target, LayoutPlan.parse("NCHW", target))
    assert "fast_erf" in mod.script() and "T.erf" not in mod.script()
    data = np.linspace(-6, 6, 1024, dtype="float32").reshape(4, 256)
    ex = tvm.compile(mod, target=target)
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(data)).numpy()
    exact = np.vectorize(lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))))(data.astype(np.float64))
    np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("axis", [-1, 1])
def test_softmax_on_cpu_uses_fast_exp_and_matches_exact_softmax(axis) -> None:
    """Over the last axis, each row's sum is inverted once (``T_softmax_rcp``) and no element
    is divided; over another axis TOPI's ``fast_softmax`` divides."""
    from tuner.graph.layout.rewrites import prepare

    target = tvm.target.Target({"kind": "llvm"})
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 4, 128), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.softmax(x, axis=axis))
        bb.emit_func_output(out)
    mod = prepare(bb.get(), target, LayoutPlan.parse("NCHW", target))
    script = mod.script()
    assert "T.exp" not in script
    assert ("T_softmax_rcp" in script) == (axis == -1)
    norm = next(line for line in script.splitlines() if "T_softmax_norm[v" in line and " = " in line)
    assert ("/" in norm.split(" = ", 1)[1]) == (axis != -1), norm
    # logits as attention gives them: a wide range, large negative masks included
    data = np.random.default_rng(0).normal(0, 8, (2, 4, 128)).astype("float32")
    data[0, 0, 64:] = -10000.0
    ex = tvm.compile(mod, target=target)
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(data)).numpy()
    z = data.astype(np.float64) - data.max(axis=axis, keepdims=True)
    exact = np.exp(z) / np.exp(z).sum(axis=axis, keepdims=True)
    np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-7)


def _gelu_tanh(v):
    return 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v**3)))


def _gelu_tanh_written_out(x: relax.Expr) -> relax.Expr:
    """GPT-2's GELU as the model writes it: ``x * 0.5 * (1 + tanh(c * (x + 0.044715 * x**3)))``."""
    op = relax.op

    def c(v: float) -> relax.Expr:
        return relax.const(v, "float32")

    cubed = op.power(x, c(3.0))
    inner = op.multiply(c(float(np.sqrt(2 / np.pi))), op.add(x, op.multiply(c(0.044715), cubed)))
    return op.multiply(op.multiply(x, c(0.5)), op.add(c(1.0), op.tanh(inner)))


@pytest.mark.parametrize(
    ("build", "exact", "libm"),
    [
        (relax.op.tanh, np.tanh, "T.tanh"),
        (relax.op.sigmoid, lambda v: 1 / (1 + np.exp(-v)), "T.sigmoid"),
        (relax.op.nn.silu, lambda v: v / (1 + np.exp(-v)), "T.sigmoid"),
        (relax.op.nn.gelu_tanh, _gelu_tanh, "T.tanh"),
        (_gelu_tanh_written_out, _gelu_tanh, "T.pow"),
        (lambda x: relax.op.power(x, relax.const(2.0, "float32")), np.square, "T.pow"),
    ],
    ids=["tanh", "sigmoid", "silu", "gelu_tanh", "gelu_tanh_written_out", "square"],
)  # fmt: skip
def test_transcendental_epilogues_on_cpu_vectorize_and_match_exact_math(build, exact, libm) -> None:
    """tanh, sigmoid, SiLU, GELU's tanh form and small integer powers leave no scalar libm call
    (``T.tanh``, ``T.exp``, ``T.pow``) on the CPU and stay within 2e-6 of the exact values over
    the range activations take, saturated ends included."""
    from tuner.graph.layout.rewrites import prepare

    target = tvm.target.Target({"kind": "llvm"})
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 257), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(build(x))
        bb.emit_func_output(out)
    mod = prepare(bb.get(), target, LayoutPlan.parse("NCHW", target))
    script = mod.script()
    assert libm not in script and "T.exp(" not in script
    data = np.linspace(-30, 30, 4 * 257).reshape(4, 257).astype("float32")
    data[0, :] = np.random.default_rng(0).normal(0, 2, 257)
    ex = tvm.compile(mod, target=target)
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(data)).numpy()
    want = exact(data.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6 * float(np.abs(want).max()))


def test_power_by_anything_but_a_small_integer_stays_tvms() -> None:
    from tuner.graph.layout.rewrites import prepare

    target = tvm.target.Target({"kind": "llvm"})
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.power(x, relax.const(2.5, "float32")))
        bb.emit_func_output(out)
    assert "T.pow" in prepare(bb.get(), target, LayoutPlan.parse("NCHW", target)).script()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_layout_transforms_fuse_with_the_casts_and_pads_beside_them(dtype) -> None:
    """The input chain of a blocked bf16 model (cast, channel pad, NCHW -> NCHW4c, spatial
    pad) is one fused function and computes what the unfused chain computes; TVM's own
    legalization leaves the transform opaque, alone in its function."""
    import ml_dtypes

    from tuner.graph.tasks import fuse

    target = tvm.target.Target({"kind": "llvm"})
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 9, 7), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            cast = bb.emit(relax.op.astype(x, dtype))
            channels = bb.emit(relax.op.nn.pad(cast, [0, 0, 0, 1, 0, 0, 0, 0]))
            blocked = bb.emit(relax.op.layout_transform(channels, lambda n, c, h, w: (n, c // 4, h, w, c % 4)))
            out = bb.emit_output(relax.op.nn.pad(blocked, [0, 0, 0, 0, 1, 2, 3, 1, 0, 0]))
        bb.emit_func_output(out)
    fused = fuse(prepare(bb.get(), target, LayoutPlan.parse("NCHW", target)), target)
    calls = [b.value for b in fused["main"].body.blocks[0].bindings]
    assert len(calls) == 1, fused["main"]
    data = np.random.default_rng(0).standard_normal((1, 3, 9, 7)).astype("float32")
    vm = relax.VirtualMachine(tvm.compile(fused, target=target), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(data)).numpy()
    want = data.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    want = np.pad(want, [(0, 0), (0, 1), (0, 0), (0, 0)]).reshape(1, 1, 4, 9, 7).transpose(0, 1, 3, 4, 2)
    want = np.pad(want, [(0, 0), (0, 0), (1, 2), (3, 1), (0, 0)])
    assert got.dtype == want.dtype and np.array_equal(got.astype("float32"), want.astype("float32"))


def test_auto_tasks_hold_each_conv_in_each_layout_once(tiny, cpu_device):
    """--layout auto's tasks: the union of the uniform plans' tasks, each conv's variants
    sharing a choice id, and a task identical across plans counted once, with one plan's weight."""
    _spec, bound, _ = tiny
    target = cpu_device.target
    layouts = auto_layouts(target)
    assert layouts[0] == f"NCHW{vector_lanes(target)}c" and layouts[-1] == "NCHW"
    tasks = extract_layout_tasks(bound, target, ("NCHW8c", "NCHW"))
    per_plan = {layout: extract_tasks(bound, target, LayoutPlan(layout)) for layout in ("NCHW8c", "NCHW")}
    union = {t.workload_key: t.weight for plan_tasks in per_plan.values() for t in plan_tasks}
    assert {t.workload_key: t.weight for t in tasks} == union
    convs = [t for t in tasks if t.layout]
    assert len(convs) == 4 and all(t.choice for t in convs)
    choices: dict[str, dict[str, Task]] = {}
    for t in convs:
        choices.setdefault(t.choice, {})[t.layout] = t
    assert len(choices) == 2 and all(set(c) == {"NCHW8c", "NCHW"} for c in choices.values())
    for pair in choices.values():
        assert pair["NCHW8c"].choice_rank == 0 and pair["NCHW"].choice_rank == 1
        assert pair["NCHW8c"].io_bytes == pair["NCHW"].io_bytes > 0
    # The classifier head is the same in both plans: one task, tuned once.
    shared = set.intersection(*({t.workload_key for t in p} for p in per_plan.values()))
    assert shared and all(not t.choice for t in tasks if t.workload_key in shared)
    # Each task says which uniform plans run it: every plan (empty) when shared, else its own.
    for rank, layout in enumerate(("NCHW8c", "NCHW")):
        own = {t.workload_key for t in per_plan[layout]} - shared
        assert own and all(t.plans == (rank,) for t in tasks if t.workload_key in own)
    assert all(t.plans == () for t in tasks if t.workload_key in shared)
    # `tune`'s "N tasks for M operators": M is what one plan runs, as `db coverage` counts.
    assert operator_count(tasks) == len(per_plan["NCHW8c"]) < len(tasks)


def _store(db, device, tasks, seconds) -> None:
    """Store, for every task, its fallback schedule as a measured record timed ``seconds(task)``."""
    from tvm.s_tir.meta_schedule.database import Workload

    from tuner.compile import fallback_record
    from tuner.db import NewRecord

    dev = db.device_id(device)
    for t in tasks:
        db.workload_id(t.workload_key, t.name, t.mod, t.flops)
        record, _ = fallback_record(Workload(t.mod), device.target)
        sec = seconds(t)
        db.add_records(dev, None, [NewRecord(t.workload_key, "fallback", json.dumps(record.as_json()), [sec] * 3)])


def _conv_seconds(fast: dict[int, str]):
    """Timings: conv 0 (3 input channels) fastest in ``fast[0]``, conv 1 in ``fast[1]``."""

    def seconds(t: Task) -> float:
        if not t.layout:
            return 2e-5
        index = 0 if int(t.mod["main"].params[0].shape[1 if t.layout == "NCHW" else -1]) == 3 else 1
        return 1e-4 if t.layout == fast[index] else 6e-4

    return seconds


def test_chooser_mixes_layouts_from_stored_records_and_the_model_stays_correct(tiny, cpu_device, tmp_path, capsys):
    """Records stored as a job stores them: conv 0 is faster in NCHW, conv 1 blocked, and the
    model's measured transforms are cheap. The chooser mixes the layouts, names the plan and
    the measured costs; the compiled mixed plan computes what the untuned NCHW build does,
    every conv on its stored record."""
    from tuner import cli
    from tuner.compile import compile_model, run_model
    from tuner.db import TuningDatabase

    spec, bound, inputs = tiny
    db = TuningDatabase(str(tmp_path / "mixed.db"))
    tasks = extract_layout_tasks(bound, cpu_device.target, ("NCHW8c", "NCHW"))
    _store(db, cpu_device, tasks, _conv_seconds({0: "NCHW", 1: "NCHW8c"}))
    choice = choose_layout(spec, cpu_device, db, ("NCHW8c", "NCHW"))
    assert choice.plan.layouts == ("NCHW", "NCHW8c") and choice.measured
    assert choice.bandwidth_measured  # from the NCHW8c plan's input/output transform tasks
    assert choice.seconds < min(choice.candidates["NCHW8c"], choice.candidates["NCHW"])
    assert [c.seconds for c in choice.convs] == [{"NCHW8c": 6e-4, "NCHW": 1e-4}, {"NCHW8c": 1e-4, "NCHW": 6e-4}]
    # The database says which layout each record belongs to: from the workload's summary, or
    # (rows written before it named the layout) from the stored PrimFunc.
    layouts = {t.workload_key: t.layout for t in tasks if t.layout}
    assert stored_layouts(db) == layouts
    with db.session() as s:
        hits = s.execute(text("SELECT key FROM workloads WHERE summary LIKE '% layout=NCHW'")).scalars().all()
        assert set(hits) == {k for k, v in layouts.items() if v == "NCHW"}
        s.execute(text("UPDATE workloads SET summary = NULL"))
    assert stored_layouts(db, list(layouts)) == layouts
    compiled = compile_model(spec, cpu_device, db, plan=choice.plan)
    conv_keys = {t.workload_key for t in tasks if t.layout}
    used = {k for k in compiled.decisions if k in conv_keys}
    assert len(used) == 2 and all(compiled.decisions[k].kind == "tuned" for k in used)
    got, _ = run_model(compiled, cpu_device, inputs, budget_s=0.1)
    assert _scaled_error(_run(bound, cpu_device.target, inputs), got[0]) < 1e-5
    # The command line says which layout each conv got and why.
    assert cli.main(["compile", "--model", "tiny", "--db", str(tmp_path / "mixed.db"), "--layout", "auto",
                     "-o", str(tmp_path / "tiny.so"), "--verify", "on"]) == 0  # fmt: skip
    printed = " ".join(capsys.readouterr().out.split())  # rich wraps lines at the terminal's width
    # The command's candidates are the target's (NCHW16c on AVX-512); tiny's 8 channels take
    # a block of 8 under either, so the stored NCHW8c records serve them.
    blocked_plan = auto_layouts(cpu_device.target)[0]
    assert f"layout plan per conv (the table above): convs: 1 NCHW, 1 {blocked_plan}, estimated" in printed
    assert "output checked against the untuned build" in printed


def test_measured_dear_transforms_keep_one_layout(tiny, cpu_device, tmp_path):
    """The same conv timings, but the model's layout transforms measured slow: switching
    layouts between the convs costs more than it saves, so one layout everywhere wins."""
    spec, bound, _ = tiny
    db = TuningDatabase(str(tmp_path / "dear.db"))
    tasks = extract_layout_tasks(bound, cpu_device.target, ("NCHW8c", "NCHW"))
    conv = _conv_seconds({0: "NCHW", 1: "NCHW8c"})
    _store(db, cpu_device, tasks, lambda t: 5e-3 if "layout_transform" in t.name else conv(t))
    choice = choose_layout(spec, cpu_device, db, ("NCHW8c", "NCHW"))
    assert choice.bandwidth_measured and choice.bandwidth < 1e8
    assert len(set(choice.plan.layouts or (choice.plan.default,))) == 1
    assert choice.seconds <= min(choice.candidates.values())


def test_a_conv_measured_in_no_layout_leaves_the_choice_to_the_others(tiny, cpu_device, tmp_path):
    """A partly tuned database: conv 0 has no record in any layout, conv 1 in both. The plan
    is still chosen from conv 1's measurements; a layout conv 1 lacks would be unmeasured."""
    spec, bound, _ = tiny
    db = TuningDatabase(str(tmp_path / "partial.db"))
    tasks = extract_layout_tasks(bound, cpu_device.target, ("NCHW8c", "NCHW"))
    first = {t.workload_key for t in tasks if t.layout and int(t.mod["main"].params[0].shape[1 if t.layout == "NCHW"
                                                                                           else -1]) == 3}  # fmt: skip
    assert len(first) == 2
    _store(db, cpu_device, [t for t in tasks if t.workload_key not in first], _conv_seconds({0: "NCHW", 1: "NCHW"}))
    choice = choose_layout(spec, cpu_device, db, ("NCHW8c", "NCHW"))
    assert choice.measured and choice.convs[0].seconds == {} and choice.convs[1].layout == "NCHW"


def test_layout_choice_is_printed_only_for_a_model_with_convs(capsys):
    """BERT has no conv: ``tune`` and ``compile`` print no empty layout table for it."""
    from tuner.cli.common import print_layout_choice
    from tuner.graph.layout.choose import ConvDecision, PlanChoice

    def choice(convs: list[ConvDecision]) -> PlanChoice:
        return PlanChoice(LayoutPlan("NCHW8c"), 1e-3, {"NCHW8c": 1e-3}, convs, 10e9, False)

    print_layout_choice(choice([]), ["NCHW8c", "NCHW"])
    assert capsys.readouterr().out == ""
    print_layout_choice(choice([ConvDecision(0, "NCHW8c", {"NCHW8c": 1e-3, "NCHW": 2e-3}, "3x3 8->8 8x8")]),
                        ["NCHW8c", "NCHW"])  # fmt: skip
    printed = capsys.readouterr().out
    assert "3x3 8->8 8x8" in printed and "layout plan NCHW8c" in printed


def test_a_plan_without_estimate_says_which_convs_it_lacks():
    """The plan line names what keeps a candidate plan from an estimate, beside a table that
    shows some of its convs measured."""
    from tuner.graph.layout.choose import ConvDecision, PlanChoice

    convs = [ConvDecision(0, "NCHW8c", {"NCHW8c": 1e-3}, "3x3 3->8 8x8"),
             ConvDecision(1, "NCHW8c", {"NCHW8c": 1e-3, "NCHW": 2e-3}, "3x3 8->8 8x8")]
    line = PlanChoice(LayoutPlan("NCHW8c"), 2e-3, {"NCHW8c": 2e-3, "NCHW": math.inf}, convs, 10e9, False).describe()
    assert "NCHW8c 2.00 ms" in line and "NCHW not estimated (1 of 2 convs unmeasured in it)" in line
    assert "unmeasured;" not in line


@pytest.mark.parametrize(("n", "packed"), [(64, 64), (250, 256), (40, None)])
def test_dense_weights_are_packed_at_compile_time_and_compute_the_same(n, packed) -> None:
    """A float32 matmul by a constant weight reads it as [N/b, K, b] with b four vectors, its
    columns padded with zeros to whole blocks where that adds at most a thirty-second (250
    to 256; 40 to 64 would add 60%: that weight stays [K, N]); each way it computes x @ W."""
    from tuner.graph.layout.plan import padded_columns
    from tuner.graph.layout.rewrites import prepare

    target = tvm.target.Target({"kind": "llvm", "mcpu": "haswell"})  # 8 lanes: b = 32
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(48, n)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 48), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, relax.const(weight)))
        bb.emit_func_output(out)
    mod = prepare(bb.get(), target, LayoutPlan.parse("NCHW", target))
    assert padded_columns(n, 8) == (packed if packed != n else None)
    shapes = {c.value.numpy().shape for c in _constants(mod)}
    if packed:
        assert (packed // 32, 48, 32) in shapes and (48, n) not in shapes
    else:
        assert (48, n) in shapes and all(len(s) != 3 for s in shapes)
    data = rng.normal(size=(1, 16, 48)).astype("float32")
    ex = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"}))
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(data)).numpy()
    np.testing.assert_allclose(got, data @ weight, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mcpu", ["haswell", "skylake-avx512"])
def test_a_classifier_dense_of_odd_columns_is_padded_into_the_x86_dense_template(mcpu) -> None:
    """A dense layer of 1000 outputs and its bias (an image classifier's head), on 8 and on
    16 lanes: the matmul reads a weight padded to whole blocks, so the x86-dense template
    has points for it (1000 is no multiple of 16, and its one tile on 8 lanes, a vector
    wide, is below the template's fewest accumulators); the bias add runs after the padding
    is dropped, in a function of its own, and the model computes x @ W + b."""
    import search_spaces
    from search_spaces import TemplateSpace
    from tuner.graph.tasks import extract_tasks

    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu})
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(64, 1000)).astype("float32")
    bias = rng.normal(size=(1000,)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(relax.op.matmul(x, relax.const(weight)), relax.const(bias)))
        bb.emit_func_output(out)
    mod = bb.get()
    tasks = {t.name: t for t in extract_tasks(mod, target, LayoutPlan.parse("NCHW", target))}
    assert set(tasks) == {"matmul", "fused_first_columns_add"}, set(tasks)
    assert "x86-dense" in search_spaces.applicable_kinds(tasks["matmul"].mod, target)
    space = TemplateSpace(tasks["matmul"].mod, target, "x86-dense")
    assert space.size() > 0
    space.apply(space.sample(np.random.default_rng(0)))
    data = rng.normal(size=(1, 64)).astype("float32")
    ex = tvm.compile(prepare(mod, target, LayoutPlan.parse("NCHW", target)), target=tvm.target.Target({"kind": "llvm"}))
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(data)).numpy()
    np.testing.assert_allclose(got, data @ weight + bias, rtol=1e-4, atol=1e-4)


def _constants(mod: tvm.IRModule) -> list[Constant]:
    found: list[Constant] = []
    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(
                func, lambda e: found.append(e) if isinstance(e, Constant) and hasattr(e.value, "numpy") else None)
    return found


@pytest.mark.parametrize(("channels", "stride"), [(4, 2), (3, 1)])
def test_a_conv_over_row_taps_is_the_conv(channels, stride):
    """A few-channel conv (ResNet's 7x7 stem) over row_taps, its kernel rows alone with
    row_tap_weight, computes the padded conv over the data: what an AMX stem runs
    (tuner.graph.layout.plan.wide_blocks; float32 here, so it builds and runs on any CPU)."""
    from tvm import te

    rng = np.random.default_rng(3)
    pad, block = (3, 3, 3, 3), 32
    data = rng.uniform(-1, 1, (1, 1, 12, 13, channels)).astype("float32")
    weight = rng.uniform(-1, 1, (2, 1, 7, 7, channels, 16)).astype("float32")  # OIHW{c}i16o
    x = te.placeholder(data.shape, "float32", name="x")

    def build(out: te.Tensor, w: te.Tensor) -> np.ndarray:
        lib = tvm.compile(tvm.IRModule({"main": te.create_prim_func([x, w, out])}), target="llvm")
        got = tvm.runtime.tensor(np.zeros([int(d) for d in out.shape], "float32"))
        lib["main"](tvm.runtime.tensor(data), tvm.runtime.tensor(packed[w.name]), got)
        return got.numpy()

    packed = {"w": pack_dot_weight(weight, 1) if channels % 2 else pack_dot_weight(weight, 2),
              "w_rows": pack_dot_weight(row_tap_weight(weight, block), 2)}
    w = te.placeholder(packed["w"].shape, "float32", name="w")
    w_rows = te.placeholder(packed["w_rows"].shape, "float32", name="w_rows")
    want = build(conv2d_nchwc_dot(x, w, (stride, stride), pad, (1, 1), "float32"), w)
    taps = row_taps(x, pad, 7, stride, block)
    got = build(conv2d_nchwc_dot(taps, w_rows, (stride, 1), (0, 0, 0, 0), (1, 1), "float32"), w_rows)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert row_taps_fit(weight.shape, block) and not row_taps_fit(weight.shape, 16)


def _fire_onnx(path, left: int, right: int):
    """SqueezeNet's fire module in ONNX: a 1x1 conv, then a 1x1 and a 3x3 conv of ``left`` and
    ``right`` channels concatenated, scaled and shifted by (C, 1, 1) constants, a dropout (ONNX
    Dropout, identity at inference) and a conv."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights, nodes = [], []

    def conv(name: str, inp: str, cin: int, cout: int, k: int) -> None:
        weights.append(numpy_helper.from_array(rng.standard_normal((cout, cin, k, k)).astype(np.float32), f"{name}_w"))
        nodes.append(helper.make_node("Conv", [inp, f"{name}_w"], [name], kernel_shape=[k, k], pads=[k // 2] * 4))

    conv("squeeze", "x", 3, 16, 1)
    nodes.append(helper.make_node("Relu", ["squeeze"], ["s"]))
    conv("e1", "s", 16, left, 1)
    conv("e3", "s", 16, right, 3)
    nodes += [helper.make_node("Relu", ["e1"], ["r1"]), helper.make_node("Relu", ["e3"], ["r3"]),
              helper.make_node("Concat", ["r1", "r3"], ["cat"], axis=1),
              helper.make_node("Mul", ["cat", "scale"], ["scaled"]),
              helper.make_node("Add", ["scaled", "shift"], ["shifted"]),
              helper.make_node("Dropout", ["shifted"], ["dropped"])]  # fmt: skip
    # A batch norm as DenseNet-121's ONNX graph writes it: by (C, 1, 1) constants.
    weights += [numpy_helper.from_array(rng.uniform(0.5, 2, (left + right, 1, 1)).astype(np.float32), name)
                for name in ("scale", "shift")]  # fmt: skip
    conv("out", "dropped", left + right, 8, 1)
    graph = helper.make_graph(nodes, "fire", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 8, 16, 16])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("channels", [(8, 8), (5, 7), (16, 16)])
def test_a_concatenation_of_blocked_convs_and_a_dropout_convert(channels, cpu_device, tmp_path):
    """ConvertLayout's own inference failed on a concat of blocked convs ("Invalid layout axis
    16b", "5b") and on dropout's tuple ("Expected nested to match tuple"): both now convert,
    every conv in the blocked layout, and compute what the model computes in NCHW. A concat
    of whole blocks and the (C, 1, 1) scaling after it stay blocked."""
    spec = load_model(str(_fire_onnx(tmp_path / "fire.onnx", *channels)))
    bound, target = spec.bound(), cpu_device.target
    tasks = extract_layout_tasks(bound, target, auto_layouts(target))
    assert any("concatenate" in t.name for t in tasks)
    inputs = spec.random_inputs(seed=0)
    want = _run(prepare(bound, target, LayoutPlan.parse("NCHW", target)), target, inputs)
    blocked = prepare(bound, target, LayoutPlan.parse("NCHW8c", target))
    convs = [gv.name_hint for gv in blocked.functions if "conv2d" in gv.name_hint]
    assert convs and all("conv2d_NCHWc" in name for name in convs), convs
    # Whole 8-channel blocks concatenate in NCHW8c: the only transforms are the graph's input
    # and output; other splits go back to NCHW around the concat.
    transforms = [gv.name_hint for gv in blocked.functions if "layout_transform" in gv.name_hint]
    assert (len(transforms) == 2) == all(c % 8 == 0 for c in channels), transforms
    assert _scaled_error(want, _run(blocked, target, inputs)) < 1e-5


def test_a_graph_the_layout_rewrite_fails_on_runs_in_nchw_with_one_warning(cpu_device, tmp_path, monkeypatch, caplog):
    """Defence in depth: where ``ConvertLayout`` still fails (here the dropout tuple it failed
    on before :func:`dropout_as_identity`, "Expected nested to match tuple"), the model is
    prepared in NCHW, tasks and compiled model alike, with one warning for all its plans."""
    from tuner.graph.layout import rewrites

    monkeypatch.setattr(rewrites, "dropout_as_identity", lambda mod: mod)
    monkeypatch.setattr(rewrites, "_WARNED", set())
    spec = load_model(str(_fire_onnx(tmp_path / "fire.onnx", 8, 8)))
    bound, target = spec.bound(), cpu_device.target
    nchw = prepare(bound, target, LayoutPlan.parse("NCHW", target))
    with caplog.at_level("WARNING", logger=rewrites.__name__):
        tasks = extract_layout_tasks(bound, target, auto_layouts(target))
        blocked = prepare(bound, target, LayoutPlan.parse("NCHW8c", target))
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, warnings
    assert "Expected nested to match tuple" in warnings[0] and "run in NCHW" in warnings[0], warnings
    assert all(t.layout in ("", "NCHW") for t in tasks), [(t.name, t.layout) for t in tasks]
    assert not any("NCHWc" in gv.name_hint for gv in blocked.functions)
    inputs = spec.random_inputs(seed=0)
    assert _scaled_error(_run(nchw, target, inputs), _run(blocked, target, inputs)) < 1e-6
