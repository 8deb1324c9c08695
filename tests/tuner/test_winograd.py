"""Winograd F(m, 3) convs: the compute, the weight transform, and the layout plan that asks for them."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, te, topi

import search_spaces
from tuner.graph.layout.choose import choose_layouts
from tuner.graph.layout.plan import (
    LayoutPlan,
    auto_layouts,
    block_of,
    check_layout,
    data_layout,
    useful_layouts,
    vector_lanes,
    winograd,
    winograd_tile,
)
from tuner.graph.layout.rewrites import prepare
from tuner.graph.tasks import extract_layout_tasks, extract_tasks
from tuner.graph.winograd import conv2d_nchwc_winograd, matrices, transform_weight, transform_weight_dot


def _build(args: list[te.Tensor]):
    return tvm.compile(te.create_prim_func(args), target="llvm")


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize(("c", "o", "hw", "ib", "padding"), [
    (16, 32, 10, 16, (1, 1, 1, 1)), (32, 16, 7, 16, (1, 1, 1, 1)),
    (3, 8, 9, 3, (1, 1, 1, 1)), (16, 16, 8, 8, (0, 0, 0, 0)),
])
def test_winograd_computes_the_direct_conv(m, c, o, hw, ib, padding):
    """Against TOPI's direct conv2d_NCHWc: every tile size, a map its tiles do not divide, a
    3-channel input block (ResNet's first conv), and no padding."""
    rng = np.random.default_rng(0)
    ob = min(o, 16)
    x = rng.standard_normal((1, c // ib, hw, hw, ib)).astype("float32")
    w = rng.standard_normal((o // ob, c // ib, 3, 3, ib, ob)).astype("float32")
    u = transform_weight(w, m)
    assert u.shape == (m + 2, m + 2, o // ob, c, ob)
    xt, ut, wt = (te.placeholder(a.shape, name=n) for a, n in ((x, "x"), (u, "u"), (w, "w")))
    out = conv2d_nchwc_winograd(xt, ut, padding, m)
    with tvm.target.Target("llvm"):
        ref = topi.nn.conv2d_NCHWc(xt, wt, 1, padding, 1, f"NCHW{ib}c", f"NCHW{ob}c", "float32")
    assert tuple(int(d) for d in out.shape) == tuple(int(d) for d in ref.shape)
    got, want = (tvm.runtime.tensor(np.zeros([int(d) for d in t.shape], "float32")) for t in (out, ref))
    _build([xt, ut, out])(tvm.runtime.tensor(x), tvm.runtime.tensor(u), got)
    _build([xt, wt, ref])(tvm.runtime.tensor(x), tvm.runtime.tensor(w), want)
    error = np.abs(got.numpy() - want.numpy()).max() / np.abs(want.numpy()).max()
    assert error < 1e-5, error


@pytest.mark.parametrize("m", [2, 4])
def test_winograd_on_bf16_data_computes_the_direct_conv_of_the_same_values(m):
    """A bf16 model's conv: bf16 data, weights transformed from their bf16 values and kept
    float32; it rounds nothing more than the direct conv of those values in float32."""
    import ml_dtypes

    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 2, 9, 9, 16)).astype(ml_dtypes.bfloat16)
    w = rng.standard_normal((2, 2, 3, 3, 16, 16)).astype(ml_dtypes.bfloat16)
    u = transform_weight(w.astype("float32"), m)
    xt = te.placeholder(x.shape, name="x", dtype="bfloat16")
    ut = te.placeholder(u.shape, name="u")
    xf, wf = (te.placeholder(a.shape, name=n) for a, n in ((x, "xf"), (w, "wf")))
    out = conv2d_nchwc_winograd(xt, ut, (1, 1, 1, 1), m)
    with tvm.target.Target("llvm"):
        ref = topi.nn.conv2d_NCHWc(xf, wf, 1, (1, 1, 1, 1), 1, "NCHW16c", "NCHW16c", "float32")
    got, want = (tvm.runtime.tensor(np.zeros([int(d) for d in t.shape], "float32")) for t in (out, ref))
    _build([xt, ut, out])(tvm.runtime.tensor(x), tvm.runtime.tensor(u), got)
    _build([xf, wf, ref])(tvm.runtime.tensor(x.astype("float32")), tvm.runtime.tensor(w.astype("float32")), want)
    error = np.abs(got.numpy() - want.numpy()).max() / np.abs(want.numpy()).max()
    assert error < 1e-5, error


def test_the_transforms_reject_what_they_cannot_compute():
    with pytest.raises(ValueError, match="tile 3"):
        matrices(3)
    with pytest.raises(ValueError, match="3x3 kernel"):
        transform_weight(np.zeros((1, 1, 1, 1, 16, 16), "float32"), 4)


def test_layout_names_carry_the_tile():
    assert winograd("NCHW16c") == "NCHW16c:w4" and winograd("NCHW8c:w4", 2) == "NCHW8c:w2"
    assert winograd_tile("NCHW16c:w4") == 4 and winograd_tile("NCHW16c") is None
    assert data_layout("NCHW16c:w4") == "NCHW16c" and block_of("NCHW16c:w2") == 16
    assert check_layout("NCHW8c:w2") == "NCHW8c:w2"
    with pytest.raises(ValueError, match="tile 3"):
        check_layout("NCHW8c:w3")
    with pytest.raises(ValueError, match="unknown conv layout"):
        check_layout("NCHW:w4")
    # One block size, with and without the algorithm.
    assert LayoutPlan("NCHW8c:w4", ("NCHW8c", "NCHW")).layout_of(0) == "NCHW8c"


def test_auto_layouts_weigh_winograd_on_x86(cpu_device):
    layouts = auto_layouts(cpu_device.target)
    blocked = f"NCHW{vector_lanes(cpu_device.target)}c"
    assert layouts == (blocked, f"{blocked}:w4", f"{blocked}:w2", "NCHW")
    assert LayoutPlan.parse("NCHWc:w4", cpu_device.target).default == f"{blocked}:w4"  # --layout NCHWc:w4
    assert auto_layouts(tvm.target.Target({"kind": "cuda", "arch": "sm_90"})) == ("NCHW",)


def test_auto_layouts_of_reduced_precisions(cpu_device):
    """int8 convs run on the dot product in the blocked layout alone. bf16 weighs Winograd
    F(2, 3) on vdpbf16ps beside it where the CPU has vdpbf16ps and no AMX tiles (which do 4x
    its work a step); F(4, 3) never (tuner.graph.winograd: its bf16 rounding)."""
    blocked = f"NCHW{vector_lanes(cpu_device.target)}c"
    assert auto_layouts(cpu_device.target, "int8") == (blocked,)
    zen4, spr, skx = (tvm.target.Target({"kind": "llvm", "mcpu": cpu, "num-cores": 2})
                      for cpu in ("znver4", "sapphirerapids", "skylake-avx512"))  # fmt: skip
    assert auto_layouts(zen4, "bf16") == ("NCHW16c", "NCHW16c:w2")
    assert auto_layouts(spr, "bf16") == auto_layouts(skx, "bf16") == ("NCHW16c",)


def test_bf16_dot_weights_are_the_transform_rounded_and_paired():
    """transform_weight_dot: transform_weight's U rounded to bf16, each lane's two input
    channels adjacent: ``out[e, n, o, i // 2, k, i % 2] == bf16(U[e, n, o, i, k])``."""
    import ml_dtypes

    w = np.random.default_rng(1).standard_normal((2, 2, 3, 3, 16, 16)).astype("float32")
    u = transform_weight(w, 2)
    packed = transform_weight_dot(w, 2)
    assert packed.dtype == ml_dtypes.bfloat16 and packed.shape == (4, 4, 2, 16, 16, 2)
    want = u.astype(ml_dtypes.bfloat16)
    assert np.array_equal(packed[:, :, :, 5, :, 1], want[:, :, :, 11, :])
    assert np.array_equal(packed.transpose(0, 1, 2, 3, 5, 4).reshape(u.shape), want)
    with pytest.raises(ValueError, match="even number of input channels"):
        transform_weight_dot(w[:, :1, :, :, :3], 2)


def test_bf16_dot_winograd_errs_within_bf16_rounding_of_the_exact_conv():
    """F(2, 3) with bf16-rounded transformed data and weights (the GEMMs on vdpbf16ps):
    against the conv of the same bf16 values computed exactly (float64), within twice the
    bf16 conv's error bound on this data (3.5e-3 here)."""
    import ml_dtypes

    rng = np.random.default_rng(3)
    x = np.maximum(rng.standard_normal((1, 4, 10, 10, 16)), 0).astype(ml_dtypes.bfloat16)
    w = (rng.standard_normal((4, 4, 3, 3, 16, 16)) * np.sqrt(2 / (9 * 64))).astype(ml_dtypes.bfloat16)
    u = transform_weight_dot(w.astype("float32"), 2)
    xt = te.placeholder(x.shape, name="x", dtype="bfloat16")
    ut = te.placeholder(u.shape, name="u", dtype="bfloat16")
    out = conv2d_nchwc_winograd(xt, ut, (1, 1, 1, 1), 2)
    got = tvm.runtime.tensor(np.zeros([int(d) for d in out.shape], "float32"))
    _build([xt, ut, out])(tvm.runtime.tensor(x), tvm.runtime.tensor(u), got)
    xf = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1), (0, 0)))
    wf = w.astype(np.float64)
    exact = sum(np.einsum("cyxi,Ocio->Oyxo", xf[0, :, i:i + 10, j:j + 10], wf[:, :, i, j])
                for i in range(3) for j in range(3))[None]  # fmt: skip
    error = np.abs(got.numpy() - exact).max() / np.abs(exact).max()
    # The direct bf16 conv of these values sums exact products in float32: ~1e-6. The bound
    # is bf16's half ulp (2^-9) of the transformed values, which are up to 4x the inputs.
    assert 1e-5 < error < 8e-3, error


def test_switching_to_winograd_in_the_same_blocks_costs_no_transform():
    """The chooser charges a transform where the data's layout changes, not the algorithm."""
    seconds = [{"NCHW8c": 1.0, "NCHW8c:w4": 0.5}, {"NCHW8c": 0.5, "NCHW8c:w4": 1.0}]
    charged = []

    def cost(i, a, b):
        charged.append((i, a, b))
        return 10.0

    choice = choose_layouts(seconds, cost)
    assert choice.plan.layouts == ("NCHW8c:w4", "NCHW8c") and choice.seconds == 21.0
    assert all(data_layout(a) != data_layout(b) for _, a, b in charged)


def _three_convs(first_stride: int = 1) -> tvm.IRModule:
    """3x3 stride 1, 3x3 stride 2, 1x1: only the first is Winograd's (none with
    ``first_stride`` 2)."""
    rng = np.random.default_rng(1)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 12, 12), "float32"))

    def weight(*shape):
        return relax.const((rng.standard_normal(shape) * 0.2).astype("float32"))

    op = relax.op.nn
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.relu(op.conv2d(x, weight(16, 16, 3, 3), strides=first_stride, padding=1)))
            y = bb.emit(op.relu(op.conv2d(y, weight(16, 16, 3, 3), strides=2, padding=1)))
            out = bb.emit_output(op.conv2d(y, weight(16, 16, 1, 1)))
        bb.emit_func_output(out)
    return bb.get()


