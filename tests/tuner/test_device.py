import pytest

from tuner.device import host_cpu_info, parse_device
from tuner.errors import UnknownDeviceError


def test_cpu_device_targets_the_host():
    dev = parse_device("cpu")
    info = host_cpu_info()
    assert dev.kind == "cpu"
    assert dev.target.kind.name == "llvm"
    assert dev.target_config["mcpu"] == info["mcpu"]
    assert dev.target_config["num-cores"] == info["cores"] >= 1
    assert dev.description["model"]
    assert "avx2" in dev.description["isa_flags"] or dev.description["machine"] != "x86_64"


def test_fingerprint_is_stable_and_keyed_on_what_matters():
    a, b = parse_device("cpu"), parse_device("llvm")
    assert a.fingerprint == b.fingerprint and len(a.fingerprint) == 16
    assert parse_device("cpu", num_cores=a.target_config["num-cores"] + 1).fingerprint != a.fingerprint


def test_cuda_cross_build_without_gpu():
    dev = parse_device("cuda:0", target_arch="sm_90")
    assert dev.target.kind.name == "cuda"
    assert dev.target_config["arch"] == "sm_90"
    assert dev.name == "cuda:0"
    other = parse_device("cuda:0", target_arch="sm_80")
    if not dev.present:
        assert dev.fingerprint != other.fingerprint


@pytest.mark.parametrize("spec", ["tpu", "cuda:x", "gpu0", "", "metal:0"])
def test_unknown_device(spec):
    with pytest.raises(UnknownDeviceError, match="cpu"):
        parse_device(spec)


def test_bad_arch():
    with pytest.raises(UnknownDeviceError, match="sm_90"):
        parse_device("cuda:0", target_arch="ampere")
    with pytest.raises(UnknownDeviceError, match="LLVM"):
        parse_device("cpu", target_arch="not-a-cpu")


def test_missing_gpu_without_arch_says_what_to_do():
    import tvm

    if tvm.cuda(3).exist:
        pytest.skip("this machine has a GPU 3")
    with pytest.raises(UnknownDeviceError, match="--target-arch"):
        parse_device("cuda:3")


THREADS = """
import os, sys
import tvm
from tuner.device import parse_device
parse_device("cpu", num_cores=int(sys.argv[1])).use_threads()
print(tvm.get_global_func("runtime.NumThreads")())
"""


def test_use_threads_sizes_the_thread_pool_to_the_target():
    """TVM alone takes half the logical CPUs on x86; a model tuned for N cores runs on N."""
    import os
    import subprocess
    import sys

    cpus = len(os.sched_getaffinity(0))
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", THREADS, str(cpus)], capture_output=True, text=True,
                         env=env, check=True, timeout=120)
    assert int(out.stdout.split()[-1]) == cpus
