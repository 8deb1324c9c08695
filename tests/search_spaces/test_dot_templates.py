"""The dot-product intrinsics (vdpbf16ps, vpdpbusd, AVX2's vpmaddubsw + vpmaddwd) and the templates on
them (beyond the conformance suite)."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
import tvm
from conftest import (
    DENSE_DOT_DEFAULTS,
    DOT_DEFAULTS,
    named_point,
    needs_avx2,
    needs_bf16,
    needs_vnni,
    space,
    target,
    task,
)

import search_spaces
from search_spaces.x86.intrin import BF16_DOT_16x2_INTRIN, register_intrinsics, target_has_bf16_dot
from tuner.measure.verify import arg_specs, check_point, reference


def _asm(lib) -> str:
    return lib.mod.inspect_source("asm") if hasattr(lib, "mod") else lib.inspect_source("asm")


@needs_bf16
def test_intrinsic_emits_vdpbf16ps_and_computes_the_dot_products():
    from tvm.s_tir import Schedule
    from tvm.script import tirx as T

    register_intrinsics()

    @T.prim_func(s_tir=True)
    def mm(A: T.Buffer((4, 32), "bfloat16"), B: T.Buffer((16, 32, 2), "bfloat16"), C: T.Buffer((4, 32), "float32")):
        for i, j, ko, ki in T.grid(4, 32, 16, 2):
            with T.sblock("C"):
                vi, vj, vko, vki = T.axis.remap("SSRR", [i, j, ko, ki])
                with T.init():
                    C[vi, vj] = T.float32(0)
                C[vi, vj] = C[vi, vj] + T.cast(A[vi, vko * 2 + vki], "float32") * T.cast(B[vko, vj, vki], "float32")

    sch = Schedule(tvm.IRModule({"main": mm}))
    i, j, ko, ki = sch.get_loops(sch.get_sblock("C"))
    jo, ji = sch.split(j, [None, 16])
    sch.reorder(i, jo, ko, ji, ki)
    sch.decompose_reduction(sch.get_sblock("C"), ko)
    sch.tensorize(ji, BF16_DOT_16x2_INTRIN)
    lib = tvm.compile(sch.mod, target=target("llvm"))
    assert "vdpbf16ps" in _asm(lib)
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (4, 32)).astype(ml_dtypes.bfloat16)
    b = rng.uniform(-1, 1, (16, 32, 2)).astype(ml_dtypes.bfloat16)
    c = tvm.runtime.tensor(np.zeros((4, 32), np.float32))
    lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), c)
    want = a.astype(np.float64) @ b.astype(np.float64).transpose(0, 2, 1).reshape(32, 32)
    # Exact bf16 products, float32 sums: within float32 rounding of the sum.
    np.testing.assert_allclose(c.numpy(), want, rtol=1e-5, atol=1e-5)


def test_template_needs_the_instruction():
    assert not target_has_bf16_dot(tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"}))
    assert target_has_bf16_dot(tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids"}))
    haswell = tvm.target.Target({"kind": "llvm", "mcpu": "haswell"})
    assert "x86-dense-bf16" not in search_spaces.applicable_kinds(task("dense_bf16"), haswell)
    # A float32 dense is x86-dense's, not this one's.
    assert "x86-dense-bf16" not in search_spaces.applicable_kinds(task("dense"), target("llvm"))


@needs_bf16
def test_sampled_points_use_vdpbf16ps_and_match_the_reference():
    """Stated tolerance: the reference is the unscheduled task on the same bf16 inputs, so a
    candidate must match it within the float32 tolerance (tuner.measure's 1e-4)."""
    sp = space("x86-dense-bf16", "dense_bf16", "llvm")
    ref = reference(task("dense_bf16"), target("llvm"))
    rng = np.random.default_rng(4)
    for _ in range(3):
        point = sp.sample(rng)
        check = check_point(sp, point, ref)
        assert check.error is None and check.elementwise_ok, (sp.values(point), check.error, check.detail)
    assert "vdpbf16ps" in _asm(tvm.compile(sp.apply(point).mod, target=target("llvm")))




@pytest.mark.parametrize(("kind", "task_name"), [
    pytest.param("x86-conv2d-nchwc-dot", "conv_nchwc_u8", marks=needs_vnni),
    pytest.param("x86-conv2d-nchwc-dot", "conv_nchwc_u8_residual", marks=needs_vnni),
    pytest.param("x86-conv2d-nchwc-dot", "conv_padded_output_u8", marks=needs_vnni),
    pytest.param("x86-dense-vnni", "dense_u8s8", marks=needs_vnni),
    # AVX2 (an AVX-512 host runs its 8-lane blocks too): 7-bit weights, which it sums exactly.
    pytest.param("x86-conv2d-nchwc-dot", "conv_nchwc_u8_avx2", marks=needs_avx2),
    pytest.param("x86-conv2d-nchwc-dot", "conv_nchwc_u8_avx2_residual", marks=needs_avx2),
    pytest.param("x86-dense-avx2-int8", "dense_u8s8", marks=needs_avx2),
])  # fmt: skip
def test_int8_templates_use_the_instruction_and_compute_exactly(kind, task_name):
    """uint8 x int8 sums are exact: a candidate matches the unscheduled task bit for bit, on
    full-range inputs (not tuner.measure's 0/1 integers, under which a kernel that dropped
    part of the reduction could still pass); on AVX2, full-range 7-bit weights."""
    mod = task(task_name)
    rng = np.random.default_rng(7)
    avx2 = "avx2" in task_name or "avx2" in kind
    inputs = _full_range_inputs(mod, rng, weight_bits=7 if avx2 else 8)
    want = _run(mod, inputs)
    assert np.count_nonzero(want), "the reference output is all zeros: the check would prove nothing"
    sp = space(kind, task_name, "llvm-avx2" if avx2 else "llvm")
    for _ in range(3):
        point = sp.sample(rng)
        _assert_exact(_run(sp.apply(point).mod, inputs), want, str(sp.values(point)))
    # AVX2's kernels are built for an AVX2 CPU (they apply only there): built for the host on
    # an Emerald Rapids (VNNI), the dense kernel's asm lacked one of the two instructions.
    asm = _asm(tvm.compile(sp.apply(point).mod, target=target("llvm-avx2" if avx2 else "llvm")))
    assert all(op in asm for op in (("vpmaddubsw", "vpmaddwd") if avx2 else ("vpdpbusd",)))


@needs_avx2
def test_avx2_int8_sums_pairs_in_int16_where_exact_for_says_so():
    """vpmaddubsw saturates a pair's int16 sum: 255 x 127 twice is 64,770, which it cannot
    hold. ``exact_for`` says which weights are safe (each pair's positive and negative parts
    at most 128: every 7-bit weight); tuner.graph.layout and tuner.precision.qdq let only those
    reach the instruction (tests/precision)."""
    from search_spaces.x86.intrin import AVX2_DOT, VNNI_DOT, exact_for

    mod = task("conv_nchwc_u8_avx2")
    sp = space("x86-conv2d-nchwc-dot", "conv_nchwc_u8_avx2", "llvm-avx2")
    point = named_point(sp, DOT_DEFAULTS, reg_n=7)
    for peak, exact in ((127, False), (64, True)):
        inputs = [np.full(a.shape, 255 if a.dtype == "uint8" else peak if a.dtype == "int8" else 0, a.dtype)
                  for a in arg_specs(mod)]  # fmt: skip
        same = np.array_equal(_run(sp.apply(point).mod, inputs), _run(mod, inputs))
        assert same == exact == exact_for(AVX2_DOT, inputs[1], axis=-1), peak
    # Mixed signs in a pair never saturate; VNNI sums in int32 and takes any weight.
    assert exact_for(AVX2_DOT, np.array([[127, -128], [64, 64]], np.int8), axis=1)
    assert not exact_for(AVX2_DOT, np.array([[-65, -64]], np.int8), axis=1)
    assert exact_for(VNNI_DOT, np.array([[127, 127]], np.int8), axis=1)
    # An odd count of reduction elements (an RGB stem's 3 channels) pairs the last with a zero.
    assert exact_for(AVX2_DOT, np.array([[1, 1, 127]], np.int8), axis=1)


def _assert_exact(got: np.ndarray, want: np.ndarray, msg: str = "") -> None:
    """Integer outputs bit for bit; a float epilogue's (bias, a scaled residual) within float32
    rounding, which vectorized and scalar code contract differently (one ulp at 2e5 seen), far
    below the 1.0 that any error in the integer sums would move it by."""
    if got.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-3, err_msg=msg)
    else:
        np.testing.assert_array_equal(got, want, err_msg=msg)


