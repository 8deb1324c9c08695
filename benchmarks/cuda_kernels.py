"""CUDA kernels built here, timed on a GPU machine that has only TVM's runtime, against PyTorch.

Two steps, on two machines:

    # here (TVM's compiler, nvcc; no GPU): build a bundle of kernels for sm_90
    python benchmarks/cuda_kernels.py export --out build/cuda_bundle [--small]
    # on the GPU (TVM runtime + PyTorch, no compiler): check, time, compare, write JSON
    python benchmarks/cuda_kernels.py run --bundle build/cuda_bundle

Each task (three ResNet-50 convs, one BERT-base dense) ships its reference (the GPU-scheduled
module the measurer checks candidates against) and a few candidate schedules. ``run`` loads
them exactly as a Ray GPU worker's device actor does (``CandidateRunner``: runtime-only import,
TVM's CUDA runtime loaded by hand, outputs checked against the reference on the GPU, CUDA-event
timings through ``time_evaluator``) and times PyTorch (cuDNN / cuBLAS) on the same inputs.
The bundle must fit the device machine's 64 MiB carry limit: ``export`` checks it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
CARRY_LIMIT = 64 << 20
# (name, kind, shapes): conv = (N, C, H, W, K, R, stride); dense = (M, K, N).
TASKS = [
    ("resnet50_conv3x3_64_56", "conv", (1, 64, 56, 56, 64, 3, 1)),
    ("resnet50_conv1x1_1024_256_14", "conv", (1, 1024, 14, 14, 256, 1, 1)),
    ("resnet50_conv3x3_256_14", "conv", (1, 256, 14, 14, 256, 3, 1)),
    ("bert_dense_768_3072", "dense", (128, 768, 3072)),
]
SMALL = [("conv3x3_16_14", "conv", (1, 16, 14, 14, 16, 3, 1)), ("dense_16_64", "dense", (16, 64, 64))]


def _module(kind: str, shape: tuple[int, ...]):
    import tvm
    from tvm import te, topi

    if kind == "conv":
        n, c, h, w, k, r, s = shape
        data = te.placeholder((n, c, h, w), name="data")
        weight = te.placeholder((k, c, r, r), name="weight")
        out = topi.nn.relu(topi.nn.conv2d_nchw(data, weight, s, r // 2, 1))
        return tvm.IRModule({"main": te.create_prim_func([data, weight, out])})
    m, kk, nn = shape
    x = te.placeholder((m, kk), name="x")
    wt = te.placeholder((nn, kk), name="w")
    return tvm.IRModule({"main": te.create_prim_func([x, wt, topi.nn.dense(x, wt)])})


def export(out: Path, small: bool) -> int:
    """Build every task's reference and candidates for sm_90 into ``out`` with a manifest."""
    import tvm

    sys.path.insert(0, str(ROOT / "tests" / "measure"))
    from test_cuda_build import gpu_candidate  # the hand schedule the CI build test uses

    from tuner.measure.builder import build_candidate
    from tuner.measure.cuda import kernel_formats, reference_module
    from tuner.measure.ray_measure import _arg_specs

    target = {"kind": "cuda", "arch": "sm_90"}
    out.mkdir(parents=True, exist_ok=True)
    manifest = []
    for name, kind, shape in SMALL if small else TASKS:
        mod = _module(kind, shape)
        mods = {"reference": reference_module(mod, tvm.target.Target(target))}
        for threads in (64, 128, 256):
            mods[f"t{threads}"] = gpu_candidate(mod, threads=threads, unroll=64)
        files = {}
        for label, m in mods.items():
            start = time.perf_counter()
            res = build_candidate(tvm.ir.save_json(m), target)
            if not res.ok or kernel_formats(res.artifact) not in (["cubin"], ["fatbin"]):
                print(f"{name}/{label}: {res.error_msg}", file=sys.stderr)
                continue
            path = out / f"{name}.{label}.so"
            path.write_bytes(res.artifact)
            files[label] = path.name
            print(f"{name}/{label}: {len(res.artifact)} bytes in {time.perf_counter() - start:.1f} s")
        manifest.append({"name": name, "kind": kind, "shape": shape, "files": files,
                         "args": [[list(a.shape), a.dtype] for a in _arg_specs(mod)]})
    (out / "manifest.json").write_text(json.dumps({"target": target, "tasks": manifest}, indent=1))
    size = sum(p.stat().st_size for p in out.iterdir())
    print(f"bundle {out}: {size / 2**20:.2f} MiB (carry limit {CARRY_LIMIT >> 20} MiB)")
    return 0 if size < CARRY_LIMIT else 1


