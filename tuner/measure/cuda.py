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

import ctypes
import functools
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Literal

from tuner.errors import NightshiftError

logger = logging.getLogger(__name__)

# CUDA_ERROR_STUB_LIBRARY: what NVIDIA's own stub driver returns from every call.
_STUB_ERROR = 34


class CudaToolchainError(NightshiftError):
    """CUDA kernels cannot be built or run here (no runtime library, no nvcc or NVRTC)."""


# ----- runtime library (both sides) -----


def driver_present() -> bool:
    """Whether NVIDIA's driver library (``libcuda.so.1``) can be loaded on this machine."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def load_cuda_runtime(*, allow_stub: bool = False) -> bool:
    """Load TVM's CUDA runtime library (``libtvm_runtime_cuda``) into this process.

    ``TVM_USE_RUNTIME_LIB=1`` (the device actors) and a machine without the driver (the
    build nodes) leave it unloaded, so ``tvm.cuda(i)`` finds no GPU and CUDA builds keep only
    source. With ``allow_stub`` and no driver, a stub ``libcuda.so.1`` is loaded first: enough
    to compile and export kernels, never to run one. Returns whether the library is loaded.
    """
    from tvm import base

    if "tvm_runtime_cuda" in base._LOADED_LIBS:
        return True
    from tvm_ffi.libinfo import load_lib_ctypes

    runtime_dir = Path(base._LOADED_LIBS["tvm_runtime"]._name).resolve().parent
    home = wheel_cuda_home()
    if home is not None and (home / "lib" / "libcudart.so.13").exists():
        ctypes.CDLL(str(home / "lib" / "libcudart.so.13"), mode=ctypes.RTLD_GLOBAL)
    if not driver_present():
        if not allow_stub:
            return False
        _load_stub_driver(runtime_dir)
    try:
        base._LOADED_LIBS["tvm_runtime_cuda"] = load_lib_ctypes(
            package="tvm", target_name="tvm_runtime_cuda", extra_lib_paths=[runtime_dir], mode="RTLD_GLOBAL"
        )
    except (OSError, RuntimeError) as err:  # e.g. libcudart.so.13 missing
        logger.warning("TVM's CUDA runtime library does not load: %s", err)
        return False
    return True


def _load_stub_driver(runtime_dir: Path) -> None:
    """Build (once per set of entry points) and load a ``libcuda.so.1`` whose functions all fail."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise CudaToolchainError("no C compiler to build the stub CUDA driver with (install gcc)")
    # The driver entry points TVM's CUDA runtime imports, read from its dynamic string table;
    # a name that is only a message string adds a harmless extra stub.
    data = (runtime_dir / "libtvm_runtime_cuda.so").read_bytes()
    symbols = sorted({m.decode() for m in re.findall(rb"\x00(cu[A-Z][A-Za-z0-9_]*)\x00", data)})
    source = "".join(f"int {s}(void) {{ return {_STUB_ERROR}; }}\n" for s in symbols)
    digest = hashlib.sha256(source.encode()).hexdigest()[:12]
    out = Path(tempfile.gettempdir()) / f"nightshift-cuda-stub-{digest}" / "libcuda.so.1"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        src = out.parent / f"stub-{os.getpid()}.c"
        src.write_text(source)
        tmp = out.parent / f"libcuda.{os.getpid()}.tmp"
        subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(tmp), str(src)],
                       check=True, capture_output=True, timeout=60)
        tmp.replace(out)  # atomic: concurrent builds on one node share the file
    # The soname now satisfies libtvm_runtime_cuda's dependency on libcuda.so.1.
    ctypes.CDLL(str(out), mode=ctypes.RTLD_GLOBAL)
    logger.info("no CUDA driver here: loaded a stub %s to build CUDA kernels", out)


# ----- build side -----


def wheel_cuda_home() -> Path | None:
    """The CUDA 13 toolkit installed by NVIDIA's wheels (the ``cuda`` extra), if any."""
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    for root in spec.submodule_search_locations if spec and spec.submodule_search_locations else []:
        home = Path(root) / "cu13"
        if home.is_dir():
            return home
    return None


