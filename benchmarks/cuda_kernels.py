"""CUDA kernels built here, timed on a GPU machine that has only TVM's runtime, against PyTorch.

Two steps, on two machines:

    # here (TVM's compiler, nvcc; no GPU): build a bundle of kernels for sm_90
    python benchmarks/cuda_kernels.py export --out build/cuda_bundle [--small] [--points 64] [--tc-points 32]
    # on the GPU (TVM runtime + PyTorch, no compiler): check, time, compare, write JSON
    python benchmarks/cuda_kernels.py run --bundle build/cuda_bundle

Each task (three ResNet-50 convs, one BERT-base dense; with ``--fp16`` only, BERT-base's three
float16 dense shapes) ships its reference (the GPU-scheduled
module the measurer checks candidates against), three hand schedules and ``--points`` random
points of Nightshift's CUDA sketch space (the GPU machine cannot join this machine's Ray
cluster, so no cost model steers them: this is the space's reach under random search). The
float16 dense tasks (BERT-base: 128 tokens x 768 -> 768, 768 -> 3072, 3072 -> 768; the matmul
as Relax legalizes it, float16 sums) also ship ``--tc-points`` random points of the
``cuda-dense-tensorcore`` template (labels ``tc*``) and are timed against cuBLAS
(``torch.matmul`` in float16) in the same run: ``best.over_torch`` is ours / cuBLAS, and
``best_by_space`` gives the best of each space.
``run`` loads them exactly as a Ray GPU worker's device actor does (``CandidateRunner``:
runtime-only import, TVM's CUDA runtime loaded by hand, outputs checked against the reference
on the GPU, CUDA-event timings through ``time_evaluator``) and times PyTorch (cuDNN / cuBLAS)
on the same inputs, fp32 with TF32 off (what TVM computes) and with PyTorch's defaults beside.
It also runs a kernel that writes out of bounds in a child process: the runner must see the
CUDA context as lost and end that process (what restarts a device actor), while this process
goes on. The bundle must fit the device machine's 64 MiB carry limit: ``export`` checks it.
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
# BERT-base's dense shapes in float16 (M, K, N): QKV/output projection, FFN up, FFN down.
FP16 = [
    ("bert_dense_fp16_768_768", "dense16", (128, 768, 768)),
    ("bert_dense_fp16_768_3072", "dense16", (128, 768, 3072)),
    ("bert_dense_fp16_3072_768", "dense16", (128, 3072, 768)),
]
TC_SPACE = "cuda-dense-tensorcore"
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
    if kind == "dense16":
        # As Relax legalizes matmul(x, W) of a float16 model: x [1, M, K] @ W [K, N], float16 sums.
        x = te.placeholder((1, m, kk), "float16", name="x")
        wt = te.placeholder((kk, nn), "float16", name="w")
        r = te.reduce_axis((0, kk), "k")
        out = te.compute((1, m, nn), lambda b, i, j: te.sum(x[b, i, r] * wt[r, j], axis=r), name="matmul")
        return tvm.IRModule({"main": te.create_prim_func([x, wt, out])})
    x = te.placeholder((m, kk), name="x")
    wt = te.placeholder((nn, kk), name="w")
    return tvm.IRModule({"main": te.create_prim_func([x, wt, topi.nn.dense(x, wt)])})


def _sketch_points(mod, target, points: int, seed: int = 0, parents: list[str] = (), kind: str = "sketch",
                   prefix: str = "") -> dict[str, tuple]:
    """``points`` distinct points of the task's CUDA sketch space, scheduled: random ones, or
    with ``parents`` (point JSON, best first) mutations of those, one knob each, as the
    evolutionary strategy's next generation would be (the GPU is too far for its cost model)."""
    import numpy as np

    import search_spaces
    from search_spaces.base import Point
    from search_spaces.preload import preload_tensor_intrinsics

    preload_tensor_intrinsics()
    space = search_spaces.create(mod, search_spaces.target_with_limits(target), kind=kind, seed=seed)
    rng = np.random.default_rng(seed)
    seen = set(parents)
    picked: dict[str, tuple] = {}
    prefix = prefix or ("m" if parents else "s")
    points = min(points, space.size())
    if kind != "sketch":
        # A template's start points first (labels ``<prefix>_start<n>``), then random ones.
        for n, point in enumerate(space.starts()):
            seen.add(point.to_json())
            picked[f"{prefix}_start{n}"] = (point.to_json(), space.apply(point).mod)
        points += len(picked)
    for k in range(points * 4):
        if len(picked) == points:
            break
        point = (space.mutate(Point.from_json(parents[k % len(parents)]), rng) if parents
                 else space.sample(rng))  # fmt: skip
        if point.to_json() not in seen:
            seen.add(point.to_json())
            picked[f"{prefix}{len(picked)}"] = (point.to_json(), space.apply(point).mod)
    return picked


