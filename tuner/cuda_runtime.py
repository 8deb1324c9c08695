"""TVM's CUDA runtime in this process, and what it says about the GPUs: below the device layer,
so that ``tuner.device`` can describe a GPU without importing the measurement side."""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tuner.errors import CudaToolchainError

logger = logging.getLogger(__name__)


# CUDA_ERROR_STUB_LIBRARY: what NVIDIA's own stub driver returns from every call.
_STUB_ERROR = 34


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


def wheel_cuda_home() -> Path | None:
    """The CUDA 13 toolkit installed by NVIDIA's wheels (the ``cuda`` extra), if any."""
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    for root in spec.submodule_search_locations if spec and spec.submodule_search_locations else []:
        home = Path(root) / "cu13"
        if home.is_dir():
            return home
    return None


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