def _full_range_inputs(mod: tvm.IRModule, rng: np.random.Generator, weight_bits: int = 8) -> list[np.ndarray]:
    inputs = []
    w = 2 ** (weight_bits - 1)
    for a in arg_specs(mod):
        lo, hi = {"uint8": (0, 256), "int8": (-w, w + (weight_bits < 8)), "int32": (-1000, 1000)}.get(
            a.dtype, (None, None))
        inputs.append(rng.integers(lo, hi, a.shape).astype(a.dtype) if lo is not None
                      else rng.uniform(-1, 1, a.shape).astype(a.dtype))  # fmt: skip
    return inputs


def _run(mod: tvm.IRModule, inputs: list[np.ndarray]) -> np.ndarray:
    lib = tvm.compile(mod, target=target("llvm"))
    arrays = [tvm.runtime.tensor(x) for x in inputs]
    lib["main"](*arrays)
    return arrays[-1].numpy()


@pytest.mark.parametrize(("kind", "task_name", "values"), [
    pytest.param("x86-dense-bf16", "dense_bf16", {"tile_m": 6}, marks=needs_bf16),  # 32 rows: 5 of 6, one of 2
    pytest.param("x86-dense-bf16", "dense_bf16_relax", {"tile_m": 12, "unroll_k": 4}, marks=needs_bf16),  # int64
    # Attention's matmul of two activations, the second packed: batch loops outside the tile.
    pytest.param("x86-dense-bf16", "attention_bf16", {"tile_m": 6}, marks=needs_bf16),
    pytest.param("x86-dense-vnni", "dense_u8s8", {"tile_m": 5, "tile_n": 48, "panel": 3}, marks=needs_vnni),
    pytest.param("x86-dense-avx2-int8", "dense_u8s8", {"tile_m": 5, "tile_n": 16, "panel": 6}, marks=needs_avx2),
])  # fmt: skip
def test_partial_row_tiles_on_the_instruction_compute_the_reference(kind, task_name, values):
    """A row tile that does not divide the rows runs on the instruction and computes what the
    matmul computes (int8 bit for bit on full-range inputs)."""
    where = "llvm-avx2" if "avx2" in kind else "llvm"
    _check_on_instruction(kind, task_name, named_point(space(kind, task_name, where), DENSE_DOT_DEFAULTS, **values),
                          where)  # fmt: skip


