"""CUDA on the build side (no GPU needed): kernels compiled to device code, the reference
that runs on the GPU, the worker's GPU resources, the CUDA image and fault classes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import tvm
from tvm import te, topi
from tvm.s_tir import Schedule
from tvm.script import tirx as T

from tuner.cuda_runtime import driver_present
from tuner.measure.builder import build_candidate
from tuner.measure.cuda import context_fatal, kernel_formats, reference_module
from tuner.measure.worker import gpu_resources, start_command, worker_resources

SM90 = {"kind": "cuda", "arch": "sm_90"}
DOCKER = Path(__file__).resolve().parents[2] / "docker"


def _conv() -> tvm.IRModule:
    """A ResNet-style 3x3 conv + bias + relu, small enough to build in seconds."""
    data = te.placeholder((1, 16, 14, 14), name="data")
    weight = te.placeholder((16, 16, 3, 3), name="weight")
    bias = te.placeholder((1, 16, 1, 1), name="bias")
    out = topi.nn.relu(topi.add(topi.nn.conv2d_nchw(data, weight, 1, 1, 1), bias))
    return tvm.IRModule({"main": te.create_prim_func([data, weight, bias, out])})


def _dense() -> tvm.IRModule:
    """A BERT-style dense layer (tokens x hidden @ hidden x hidden), shrunk."""
    x = te.placeholder((16, 64), name="x")
    w = te.placeholder((64, 64), name="w")
    return tvm.IRModule({"main": te.create_prim_func([x, w, topi.nn.dense(x, w)])})


def gpu_candidate(mod: tvm.IRModule, threads: int = 64, unroll: int = 16) -> tvm.IRModule:
    """A hand-written GPU schedule of a conv or dense: padding inlined, each block's output
    elements spread over blocks of ``threads`` threads, the reduction unrolled. (Sampling the
    search space's CUDA sketches takes minutes on a loaded 2-core machine; the builder is what
    is tested here.)"""
    sch = Schedule(mod)
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        if sch.get(block).name_hint.startswith("pad"):
            sch.compute_inline(block)
            continue
        loops = sch.get_loops(block)
        kinds = [int(it.iter_type) for it in sch.get(block).iter_vars]  # 0 spatial, 2 reduction
        spatial = [lp for lp, k in zip(loops, kinds, strict=True) if k == 0]
        bx, tx = sch.split(sch.fuse(*spatial), [None, threads])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        if 2 in kinds:
            sch.annotate(loops[kinds.index(2)], "pragma_auto_unroll_max_step", unroll)
    return sch.mod


def out_of_bounds() -> tvm.IRModule:
    """The dense's signature, but each thread writes 2 GiB past its output: a real illegal
    memory access, which leaves the CUDA context unusable."""

    @T.prim_func(s_tir=True)
    def main(x: T.Buffer((16, 64), "float32"), w: T.Buffer((64, 64), "float32"),
             out: T.Buffer((16, 64), "float32")):
        T.func_attr({"tirx.noalias": True})
        flat = T.decl_buffer((1 << 30,), "float32", data=out.data)
        for b in T.thread_binding(16, thread="blockIdx.x"):
            for t in T.thread_binding(64, thread="threadIdx.x"):
                flat[(1 << 29) + b * 64 + t] = x[b, t] + w[0, t]

    return tvm.IRModule({"main": main})


@pytest.mark.parametrize("make", [_conv, _dense], ids=["conv", "dense"])
def test_cuda_candidate_builds_to_device_code(make):
    sch_mod = gpu_candidate(make())
    result = build_candidate(tvm.ir.save_json(sch_mod), SM90)
    assert result.ok, result.error_msg
    # Device code (nvcc's fatbin or NVRTC's cubin), not the CUDA source TVM keeps when its CUDA
    # runtime library is not loaded, which a runtime-only GPU worker cannot compile.
    assert kernel_formats(result.artifact) in (["cubin"], ["fatbin"]), kernel_formats(result.artifact)
    assert b"__global__" not in result.artifact


@pytest.mark.slow
def test_kernel_formats_tells_source_from_device_code(tmp_path):
    """The check the builder relies on: TVM's fallback (source) module reads as ``cuda``."""
    import subprocess
    import sys

    # A fresh process that never loads TVM's CUDA runtime builds the fallback module.
    code = ("import tvm, sys\nfrom tvm import te\nfrom tuner.measure.cuda import reference_module\n"
            "a = te.placeholder((8,), name='a'); b = te.compute((8,), lambda i: a[i] * 2, name='b')\n"
            "t = tvm.target.Target({'kind': 'cuda', 'arch': 'sm_90'})\n"
            "mod = reference_module(tvm.IRModule({'main': te.create_prim_func([a, b])}), t)\n"
            "tvm.compile(mod, target=t).export_library(sys.argv[1])\n")
    path = tmp_path / "fallback.so"
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=300)
    formats = kernel_formats(path.read_bytes())
    assert formats == ["cuda"], formats
    assert b"__global__" in path.read_bytes()