def cuda_compiler() -> Literal["nvcc", "nvrtc"]:
    """The CUDA compiler this node builds kernels with: nvcc if on PATH, else NVRTC.

    Raises:
        CudaToolchainError: neither nvcc nor NVRTC's Python bindings (the ``cuda`` extra).
    """
    home = wheel_cuda_home()
    if not shutil.which("nvcc") and home is not None and (home / "bin" / "nvcc").exists():
        # The `cuda` extra's toolkit wheels; TVM runs "nvcc" from PATH.
        os.environ["PATH"] = f"{home / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    if shutil.which("nvcc"):
        return "nvcc"
    try:
        from cuda.bindings import nvrtc  # noqa: F401
    except ImportError:
        raise CudaToolchainError(
            "building CUDA kernels needs nvcc on PATH or NVRTC: pip install 'nightshift[cuda]'"
        ) from None
    return "nvrtc"


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


def _version(lib: str, func: str) -> str | None:
    """A CUDA version as ``major.minor`` from ``cuDriverGetVersion``/``cudaRuntimeGetVersion``."""
    try:
        fn = getattr(ctypes.CDLL(lib), func)
    except (OSError, AttributeError):
        return None
    value = ctypes.c_int(0)
    if fn(ctypes.byref(value)) != 0 or value.value <= 0:
        return None
    return f"{value.value // 1000}.{value.value % 1000 // 10}"


def gpu_identity(index: int = 0) -> dict[str, Any] | None:
    """GPU ``index`` as this node sees it, with TVM's runtime alone; None if absent.

    Keys: ``gpu`` (name), ``arch`` (``sm_XX``), the per-block limits TVM's CUDA target takes,
    ``driver`` (NVIDIA driver version, from nvidia-smi where present), ``cuda_driver`` (the
    CUDA version the driver supports) and ``cuda_runtime`` (the libcudart TVM runs on).
    """
    import tvm

    load_cuda_runtime()
    dev = tvm.cuda(index)
    if not dev.exist:
        return None
    major, _, minor = str(dev.compute_version).partition(".")
    info: dict[str, Any] = {
        "gpu": str(dev.device_name),
        "arch": f"sm_{major}{minor}",
        "max_num_threads": int(dev.max_threads_per_block),
        "max_shared_memory_per_block": int(dev.max_shared_memory_per_block),
        "thread_warp_size": int(dev.warp_size),
        "cuda_driver": _version("libcuda.so.1", "cuDriverGetVersion"),
        "cuda_runtime": _version("libcudart.so.13", "cudaRuntimeGetVersion"),
    }
    if shutil.which("nvidia-smi"):
        out = subprocess.run(
            ["nvidia-smi", f"--id={index}", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        if out.returncode == 0 and out.stdout.strip():
            info["driver"] = out.stdout.strip().splitlines()[0]
    return info


def gpu_archs() -> list[str]:
    """The ``sm_XX`` of each GPU this node has (one entry per GPU), with TVM's runtime alone."""
    import tvm

    if not load_cuda_runtime():
        return []
    archs = []
    for i in range(64):
        dev = tvm.cuda(i)
        if not dev.exist:
            break
        archs.append("sm_" + str(dev.compute_version).replace(".", ""))
    return archs


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


def identify_gpu_worker(device: Any, timeout_s: float = 120.0) -> Any:
    """``device`` as the Ray node that will time it sees its GPU: name, SM, driver, CUDA.

    The driver may have no GPU (``--target-arch`` cross-builds); the fingerprint must come
    from the node that times, so a probe takes the device's Ray resource and a GPU there, runs
    ``gpu_identity`` with TVM's runtime alone, and the description and per-block limits it
    reports replace the driver's guess.

    Raises:
        CudaToolchainError: the node that offers the resource sees no GPU, or another arch.
    """
    import dataclasses

    import ray

    from tuner.measure.ray_measure import device_resource

    resource = device_resource(device)
    probe = ray.remote(gpu_identity).options(
        num_cpus=0, num_gpus=1, resources={resource: 1},
        runtime_env={"env_vars": {"TVM_USE_RUNTIME_LIB": "1"}},
    )  # fmt: skip
    info = ray.get(probe.remote(0), timeout=timeout_s)
    if info is None:
        raise CudaToolchainError(f"the node offering {resource} sees no GPU with TVM's CUDA runtime")
    if info["arch"] != device.arch:
        raise CudaToolchainError(f"the node offering {resource} has a {info['gpu']} ({info['arch']}), "
                                 f"not {device.arch}")
    config = dict(device.target_config)
    for key in ("max_num_threads", "max_shared_memory_per_block", "thread_warp_size"):
        config[key] = info[key]
    logger.info("timing node's GPU: %s", info)
    return dataclasses.replace(device, target_config=config, description=info, present=True)
