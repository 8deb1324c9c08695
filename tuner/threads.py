"""TVM's CPU thread pool, sized to the threads a model was tuned on.

Imports ``tvm.runtime`` APIs only: an artifact loads under ``TVM_USE_RUNTIME_LIB=1``
(``tuner.artifact``) and sizes the pool the same way as a build in the tuner.
"""

from __future__ import annotations

import os

import tvm


def size_thread_pool(cores: int) -> None:
    """Run this process's TVM kernels on ``cores`` threads, each free to run on any CPU this
    process may use.

    Without ``TVM_NUM_THREADS`` TVM's pool takes half the logical CPUs on x86 (it assumes
    hyper-threading): one thread on a 2-core machine. ``runtime.config_threadpool`` caps the
    pool at the length of its CPU list, and an empty list means that default again, whatever
    ``cores`` says (TVM's ``threading::Configure``), so the list is given.
    """
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    # Affinity mode kSpecifyThreadShareAllCore: every worker may run on any of ``cpus``.
    tvm.get_global_func("runtime.config_threadpool")(-3, cores, [str(c) for c in cpus])
