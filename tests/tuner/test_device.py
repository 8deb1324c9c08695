import pytest
import tvm
from tvm.target import codegen

from search_spaces.constraints import limits_for
from tuner.device import _LLVM_FEATURES, hidden_features, host_cpu_info, parse_device, unnamed_features
from tuner.errors import UnknownDeviceError
from tuner.host import host_cpu_flags


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


@pytest.mark.slow
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


ZEN4_FLAGS = ["sse2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd",
              "avx512ifma", "avx512vbmi", "avx512_vbmi2", "avx512_vnni", "avx512_bitalg", "avx512_vpopcntdq",
              "avx512_bf16"]  # fmt: skip


def test_features_a_hypervisor_hides_are_built_without():
    # A Zen 4 guest whose hypervisor masks AVX-512: LLVM still names the CPU znver4.
    guest = [f for f in ZEN4_FLAGS if not f.startswith("avx512")]
    hidden = hidden_features({"kind": "llvm", "mcpu": "znver4"}, guest)
    assert {"avx512f", "avx512vnni", "avx512bf16"} <= set(hidden) and "avx2" not in hidden
    target = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "mattr": [f"-{f}" for f in hidden]})
    assert limits_for(target).vector_bits == 256
    assert not codegen.target_has_features("avx512f", target) and codegen.target_has_features("fma", target)
    assert hidden_features({"kind": "llvm", "mcpu": "znver4"}, ZEN4_FLAGS) == []
    assert hidden_features({"kind": "llvm", "mcpu": "znver4"}, []) == []  # flags unknown: trust LLVM


def test_features_the_cpu_has_beyond_llvms_name_for_it_are_built_with():
    # A Xeon with AMX that the hypervisor reports as model 167: LLVM names it rocketlake.
    xeon = [*ZEN4_FLAGS, "avx512_fp16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16"]
    unnamed = unnamed_features({"kind": "llvm", "mcpu": "rocketlake"}, xeon)
    assert set(unnamed) == {"avx512bf16", "avx512fp16", "avxvnni", "amx-tile", "amx-int8", "amx-bf16"}
    assert hidden_features({"kind": "llvm", "mcpu": "rocketlake"}, xeon) == []
    target = tvm.target.Target({"kind": "llvm", "mcpu": "rocketlake", "mattr": [f"+{f}" for f in unnamed]})
    assert all(codegen.target_has_features(f, target) for f in unnamed)
    assert unnamed_features({"kind": "llvm", "mcpu": "sapphirerapids"}, xeon) == []
    assert unnamed_features({"kind": "llvm", "mcpu": "rocketlake"}, []) == []  # flags unknown: trust LLVM


def test_host_target_claims_no_feature_the_cpu_lacks():
    dev = parse_device("cpu")
    flags = set(host_cpu_flags())
    if "avx" not in flags:
        pytest.skip("not an x86 CPU with /proc/cpuinfo flags")
    # Each feature LLVM would use must be one the CPU lists (names from tuner.device's table).
    claimed = [flag for flag, llvm in _LLVM_FEATURES if codegen.target_has_features(llvm, dev.target)]
    assert set(claimed) <= flags, (sorted(set(claimed) - flags), dev.target_config)
    # and leaves out none that it lists
    listed = [flag for flag, _ in _LLVM_FEATURES if flag in flags]
    assert set(listed) <= set(claimed), (sorted(set(listed) - set(claimed)), dev.target_config)
    # and explicit --target-arch cross-builds for the named CPU, as asked
    assert "mattr" not in parse_device("cpu", target_arch="znver4").target_config