def _run(mod: tvm.IRModule, target: tvm.target.Target, x: np.ndarray) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def test_a_winograd_plan_converts_only_the_convs_it_fits_and_computes_the_same(cpu_device):
    target = cpu_device.target
    mod = _three_convs()
    x = np.random.default_rng(2).standard_normal((1, 16, 12, 12)).astype("float32")
    want = _run(mod, target, x)
    plan = LayoutPlan("NCHW8c:w4")
    got = _run(prepare(mod, target, plan), target, x)
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-5
    layouts = sorted(t.layout for t in extract_tasks(mod, target, plan) if t.layout)
    assert layouts == ["NCHW8c", "NCHW8c", "NCHW8c:w4"]
    # Per conv: Winograd asked for the stride-2 conv only, which it does not fit: none is.
    plan = LayoutPlan("NCHW8c", ("NCHW8c", "NCHW8c:w4"))
    assert sorted(t.layout for t in extract_tasks(mod, target, plan) if t.layout) == ["NCHW8c"] * 3


def test_a_bf16_model_runs_its_3x3_stride_1_conv_by_winograd_where_planned(cpu_device):
    """In bf16 the plan's Winograd conv reads the bf16 activation and computes in float32;
    the model's output stays within bf16's rounding of the direct bf16 build's (the convs
    after it round their inputs to bf16 either way)."""
    from tuner.precision import apply_precision

    target = cpu_device.target
    mod = apply_precision(_three_convs(), "bf16")
    x = np.random.default_rng(2).standard_normal((1, 16, 12, 12)).astype("float32")
    direct = _run(prepare(mod, target, LayoutPlan("NCHW16c")), target, x)
    got = _run(prepare(mod, target, LayoutPlan("NCHW16c:w4")), target, x)
    assert np.abs(got - direct).max() / np.abs(direct).max() < 2e-2
    tasks = extract_tasks(mod, target, LayoutPlan("NCHW16c:w4"), precision="bf16")
    wino = next(t for t in tasks if t.layout == "NCHW16c:w4")
    assert "x86-conv2d-winograd" in search_spaces.applicable_kinds(wino.mod, target)
    assert sorted(t.layout for t in tasks if t.layout) == ["NCHW16c", "NCHW16c", "NCHW16c:w4"]


