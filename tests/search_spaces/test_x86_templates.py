"""What the x86 register-tiled templates promise beyond the conformance suite: the register
budget on AVX-512 and AVX2, which tasks they take, and accumulators that are one tile."""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import pytest
import tvm
from conftest import (
    DENSE_DEFAULTS,
    DENSE_DOT_DEFAULTS,
    NCHWC_DEFAULTS,
    dense,
    named_point,
    needs_vnni,
    space,
    target,
    task,
)
from tvm import te, topi

import search_spaces
from search_spaces import Limits, Point, TemplateSpace


def _regs(kind: str, values: dict, lanes: int) -> int:
    if kind == "x86-conv2d-nchwc":
        return values["reg_n"] * values["tile_oh"] * values["tile_oc"] * math.ceil(values["oc_block"] / lanes)
    if kind == "x86-conv2d-winograd":
        return values["tile_p"] * values["tile_oc"] * math.ceil(values["oc_block"] / lanes)
    if kind == "x86-depthwise-conv2d-nchw":
        return values["tile_c"] * values["tile_h"] * math.ceil(values["tile_w"] / lanes)
    if kind == "x86-depthwise-conv2d-nchwc":
        return values["tile_c"] * values["tile_h"] * values["tile_w"] * math.ceil(values["block"] / lanes)
    return values["tile_m"] * values["tile_n"] // lanes


@pytest.mark.parametrize(("kind", "task_name", "fewest"), [
    ("x86-conv2d-nchwc", "conv_nchwc", 4), ("x86-dense", "dense", 4), ("x86-dense", "dense_packed", 4),
    ("x86-depthwise-conv2d-nchw", "depthwise", 1),
    ("x86-depthwise-conv2d-nchwc", "depthwise_nchwc16", 4), ("x86-conv2d-winograd", "conv_winograd", 4),
])
@pytest.mark.parametrize("vector_bits", [512, 256])
def test_register_budget_holds_for_every_point(kind, task_name, fewest, vector_bits):
    """Every point inside the constraint keeps ``fewest``..24 accumulator registers on
    AVX-512, and fewer of AVX2's 16 (where a 16-lane channel block takes two registers), so
    nothing spills; and the bound bites."""
    most = 24 if vector_bits == 512 else {"x86-conv2d-nchwc": 14, "x86-depthwise-conv2d-nchwc": 12,
                                          "x86-dense": 14, "x86-conv2d-winograd": 14}.get(kind, 24)
    limits = Limits(vector_bits=vector_bits, num_cores=2)
    sp = TemplateSpace(task(task_name), target("llvm"), kind, limits=limits)
    knobs = sp.knobs(0)
    inside = 0
    for values in itertools.product(*(k.choices for k in knobs)):
        point = Point(0, values)
        named = sp.values(point)
        regs = _regs(kind, named, vector_bits // 32)
        reason = sp.static_violation(point)
        if reason is None:
            inside += 1
            assert fewest <= regs <= most, named
        elif not fewest <= regs <= most:
            assert "register" in reason
    assert 0 < inside == sp.size() < sp.grid_size()


def test_templates_take_only_their_pattern():
    llvm = target("llvm")
    # NCHW conv is the other template's; a plain 64^3 matmul block named C is not "matmul".
    assert "x86-conv2d-nchwc" not in search_spaces.applicable_kinds(task("conv"), llvm)
    # A direct blocked conv is not the Winograd template's, nor a Winograd conv the direct one's.
    assert "x86-conv2d-winograd" not in search_spaces.applicable_kinds(task("conv_nchwc"), llvm)
    assert "x86-conv2d-nchwc" not in search_spaces.applicable_kinds(task("conv_winograd"), llvm)
    assert "x86-dense" not in search_spaces.applicable_kinds(task("matmul"), llvm)
    # An NT matmul (B is [n, k]) would load B's columns with a stride: not this template's.
    a = te.placeholder((1, 32, 64), name="A")
    b = te.placeholder((48, 64), name="B")
    k = te.reduce_axis((0, 64), name="k")
    nt = te.compute((1, 32, 48), lambda z, i, j: te.sum(a[z, i, k] * b[j, k], axis=k), name="matmul")
    assert search_spaces.applicable_kinds(tvm.IRModule({"main": te.create_prim_func([a, b, nt])}), llvm) == ["sketch"]
    # A reduction after the matmul cannot be computed at the register tile.
    b = te.placeholder((64, 48), name="B")
    nn = te.compute((1, 32, 48), lambda z, i, j: te.sum(a[z, i, k] * b[k, j], axis=k), name="matmul")
    for after, applies in ((topi.nn.relu(nn), True), (topi.sum(nn, axis=2), False)):
        mod = tvm.IRModule({"main": te.create_prim_func([a, b, after])})
        assert ("x86-dense" in search_spaces.applicable_kinds(mod, llvm)) is applies
    # N not a multiple of the vector lanes: no vector tile of C's columns exists.
    assert "x86-dense" not in search_spaces.applicable_kinds(dense(n=20), llvm)
    # A softmax over another axis than the last is not computed a row at a time.
    assert "x86-softmax" in search_spaces.applicable_kinds(task("softmax"), llvm)
    assert "x86-softmax" not in search_spaces.applicable_kinds(task("softmax_axis1"), llvm)
    assert "x86-layer-norm" in search_spaces.applicable_kinds(task("layer_norm"), llvm)
    assert "x86-layer-norm" not in search_spaces.applicable_kinds(task("layer_norm_axis1"), llvm)
    assert "x86-softmax" not in search_spaces.applicable_kinds(task("layer_norm"), llvm)


def test_the_bf16_winograd_gemm_takes_the_dot_product_only_where_the_cpu_has_it():
    """The bf16 F(2, 3) task (data_pack of bf16 bits, weights in pairs) is the Winograd
    template's on an AVX512_BF16 CPU, built with vdpbf16ps; not on a VNNI CPU without it. Its
    unrolled step is in pairs of input channels (16 channel blocks: up to 8)."""
    wino = task("conv_winograd_bf16_dot")
    assert "x86-conv2d-winograd" not in search_spaces.applicable_kinds(wino, target("llvm-vnni"))
    zen4 = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})
    sp = TemplateSpace(wino, zen4, "x86-conv2d-winograd")
    assert dict((k.name, k.choices) for k in sp.knobs(0))["tile_ci"] == (1, 2, 4, 8)
    sch = sp.apply(sp.sample(np.random.default_rng(0)))
    assert "dot_16x2_bf16bits" not in sch.mod.script()  # tensorized: the instruction's implementation
    assert "nightshift_dpbf16ps_512" in sch.mod.script()


