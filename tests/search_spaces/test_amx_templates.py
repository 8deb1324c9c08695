"""The AMX tile intrinsics (tdpbf16ps, tdpbusd) and the templates on them (beyond the
conformance suite, which covers them on an AMX host through the host target)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tvm
from conftest import needs_amx_bf16, needs_amx_int8, space, target, task

import search_spaces
from tuner.measure.verify import arg_specs, check_point, reference

AMX_DEFAULTS = {"tile_m": 1, "tile_n": 1, "panel": 1, "unroll_k": 1, "order": 0, "parallel_depth": 1}


def _asm(mod: tvm.IRModule) -> str:
    lib = tvm.compile(mod, target=target("llvm"))
    return lib.mod.inspect_source("asm")


def test_templates_need_amx_and_whole_tiles():
    amx, vnni = target("llvm-amx"), target("llvm-vnni")
    assert "x86-dense-amx-bf16" in search_spaces.applicable_kinds(task("dense_bf16"), amx)
    assert "x86-dense-amx-int8" in search_spaces.applicable_kinds(task("dense_u8s8"), amx)
    # AVX512_BF16 / VNNI without tiles: the AVX-512 templates' tasks.
    assert "x86-dense-amx-bf16" not in search_spaces.applicable_kinds(task("dense_bf16"), vnni)
    assert "x86-dense-amx-int8" not in search_spaces.applicable_kinds(task("dense_u8s8"), vnni)
    # Rows that are not whole tiles of 16.
    from conftest import dense_bf16

    assert "x86-dense-amx-bf16" not in search_spaces.applicable_kinds(dense_bf16(m=24), amx)
    # Attention's packed second activation (batched W): on tiles too, one batch at a time.
    assert {"x86-dense-amx-bf16", "x86-dense-bf16"} <= set(search_spaces.applicable_kinds(task("attention_bf16"), amx))
    assert "x86-conv2d-amx" in search_spaces.applicable_kinds(task("conv_nchwc_bf16"), amx)
    assert "x86-conv2d-amx" in search_spaces.applicable_kinds(task("conv_nchwc_u8"), amx)
    assert "x86-conv2d-amx" not in search_spaces.applicable_kinds(task("conv_nchwc_bf16"), vnni)
    # Stride 2: A's rows are two pixels apart.
    assert "x86-conv2d-amx" in search_spaces.applicable_kinds(task("conv_nchwc_bf16_s2"), amx)
    # Wide blocks (a whole 64-byte tile row per pixel): on tiles and on the AVX-512 dot products.
    for name in ("conv_nchwc_bf16_wide", "conv_nchwc_u8_wide"):
        assert {"x86-conv2d-amx", "x86-conv2d-nchwc-dot"} <= set(search_spaces.applicable_kinds(task(name), amx))


def test_register_tiles_fit_the_tile_registers_and_the_weight_blocks():
    """tile_m x tile_n accumulators with their A and B tiles fit the 8 tile registers, and
    the tile_n B tiles of a step lie side by side in one column block of the packed weight
    (64 columns for 128; 16 for 48, so one tile)."""
    from conftest import dense_bf16

    assert [k.choices for k in space("x86-dense-amx-bf16", "dense_bf16", "llvm-amx").knobs(0)
            if k.name == "tile_n"] == [(1,)]
    sp = search_spaces.create(dense_bf16(m=96, n=128), target("llvm-amx"), kind="x86-dense-amx-bf16")
    names = [k.name for k in sp.knobs(0)]
    assert dict(zip(names, (k.choices for k in sp.knobs(0)), strict=True))["tile_n"] == (1, 2)

    def why(**values) -> str | None:
        named = {**AMX_DEFAULTS, **values}
        return sp.static_violation(search_spaces.Point(0, tuple(
            named.get(n, k.choices[0]) for n, k in zip(names, sp.knobs(0), strict=True))))

    assert why() is None
    assert why(tile_m=2, tile_n=2, panel=2) is None
    assert "whole number of column tiles" in why(tile_n=2, panel=1)
    assert "more than 8 tile registers" in why(tile_m=3, tile_n=2, panel=2)


def _points(kind: str, task_name: str, count: int, seed: int, target_name: str = "llvm"):
    sp = space(kind, task_name, target_name)
    rng = np.random.default_rng(seed)
    return sp, [sp.sample(rng) for _ in range(count)]


@needs_amx_bf16
@pytest.mark.parametrize(("kind", "task_name"), [("x86-dense-amx-bf16", "dense_bf16"),
                                                 ("x86-dense-amx-bf16", "attention_bf16"),
                                                 ("x86-conv2d-amx", "conv_nchwc_bf16"),
                                                 ("x86-conv2d-amx", "conv_nchwc_bf16_s2"),
                                                 ("x86-conv2d-amx", "conv_nchwc_bf16_wide")])  # fmt: skip
def test_bf16_points_run_on_tiles_and_match_the_reference(kind, task_name):
    """Stated tolerance: the reference is the unscheduled task on the same bf16 inputs; the
    tiles sum the exact bf16 products in float32, so a candidate matches within the float32
    tolerance (tuner.measure's 1e-4)."""
    sp, points = _points(kind, task_name, 4, 5)
    ref = reference(task(task_name), target("llvm"))
    for point in points:
        check = check_point(sp, point, ref)
        assert check.error is None and check.elementwise_ok, (sp.values(point), check.error, check.detail)
    asm = _asm(sp.apply(points[-1]).mod)
    assert "tdpbf16ps" in asm and "ldtilecfg" in asm and "tilestored" in asm


@needs_amx_int8
@pytest.mark.parametrize(("kind", "task_name"), [("x86-dense-amx-int8", "dense_u8s8"),
                                                 ("x86-conv2d-amx", "conv_nchwc_u8"),
                                                 ("x86-conv2d-amx", "conv_nchwc_u8_residual"),
                                                 ("x86-conv2d-amx", "conv_nchwc_u8_wide")])  # fmt: skip
def test_int8_points_compute_exactly(kind, task_name):
    """uint8 x int8 sums in int32 are exact: bit for bit on full-range inputs (not the 0/1
    integers of tuner.measure, under which a kernel that dropped part of the reduction could
    still pass)."""
    mod = task(task_name)
    rng = np.random.default_rng(11)
    inputs = [rng.integers(*{"uint8": (0, 256), "int8": (-128, 128)}.get(a.dtype, (-1000, 1000)), a.shape)
              .astype(a.dtype) if a.dtype != "float32" else rng.uniform(-1, 1, a.shape).astype(a.dtype)
              for a in arg_specs(mod)]  # fmt: skip
    want = _run(mod, inputs)
    assert np.count_nonzero(want), "the reference output is all zeros: the check would prove nothing"
    sp, points = _points(kind, task_name, 4, 6)
    for point in points:
        np.testing.assert_array_equal(_run(sp.apply(point).mod, inputs), want, err_msg=str(sp.values(point)))
    assert "tdpbusd" in _asm(sp.apply(points[-1]).mod)


def _run(mod: tvm.IRModule, inputs: list[np.ndarray]) -> np.ndarray:
    lib = tvm.compile(mod, target=target("llvm"))
    arrays = [tvm.runtime.tensor(x) for x in inputs]
    lib["main"](*arrays)
    return arrays[-1].numpy()


@needs_amx_bf16
def test_a_compiled_kernel_asks_linux_for_the_tiles_itself(tmp_path):
    """Linux faults the first AMX instruction of a process that did not ask for the tile state
    (arch_prctl): a library exported here runs in a fresh process that loads nothing but TVM's
    runtime, as a deployment would."""
    from tuner.precision.bf16 import packed_shape

    sp, points = _points("x86-dense-amx-bf16", "dense_bf16", 1, 7)
    lib_path = tmp_path / "amx.so"
    tvm.compile(sp.apply(points[0]).mod, target=target("llvm")).export_library(str(lib_path))
    script = textwrap.dedent(f"""
        import ml_dtypes, numpy as np, tvm
        lib = tvm.runtime.load_module({str(lib_path)!r})
        a = np.ones((1, 32, 64), ml_dtypes.bfloat16)
        w = np.ones({packed_shape(64, 48)}, ml_dtypes.bfloat16)
        out = tvm.runtime.tensor(np.zeros((1, 32, 48), np.float32))
        lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(w), tvm.runtime.tensor(np.zeros(48, np.float32)), out)
        print(float(out.numpy().min()), float(out.numpy().max()))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["64.0", "64.0"]  # relu(64 products of 1 + bias 0)


@needs_amx_bf16
def test_kernels_of_different_tile_configurations_alternate_on_one_thread():
    """Each kernel reloads the tile configuration only when the thread's differs from its
    own: a conv of 7-row tiles between two runs of a matmul of 16-row ones leaves both right."""
    from search_spaces.base import Point

    def run_case(kind: str, task_name: str, values: dict):
        sp = space(kind, task_name, "llvm")
        point = Point(0, tuple(values.get(k.name, k.choices[0]) for k in sp.knobs(0)))
        mod = sp.apply(point).mod
        ref = reference(task(task_name), target("llvm"))
        lib = tvm.compile(mod, target=target("llvm"))
        arrays = [tvm.runtime.tensor(x) for x in ref.inputs]  # every argument, the output last
        return lambda: (lib["main"](*arrays), arrays[-1].numpy())[1], ref.outputs[-1]

    dense, dense_want = run_case("x86-dense-amx-bf16", "dense_bf16", {"tile_m": 2, "tile_n": 1, "parallel_depth": 1})
    conv, conv_want = run_case("x86-conv2d-amx", "conv_nchwc_bf16", {"rows": 7, "tile_oc": 2, "parallel_depth": 1})
    for run, want in ((dense, dense_want), (conv, conv_want), (dense, dense_want), (conv, conv_want)):
        np.testing.assert_allclose(run(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_only_functions_that_configure_tiles_save_and_restore_the_callers_configuration():
    """keep_caller_tile_config wraps a function whose kernels call the tiles' init helper in
    one save and one restore of the calling thread's configuration; others stay as they are."""
    from search_spaces.x86.intrin_amx import RESTORE, SAVE, keep_caller_tile_config

    sp, points = _points("x86-dense-amx-bf16", "dense_bf16", 1, 7, "llvm-amx")
    kept = keep_caller_tile_config(sp.apply(points[0]).mod).script()
    assert kept.count(SAVE) == kept.count(RESTORE) == 1
    assert kept.index(SAVE) < kept.index("nightshift_amx_init_") < kept.index("nightshift_amx_store_") \
        < kept.index(RESTORE)
    plain = task("relu")
    tvm.ir.assert_structural_equal(keep_caller_tile_config(plain), plain)


@needs_amx_bf16
def test_a_kernel_leaves_the_calling_threads_tile_configuration_as_it_found_it():
    """Another runtime may configure a thread's tiles once and keep using them (ONNX
    Runtime's int8 kernels faulted with SIGILL after a Nightshift model ran on the same
    thread): the thread's configuration, read before and after an AMX kernel, is the same."""
    from tvm.script import tirx as T

    from search_spaces.x86.intrin_amx import AMX_BF16, SAVE, TileShape, _helpers

    ir = _helpers(AMX_BF16, TileShape(1, 1))[3]

    @T.prim_func(s_tir=True)
    def read_config(out: T.Buffer((8,), "int64")) -> None:
        with T.attr(0, "pragma_import_llvm", ir):
            T.evaluate(T.call_extern("int32", SAVE, out.access_ptr("w")))

    probe = tvm.compile(tvm.IRModule({"main": read_config}), target=target("llvm"))
    sp, points = _points("x86-dense-amx-bf16", "dense_bf16", 1, 7)
    kernel = tvm.compile(sp.apply(points[0]).mod, target=target("llvm"))
    ref = reference(task("dense_bf16"), target("llvm"))
    arrays = [tvm.runtime.tensor(x) for x in ref.inputs]

    def config() -> np.ndarray:
        out = tvm.runtime.tensor(np.full(8, -1, np.int64))
        probe["main"](out)
        return out.numpy()

    before = config()
    kernel["main"](*arrays)
    np.testing.assert_array_equal(config(), before)
    np.testing.assert_allclose(arrays[-1].numpy(), ref.outputs[-1], rtol=1e-2, atol=1e-2)


@needs_amx_bf16
@pytest.mark.parametrize("prefetch", [1, 4])
def test_prefetching_steps_ahead_computes_the_same(prefetch):
    """An update that prefetches B's rows ``prefetch`` steps ahead (past the weight's end on
    the last steps: a prefetch never faults) computes what the task does, with 2 B tiles of
    one 64-column block side by side."""
    from conftest import dense_bf16

    from search_spaces.base import Point

    mod = dense_bf16(m=32, k=256, n=128)
    sp = search_spaces.create(mod, target("llvm"), kind="x86-dense-amx-bf16")
    values = {**AMX_DEFAULTS, "tile_n": 2, "panel": 2, "prefetch": prefetch}
    point = Point(0, tuple(values.get(k.name, k.choices[0]) for k in sp.knobs(0)))
    check = check_point(sp, point, reference(mod, target("llvm")))
    assert check.error is None and check.elementwise_ok, (check.error, check.detail)
    assert "prefetcht0" in _asm(sp.apply(point).mod)
