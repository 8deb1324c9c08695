"""What a GPU server shows on first contact, fixed and tested here without a GPU: tvm_ffi's
torch add-on kept out of Ray's workers, the GPUs offered to Ray by TVM's count, a GPU probe
that says why it cannot run instead of waiting 120 s, nvcc found off PATH, NVRTC's headers,
and the Ray resource of an H200."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuner.device import Device, parse_device
from tuner.errors import CudaToolchainError
from tuner.measure.base import WORKER_ENV, device_resource
from tuner.measure.cuda import cuda_headers_home, find_nvcc

ROOT = Path(__file__).resolve().parents[2]
FLAG = "TVM_FFI_DISABLE_TORCH_C_DLPACK"


def _clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This process's environment without Ray's, Nightshift's and the flag under test."""
    drop = ("RAY_", "NIGHTSHIFT_", FLAG, "CUDA_HOME", "CUDA_PATH")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    return env | {"HOME": str(tmp_path), "PYTHONPATH": str(ROOT)} | extra


@pytest.mark.slow
def test_installed_tvm_ffi_honours_the_flag(tmp_path):
    """With the flag, tvm_ffi never reaches its add-on loader (which JIT-builds the add-on into
    its cache for a torch without the C exchange API); without it, it does."""
    code = ("import tvm_ffi._optional_torch_c_dlpack as m, os\n"
            "print(hasattr(m, '_LIB'), sorted(os.listdir(os.environ['TVM_FFI_CACHE_DIR'])))")  # fmt: skip
    seen = {}
    for value in ("1", None):
        cache = tmp_path / f"cache{value}"
        cache.mkdir()
        env = _clean_env(tmp_path, TVM_FFI_CACHE_DIR=str(cache), **({FLAG: value} if value else {}))
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        seen[value] = out.stdout.split()[0]
    assert seen == {"1": "False", None: "True"}, seen
    assert WORKER_ENV[FLAG] == "1"


_WORKERS = r"""
import os, ray
from tuner.measure.ray_measure import connect
connect(num_cpus=1)
task = ray.remote(lambda: os.environ.get("TVM_FFI_DISABLE_TORCH_C_DLPACK"))
# An actor with its own env_vars, as the device actors and the GPU probe have.
Actor = ray.remote(num_cpus=0, runtime_env={"env_vars": {"TVM_USE_RUNTIME_LIB": "1"}})(
    type("A", (), {"env": lambda self: (os.environ.get("TVM_FFI_DISABLE_TORCH_C_DLPACK"),
                                       os.environ.get("TVM_USE_RUNTIME_LIB"))}))
print("driver", os.environ.get("TVM_FFI_DISABLE_TORCH_C_DLPACK"))
print("task", ray.get(task.remote()))
print("actor", *ray.get(Actor.remote().env.remote()))
ray.shutdown()
"""


@pytest.mark.slow
@pytest.mark.ray
def test_ray_workers_get_the_flag(tmp_path):
    """The job's runtime environment carries the flag to every worker of a local cluster (the
    driver's own environment lacks it), and an actor's own env_vars add to it."""
    out = subprocess.run([sys.executable, "-c", _WORKERS], env=_clean_env(tmp_path), capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.strip().splitlines())
    assert lines == {"driver": "None", "task": "1", "actor": "1 1"}, lines


def test_the_command_line_sets_the_flag_for_its_own_process(tmp_path):
    """The driver (``tune``, ``nightshift``) imports tvm_ffi too: the command line sets the flag
    before any command runs, and a value the user set stays."""
    probe = ("import os, sys; from tuner.cli import main; main(['jobs', '--db', sys.argv[1]]); "
             "print('flag', os.environ.get('TVM_FFI_DISABLE_TORCH_C_DLPACK'))")
    db = str(tmp_path / "none.db")
    for preset, want in ((None, "1"), ("0", "0")):
        env = _clean_env(tmp_path) | ({} if preset is None else {"TVM_FFI_DISABLE_TORCH_C_DLPACK": preset})
        out = subprocess.run([sys.executable, "-c", probe, db], env=env, capture_output=True, text=True, timeout=120)
        assert f"flag {want}" in out.stdout, (out.stdout, out.stderr)


_GPUS = r"""
import ray
import tuner.measure.ray_measure as rm
# TVM's CUDA runtime finds no GPU on this machine; stand in for a node where it finds two
# and Ray's NVML count is 0, as a container without NVML shows.
rm.gpu_archs = lambda: ["sm_90", "sm_90"]
rm.connect(num_cpus=1)
r = ray.cluster_resources()
config = ray._private.worker._global_node._config  # what the raylet and GCS were started with
print(r.get("GPU", 0), r.get("nightshift_cuda_sm_90", 0), config.get("memory_monitor_refresh_ms"))
ray.shutdown()
"""


