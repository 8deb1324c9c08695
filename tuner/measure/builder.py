"""Building one candidate into a shared library, returned as bytes."""

from __future__ import annotations

import contextlib
import logging
import tempfile
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path

import tvm

from search_spaces import lowering
from tuner.errors import CudaToolchainError
from tuner.measure.cuda import kernel_formats, prepare_cuda_build
from tuner.measure.quiet import cpu_work
from tuner.measure.results import BuildResult, ErrorClass
from tuner.measure.runner import ArgSpec

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuildPause:
    """An item of a build's stream: the build handed its node to a timing (``paused``) or got
    it back; ``ran_s``: how long it has run so far, the time its timeout counts."""

    paused: bool
    ran_s: float


def build_stages(mod_json: str, target_config: dict) -> Generator[None, None, BuildResult]:
    """Compile a scheduled PrimFunc module (TVM JSON) and export it as a .so's bytes, in stages.

    Yields between the stages (compilation, then export: object code and link), where the
    caller may hand its cores to a timing; returns the ``BuildResult``, whose ``build_sec``
    counts the stages only. Errors become a ``BuildResult`` with ``BUILD_ERROR``.
    """
    ran = 0.0
    start = time.perf_counter()
    target = tvm.target.Target(target_config)
    cuda = str(target.kind.name) == "cuda"
    try:
        if cuda:
            prepare_cuda_build()
        mod = tvm.ir.load_json(mod_json)
        lowering.install()  # peels the partial tiles that templates hint
        # The CUDA compile callback reads the arch from the target in scope.
        with target if cuda else contextlib.nullcontext():
            lib = tvm.compile(mod, target=target)
        ran += time.perf_counter() - start
        yield
        start = time.perf_counter()
        # LLVM emits the object code here, about as long as the compilation.
        with tempfile.TemporaryDirectory(prefix="nightshift-build-") as tmp:
            path = Path(tmp) / "candidate.so"
            lib.export_library(str(path))
            data = path.read_bytes()
        if cuda and "cuda" in kernel_formats(data):
            raise CudaToolchainError("CUDA kernels were kept as source, which no GPU worker can run")
    except Exception as err:  # TVM raises many error types for unbuildable schedules
        return BuildResult(None, ran + time.perf_counter() - start, ErrorClass.BUILD_ERROR, _short(err))
    return BuildResult(data, ran + time.perf_counter() - start, size=len(data))


def build_candidate(mod_json: str, target_config: dict) -> BuildResult:
    """Compile a scheduled PrimFunc module (TVM JSON) and export it as a .so's bytes.

    Runs wherever the compiler is; the bytes travel to a measuring node that needs only the
    TVM runtime (CUDA kernels are compiled to device code here, see ``tuner.measure.cuda``).
    Errors become a ``BuildResult`` with ``BUILD_ERROR``.
    """
    stages = build_stages(mod_json, target_config)
    while True:
        try:
            next(stages)
        except StopIteration as stop:
            return stop.value


def build_task(mod_json: str, target_config: dict) -> Iterator[str | BuildPause | BuildResult | bytes | None]:
    """The Ray task body, a streaming generator: its node's id, pauses, metadata, then the bytes.

    The start (the id of the node it builds on) is reported once the process is up, TVM
    imported and its node's shared lease held (see ``tuner.measure.quiet``: no timing runs on
    the node while it builds), so the driver's build timeout counts compilation only. Between
    stages the build lets a timing that waits for the node go first, and says so
    (``BuildPause``): the driver stops its timeout meanwhile. The driver reads only the small
    metadata; the bytes go from the object store straight to the device actor.
    """
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    with cpu_work(node_id) as work:
        yield node_id
        started = time.perf_counter()
        paused = 0.0
        stages = build_stages(mod_json, target_config)
        while True:
            try:
                next(stages)
            except StopIteration as stop:
                result: BuildResult = stop.value
                break
            if work.timing_pending():
                ran = time.perf_counter() - started - paused
                yield BuildPause(True, ran)
                paused += work.pause()
                yield BuildPause(False, ran)
    yield BuildResult(None, result.build_sec, result.error_class, result.error_msg, node_id, result.size)
    yield result.artifact


def _short(err: BaseException, limit: int = 2000) -> str:
    text = f"{type(err).__name__}: {err}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def entry_name(mod: tvm.IRModule) -> str:
    """The symbol a task module's built library exports its ``main`` as."""
    func = mod["main"]
    if func.attrs and "global_symbol" in func.attrs:
        return str(func.attrs["global_symbol"])
    return "main"


def arg_specs(mod: tvm.IRModule) -> list[ArgSpec]:
    """Shapes and dtypes of a task module's arguments (what its reference is run on)."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    return [
        ArgSpec(tuple(int(d) for d in info.shape), str(info.dtype))
        for info in ArgInfo.from_prim_func(mod["main"])
    ]
