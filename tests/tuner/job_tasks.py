"""Small real tasks for the job tests (tests/tuner is on sys.path, as for morning_job)."""

from __future__ import annotations

import tvm
from tvm import te

from tuner.graph.keys import workload_key
from tuner.graph.tasks import Task


def matmul_task(n: int) -> Task:
    """An n x n x n float32 matmul as a tuning task named ``matmul{n}``."""
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    mod = tvm.IRModule({"main": te.create_prim_func([a, b, c])})
    return Task(f"matmul{n}", mod, 1, 2.0 * n**3, workload_key(mod))


def dense_bf16_task(m: int = 32, k: int = 64, n: int = 64) -> Task:
    """A bf16 dense layer as ``tuner.precision.bf16`` writes it (packed weight), + relu: a
    task of the ``x86-dense-bf16`` template, named ``dense_bf16``."""
    from tvm import topi

    from tuner.precision.bf16 import packed_matmul, packed_shape

    a = te.placeholder((1, m, k), name="A", dtype="bfloat16")
    w = te.placeholder(packed_shape(k, n), name="W", dtype="bfloat16")
    mod = tvm.IRModule({"main": te.create_prim_func([a, w, topi.nn.relu(packed_matmul(a, w))])})
    return Task("dense_bf16", mod, 1, 2.0 * m * k * n, workload_key(mod, "bf16"))
