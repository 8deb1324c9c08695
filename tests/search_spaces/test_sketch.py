"""The sketch space's own checks on the schedules TVM's postprocessors let through."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import tvm
from conftest import needs_vnni, target, task
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


def _build_fails(mod: tvm.IRModule) -> subprocess.CompletedProcess:
    """Build ``mod`` for the host in a process of its own: TVM's vectorizer may segfault."""
    code = ("import sys, tvm; from search_spaces import lowering; from tuner.device import parse_device; "
            "lowering.install(); tvm.compile(tvm.ir.load_json(sys.stdin.read()), target=parse_device('cpu').target)")
    return subprocess.run([sys.executable, "-c", code], input=tvm.ir.save_json(mod), capture_output=True, text=True,
                          timeout=300)  # fmt: skip


@needs_vnni
def test_points_that_vectorize_a_tensorized_dot_product_are_rejected_before_they_build(monkeypatch):
    """MetaSchedule's vectorize postprocessor vectorizes loops around a tensorized vpdpbusd;
    such a point fails to build (or crashes the build process), so the space rejects it, and
    sampling never returns one."""
    space = search_spaces.create(task("dense_u8s8"), target("llvm"), kind="sketch")
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
    unchecked = search_spaces.create(task("dense_u8s8"), target("llvm"), kind="sketch")
    proc = _build_fails(unchecked.apply(rejected).mod)
    assert proc.returncode != 0, "the rejected point built"
    monkeypatch.undo()
    for _ in range(20):
        assert vectorized_vectors(space.apply(space.sample(rng)).mod) is None
