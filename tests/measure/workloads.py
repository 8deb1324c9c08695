"""Real workloads and deliberately faulty candidates for the measurement tests.

The faulty candidates are real: PrimFuncs with the task's signature that TVM compiles into
real shared libraries which segfault, sleep for an hour, compute the wrong thing, fail to
compile, or take minutes to compile.
"""

from __future__ import annotations

import tvm
from tvm import te
from tvm.s_tir import Schedule
from tvm.script import tirx as T

from tuner.graph.keys import workload_key
from tuner.graph.tasks import Task

N = 64


def _matmul_func(n: int = N, *, bias: float = 0.0) -> tvm.tirx.PrimFunc:
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    if bias:
        d = te.compute((n, n), lambda i, j: c[i, j] + bias, name="D")
        return te.create_prim_func([a, b, d])
    return te.create_prim_func([a, b, c])


def matmul_task(n: int = N) -> Task:
    """An n x n x n float32 matmul as a tuning task."""
    mod = tvm.IRModule({"main": _matmul_func(n)})
    return Task("matmul", mod, 1, 2.0 * n**3, workload_key(mod))


def tiled(task: Task, tile: int, *, vectorize: bool = True, parallel: bool = True) -> tvm.IRModule:
    """A correct schedule of the matmul: tile i and j, vectorize the inner j, parallel outer i."""
    sch = Schedule(task.mod)
    block = sch.get_sblock("C")
    i, j, k = sch.get_loops(block)
    io, ii = sch.split(i, [None, tile])
    jo, ji = sch.split(j, [None, tile])
    sch.reorder(io, jo, k, ii, ji)
    if vectorize:
        sch.vectorize(ji)
    if parallel:
        sch.parallel(io)
    return sch.mod


def wrong_result(n: int = N) -> tvm.IRModule:
    """Same signature, but C = A @ B + 1."""
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j] + te.const(1.0 / n, "float32"), axis=k),
                   name="C")
    return tvm.IRModule({"main": te.create_prim_func([a, b, c])})


@T.prim_func
def _crash(A: T.Buffer((N, N), "float32"), B: T.Buffer((N, N), "float32"), C: T.Buffer((N, N), "float32")):
    T.func_attr({"global_symbol": "main", "tirx.noalias": True})
    flat = T.decl_buffer((1,), "float32", data=C.data)
    for i in range(N):
        # A terabyte past the output: an unmapped address, so the process gets SIGSEGV.
        flat[T.int64(i + 1) * T.int64(1 << 40)] = A[0, i] + B[0, i]


@T.prim_func
def _hang(A: T.Buffer((N, N), "float32"), B: T.Buffer((N, N), "float32"), C: T.Buffer((N, N), "float32")):
    T.func_attr({"global_symbol": "main", "tirx.noalias": True})
    T.evaluate(T.call_extern("int32", "sleep", 3600))
    C[0, 0] = A[0, 0] + B[0, 0]


def crash() -> tvm.IRModule:
    """Same signature; writes to an unmapped address (segfault)."""
    return tvm.IRModule({"main": _crash})


def hang() -> tvm.IRModule:
    """Same signature; sleeps for an hour."""
    return tvm.IRModule({"main": _hang})


def build_error(task: Task) -> tvm.IRModule:
    """A GPU thread binding on a CPU target: TVM's LLVM code generator rejects it."""
    sch = Schedule(task.mod)
    i, _, _ = sch.get_loops(sch.get_sblock("C"))
    sch.bind(i, "threadIdx.x")
    return sch.mod


def slow_build(task: Task) -> tvm.IRModule:
    """Every loop fully unrolled: N^3 statements for LLVM, minutes of compilation."""
    sch = Schedule(task.mod)
    for loop in sch.get_loops(sch.get_sblock("C")):
        sch.unroll(loop)
    return sch.mod


def unrolled(task: Task, tile: int) -> tvm.IRModule:
    """A correct schedule that takes LLVM seconds: the tiled matmul with its k loop unrolled."""
    sch = Schedule(task.mod)
    block = sch.get_sblock("C")
    i, j, k = sch.get_loops(block)
    jo, ji = sch.split(j, [None, tile])
    sch.reorder(i, jo, k, ji)
    sch.unroll(k)
    sch.unroll(ji)
    return sch.mod
