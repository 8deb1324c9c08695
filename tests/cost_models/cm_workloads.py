"""Small TIR workloads the cost-model tests featurize and store."""

from __future__ import annotations

import tvm
from tvm import te


def matmul(n: int) -> tvm.IRModule:
    """An ``n`` x ``n`` matmul as a PrimFunc named ``matmul``."""
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return tvm.IRModule({"main": te.create_prim_func([a, b, c]).with_attr("global_symbol", "matmul")})