def _best_points(result_json: Path, top: int) -> dict[str, list[str]]:
    """Per task of an earlier ``run``'s JSON, the ``top`` fastest sketch points, best first."""
    meta = json.loads(result_json.read_text())
    out = {}
    for task in meta["tasks"]:
        # Sketch points only: a tensor-core point (tc*) is a point of another space.
        timed = sorted((v["median_s"], k) for k, v in task["tvm"].items()
                       if v["median_s"] and k in task["points"] and not k.startswith("tc"))
        out[task["task"]] = [task["points"][k] for _, k in timed[:top]]
    return out


def export(out: Path, small: bool, points: int = 0, parents_from: Path | None = None, top: int = 8,
           tc_points: int = 32, fp16_only: bool = False) -> int:
    """Build every task's reference and candidates for sm_90 into ``out`` with a manifest."""
    import tvm

    sys.path.insert(0, str(ROOT / "tests" / "measure"))
    # The hand schedule and the context-killing kernel of the CI build test.
    from test_cuda_build import gpu_candidate, out_of_bounds

    from tuner.measure.cuda import reference_module
    from tuner.measure.ray_measure import _arg_specs

    target = {"kind": "cuda", "arch": "sm_90"}
    out.mkdir(parents=True, exist_ok=True)
    manifest = []
    for name, kind, shape in SMALL if small else FP16 if fp16_only else TASKS + FP16:
        mod = _module(kind, shape)
        mods = {"reference": reference_module(mod, tvm.target.Target(target))}
        for threads in (64, 128, 256):
            mods[f"t{threads}"] = gpu_candidate(mod, threads=threads, unroll=64)
        start = time.perf_counter()
        parents = _best_points(parents_from, top).get(name, []) if parents_from else []
        sampled = _sketch_points(mod, tvm.target.Target(target), points, parents=parents) if points else {}
        print(f"{name}: {len(sampled)} sketch points in {time.perf_counter() - start:.1f} s")
        mods |= {label: m for label, (_, m) in sampled.items()}
        files = _build_all(out, name, mods, target)
        if kind == "dense16" and tc_points:
            # Timed apart: the template's throughput, points scheduled and built (nvcc) per second.
            start = time.perf_counter()
            tc = _sketch_points(mod, tvm.target.Target(target), tc_points, kind=TC_SPACE, prefix="tc")
            tc_files = _build_all(out, name, {label: m for label, (_, m) in tc.items()}, target)
            took = time.perf_counter() - start
            print(f"{name}: {len(tc_files)} of {len(tc)} {TC_SPACE} points built in {took:.1f} s "
                  f"({len(tc_files) / took:.2f} points/s)")
            sampled |= tc
            files |= tc_files
        manifest.append({"name": name, "kind": kind, "shape": shape, "files": files,
                         "points": {label: p for label, (p, _) in sampled.items()},
                         "args": [[list(a.shape), a.dtype] for a in _arg_specs(mod)]})
    crash = _build_all(out, "crash", {"out_of_bounds": out_of_bounds()}, target)
    (out / "manifest.json").write_text(json.dumps({"target": target, "tasks": manifest, "crash": crash}, indent=1))
    size = sum(p.stat().st_size for p in out.iterdir())
    print(f"bundle {out}: {size / 2**20:.2f} MiB (carry limit {CARRY_LIMIT >> 20} MiB)")
    return 0 if size < CARRY_LIMIT else 1


