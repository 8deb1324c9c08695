"""Constraints: unroll and vector-width bounds on CPUs, per-block limits on CUDA."""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import pytest
import tvm
from conftest import space, target, task
from tvm.target import codegen

import search_spaces
from search_spaces import SketchSpace, limits_for, target_with_limits
from tuner.measure.builder import build_candidate

CUDA_ARCHS = ["sm_80", "sm_90"]


def _lower_for_verify(mod: tvm.IRModule) -> tvm.tirx.PrimFunc:
    """The lowering ``verify_gpu_code`` needs (thread extents and flat allocations)."""
    st, tx = tvm.s_tir.transform, tvm.tirx.transform
    seq = tvm.transform.Sequential([
        st.LowerCrossThreadReduction(), st.LowerInitBlock(), st.PlanAndUpdateBufferAllocationLocation(),
        st.ConvertBlocksToOpaque(), st.UnifyThreadBinding(), st.CompactBufferAllocation(),
        st.LowerMatchBuffer(), st.LowerOpaqueBlock(), tx.FlattenBuffer(), tx.VectorizeLoop(),
        st.InjectVirtualThread(), tx.StorageRewrite(),
    ])  # fmt: skip
    return seq(mod)["main"]


def _gpu_limits(tgt: tvm.target.Target) -> dict[str, int]:
    return {
        "max_threads_per_block": int(tgt.attrs["max_threads_per_block"]),
        "max_shared_memory_per_block": int(tgt.attrs["max_shared_memory_per_block"]),
        "max_local_memory_per_block": 2**31 - 1,
        "max_vthread": 8,
        "max_vector_bytes": 16,
    }


def test_cpu_unroll_and_vector_width_are_bounded():
    sp = space("sketch", "conv", "llvm")
    limits = sp.limits
    host = target("llvm")
    # By the host's own ISA flags (TVM's llvm_get_vector_width says 512 for any x86 mcpu).
    flags = Path("/proc/cpuinfo").read_text().split() if platform.machine() == "x86_64" else []
    if flags:
        assert limits.vector_bits == (512 if "avx512f" in flags else 256 if "avx" in flags else 128)
    else:
        assert limits.vector_bits == max(128, int(codegen.llvm_get_vector_width(host)))
    seen = set()
    for s in range(sp.num_sketches):
        for knob in sp.knobs(s):
            seen.add(knob.name)
            if knob.name.startswith("unroll"):
                assert max(knob.candidates[i] for i in knob.choices) <= limits.max_unroll_step
                assert 512 in knob.candidates, "TVM offers 512; the bound removed it"
            if knob.name == "vectorize":
                assert max(knob.choices) <= limits.max_vector_lanes
                assert all(v % (limits.vector_bits // 32) == 0 for v in knob.choices)
    assert {"unroll_explicit", "vectorize", "parallel"} <= seen


def test_template_register_budget_is_enforced():
    sp = space("x86-conv2d-nchw", "conv", "llvm")
    over = next(v for v in sp.knobs(0)[0].choices if v * 14 > 24 * (sp.limits.vector_bits // 32))
    values = {k.name: k.choices[0] for k in sp.knobs(0)} | {"tile_co": over, "tile_w": 14}
    point = search_spaces.Point(0, tuple(values[k.name] for k in sp.knobs(0)))
    assert "register" in (sp.check(point) or "")
    assert sp.size() < sp.grid_size()


def test_cuda_target_gets_per_block_limits():
    bare = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    full = target_with_limits(bare)
    assert int(full.attrs["max_threads_per_block"]) == 1024
    assert int(full.attrs["max_shared_memory_per_block"]) == 49152
    small = tvm.target.Target({"kind": "cuda", "arch": "sm_80", "max_threads_per_block": 128,
                               "max_shared_memory_per_block": 16384})
    kept = target_with_limits(small)
    assert int(kept.attrs["max_threads_per_block"]) == 128
    assert limits_for(kept).gpu["max_shared_memory_per_block"] == 16384


@pytest.mark.parametrize("arch", CUDA_ARCHS)
@pytest.mark.parametrize("task_name", ["matmul", "conv"])
def test_cuda_points_build_and_pass_gpu_verification(arch, task_name):
    tgt = tvm.target.Target({"kind": "cuda", "arch": arch})
    sp = search_spaces.create(task(task_name), tgt)
    limits = _gpu_limits(sp.target)
    rng = np.random.default_rng(0)
    for n in range(3):
        sch = sp.apply(sp.sample(rng))
        func = _lower_for_verify(sch.mod)
        assert tvm.s_tir.analysis.verify_gpu_code(func, limits)
        # The same check refuses a limit the kernel exceeds, so it is not vacuous.
        assert not tvm.s_tir.analysis.verify_gpu_code(func, limits | {"max_threads_per_block": 1})
        if n == 0:  # compiled to device code as a build worker does (nvcc: seconds per kernel)
            built = build_candidate(tvm.ir.save_json(sch.mod), sp.target.export())
            assert built.error_class is None, built.error_msg


def test_cuda_limits_from_the_target_shape_the_space():
    tight = tvm.target.Target({"kind": "cuda", "arch": "sm_90", "max_threads_per_block": 256,
                               "max_shared_memory_per_block": 16384})
    sp = SketchSpace(task("matmul"), tight)
    limits = _gpu_limits(sp.target)
    assert limits["max_threads_per_block"] == 256
    rng = np.random.default_rng(3)
    for _ in range(4):
        func = _lower_for_verify(sp.apply(sp.sample(rng)).mod)
        assert tvm.s_tir.analysis.verify_gpu_code(func, limits)


@pytest.mark.parametrize("task_name", ["matmul", "conv"])
def test_cuda_thread_bounds_refuse_only_what_tvm_refuses(task_name):
    """Static thread-extent bounds (checked before any replay) never refuse a point that TVM's
    postprocessors accept, and they catch most of the points those refuse."""
    sp = SketchSpace(task(task_name), tvm.target.Target({"kind": "cuda", "arch": "sm_90"}))
    assert all(sp._bounds), "every CUDA sketch binds threads"
    rng = np.random.default_rng(0)
    refused_statically = refused_by_tvm = 0
    for _ in range(60):
        s = int(rng.integers(sp.num_sketches))
        point = search_spaces.Point(s, tuple(k.choices[int(rng.integers(len(k)))] for k in sp.knobs(s)))
        static = sp.static_violation(point)
        try:
            sp._schedule(point)
            accepted = True
        except search_spaces.InvalidPointError:
            accepted = False
        assert not (static and accepted), f"{point.to_json()} refused statically ({static}) but TVM accepts it"
        refused_statically += static is not None
        refused_by_tvm += not accepted
    assert refused_statically >= 0.8 * refused_by_tvm > 0


def test_cuda_size_counts_the_points_within_thread_bounds():
    """``size`` is exact: the dynamic-programming count equals a brute-force count."""
    import itertools
    import math

    sp = SketchSpace(task("matmul"), tvm.target.Target({"kind": "cuda", "arch": "sm_90"}))
    knobs = sp.knobs(0)
    involved = sorted({t[0] for b in sp._bounds[0] for t in b.terms})
    free = math.prod(len(k) for i, k in enumerate(knobs) if i not in involved)
    base = [k.choices[0] for k in knobs]
    within = 0
    for values in itertools.product(*(knobs[i].choices for i in involved)):
        for i, v in zip(involved, values, strict=True):
            base[i] = v
        within += sp.static_violation(search_spaces.Point(0, tuple(base))) is None
    assert sp._static_count(0) == within * free
    assert 0 < sp.size() < sp.grid_size()
