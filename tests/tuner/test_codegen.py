"""One LLVM module per function in a model's CPU build (tuner.codegen)."""

from __future__ import annotations

import numpy as np
import tvm
from tvm.script import ir as I
from tvm.script import tirx as T

from tuner import codegen
from tuner.compile import Compiled, compile_model, run_model
from tuner.frontends import load_model


def _llvm_modules(lib: tvm.runtime.Module) -> int:
    return (lib.kind == "llvm") + sum(_llvm_modules(m) for m in lib.imports)


@I.ir_module
class TwoKernels:
    @T.prim_func
    def add_one(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32")):
        for i in range(64):
            b[i] = a[i] + T.float32(1)

    @T.prim_func
    def double(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32")):
        for i in range(64):
            b[i] = a[i] * T.float32(2)


def test_each_function_gets_its_own_module_and_all_are_callable():
    with codegen.per_function(), tvm.transform.PassContext(opt_level=3):
        lib = tvm.tirx.build(TwoKernels, target="llvm")
    assert _llvm_modules(lib) == 2
    a = tvm.runtime.tensor(np.arange(64, dtype="float32"))
    b = tvm.runtime.tensor(np.zeros(64, dtype="float32"))
    # Found through the first module's imports, as the Relax VM looks its kernels up.
    lib.get_function("add_one", query_imports=True)(a, b)
    np.testing.assert_array_equal(b.numpy(), np.arange(64) + 1)
    lib.get_function("double", query_imports=True)(a, b)
    np.testing.assert_array_equal(b.numpy(), np.arange(64) * 2)


def test_single_module_builds_one_module_inside_per_function():
    with codegen.per_function(), codegen.single_module(), tvm.transform.PassContext(opt_level=3):
        lib = tvm.tirx.build(TwoKernels, target="llvm")
    assert _llvm_modules(lib) == 1


def test_tvms_own_build_is_back_after_the_context():
    with codegen.per_function(), codegen.per_function():  # nested
        pass
    with tvm.transform.PassContext(opt_level=3):
        lib = tvm.tirx.build(TwoKernels, target="llvm")
    assert _llvm_modules(lib) == 1


def test_a_module_with_a_private_function_stays_whole():
    private = tvm.IRModule({gv: (f.without_attr("global_symbol") if gv.name_hint == "double" else f)
                            for gv, f in TwoKernels.functions.items()})  # fmt: skip
    assert not codegen._splittable(private)
    assert codegen._splittable(TwoKernels)


def test_split_model_build_computes_what_the_single_module_computes(cpu_device, tmp_path):
    from tuner.graph.layout.plan import LayoutPlan
    from tuner.graph.layout.rewrites import prepare

    spec = load_model("tiny")
    inputs = spec.random_inputs(seed=0)
    split = compile_model(spec, cpu_device, None)
    assert _llvm_modules(split.executable.mod) > 1
    with tvm.transform.PassContext(opt_level=3):  # the same module, TVM's single LLVM module
        whole = tvm.compile(prepare(spec.bound(), cpu_device.target, LayoutPlan.for_target(cpu_device.target)),
                            target=cpu_device.target)  # fmt: skip
    assert _llvm_modules(whole.mod) == 1
    expected, _ = run_model(Compiled(whole, {}, {}, 0.0), cpu_device, inputs)
    got, _ = run_model(split, cpu_device, inputs)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
    # Exported with every module linked into one library, loaded back by TVM's runtime.
    path = tmp_path / "model.so"
    split.executable.export_library(str(path))
    loaded = Compiled(tvm.runtime.load_module(str(path)), {}, {}, 0.0)
    again, _ = run_model(loaded, cpu_device, inputs)
    for g, e in zip(again, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