def _build_all(out: Path, name: str, mods: dict, target: dict) -> dict[str, str]:
    """Build each module to device code, write ``name.label.so``; the files by label."""
    import tvm

    from tuner.measure.builder import build_candidate
    from tuner.measure.cuda import kernel_formats

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
    return files


def run(bundle: Path, json_out: Path) -> int:
    """On the GPU: check each candidate against the reference, time it, time PyTorch."""
    os.environ["TVM_USE_RUNTIME_LIB"] = "1"  # what the GPU worker's device actor runs with
    import numpy as np
    import torch

    from tuner.cuda_runtime import gpu_identity
    from tuner.measure.runner import ArgSpec, CandidateRunner, TimingConfig

    meta = json.loads((bundle / "manifest.json").read_text())
    runner = CandidateRunner("cuda", 0)
    timing = TimingConfig(repeat=10, min_repeat_ms=50, hopeless_factor=0)
    rows = []
    for task in meta["tasks"]:
        args = [ArgSpec(tuple(s), d) for s, d in task["args"]]
        ref = runner.set_reference(task["name"], (bundle / task["files"]["reference"]).read_bytes(), "main", args)
        row: dict = {"task": task["name"], "shape": task["shape"], "tvm": {}, "points": task.get("points", {})}
        if not ref.ok:
            row["error"] = ref.error_msg
            rows.append(row)
            continue
        for label, file in task["files"].items():
            r = runner.measure(task["name"], (bundle / file).read_bytes(), "main", timing)
            row["tvm"][label] = {"median_s": r.median, "error": r.error_msg}
        fn = _torch_op(task, [torch.from_numpy(a).cuda() for a in runner._inputs[task["name"]][:2]])
        want = runner._reference[task["name"]][-1]
        tol = 1e-2 if task["kind"] == "dense16" else 1e-3  # float16 sums in another order
        for tf32 in (False, True):  # fp32 as TVM computes it; then PyTorch's default on Hopper
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
            key = "torch_tf32" if tf32 else "torch"
            row[f"{key}_matches_reference"] = bool(np.allclose(fn().cpu().numpy(), want, rtol=tol,
                                                                      atol=tol * float(np.abs(want).max())))
            row[f"{key}_s"] = _torch_time(fn)
        timed = {k: v["median_s"] for k, v in row["tvm"].items() if v["median_s"] and k != "reference"}
        best = min(timed, key=timed.get, default=None)
        row["best"] = best and {"label": best, "median_s": timed[best], "point": task.get("points", {}).get(best),
                                "over_torch": timed[best] / row["torch_s"],
                                "over_torch_tf32": timed[best] / row["torch_tf32_s"]}  # fmt: skip
        row["errors"] = sum(1 for v in row["tvm"].values() if v["error"])
        spaces = {"tensorcore": "tc", "sketch": ("s", "m"), "hand": "t"}
        row["best_by_space"] = {}
        for space, prefixes in spaces.items():
            own = {k: v for k, v in timed.items() if k.startswith(prefixes)}
            if own:
                label = min(own, key=own.get)
                row["best_by_space"][space] = {"label": label, "median_s": own[label],
                                               "over_torch": own[label] / row["torch_s"]}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("tvm", "points")}))
    result = {"gpu": gpu_identity(0), "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
              "crash": _crash_probe(bundle, meta.get("crash", {})), "tasks": rows}
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(result, indent=1))
    return 0