def _check_on_instruction(kind: str, task_name: str, point, where: str = "llvm") -> None:
    """``point`` of ``kind`` on ``task_name`` (for the target ``where``) is valid, computes
    the reference (int8 exactly, bf16 within the float32 tolerance of the same bf16 inputs)
    and runs on the instruction."""
    sp = space(kind, task_name, where)
    assert sp.static_violation(point) is None, sp.values(point)
    mod = sp.apply(point).mod
    int8, avx2 = "u8" in task_name, where == "llvm-avx2"
    if int8:
        inputs = _full_range_inputs(task(task_name), np.random.default_rng(3), weight_bits=7 if avx2 else 8)
        _assert_exact(_run(mod, inputs), _run(task(task_name), inputs))
    else:
        check = check_point(sp, point, reference(task(task_name), target("llvm")))
        assert check.error is None and check.elementwise_ok, (check.error, check.detail)
    mnemonic = "vpmaddubsw" if avx2 else "vpdpbusd" if int8 else "vdpbf16ps"
    assert mnemonic in _asm(tvm.compile(mod, target=target("llvm")))


@pytest.mark.parametrize(("task_name", "values"), [
    pytest.param("conv_nchwc_bf16", {"reg_n": 5}, marks=needs_bf16),  # 196 pixels: 39 tiles of 5, one of 1
    # Relax's int64 task (search_spaces.lowering peels it): 16 tiles of 12 x 2 blocks, one of 4
    pytest.param("conv_nchwc_bf16_relax", {"reg_n": 12, "tile_oc": 2}, marks=needs_bf16),
    pytest.param("conv_nchwc_bf16_s2", {"reg_n": 4, "order": 2}, marks=needs_bf16),  # 7x7 output: 12 of 4, one of 1
    pytest.param("conv_nchwc_bf16", {"reg_n": 7}, marks=needs_bf16),  # whole tiles across rows
    # The tiles stored into the interior of the next conv's padded input: 16 of 12 pixels, one of 4.
    pytest.param("conv_padded_output_bf16", {"reg_n": 12, "tile_oc": 2}, marks=needs_bf16),
    pytest.param("conv_padded_output_bf16", {"reg_n": 7, "fuse_pixels": 0, "tile_oh": 2}, marks=needs_bf16),
    pytest.param("conv_padded_output_u8", {"reg_n": 12, "tile_oc": 2}, marks=needs_vnni),
    pytest.param("conv_padded_output_u8", {"reg_n": 7, "fuse_pixels": 0, "tile_oh": 2}, marks=needs_vnni),
    pytest.param("conv_nchwc_u8", {"reg_n": 6, "tile_oc": 2}, marks=needs_vnni),  # padding its own pass
    pytest.param("conv_nchwc_u8_residual", {"reg_n": 5, "order": 1, "unroll_kw": 3}, marks=needs_vnni),
    pytest.param("conv_nchwc_u8_avx2", {"reg_n": 6, "tile_oc": 2}, marks=needs_avx2),  # 196 pixels: 32 of 6, one of 4
])  # fmt: skip
def test_fused_pixel_tiles_on_the_instruction_compute_the_reference(task_name, values):
    """A pixel tile along the fused (oh, ow) axis, with a shorter last tile or without, still
    runs on the instruction and computes what the operator computes: int8 bit for bit on
    full-range inputs, bf16 within the float32 tolerance of the same bf16 inputs."""
    where = "llvm-avx2" if "avx2" in task_name else "llvm"
    sp = space("x86-conv2d-nchwc-dot", task_name, where)
    _check_on_instruction("x86-conv2d-nchwc-dot", task_name, named_point(sp, DOT_DEFAULTS, **values), where)