def test_reference_for_cuda_runs_on_the_gpu():
    mod = _conv()
    cpu = tvm.target.Target({"kind": "llvm"})
    assert reference_module(mod, cpu) is mod  # CPU: the unscheduled loops themselves
    ref = reference_module(mod, tvm.target.Target(SM90))
    text = ref.script()
    assert 'thread="blockIdx.x"' in text and 'thread="threadIdx.x"' in text
    result = build_candidate(tvm.ir.save_json(ref), SM90)
    assert result.ok, result.error_msg
    assert kernel_formats(result.artifact) in (["cubin"], ["fatbin"])


def test_measurer_builds_the_gpu_reference_for_cuda_tasks():
    """The reference the measurer submits for a CUDA task is the GPU-scheduled one."""
    src = (Path(__file__).resolve().parents[2] / "tuner" / "measure" / "ray_measure.py").read_text()
    submit = src[src.index("    def submit("): src.index("    def measure(")]
    assert "reference_module(task.mod, self.device.target)" in submit
    assert "save_json(ref_mod)" in submit


@pytest.mark.parametrize(("message", "fatal"), [
    # TVM's driver-API format (cuda_module.cc) and runtime-API format (cuda_common.h).
    ("CUDAError: cuLaunchKernelEx(...) failed with error: CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_ILLEGAL_ADDRESS"),
    ("CUDA Runtime Error: an illegal memory access was encountered", "CUDA_ERROR_ILLEGAL_ADDRESS"),
    ("CUDA Runtime Error: unspecified launch failure", "CUDA_ERROR_LAUNCH_FAILED"),
    ("CUDA Runtime Error: misaligned address", "CUDA_ERROR_MISALIGNED_ADDRESS"),
    ("CUDAError: cuLaunchKernelEx(...) failed with error: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", None),
    ("CUDA Runtime Error: too many resources requested for launch", None),
    ("CUDA Runtime Error: invalid configuration argument", None),
    ("CUDA Runtime Error: out of memory", None),
])
def test_context_fatal_classification(message, fatal):
    assert context_fatal(message) == fatal


def test_gpu_worker_advertises_one_resource_per_gpu():
    res = gpu_resources(["sm_90", "sm_90", "sm_80"])
    assert res == {"nightshift_cuda_sm_90": 2.0, "nightshift_cuda_sm_80": 1.0}
    cmd = start_command("head:6379", num_cpus=0, cpu_device=False, block=True, resources=res)
    assert json.loads(cmd[cmd.index("--resources") + 1]) == res
    assert cmd[cmd.index("--num-gpus") + 1] == "3"  # the device actor also asks Ray for a GPU
    assert cmd[cmd.index("--num-cpus") + 1] == "0"


@pytest.mark.skipif(driver_present(), reason="checks a machine without NVIDIA's driver")
def test_no_gpu_resource_without_a_driver():
    assert not any(k.startswith("nightshift_cuda_") for k in worker_resources(cpu=False))
    cmd = start_command("head:6379", num_cpus=None, cpu_device=False, block=False)
    assert "--num-gpus" not in cmd


def _needed_cudart(lib: Path) -> int:
    """The major version of libcudart.so.N a shared library needs (from its dynamic strings)."""
    found = set(re.findall(rb"\x00libcudart\.so\.(\d+)\x00", lib.read_bytes()))
    assert len(found) == 1, found
    return int(found.pop())


def test_cuda_worker_image_matches_the_wheels_cuda_runtime():
    lib = Path(tvm.__file__).parent / "lib" / "libtvm_runtime_cuda.so"
    need = _needed_cudart(lib)
    text = (DOCKER / "cuda-worker.Dockerfile").read_text()
    base = re.search(r"^FROM\s+nvidia/cuda:(\d+)\.(\d+)\.(\d+)-(runtime|base|devel)", text, re.M)
    assert base, "the CUDA worker image starts from an nvidia/cuda image"
    assert int(base.group(1)) == need, f"image has CUDA {base.group(1)}, the wheel needs libcudart.so.{need}"
    assert base.group(4) != "base"  # the base flavour has no libcudart
    # The join command is the worker module's, runtime-only, offering GPUs and no CPUs for builds.
    cmd = text[text.index("CMD"):]
    assert "tuner.measure.worker" in cmd and "--no-cpu-device" in cmd and "--num-cpus 0" in cmd
    assert "TVM_USE_RUNTIME_LIB=1" in text


def test_untuned_gpu_operators_get_tvms_gpu_schedules(tmp_path):
    """A cross-built model (``--target-arch sm_90``, no GPU here) with no records compiles to
    device code: every operator gets the CUDA pipeline's default schedule and says so, not the
    CPU fallback (one thread per block), and the target gets its per-block limits."""
    from tuner.compile import GPU_DEFAULT_DESCRIPTION, compile_model
    from tuner.db import TuningDatabase
    from tuner.device import parse_device
    from tuner.frontends.zoo import tiny

    device = parse_device("cuda:0", target_arch="sm_90")
    db = TuningDatabase(f"sqlite:///{tmp_path / 'empty.db'}", create=True)
    compiled = compile_model(tiny(), device, db)
    kinds = {(d.kind, d.detail) for d in compiled.decisions.values()}
    assert kinds == {("tvm-default", GPU_DEFAULT_DESCRIPTION)}, kinds
    path = tmp_path / "tiny.so"
    compiled.executable.export_library(str(path))
    assert kernel_formats(path.read_bytes()) in (["cubin"], ["fatbin"])