def _torch_op(task: dict, inputs: list):
    """The PyTorch op (cuDNN conv + relu, cuBLAS matmul) that computes the task."""
    import torch

    if task["kind"] == "conv":
        stride, pad = task["shape"][6], task["shape"][5] // 2
        return lambda: torch.relu(torch.nn.functional.conv2d(inputs[0], inputs[1], stride=stride, padding=pad))
    if task["kind"] == "dense16":
        return lambda: torch.matmul(inputs[0], inputs[1])  # cuBLAS, float16
    return lambda: inputs[0] @ inputs[1].T


def _torch_time(fn, repeat: int = 20, min_ms: float = 50.0) -> float:
    """Median over ``repeat`` CUDA-event timings of ``fn``, each over as many back-to-back
    calls as fill ``min_ms`` (as TVM's ``time_evaluator`` does with ``min_repeat_ms``): one
    call per event pair would time PyTorch's launch overhead, not its kernels."""
    import statistics

    import torch

    def timed(n: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / n

    number = 1
    while timed(number) * number * 1e3 < min_ms:
        number *= 2
    return statistics.median(timed(number) for _ in range(repeat))


def _crash_probe(bundle: Path, files: dict[str, str]) -> dict:
    """Run the out-of-bounds kernel in a child process as a device actor would, and check
    that the child ends with the actor's restart code while this process's context lives on."""
    import subprocess

    if "out_of_bounds" not in files:
        return {"skipped": "no crash kernel in the bundle"}
    child = subprocess.run([sys.executable, __file__, "crash-child", str(bundle / files["out_of_bounds"])],
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    return {"child_exit_code": child.returncode, "expected_exit_code": 70,
            "log_tail": (child.stdout + child.stderr)[-600:]}


def _crash_child(artifact: Path) -> int:
    os.environ["TVM_USE_RUNTIME_LIB"] = "1"
    from tuner.measure.runner import ArgSpec, CandidateRunner, TimingConfig

    runner = CandidateRunner("cuda", 0)
    args = [ArgSpec((16, 64), "float32"), ArgSpec((64, 64), "float32"), ArgSpec((16, 64), "float32")]
    # Its own reference (timing needs one); the reference run is where the fault surfaces.
    ref = runner.set_reference("oob", artifact.read_bytes(), "main", args)
    r = runner.measure("oob", artifact.read_bytes(), "main", TimingConfig(repeat=3))
    print(f"runner returned instead of exiting: reference {ref.error_msg!r}, run {r.error_msg!r}")
    return 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("export")
    ex.add_argument("--out", type=Path, default=ROOT / "build" / "cuda_bundle")
    ex.add_argument("--small", action="store_true", help="two tiny tasks (a check that it works)")
    ex.add_argument("--points", type=int, default=0, help="random sketch-space points per task (0)")
    ex.add_argument("--parents-from", type=Path, default=None,
                    help="an earlier run's JSON: the points are mutations of its --top best per task")
    ex.add_argument("--top", type=int, default=8)
    ex.add_argument("--tc-points", type=int, default=32,
                    help=f"random {TC_SPACE} points per float16 dense task (32)")
    ex.add_argument("--fp16", action="store_true", help="only BERT-base's float16 dense tasks")
    rn = sub.add_parser("run")
    rn.add_argument("--bundle", type=Path, default=ROOT / "build" / "cuda_bundle")
    rn.add_argument("--json", type=Path, default=RESULTS / "cuda_kernels.json")
    sub.add_parser("crash-child").add_argument("artifact", type=Path)
    args = parser.parse_args()
    if args.cmd == "crash-child":
        return _crash_child(args.artifact)
    if args.cmd == "export":
        return export(args.out, args.small, args.points, args.parents_from, args.top, args.tc_points, args.fp16)
    return run(args.bundle, args.json)


if __name__ == "__main__":
    sys.exit(main())