def test_partial_pixel_tiles_need_a_serial_pixel_loop():
    sp = space("x86-conv2d-nchwc-dot", "conv_nchwc_u8", "llvm-vnni")

    def why(**values) -> str | None:
        return sp.static_violation(named_point(sp, DOT_DEFAULTS, **values))

    assert why(reg_n=5) is None
    assert "serial" in why(reg_n=5, parallel_depth=3)
    assert why(reg_n=7, parallel_depth=3) is None
    assert "does not divide the row" in why(reg_n=5, fuse_pixels=0)
    assert "register" in why(reg_n=13, tile_oc=2)


def test_a_block_that_feeds_the_operator_is_not_inlined_into_it():
    """An elementwise block before the matmul that computes its operand (a cast) keeps the
    int8 template off the task: the intrinsic must read a buffer. One that feeds only the
    epilogue is inlined there (conv_nchwc_u8_residual)."""
    from tvm import te, topi

    from tuner.precision.bf16 import packed_matmul, packed_shape
    from tuner.precision.qdq import INT8_MATMUL

    a32 = te.placeholder((1, 32, 64), name="A", dtype="int32")
    w = te.placeholder(packed_shape(64, 48, 4), name="W", dtype="int8")
    out = packed_matmul(topi.cast(a32, "uint8"), w, "int32", INT8_MATMUL)
    mod = tvm.IRModule({"main": te.create_prim_func([a32, w, out])})
    vnni = tvm.target.Target({"kind": "llvm", "mcpu": "cascadelake"})
    assert "x86-dense-vnni" not in search_spaces.applicable_kinds(mod, vnni)
    assert "x86-dense-vnni" in search_spaces.applicable_kinds(task("dense_u8s8"), vnni)
    assert "x86-conv2d-nchwc-dot" in search_spaces.applicable_kinds(task("conv_nchwc_u8_residual"), vnni)