@pytest.mark.slow
def test_the_chooser_gives_a_bf16_conv_winograd_where_it_was_measured_faster(cpu_device):
    """bf16 candidates: the 3x3 stride-1 conv measured faster by Winograd F(4, 3) than on the
    dot product, the others with one (blocked) variant: the plan runs that conv by Winograd
    and the others blocked, and the model computes what its fp32 build does."""
    from tuner.graph.layout.choose import choose_from_database
    from tuner.precision import apply_precision

    target = cpu_device.target
    layouts = ("NCHW16c", "NCHW16c:w4", "NCHW16c:w2")
    tasks = extract_layout_tasks(_three_convs(), target, layouts, precision="bf16")
    assert sorted(t.layout for t in tasks if t.layout) == ["NCHW16c"] * 3 + ["NCHW16c:w2", "NCHW16c:w4"]
    seconds = {t.workload_key: {"NCHW16c:w4": 1e-4, "NCHW16c:w2": 3e-4}.get(t.layout, 6e-4 if t.layout else 2e-5)
               for t in tasks}  # fmt: skip
    mod = apply_precision(_three_convs(), "bf16")
    choice = choose_from_database(mod, target, seconds.get, layouts, precision="bf16")
    assert choice.plan.layout_of(0) == "NCHW16c:w4"
    # The convs Winograd does not fit run blocked on the dot product whatever the plan says.
    planned = extract_tasks(_three_convs(), target, choice.plan, precision="bf16")
    assert sorted(t.layout for t in planned if t.layout) == ["NCHW16c", "NCHW16c", "NCHW16c:w4"]
    x = np.random.default_rng(5).standard_normal((1, 16, 12, 12)).astype("float32")
    want = _run(_three_convs(), target, x)
    got = _run(prepare(mod, target, choice.plan), target, x)
    assert np.abs(got - want).max() / np.abs(want).max() < 3e-2


