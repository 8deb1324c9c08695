"""Small tasks and spaces shared by the search tests (each built once per session)."""

from __future__ import annotations

import functools

import tvm
from tvm import te, topi

import search_spaces
from tuner.graph.keys import workload_key
from tuner.graph.tasks import Task


def matmul_mod(n: int = 64) -> tvm.IRModule:
    """C = A @ B, square."""
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return tvm.IRModule({"main": te.create_prim_func([a, b, c])})


def conv_mod() -> tvm.IRModule:
    """A small 3x3 conv (pad 1) + bias + relu: both the sketch space and the x86 template apply."""
    data = te.placeholder((1, 16, 14, 14), name="data")
    weight = te.placeholder((32, 16, 3, 3), name="weight")
    bias = te.placeholder((1, 32, 1, 1), name="bias")
    conv = topi.nn.conv2d_nchw(data, weight, stride=1, padding=1, dilation=1)
    out = topi.nn.relu(topi.add(conv, bias))
    return tvm.IRModule({"main": te.create_prim_func([data, weight, bias, out])})


def relu_mod() -> tvm.IRModule:
    """An elementwise op whose whole space is a dozen points."""
    x = te.placeholder((4, 8), name="x")
    return tvm.IRModule({"main": te.create_prim_func([x, topi.nn.relu(x)])})


MODS = {"matmul": matmul_mod, "conv": conv_mod, "relu": relu_mod}
FLOPS = {"matmul": 2.0 * 64**3, "conv": 2.0 * 32 * 14 * 14 * 16 * 9, "relu": 32.0}


@functools.cache
def target() -> tvm.target.Target:
    """The host CPU's target."""
    from tuner.device import parse_device

    return parse_device("cpu").target


@functools.cache
def mod(name: str) -> tvm.IRModule:
    return MODS[name]()


def task(name: str) -> Task:
    """``name`` as a tuning task."""
    m = mod(name)
    return Task(name, m, 1, FLOPS[name], workload_key(m))


@functools.cache
def space(kind: str, name: str) -> search_spaces.SearchSpace:
    """The ``kind`` space of task ``name`` on the host CPU."""
    return search_spaces.create(mod(name), target(), kind=kind)