def run(bundle: Path, json_out: Path) -> int:
    """On the GPU: check each candidate against the reference, time it, time PyTorch."""
    os.environ["TVM_USE_RUNTIME_LIB"] = "1"  # what the GPU worker's device actor runs with
    import numpy as np
    import torch

    from tuner.measure.cuda import gpu_identity
    from tuner.measure.runner import ArgSpec, CandidateRunner, TimingConfig

    meta = json.loads((bundle / "manifest.json").read_text())
    runner = CandidateRunner("cuda", 0)
    timing = TimingConfig(repeat=10, min_repeat_ms=50, hopeless_factor=0)
    rows = []
    for task in meta["tasks"]:
        args = [ArgSpec(tuple(s), d) for s, d in task["args"]]
        ref = runner.set_reference(task["name"], (bundle / task["files"]["reference"]).read_bytes(), "main", args)
        row: dict = {"task": task["name"], "shape": task["shape"], "tvm": {}}
        if not ref.ok:
            row["error"] = ref.error_msg
            rows.append(row)
            continue
        for label, file in task["files"].items():
            r = runner.measure(task["name"], (bundle / file).read_bytes(), "main", timing)
            row["tvm"][label] = {"median_s": r.median, "error": r.error_msg}
        fn = _torch_op(task, [torch.from_numpy(a).cuda() for a in runner._inputs[task["name"]][:2]])
        want = runner._reference[task["name"]][-1]
        row["torch_matches_reference"] = bool(np.allclose(fn().cpu().numpy(), want, rtol=1e-3, atol=1e-3))
        row["torch_s"] = _torch_time(fn)
        best = min((v["median_s"] for v in row["tvm"].values() if v["median_s"]), default=None)
        row["best_tvm_over_torch"] = best / row["torch_s"] if best else None
        rows.append(row)
        print(json.dumps(row))
    result = {"gpu": gpu_identity(0), "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
              "tasks": rows}
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(result, indent=1))
    return 0


def _torch_op(task: dict, inputs: list):
    """The PyTorch op (cuDNN conv + relu, cuBLAS matmul) that computes the task."""
    import torch

    if task["kind"] == "conv":
        stride, pad = task["shape"][6], task["shape"][5] // 2
        return lambda: torch.relu(torch.nn.functional.conv2d(inputs[0], inputs[1], stride=stride, padding=pad))
    return lambda: inputs[0] @ inputs[1].T


def _torch_time(fn, repeat: int = 50) -> float:
    """Median of ``repeat`` CUDA-event timings of ``fn`` after a warm-up."""
    import statistics

    import torch

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("export")
    ex.add_argument("--out", type=Path, default=ROOT / "build" / "cuda_bundle")
    ex.add_argument("--small", action="store_true", help="two tiny tasks (a check that it works)")
    rn = sub.add_parser("run")
    rn.add_argument("--bundle", type=Path, default=ROOT / "build" / "cuda_bundle")
    rn.add_argument("--json", type=Path, default=RESULTS / "cuda_kernels.json")
    args = parser.parse_args()
    return export(args.out, args.small) if args.cmd == "export" else run(args.bundle, args.json)


if __name__ == "__main__":
    sys.exit(main())
