"""The vdpbf16ps tensor intrinsic and the x86-dense-bf16 template (beyond the conformance suite)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import tvm
from conftest import space, target, task

import search_spaces
from search_spaces.templates.intrin_x86 import BF16_DOT_16x2_INTRIN, register_intrinsics, target_has_bf16_dot
from search_spaces.verify import check_point, reference
from tuner.device import host_cpu_info

needs_bf16 = pytest.mark.skipif("avx512_bf16" not in host_cpu_info()["isa_flags"],
                                reason="this CPU has no AVX512_BF16")  # fmt: skip


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
