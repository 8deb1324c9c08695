"""Building one candidate into a shared library, returned as bytes."""

from __future__ import annotations

import contextlib
import logging
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import tvm

from tuner.measure.cuda import CudaToolchainError, kernel_formats, prepare_cuda_build
from tuner.measure.quiet import cpu_work
from tuner.measure.results import BuildResult, ErrorClass

logger = logging.getLogger(__name__)


def build_candidate(mod_json: str, target_config: dict) -> BuildResult:
    """Compile a scheduled PrimFunc module (TVM JSON) and export it as a .so's bytes.

    Runs wherever the compiler is; the bytes travel to a measuring node that needs only the
    TVM runtime (CUDA kernels are compiled to device code here, see ``tuner.measure.cuda``).
    Errors become a ``BuildResult`` with ``BUILD_ERROR``.
    """
    start = time.perf_counter()
    target = tvm.target.Target(target_config)
    cuda = str(target.kind.name) == "cuda"
    try:
        if cuda:
            prepare_cuda_build()
        mod = tvm.ir.load_json(mod_json)
        # The CUDA compile callback reads the arch from the target in scope.
        with target if cuda else contextlib.nullcontext():
            lib = tvm.compile(mod, target=target)
        with tempfile.TemporaryDirectory(prefix="nightshift-build-") as tmp:
            path = Path(tmp) / "candidate.so"
            lib.export_library(str(path))
            data = path.read_bytes()
        if cuda and "cuda" in kernel_formats(data):
            raise CudaToolchainError("CUDA kernels were kept as source, which no GPU worker can run")
    except Exception as err:  # TVM raises many error types for unbuildable schedules
        return BuildResult(None, time.perf_counter() - start, ErrorClass.BUILD_ERROR, _short(err))
    return BuildResult(data, time.perf_counter() - start, size=len(data))


def build_task(mod_json: str, target_config: dict) -> Iterator[float | bytes | BuildResult | None]:
    """The Ray task body, a streaming generator: start time, metadata, then the bytes.

    The start is reported once the process is up, TVM imported and its node's shared lease
    held (see ``tuner.measure.quiet``: no timing runs on the node while it builds), so the
    driver's build timeout counts compilation only. The driver reads only the small
    metadata; the bytes go from the object store straight to the device actor.
    """
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    with cpu_work(node_id):
        yield time.time()
        result = build_candidate(mod_json, target_config)
    yield BuildResult(None, result.build_sec, result.error_class, result.error_msg, node_id, result.size)
    yield result.artifact


def _short(err: BaseException, limit: int = 2000) -> str:
    text = f"{type(err).__name__}: {err}"
    return text if len(text) <= limit else text[: limit - 3] + "..."
