"""The TIR pipeline (search_spaces.lowering): partial tiles peeled, nearbyint on LLVM's intrinsic."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from conftest import (
    DENSE_DEFAULTS,
    DENSE_DOT_DEFAULTS,
    DOT_DEFAULTS,
    NCHWC_DEFAULTS,
    named_point,
    needs_bf16,
    space,
    target,
    task,
)
from tvm.script import tirx as T

from search_spaces import Point, lowering


def _fused_point(sp, reg_n: int) -> Point:
    return named_point(sp, NCHWC_DEFAULTS, reg_n=reg_n)


@tvm.instrument.pass_instrument
class _AfterLoopPartition:
    def __init__(self) -> None:
        self.script = ""

    def run_after_pass(self, mod: tvm.IRModule, info: tvm.transform.PassInfo) -> None:
        if info.name.endswith("LoopPartition"):
            self.script = mod.script()


def _lowered(mod: tvm.IRModule) -> str:
    """``mod`` as ``tvm.compile`` lowers it, just after LoopPartition."""
    seen = _AfterLoopPartition()
    with tvm.transform.PassContext(opt_level=3, instruments=[seen]):
        tvm.compile(mod, target=target("llvm"))
    assert seen.script
    return seen.script


def _lowered_by_tvm(mod: tvm.IRModule) -> str:
    """``mod`` lowered by TVM's own default pipeline, just after LoopPartition."""
    with lowering.tvm_pipeline():
        return _lowered(mod)


def _outer_loop(extent: int) -> str:
    """A pattern of a loop of ``extent`` (also the first of a ``T.grid``), its variable captured."""
    return rf"for (\w+)[\w, ]* in (?:range|T\.grid)\({extent}[,)]"


def _guarded_tile_loops(lowered: str, tiles: int) -> tuple[str | None, list[str]]:
    """The loop over ``tiles`` whole pixel tiles, and the bounds checks that use its variable."""
    found = re.search(_outer_loop(tiles), lowered)
    if not found:
        return None, []
    var = found.group(1)
    return var, [line for line in lowered.splitlines() if re.match(r"\s*if ", line) and re.search(rf"\b{var}\b", line)]


def _dense_point(sp, tile_m: int) -> Point:
    return named_point(sp, DENSE_DEFAULTS, tile_m=tile_m)


# (template, task, point, whole tiles): 196 pixels in tiles of 5 (39 and one of 1); 46 rows in
# tiles of 6 (7 and one of 4); the same on vdpbf16ps.
PEELED = [("x86-conv2d-nchwc", "conv_nchwc", lambda sp: _fused_point(sp, 5), 39),
          ("x86-conv2d-nchwc", "conv_nchwc_relax", lambda sp: _fused_point(sp, 5), 39),
          ("x86-dense", "dense_relax", lambda sp: _dense_point(sp, 6), 7),
          pytest.param("x86-conv2d-nchwc-dot", "conv_nchwc_bf16_relax",
                       lambda sp: named_point(sp, DOT_DEFAULTS, reg_n=5), 39, marks=needs_bf16),
          pytest.param("x86-dense-bf16", "dense_bf16_relax",
                       lambda sp: named_point(sp, DENSE_DOT_DEFAULTS, tile_m=6), 7, marks=needs_bf16)]


@pytest.mark.parametrize(("kind", "task_name", "point", "tiles"), PEELED)
def test_the_last_shorter_tile_is_peeled(kind, task_name, point, tiles):
    """The whole tiles run without a bounds check and the last one apart, on int32 tasks and
    on Relax's int64 ones (where TVM's own pipeline loses the hint)."""
    sp = space(kind, task_name, "llvm")
    mod = sp.apply(point(sp)).mod
    assert lowering.HINT in mod.script()
    lowered = _lowered(mod)
    var, guards = _guarded_tile_loops(lowered, tiles)
    assert var, lowered
    assert not guards, guards


@pytest.mark.parametrize(("kind", "task_name", "point", "tiles"), PEELED[1:])
def test_tvm_alone_keeps_the_guard_in_every_int64_tile(kind, task_name, point, tiles):
    """Why the pipeline exists (TVM 0.27): NarrowDataType gives the int64 loop a new variable
    and LoopPartition no longer finds the hint. When this fails, TVM peels by itself and
    search_spaces.lowering can go."""
    sp = space(kind, task_name, "llvm")
    lowered = _lowered_by_tvm(sp.apply(point(sp)).mod)
    assert re.search(_outer_loop(tiles + 1), lowered), lowered  # one loop, every tile guarded
    assert not re.search(_outer_loop(tiles), lowered)