def test_winograd_template_starts_from_the_tiles_a_full_sweep_found_fastest():
    """A job measures 4 tiles x 4 channel blocks, 7 x 2, 1 x 4 and 4 x 2 first (the bests of
    ResNet-50 bf16's F(2, 3) tasks when a Zen 4 timed every point): valid points, and only
    the tiles the task's tiles and channels take."""
    from conftest import conv_winograd

    zen4 = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})
    # F(2, 3) on a 28x28 map: 14 x 14 = 196 tiles, which 4 and 7 divide; 64 channels: 4 blocks.
    wide = TemplateSpace(conv_winograd(c=64, o=64, hw=28, m=2, dtype="bfloat16", dot=True), zen4,
                         "x86-conv2d-winograd")
    starts = [wide.values(p) for p in wide.starts()]
    assert all(wide.static_violation(p) is None for p in wide.starts())
    assert [(v["tile_p"], v["tile_oc"]) for v in starts] == [(4, 4), (7, 2), (1, 4), (4, 2)]
    assert {(v["tile_ci"], v["pad_inline"]) for v in starts} == {(1, 0)}
    # 14x14: 49 tiles, which 4 does not divide.
    odd = TemplateSpace(conv_winograd(c=64, o=64, hw=14, m=2, dtype="bfloat16", dot=True), zen4, "x86-conv2d-winograd")
    assert [(odd.values(p)["tile_p"], odd.values(p)["tile_oc"]) for p in odd.starts()] == [(7, 2), (1, 4)]


@pytest.mark.parametrize("task_name", ["conv_winograd", "conv_winograd_bf16_dot"])
def test_winograd_gemm_unrolls_its_register_tile_and_not_the_tile_loop(task_name):
    """With one output channel block in the register tile the accumulators' store has no
    channel loop; the template unrolled the loop of register tiles instead (a 56x56 map's
    196 steps: LLVM took 10-120 s a build and the jobs' builds timed out)."""
    zen4 = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})
    sp = TemplateSpace(task(task_name), zen4, "x86-conv2d-winograd")
    points = (Point(0, v) for v in itertools.product(*(k.choices for k in sp.knobs(0))))
    point = next(p for p in points if sp.static_violation(p) is None
                 and sp.values(p)["tile_oc"] == 1 and sp.values(p)["tile_p"] in (4, 7))  # fmt: skip
    script = sp.apply(point).mod.script()
    assert re.search(r"for p_0 in range\(\d+\)", script), script
    assert not re.search(r"for p_0 in T\.unroll", script)