@pytest.mark.slow
@pytest.mark.ray
def test_local_cluster_offers_the_gpus_tvm_sees(tmp_path):
    """Ray's GPUs from TVM's count, not NVML's; and no memory monitor killing builds on a VM
    that reports less memory than it gives."""
    out = subprocess.run([sys.executable, "-c", _GPUS], env=_clean_env(tmp_path), capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["2.0", "2.0", "0"], out.stdout


def _sm90() -> Device:
    return parse_device("cuda:0", target_arch="sm_90")


@pytest.mark.slow
def test_gpu_probe_on_a_node_without_ray_gpus_fails_at_once(multinode):
    """A node offers the device resource but Ray counts no GPU there (NVML not found, or
    CUDA_VISIBLE_DEVICES empty): the probe could never be scheduled; it says so at once."""
    from tuner.measure.ray_measure import identify_gpu_worker

    multinode.add_node(num_cpus=1, num_gpus=0, resources={"nightshift_cuda_sm_90": 1})
    multinode.wait_for_nodes()
    start = time.monotonic()
    with pytest.raises(CudaToolchainError, match="offer Ray no GPU") as err:
        identify_gpu_worker(_sm90(), timeout_s=120)
    assert time.monotonic() - start < 10
    assert "--num-gpus" in str(err.value) and "nightshift_cuda_sm_90 1" in str(err.value)


@pytest.mark.slow
def test_gpu_probe_that_cannot_start_says_what_is_free(multinode):
    """The GPU is there but taken (another job's actor holds it): the probe's timeout names the
    resources it asked for and what the cluster has free, instead of a bare GetTimeoutError."""
    import ray

    from tuner.measure.ray_measure import identify_gpu_worker

    multinode.add_node(num_cpus=1, num_gpus=1, resources={"nightshift_cuda_sm_90": 1})
    multinode.wait_for_nodes()

    @ray.remote(num_cpus=0, num_gpus=1)
    class Holder:
        def ready(self) -> bool:
            return True

    holder = Holder.remote()
    ray.get(holder.ready.remote(), timeout=120)
    with pytest.raises(CudaToolchainError, match="did not run within 3 s") as err:
        identify_gpu_worker(_sm90(), timeout_s=3)
    assert "GPU 0" in str(err.value) and "GPU 1" in str(err.value), err.value
    ray.kill(holder)


def test_find_nvcc_off_path(tmp_path):
    """nvcc on PATH first; else $CUDA_HOME/bin, the toolkit folders, the wheel; else None."""
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    nvcc = home / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\n")
    nvcc.chmod(0o755)
    empty = str(tmp_path / "nothing")
    assert find_nvcc(path=empty, cuda_home=str(home), dirs=()) == nvcc
    assert find_nvcc(path=empty, cuda_home="", dirs=(str(home / "bin"),)) == nvcc
    assert find_nvcc(path=str(home / "bin"), cuda_home="", dirs=()) == nvcc
    nvcc.chmod(0o644)  # not executable: not an nvcc to run
    assert find_nvcc(path=empty, cuda_home=str(home), dirs=()) is None


_BUILD = r"""
import os, sys, tvm
sys.path.insert(0, {tests!r})
from test_cuda_build import _dense, gpu_candidate
import tuner.measure.cuda as cuda
{setup}
from tuner.measure.builder import build_candidate
from tuner.measure.cuda import kernel_formats
compiler = cuda.cuda_compiler()
r = build_candidate(tvm.ir.save_json(gpu_candidate(_dense())), {{"kind": "cuda", "arch": "sm_90"}})
assert r.ok, r.error_msg
print(compiler, kernel_formats(r.artifact), os.environ.get("CUDA_PATH"))
"""


def _toolkit_nvcc() -> Path | None:
    return next((p for p in (Path(d) / "nvcc" for d in ("/usr/local/cuda/bin", "/opt/cuda/bin")) if p.is_file()),
                None)  # fmt: skip


@pytest.mark.slow
@pytest.mark.skipif(_toolkit_nvcc() is None, reason="no CUDA toolkit under /usr/local/cuda or /opt/cuda")
def test_cuda_build_with_nvcc_off_path(tmp_path):
    """A Ray worker's PATH without the toolkit's bin (no login profile): the build finds nvcc
    under /usr/local/cuda and makes device code."""
    env = _clean_env(tmp_path, PATH="/usr/bin:/bin")
    code = _BUILD.format(tests=str(ROOT / "tests" / "measure"), setup="")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    compiler, formats, _ = out.stdout.strip().splitlines()[-1].split(" ", 2)
    # TVM 0.27 labels nvcc's fatbin as "cubin" too; device code either way, not source.
    assert compiler == "nvcc" and formats in ("['cubin']", "['fatbin']"), out.stdout


@pytest.mark.slow
def test_cuda_build_with_nvrtc_when_there_is_no_nvcc(tmp_path):
    """No nvcc anywhere: NVRTC (cuda-bindings, as GPU servers with a CUDA PyTorch have) builds
    the kernels to a cubin, its headers found for TVM through CUDA_PATH."""
    pytest.importorskip("cuda.bindings.nvrtc", reason="NVRTC's Python bindings (cuda-bindings) are not installed")
    headers = cuda_headers_home()
    if headers is None:
        pytest.skip("no CUDA headers (include/cuda_runtime.h) here for NVRTC")
    env = _clean_env(tmp_path, PATH="/usr/bin:/bin", PYTHONPATH=os.pathsep.join([str(ROOT), *sys.path[1:]]))
    setup = "cuda.find_nvcc = lambda *args, **kwargs: None  # this host has nvcc; a GPU server may not"
    code = _BUILD.format(tests=str(ROOT / "tests" / "measure"), setup=setup)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    compiler, formats, path = out.stdout.strip().splitlines()[-1].split(" ", 2)
    assert compiler == "nvrtc" and formats == "['cubin']" and path == str(headers), out.stdout


def test_h200_resource_and_fingerprint():
    """An H200 is sm_90 like an H100: the same Ray resource (one worker command fits both), but
    its own fingerprint, so best-record lookups never mix the two GPUs."""
    h100 = {"gpu": "NVIDIA H100 80GB HBM3", "arch": "sm_90", "driver": "580.159.04"}
    h200 = {"gpu": "NVIDIA H200", "arch": "sm_90", "driver": "580.159.04"}
    devices = [Device("cuda", 0, {"kind": "cuda", "arch": "sm_90"}, d) for d in (h100, h200)]
    assert {device_resource(d) for d in devices} == {"nightshift_cuda_sm_90"}
    assert devices[0].fingerprint != devices[1].fingerprint
