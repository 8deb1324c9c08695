"""The sketch space's own checks on the schedules TVM's postprocessors let through."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import tvm
from conftest import TARGETS, target, task
from tvm.script import tirx as T

import search_spaces
import search_spaces.sketch as sketch
from search_spaces.base import InvalidPointError, Point
from search_spaces.sketch import vectorized_vectors


def _module(body: str) -> tvm.IRModule:
    """A PrimFunc over A, B (float32, 64 elements) whose body is ``body``, as a module."""

    @T.prim_func
    def scalar(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32")):
        for i in T.vectorized(64):
            b[i] = a[i] * T.float32(2)

    @T.prim_func
    def nested(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32")):
        for i in T.vectorized(4):
            for j in T.vectorized(16):
                b[i * 16 + j] = a[i * 16 + j]

    @T.prim_func
    def vector(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32")):
        for i in T.vectorized(4):
            b[T.Ramp(i * 16, 1, 16)] = a[T.Ramp(i * 16, 1, 16)] + T.Broadcast(T.float32(1), 16)

    return tvm.IRModule({"main": {"scalar": scalar, "nested": nested, "vector": vector}[body]})


def test_vectorizing_what_is_vector_already_is_named():
    assert vectorized_vectors(_module("scalar")) is None
    assert vectorized_vectors(_module("nested")) == "vectorized loop j inside a vectorized loop"
    assert vectorized_vectors(_module("vector")).startswith("vectorized loop over a ")


def _build(mod: tvm.IRModule, target_config: dict) -> subprocess.CompletedProcess:
    """Compile ``mod`` in a process of its own: TVM's vectorizer may segfault."""
    code = ("import json, sys, tvm; from search_spaces import lowering; lowering.install(); "
            "tvm.compile(tvm.ir.load_json(sys.stdin.read()), target=tvm.target.Target(json.loads(sys.argv[1])))")
    return subprocess.run([sys.executable, "-c", code, json.dumps(target_config)], input=tvm.ir.save_json(mod),
                          capture_output=True, text=True, timeout=300)  # fmt: skip


@pytest.mark.slow
def test_points_that_vectorize_a_tensorized_dot_product_are_rejected_before_they_build(monkeypatch):
    """MetaSchedule's vectorize postprocessor vectorizes loops around a tensorized vpdpbusd;
    such a point fails to build (or crashes the build process), so the space rejects it, and
    sampling never returns one. For an AVX-512 VNNI CPU without AMX (compiled, never run, so
    any x86 host checks it)."""
    space = search_spaces.create(task("dense_u8s8"), target("llvm-vnni"), kind="sketch")
    rng = np.random.default_rng(0)
    rejected = None
    for _ in range(400):
        s = int(rng.integers(space.num_sketches))
        point = Point(s, tuple(k.choices[int(rng.integers(len(k)))] for k in space.knobs(s)))
        if space.static_violation(point) is not None:
            continue
        try:
            space.apply(point)
        except InvalidPointError as err:
            if "vectorized" in str(err):
                rejected = point
                break
    assert rejected is not None, "no point of the VNNI sketches vectorizes the tensorized instruction"
    monkeypatch.setattr(sketch, "vectorized_vectors", lambda mod: None)
    unchecked = search_spaces.create(task("dense_u8s8"), target("llvm-vnni"), kind="sketch")
    proc = _build(unchecked.apply(rejected).mod, TARGETS["llvm-vnni"])
    assert proc.returncode != 0, "the rejected point built"
    monkeypatch.undo()
    sampled = [space.apply(space.sample(rng)).mod for _ in range(20)]
    assert all(vectorized_vectors(mod) is None for mod in sampled)
    proc = _build(sampled[0], TARGETS["llvm-vnni"])  # the same harness builds an accepted point
    assert proc.returncode == 0, proc.stderr[-2000:]


def _broadcast_multiply(block: int = 16) -> tvm.IRModule:
    """A squeeze-excitation gate's multiply in a blocked layout: a map by a per-channel gate."""
    from tvm import te, topi

    x = te.placeholder((1, 4, 9, 9, block), name="x")
    g = te.placeholder((1, 4, 1, 1, block), name="g")
    return tvm.IRModule({"main": te.create_prim_func([x, g, topi.multiply(x, g)]).with_attr("global_symbol", "main")})


@pytest.mark.parametrize(("target_name", "block", "lanes"), [
    ("llvm-avx2", 16, 8),   # one register of 8 lanes
    ("llvm-vnni", 16, 16),  # one register of 16 lanes
    ("llvm-vnni", 8, 8),    # an 8-channel block under AVX-512: vectors of the block
    ("llvm-vnni", 15, 15),  # 120 channels as 8 blocks of 15
    ("llvm-avx2", 4, 4),
])  # fmt: skip
def test_an_elementwise_function_starts_at_one_register_or_its_block(target_name, block, lanes):
    space = sketch.SketchSpace(_broadcast_multiply(block), target(target_name))
    starts = space.starts()
    assert len(starts) == 1
    knobs = dict(zip((k.name for k in space.knobs(starts[0].sketch)), starts[0].decisions, strict=True))
    assert knobs == {"parallel": 2 * 4, "vectorize": lanes}
    assert space.check(starts[0]) is None
    vectorize = next(k for k in space.knobs(0) if k.name == "vectorize")
    assert lanes in vectorize.choices
    assert min(vectorize.choices) == lanes  # nothing narrower than the block or a register


def test_a_function_with_tiles_has_no_elementwise_start():
    assert sketch.SketchSpace(task("conv"), target("llvm")).starts() == []
