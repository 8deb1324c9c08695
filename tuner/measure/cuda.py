"""CUDA on both sides of the measurement: device code built on CPU nodes, run on GPU nodes.

Build side (CPU node, TVM's compiler): TVM's CUDA code generator only compiles kernels to
device code when TVM's CUDA runtime library is loaded (it registers ``ffi.Module.create.cuda``);
without it, it silently keeps the CUDA *source* in a fallback module that no GPU can run. That
library needs ``libcuda.so.1``, the driver, which a CPU node does not have: there a stub driver
whose entry points all fail is loaded first (built once with the C compiler that
``export_library`` already needs). Kernels are compiled with nvcc to a fatbin, or with NVRTC to
a cubin when only NVIDIA's Python bindings are installed (the ``cuda`` extra).

GPU side (runtime only): load the CUDA runtime library, name the GPUs, and tell a CUDA error
that leaves the context unusable (the process must go) from one that does not.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, Literal

from tuner.cuda_runtime import load_cuda_runtime, wheel_cuda_home
from tuner.errors import CudaToolchainError, install_hint

logger = logging.getLogger(__name__)


# ----- runtime library (both sides) -----


# ----- build side -----


#: Where CUDA toolkits install nvcc when it is not on PATH (a login shell's profile adds it;
#: a Ray worker, a container's entry point or ``ssh host cmd`` may not run that profile).
NVCC_DIRS = ("/usr/local/cuda/bin", "/opt/cuda/bin")


def find_nvcc(path: str | None = None, cuda_home: str | None = None,
              dirs: tuple[str, ...] = NVCC_DIRS) -> Path | None:
    """The nvcc this node can run: on ``path`` (default: ``$PATH``), else under ``cuda_home``
    (default: ``$CUDA_HOME`` or ``$CUDA_PATH``), the usual toolkit folders, or the ``cuda``
    extra's wheel (``nvidia-cuda-nvcc``); None if there is none."""
    found = shutil.which("nvcc", path=path)
    if found:
        return Path(found)
    home = cuda_home if cuda_home is not None else os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    wheel = wheel_cuda_home()
    candidates = [*([Path(home) / "bin"] if home else []), *(Path(d) for d in dirs),
                  *([wheel / "bin"] if wheel is not None else [])]  # fmt: skip
    for folder in candidates:
        nvcc = folder / "nvcc"
        if nvcc.is_file() and os.access(nvcc, os.X_OK):
            return nvcc
    return None


def cuda_compiler() -> Literal["nvcc", "nvrtc"]:
    """The CUDA compiler this node builds kernels with: nvcc (see :func:`find_nvcc`), else NVRTC.

    An nvcc found off PATH is put on this process's PATH: TVM runs "nvcc" by name, and finds
    the toolkit's headers from where that nvcc is.

    Raises:
        CudaToolchainError: neither nvcc nor NVRTC's Python bindings (the ``cuda`` extra).
    """
    nvcc = find_nvcc()
    if nvcc is not None:
        if not shutil.which("nvcc"):
            os.environ["PATH"] = f"{nvcc.parent}{os.pathsep}{os.environ.get('PATH', '')}"
            logger.info("nvcc is not on PATH: using %s", nvcc)
        return "nvcc"
    try:
        from cuda.bindings import nvrtc  # noqa: F401
    except ImportError:
        raise CudaToolchainError(
            "building CUDA kernels needs nvcc (on PATH, under $CUDA_HOME or /usr/local/cuda) or NVRTC: "
            f"{install_hint('cuda')}"
        ) from None
    if not os.environ.get("CUDA_PATH"):
        # TVM's NVRTC path takes CUDA's headers from $CUDA_PATH, else from where nvcc is, which
        # here is nowhere: it would fail each build with "Cannot find CUDA path".
        headers = cuda_headers_home()
        if headers is None:
            raise CudaToolchainError("NVRTC needs CUDA's headers (include/cuda_runtime.h): set CUDA_PATH to a "
                                     f"CUDA toolkit, or {install_hint('cuda')}")  # fmt: skip
        os.environ["CUDA_PATH"] = str(headers)
        logger.info("no nvcc here: CUDA kernels compile with NVRTC (headers from %s)", headers)
    return "nvrtc"


def cuda_headers_home(cuda_home: str | None = None, dirs: tuple[str, ...] = NVCC_DIRS) -> Path | None:
    """A CUDA root whose ``include/`` has ``cuda_runtime.h`` (``cuda_home``, default
    ``$CUDA_HOME``; the toolkit folders; the ``cuda`` extra's wheels), or None."""
    home = cuda_home if cuda_home is not None else os.environ.get("CUDA_HOME")
    wheel = wheel_cuda_home()
    roots = [*([Path(home)] if home else []), *(Path(d).parent for d in dirs), *([wheel] if wheel else [])]
    return next((r for r in roots if (r / "include" / "cuda_runtime.h").is_file()), None)


def prepare_cuda_build() -> str:
    """Make this process compile CUDA kernels to device code; returns the compiler used.

    Loads TVM's CUDA runtime library (with a stub driver on a machine without one), without
    which TVM keeps only the kernels' source, and registers the compile callback TVM calls:
    nvcc (fatbin) or NVRTC (cubin) for the current target's ``arch``. TVM's own callback would
    pick NVRTC unless an environment variable says otherwise.

    Raises:
        CudaToolchainError: no compiler, or TVM's CUDA runtime library cannot be loaded.
    """
    compiler = cuda_compiler()
    if not load_cuda_runtime(allow_stub=True):
        raise CudaToolchainError("TVM's CUDA runtime library (libtvm_runtime_cuda) does not load: "
                                 "it needs libcudart.so.13 (CUDA 13 runtime)")
    _register_compile_callback(compiler)
    return compiler