def _compacted(mod: tvm.IRModule, *then: tvm.transform.Pass) -> str:
    """``mod`` lowered through TVM's buffer planning (and the passes ``then``), as TVMScript."""
    st = tvm.s_tir.transform
    passes = [st.LowerInitBlock(), st.PlanAndUpdateBufferAllocationLocation(), st.ConvertBlocksToOpaque(),
              st.CompactBufferAllocation(), *then]
    return tvm.transform.Sequential(passes)(mod).script()


@pytest.mark.parametrize(("kind", "task_name", "acc"), [("x86-conv2d-nchwc", "conv_nchwc", "conv2d_NCHWc_local"),
                                                        ("x86-dense", "dense", "matmul_local"),
                                                        ("x86-dense", "dense_packed", "matmul_local"),
                                                        ("x86-depthwise-conv2d-nchw", "depthwise",
                                                         "group_conv2d_nchw_local"),
                                                        ("x86-depthwise-conv2d-nchwc", "depthwise_nchwc",
                                                         "depthwise_conv2d_NCHWc_local"),
                                                        ("x86-conv2d-winograd", "conv_winograd", "bgemm_local")])
def test_accumulators_are_one_register_tile(kind, task_name, acc):
    """After TVM's buffer planning the accumulator buffer holds exactly the register tile,
    so LLVM can keep it in registers (a full-size buffer would live in memory)."""
    sp = space(kind, task_name, "llvm")
    point = sp.sample(np.random.default_rng(3))
    values = sp.values(point)
    found = re.findall(rf"{acc} = T\.\w*alloc_buffer\(\(([^)]*)\)", _compacted(sp.apply(point).mod))
    assert len(found) == 1, found
    shapes = [[int(d) for d in found[0].split(",") if d.strip()]]
    if kind == "x86-conv2d-nchwc":
        want = values["tile_oh"] * values["reg_n"] * values["tile_oc"] * values["oc_block"]
    elif kind == "x86-conv2d-winograd":
        want = values["tile_p"] * values["tile_oc"] * values["oc_block"]
    elif kind == "x86-depthwise-conv2d-nchw":
        want = values["tile_c"] * values["tile_h"] * values["tile_w"]
    elif kind == "x86-depthwise-conv2d-nchwc":
        want = values["tile_c"] * values["tile_h"] * values["tile_w"] * values["block"]
    else:
        want = values["tile_m"] * values["tile_n"]
    assert math.prod(shapes[0]) == want, (shapes, values)


def _nchwc_point(sp: TemplateSpace, **values) -> Point:
    return named_point(sp, NCHWC_DEFAULTS, **values)


@pytest.mark.parametrize(("task_name", "values"), [
    ("conv_nchwc", {"reg_n": 4}),  # 196 pixels: 49 tiles of 4, across rows of 14
    ("conv_nchwc", {"reg_n": 5}),  # 39 tiles of 5, then one of 1 (peeled)
    ("conv_nchwc_relax", {"reg_n": 6, "tile_oc": 2}),  # Relax's int64 indices: 32 of 6, one of 4
    ("conv_nchwc", {"reg_n": 7, "parallel_depth": 3, "order": 1, "unroll_kw": 3}),
    ("conv_nchwc", {"reg_n": 2, "pad_inline": 1, "tile_oc": 2, "order": 2}),
    ("conv_nchwc_bare", {"reg_n": 7}),  # 1x1 stride 2, 7x7 output, no epilogue: a cache-write store
    ("conv_nchwc_bare", {"reg_n": 6}),  # the same with 8 tiles of 6 and one of 1
    ("conv_nchwc_first", {"reg_n": 4, "tile_ic": 3}),  # 7x7 stride 2 over 3 channels, 16x16 output
])
def test_fused_pixel_tiles_compute_the_reference(task_name, values):
    """A pixel tile along the fused (oh, ow) axis, with and without a last shorter tile,
    computes what the operator computes; its accumulators are one register tile."""
    from tuner.measure.verify import check_point, reference

    sp = space("x86-conv2d-nchwc", task_name, "llvm")
    point = _nchwc_point(sp, **values)
    assert sp.static_violation(point) is None
    check = check_point(sp, point, reference(task(task_name), target("llvm")))
    assert check.error is None, (check.error, check.detail)
    # The shape's dims are ints or, on Relax's tasks, T.int64(n).
    found = re.findall(r"conv2d_NCHWc\w*_local = T\.\w*alloc_buffer\(\(((?:[^()]|\([^()]*\))*)\)",
                       _compacted(sp.apply(point).mod))
    named = sp.values(point)
    assert [math.prod(int(re.findall(r"\d+", d)[-1]) for d in f.split(",") if d.strip()) for f in found] == [
        named["reg_n"] * named["tile_oc"] * named["oc_block"]]