def test_it_is_the_default_and_leaves_unhinted_code_alone():
    lowering.install()
    pipeline, _, _ = tvm.tirx.get_tir_pipeline("default")
    assert pipeline.info.name == "NightshiftTIRPipeline"
    with lowering.tvm_pipeline():
        assert tvm.tirx.get_tir_pipeline("default")[0].info.name != "NightshiftTIRPipeline"
    assert tvm.tirx.get_tir_pipeline("default")[0].info.name == "NightshiftTIRPipeline"
    sp = space("x86-conv2d-nchwc", "conv_nchwc", "llvm")
    mod = sp.apply(_fused_point(sp, 4)).mod  # 49 whole tiles: nothing to peel
    assert lowering.HINT not in mod.script()
    assert lowering.mark_partitions(mod).same_as(mod)
    assert _lowered(mod) == _lowered_by_tvm(mod)
    assert lowering.mark_partitions(task("conv")).same_as(task("conv"))


def test_a_users_loop_partition_settings_are_kept():
    config = {"s_tir.LoopPartition": {"no_unroll_loop_with_extent_one": True}}
    with tvm.transform.PassContext(opt_level=3, config=config) as ctx:
        got = lowering._partition_config(ctx)["s_tir.LoopPartition"]
    assert got == {"no_unroll_loop_with_extent_one": True, "unroll_loop_with_partition_hint_no_interval": False,
                   "partition_const_loop": True}


@T.prim_func(s_tir=True)
def _rounds(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "uint8")):
    for i_o in range(8):
        for i_i in T.vectorized(8):
            b[i_o * 8 + i_i] = T.Cast("uint8", T.min(T.max(T.nearbyint(a[i_o * 8 + i_i]), T.float32(0)),
                                                   T.float32(255)))


def test_tvm_alone_scalarizes_a_vector_nearbyint():
    """Why :func:`lowering.llvm_nearbyint` exists (TVM 0.27): ``tirx.nearbyint`` is not marked
    vectorizable, so VectorizeLoop turns the loop into a scalar one. When this fails, TVM
    vectorizes it by itself and the rewrite can go."""
    scalar = tvm.tirx.transform.VectorizeLoop()(tvm.IRModule({"main": _rounds})).script()
    assert "T.vectorized" not in scalar and "i_i_s" in scalar, scalar


def test_nearbyint_is_llvms_in_cpu_functions_and_vectorizes_to_the_same_values():
    mod = tvm.IRModule({"main": _rounds.with_attr("target", target("llvm"))})
    rewritten = lowering.llvm_nearbyint(mod).script()
    assert "llvm.nearbyint" in rewritten and "T.nearbyint" not in rewritten
    vectorized = tvm.tirx.transform.VectorizeLoop()(lowering.llvm_nearbyint(mod)).script()
    assert "i_i_s" not in vectorized and '"float32x8"' in vectorized, vectorized
    # Built for AVX2 (which any AVX2 or AVX-512 host runs): 8 lanes rounded in one instruction.
    lib = tvm.compile(tvm.IRModule({"main": _rounds}), target=target("llvm-avx2"))
    assert re.search(r"vroundps\s+\$12, [^\n]*%ymm", lib.mod.inspect_source("asm"))
    # Ties go to the even neighbour, as ONNX's QuantizeLinear rounds; the clip as before.
    a = np.array([0.5, 1.5, 2.5, 3.5, -0.5, 254.5, 255.5, 300.0, 2.4999, 7.5000005] + [126.5] * 54, "float32")
    out = tvm.runtime.tensor(np.zeros(64, "uint8"))
    lib["main"](tvm.runtime.tensor(a), out)
    np.testing.assert_array_equal(out.numpy(), np.clip(np.rint(a), 0, 255).astype("uint8"))


def test_gpu_functions_and_narrow_floats_keep_tvms_nearbyint():
    """GPU code generators print the op; LLVM's intrinsic is the CPU's. A bfloat16 or float16
    rounding is TVM's to legalize to float32 first."""
    mod = tvm.IRModule({"main": _rounds.with_attr("target", tvm.target.Target({"kind": "cuda"}))})
    assert lowering.llvm_nearbyint(mod).same_as(mod)
    for dtype in ("bfloat16", "float16"):
        narrow = tvm.tirx.call_intrin(dtype, "tirx.nearbyint", tvm.tirx.const(1.5, dtype))
        assert lowering._llvm_rounding(narrow).same_as(narrow)