@functools.cache
def _register_compile_callback(compiler: str) -> None:
    import tvm_ffi
    from tvm.support import nvcc

    fmt = "fatbin" if compiler == "nvcc" else "cubin"

    @tvm_ffi.register_global_func("tvm_callback_cuda_compile", override=True)
    def _compile(code: str) -> bytes:  # the arch comes from the target in scope (tvm.compile's)
        return nvcc.compile_cuda(code, target_format=fmt, compiler=compiler)

    logger.debug("CUDA kernels compile with %s to %s", compiler, fmt)


def kernel_formats(artifact: bytes) -> list[str]:
    """The format of each CUDA module in an exported library: ``fatbin``/``cubin``/``ptx`` for
    device code, ``cuda`` for the source TVM keeps when its CUDA runtime library is not loaded
    (a GPU worker without a compiler cannot run that)."""
    # Each imported module is serialized as its kind, its blob's size, then (CUDA) its format.
    formats, after = [], 0
    for m in re.finditer(rb"\x04\x00{7}cuda.{8}", artifact, flags=re.DOTALL):
        if m.start() < after:  # the source format's own name, read just before
            continue
        end = m.end()
        size = int.from_bytes(artifact[end : end + 8], "little")
        fmt = artifact[end + 8 : end + 8 + size].decode(errors="replace") if 0 < size <= 8 else ""
        if fmt in ("cuda", "cubin", "fatbin", "ptx"):
            formats.append(fmt)
            after = end + 8 + size
    return formats


def reference_module(mod: Any, target: Any) -> Any:
    """The module whose outputs a task's candidates are checked against, for ``target``.

    On CPUs, the unscheduled module. On CUDA, the unscheduled module does not build into a
    kernel (its loops would run on the host over device pointers): TVM's default GPU schedule
    binds its loops to blocks and threads, one output element per thread, which keeps the
    arithmetic of the unscheduled loops and runs on the same GPU as the candidates.
    """
    if str(target.kind.name) != "cuda":
        return mod
    from tvm.s_tir.transform import DefaultGPUSchedule

    try:
        with target:
            return DefaultGPUSchedule()(mod)
    except Exception as err:  # TVM 0.27's pass refuses some multi-block functions (e.g. padded convs)
        logger.debug("DefaultGPUSchedule failed (%s); binding each block's spatial loops", err)
    return _bind_spatial_loops(mod, int(target.attrs.get("max_num_threads", 256)))


def _bind_spatial_loops(mod: Any, threads: int) -> Any:
    """What the default GPU schedule does: per block, its spatial loops fused and spread over
    blocks of ``threads`` threads, its reduction loops left serial inside each thread."""
    from tvm.s_tir import Schedule

    sch = Schedule(mod)
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        loops = sch.get_loops(block)
        kinds = [int(iv.iter_type) for iv in sch.get(block).iter_vars]  # 0: spatial
        if len(kinds) != len(loops):
            raise ValueError(f"block {sch.get(block).name_hint}: loops do not match its iterators")
        spatial = [lp for lp, k in zip(loops, kinds, strict=True) if k == 0]
        if kinds[: len(spatial)] != [0] * len(spatial):
            sch.reorder(*spatial, *(lp for lp in loops if lp not in spatial))
        fused = sch.fuse(*spatial) if spatial else sch.add_unit_loop(block)
        bx, tx = sch.split(fused, [None, threads])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
    return sch.mod


# ----- GPU side -----


# Errors after which the CUDA context is unusable: every later call in the process fails
# with the same error, so the process must end (CUDA runtime docs: "sticky" errors). The
# runtime API's message and the driver API's name of each (TVM reports either).
_CONTEXT_FATAL = (
    ("an illegal memory access was encountered", "CUDA_ERROR_ILLEGAL_ADDRESS"),
    ("misaligned address", "CUDA_ERROR_MISALIGNED_ADDRESS"),
    ("an illegal instruction was encountered", "CUDA_ERROR_ILLEGAL_INSTRUCTION"),
    ("unspecified launch failure", "CUDA_ERROR_LAUNCH_FAILED"),
    ("invalid program counter", "CUDA_ERROR_INVALID_PC"),
    ("hardware stack error", "CUDA_ERROR_HARDWARE_STACK_ERROR"),
    ("operation not supported on global/shared address space", "CUDA_ERROR_INVALID_ADDRESS_SPACE"),
    ("device-side assert triggered", "CUDA_ERROR_ASSERT"),
    ("the launch timed out and was terminated", "CUDA_ERROR_LAUNCH_TIMEOUT"),
    ("uncorrectable ECC error encountered", "CUDA_ERROR_ECC_UNCORRECTABLE"),
    ("context is destroyed", "CUDA_ERROR_CONTEXT_IS_DESTROYED"),
)


def context_fatal(message: str) -> str | None:
    """The CUDA error in ``message`` if it leaves the context unusable, else None.

    A candidate's other launch failures (too many resources requested, an invalid launch
    configuration) fail only that launch: the process goes on timing the next candidate.
    """
    for text, name in _CONTEXT_FATAL:
        if text in message or name in message:
            return name
    return None