def test_auto_tasks_add_a_winograd_variant_only_where_it_fits(cpu_device):
    """Under --layout auto's candidates the 3x3 stride-1 conv has four variants; the others
    keep two, the Winograd plans giving them the blocked plan's task."""
    target = cpu_device.target
    tasks = extract_layout_tasks(_three_convs(), target, ("NCHW8c", "NCHW8c:w4", "NCHW8c:w2", "NCHW"))
    variants: dict[str, set[str]] = {}
    for t in tasks:
        if t.layout:
            variants.setdefault(t.choice, set()).add(t.layout)
    assert sorted(map(sorted, variants.values())) == [["NCHW", "NCHW8c"], ["NCHW", "NCHW8c"],
                                                      ["NCHW", "NCHW8c", "NCHW8c:w2", "NCHW8c:w4"]]  # fmt: skip
    wino = next(t for t in tasks if t.layout == "NCHW8c:w4")
    assert "x86-conv2d-winograd" in search_spaces.applicable_kinds(wino.mod, target)
    # The two Winograd variants' functions have one name in their own plans: apart here.
    names = [t.name for t in tasks]
    assert len(names) == len(set(names))
    assert next(t for t in tasks if t.layout == "NCHW8c:w2").name == f"{wino.name}[NCHW8c:w2]"


def test_winograd_candidates_are_dropped_for_a_model_without_a_conv_they_fit():
    """No fitting conv (BERT, MobileNet): the Winograd plans would repeat the blocked one's
    tasks, so they are not extracted nor weighed again."""
    candidates = ("NCHW8c", "NCHW8c:w4", "NCHW8c:w2", "NCHW")
    assert useful_layouts(_three_convs(), candidates) == candidates
    assert useful_layouts(_three_convs(first_stride=2), candidates) == ("NCHW8c", "NCHW")


def test_bf16_bits_round_to_nearest_even_as_numpy_does():
    """``bf16_bits`` (data_pack's rounding) gives ml_dtypes' bfloat16 bits: ties to even,
    carries into the exponent; ``bf16_value`` widens them back exactly."""
    import ml_dtypes

    from search_spaces.x86.intrin import bf16_bits, bf16_value

    rng = np.random.default_rng(0)
    ties = np.array([0x3F808000, 0x3F818000, 0x3F7FFFFF, 0x3F80FFFF, 0xBF808001], np.uint32).view(np.float32)
    x = np.concatenate([ties, rng.standard_normal(4091) * 10.0 ** rng.integers(-3, 4, 4091)]).astype(np.float32)
    xt = te.placeholder(x.shape, name="x")
    bits = te.compute(x.shape, lambda i: bf16_bits(xt[i]), name="bits")
    back = te.compute(x.shape, lambda i: bf16_value(bits[i]), name="back")
    got_bits = tvm.runtime.tensor(np.zeros(x.shape, np.uint16))
    got_back = tvm.runtime.tensor(np.zeros(x.shape, np.float32))
    _build([xt, bits, back])(tvm.runtime.tensor(x), got_bits, got_back)
    want = x.astype(ml_dtypes.bfloat16)
    assert np.array_equal(got_bits.numpy(), want.view(np.uint16))
    assert np.array_equal(got_back.numpy(), want.astype(np.float32))
