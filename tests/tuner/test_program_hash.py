"""program_hash: the key by which a scheduled program is measured once per device."""

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import te

import search_spaces
from tuner.compile import preload_tensor_intrinsics
from tuner.graph.keys import program_hash, trace_program_hash

TARGET = {"kind": "llvm", "mcpu": "x86-64", "num-cores": 2}
ROOT = Path(__file__).resolve().parents[2]


def matmul_mod(n: int = 64) -> tvm.IRModule:
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return tvm.IRModule({"main": te.create_prim_func([a, b, c]).with_attr("global_symbol", "matmul")})


def elementwise_mod(n: int = 64) -> tvm.IRModule:
    """Two fused elementwise ops: a space of 12 knob settings but only a few programs."""
    a = te.placeholder((n, n), name="a")
    b = te.compute((n, n), lambda i, j: a[i, j] + 1, name="b")
    c = te.compute((n, n), lambda i, j: b[i, j] * 2, name="c")
    return tvm.IRModule({"main": te.create_prim_func([a, c]).with_attr("global_symbol", "ew")})


@pytest.fixture(scope="module", autouse=True)
def _tvm_tensor_intrinsics() -> None:
    """TVM's tensor intrinsics, imported the fast way (else the first space takes minutes)."""
    preload_tensor_intrinsics()


def _hashes(space: search_spaces.SearchSpace, points: list) -> list[str]:
    return [program_hash(space.apply(p).mod) for p in points]


# Run in a fresh interpreter: another process, another PYTHONHASHSEED, a freshly built space.
_CHILD = """
import json, sys, tvm
import search_spaces
from search_spaces import Point
from tuner.compile import preload_tensor_intrinsics
from tuner.graph.keys import program_hash, trace_program_hash
from tests.tuner.test_program_hash import TARGET, matmul_mod
preload_tensor_intrinsics()
space = search_spaces.create(matmul_mod(), tvm.target.Target(TARGET), seed=1)
points = [Point.from_json(p) for p in json.loads(sys.stdin.read())]
print(json.dumps([program_hash(space.apply(p).mod) for p in points]))
"""


@pytest.mark.slow
def test_stable_across_processes():
    space = search_spaces.create(matmul_mod(), tvm.target.Target(TARGET), seed=1)
    rng = np.random.default_rng(0)
    points = [space.sample(rng) for _ in range(6)]
    here = _hashes(space, points)
    assert all(len(h) == 16 and int(h, 16) >= 0 for h in here)
    again = search_spaces.create(matmul_mod(), tvm.target.Target(TARGET), seed=1)
    assert _hashes(again, points) == here
    env = os.environ | {"PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", _CHILD], input=json.dumps([p.to_json() for p in points]),
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=True)  # fmt: skip
    assert json.loads(out.stdout.strip().splitlines()[-1]) == here


@pytest.mark.parametrize("make", [elementwise_mod, matmul_mod], ids=["elementwise", "matmul"])
def test_equal_hash_exactly_for_equal_programs(make):
    space = search_spaces.create(make(), tvm.target.Target(TARGET), seed=1)
    rng = np.random.default_rng(1)
    points = {p.to_json(): p for p in (space.sample(rng) for _ in range(24))}
    mods = [space.apply(p).mod for p in points.values()]
    hashes = [program_hash(m) for m in mods]
    for (ha, ma), (hb, mb) in itertools.combinations(zip(hashes, mods, strict=True), 2):
        assert (ha == hb) == bool(tvm_ffi.structural_equal(ma, mb))
    assert len(set(hashes)) > 1  # different schedules, different keys


def test_different_knobs_can_give_one_program():
    """The elementwise space's parallel knob beyond the loop's extent changes nothing: the
    knob JSON alone would measure those points again, the program hash does not."""
    space = search_spaces.create(elementwise_mod(), tvm.target.Target(TARGET), seed=1)
    points = list(space.enumerate())
    hashes = set(_hashes(space, points))
    assert len(points) > len(hashes) > 1


def test_metaschedule_trace_gives_the_same_hash():
    """A MetaSchedule record of a program (its trace, through its JSON) has the program's hash."""
    from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

    mod = matmul_mod()
    target = tvm.target.Target(TARGET)
    space = search_spaces.create(mod, target, seed=1)
    rng = np.random.default_rng(2)
    for point in (space.sample(rng) for _ in range(3)):
        record = TuningRecord(space.to_trace(point), Workload(mod), [1e-3], target, None)
        again = TuningRecord.from_json(json.loads(json.dumps(record.as_json())), Workload(mod))
        assert trace_program_hash(again.trace, mod) == program_hash(space.apply(point).mod)
    # A trace of another workload does not replay here.
    other = search_spaces.create(elementwise_mod(), target, seed=1)
    assert trace_program_hash(other.to_trace(next(other.enumerate())), mod) is None