def test_pixel_tile_constraints():
    sp = space("x86-conv2d-nchwc", "conv_nchwc", "llvm")
    why = sp.static_violation(_nchwc_point(sp, reg_n=4, fuse_pixels=0))
    assert why and "does not divide the row" in why
    assert sp.static_violation(_nchwc_point(sp, reg_n=7, fuse_pixels=0)) is None
    assert "tile_oh" in sp.static_violation(_nchwc_point(sp, reg_n=2, tile_oh=2))
    assert "ow loop" in sp.static_violation(_nchwc_point(sp, reg_n=4, parallel_depth=4))
    # A last, shorter tile is peeled from a serial pixel loop only (search_spaces.lowering).
    assert sp.static_violation(_nchwc_point(sp, reg_n=5)) is None
    assert "serial" in sp.static_violation(_nchwc_point(sp, reg_n=5, parallel_depth=3))
    assert sp.static_violation(_nchwc_point(sp, reg_n=4, parallel_depth=3)) is None


@pytest.mark.parametrize(("task_name", "values"), [
    ("dense", {"tile_m": 6}),  # 32 rows: 5 tiles of 6, one of 2 (peeled)
    ("dense_relax", {"tile_m": 5, "unroll_k": 8}),  # Relax's int64 indices, packed weight: 9 of 5, one of 1
    ("dense_relax", {"tile_m": 12}),  # 3 of 12, one of 10
])
def test_partial_row_tiles_compute_the_reference(task_name, values):
    """A row tile that does not divide the rows computes what the matmul computes."""
    from tuner.measure.verify import check_point, reference

    sp = space("x86-dense", task_name, "llvm")
    point = named_point(sp, DENSE_DEFAULTS, **values)
    assert sp.static_violation(point) is None, sp.values(point)
    check = check_point(sp, point, reference(task(task_name), target("llvm")))
    assert check.error is None, (check.error, check.detail)


@pytest.mark.parametrize(("kind", "task_name", "defaults"), [
    ("x86-dense", "dense", DENSE_DEFAULTS),
    pytest.param("x86-dense-vnni", "dense_u8s8", DENSE_DOT_DEFAULTS, marks=needs_vnni),
])  # fmt: skip
def test_partial_row_tiles_need_a_serial_row_loop(kind, task_name, defaults):
    sp = space(kind, task_name, "llvm")

    def why(**values) -> str | None:
        return sp.static_violation(named_point(sp, defaults, **values))

    assert why(tile_m=6) is None
    assert "serial" in why(tile_m=6, order=1)
    assert "serial" in why(tile_m=6, parallel_depth=2)
    assert why(tile_m=8, order=1, parallel_depth=2) is None


def test_row_taps_vectorize_the_columns_that_read_no_padding():
    """``x86-row-taps`` partitions the columns at the ones whose every slot lies inside the
    image (the annotation ``tuner.graph.layout.ops.row_taps`` computes: columns 2-8 of 11 for 22
    image columns, pad 3, stride 2, 8 slots a channel); there a channel's 8 slots load 8
    neighbouring image columns as one vector, which an element-wise bounds check prevents."""
    from tuner.graph.layout.plan import ROW_TAPS_ATTR

    sp = space("x86-row-taps", "row_taps", "llvm")
    assert dict((k.name, k.choices) for k in sp.knobs(0))["vector"] == (1, 0)

    def loads(vector: int) -> int:
        sch = sp.apply(named_point(sp, {}, vector=vector, rows=1))
        assert [int(a) for a in sch.get(sch.get_sblock("row_taps_i31")).annotations[ROW_TAPS_ATTR]] == [2, 9, 8]
        ll = tvm.compile(sch.mod, target=target("llvm")).mod.inspect_source("ll")
        return len(re.findall(r"load <8 x float>", ll))

    assert loads(1) > 0
    assert loads(0) == 0