def test_dense_dot_templates_start_from_onednn_register_tiles():
    """The search measures oneDNN's tiles first (6 rows x 4 vectors, 12 x 2, 24 x 1): valid
    points of the space, and only the tiles the task's columns take."""
    from conftest import dense_bf16

    from search_spaces.template_space import TemplateSpace

    sp = TemplateSpace(dense_bf16(n=64), target("llvm-amx"), "x86-dense-bf16")
    starts = [sp.values(p) for p in sp.starts()]
    assert all(sp.static_violation(p) is None for p in sp.starts())
    assert {(v["tile_m"], v["tile_n"]) for v in starts} == {(6, 64), (12, 32), (24, 16)}
    assert {v["panel"] for v in starts} == {4}  # 64 columns: one panel of 4 vectors at most
    # 48 columns take no tile of 2 or 4 vectors.
    narrow = TemplateSpace(dense_bf16(n=48), target("llvm-amx"), "x86-dense-bf16")
    assert {(narrow.values(p)["tile_m"], narrow.values(p)["tile_n"]) for p in narrow.starts()} == {(24, 16)}


def test_dot_conv_template_starts_from_its_common_register_tiles():
    """Every job measures 4 pixels x 4 channel blocks, 7 x 2, 6 x 4 and 12 x 2 first (AVX2: 4 x 2,
    2 x 4, 8 x 1 and 6 x 2), along the fused pixel axis: valid points, and only the tiles the
    task's channels take."""
    from conftest import conv_nchwc_dot

    from search_spaces.template_space import TemplateSpace

    # 64 output channels: four blocks of 16. The task is built for no host, so this runs on
    # CPUs without AVX512_BF16 too.
    wide = TemplateSpace(conv_nchwc_dot(channels=64), target("llvm-amx"), "x86-conv2d-nchwc-dot")
    starts = [wide.values(p) for p in wide.starts()]
    assert all(wide.static_violation(p) is None for p in wide.starts())
    assert [(v["reg_n"], v["tile_oc"]) for v in starts] == [(4, 4), (7, 2), (6, 4), (12, 2)]
    assert {(v["fuse_pixels"], v["tile_ic"]) for v in starts} == {(1, 8)}  # 8 pairs of channels per step
    # 32 output channels take no tile of 4 blocks.
    narrow = space("x86-conv2d-nchwc-dot", "conv_nchwc_bf16", "llvm-amx")
    assert [(narrow.values(p)["reg_n"], narrow.values(p)["tile_oc"]) for p in narrow.starts()] == [(7, 2), (12, 2)]
    # AVX2's budget of 13 accumulators takes none of those: its own, smaller tiles.
    avx2 = space("x86-conv2d-nchwc-dot", "conv_nchwc_u8_avx2", "llvm-avx2")
    assert all(avx2.static_violation(p) is None for p in avx2.starts())
    assert [(avx2.values(p)["reg_n"], avx2.values(p)["tile_oc"]) for p in avx2.starts()] == [(4, 2), (2, 4), (8, 1),
                                                                                            (6, 2)]


@needs_avx2
@pytest.mark.parametrize(("split", "parallel"), [(0, 2), (1, 49)])
def test_conv_splits_the_threads_work_by_channels_or_by_pixels(split, parallel):
    """``split`` 0 runs the (batch, channel tile) loops in parallel: 4 blocks of 8 channels in
    tiles of 2; 1 the (batch, pixel tile) loops: 196 pixels in tiles of 4. Both compute the
    conv exactly on the instruction. A split by pixels with a partial last tile is refused
    (its peel needs the pixel-tile loop of its own)."""
    sp = space("x86-conv2d-nchwc-dot", "conv_nchwc_u8_avx2", "llvm-avx2")
    point = named_point(sp, DOT_DEFAULTS, reg_n=4, tile_oc=2, split=split)
    extents = re.findall(r"T\.parallel\((?:T\.int64\()?(\d+)", sp.apply(point).mod.script())
    assert int(extents[-1]) == parallel  # the first is the padding pass's
    _check_on_instruction("x86-conv2d-nchwc-dot", "conv_nchwc_u8_avx2", point, "llvm-avx2")
    partial = named_point(sp, DOT_DEFAULTS, reg_n=5, tile_oc=2, split=split)
    assert (sp.static_violation(partial) is None) == (split == 0)
