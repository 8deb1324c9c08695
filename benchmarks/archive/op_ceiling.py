"""Best of N random points: hand-written templates vs the sketch space vs PyTorch (oneDNN).

For each workload, in one process on this machine, draws N points from every space kind
that applies to it (``search_spaces.applicable_kinds``: the sketch space and the
templates), builds each with ``tvm.compile``, checks it against the unscheduled build and
times it on the target's ``num-cores`` threads; PyTorch's same operator (conv2d + bias +
relu, or linear + bias + gelu) runs on as many threads, and numpy's sgemm gives the
machine's practical peak. Every round times one point of each kind, PyTorch and the sgemm,
so machine noise hits them alike. Writes benchmarks/archive/results/op_ceiling.json.

Workloads: ResNet-50 convs in the NCHW{b}c layout the layout pass gives the conv template,
``b`` the target's vector lanes unless ``--block`` says otherwise (3x3 64->64 56x56, 3x3
128->128 28x28, 3x3 256->256 14x14, 1x1 1024->256 14x14, 1x1 64->256 56x56; ``conv_s2`` a
3x3 stride-2, ``conv1`` the 7x7 stride-2 first conv over 3 channels), MobileNet-V2's
depthwise 3x3 convs + relu6 (``dw_*``) and BERT-base's heaviest dense task (``nightshift
tasks --model bert-base``: 128x768 @ 768x3072 + bias + gelu).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE nice -n 10 .venv/bin/python benchmarks/archive/op_ceiling.py --points 32
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tvm
import sys  # the maintained helpers stay in benchmarks/, one folder up
sys.path.append(str(Path(__file__).resolve().parents[1]))
from space_vs_metaschedule import measure
from tvm import te, topi

import search_spaces
from tuner.measure.verify import Reference, compare, reference
from tuner.device import Device, parse_device

logger = logging.getLogger("op_ceiling")
RESULTS = Path(__file__).parent / "results" / "op_ceiling.json"


@dataclass(frozen=True)
class Workload:
    """One operator: its TVM task, its FLOPs and PyTorch's version of it on the same inputs."""

    name: str
    mod: tvm.IRModule
    flops: float
    # Given the reference inputs (TVM's layouts), returns a zero-argument call of PyTorch.
    torch_call: Callable[[list[np.ndarray]], Callable[[], object]]


def conv_nchwc(name: str, c: int, hw: int, o: int, k: int, stride: int, pad: int, ic_block: int = 16,
               oc_block: int = 16) -> Workload:
    """conv2d_NCHWc + bias + relu, as the layout pass hands it to the template."""
    data = te.placeholder((1, c // ic_block, hw, hw, ic_block), name="data")
    kernel = te.placeholder((o // oc_block, c // ic_block, k, k, ic_block, oc_block), name="kernel")
    bias = te.placeholder((1, o // oc_block, 1, 1, oc_block), name="bias")
    with tvm.target.Target({"kind": "llvm"}):
        conv = topi.nn.conv2d_NCHWc(data, kernel, stride, pad, 1, layout=f"NCHW{ic_block}c",
                                    out_layout=f"NCHW{oc_block}c")
    out = topi.nn.relu(topi.add(conv, bias))
    mod = tvm.IRModule({"main": te.create_prim_func([data, kernel, bias, out])})
    out_hw = (hw + 2 * pad - k) // stride + 1
    flops = 2.0 * o * c * k * k * out_hw * out_hw

    def torch_call(inputs: list[np.ndarray]) -> Callable[[], object]:
        import torch

        # The same numbers in PyTorch's NCHW / OIHW layouts.
        x = torch.from_numpy(np.ascontiguousarray(inputs[0].transpose(0, 1, 4, 2, 3).reshape(1, c, hw, hw)))
        w = torch.from_numpy(np.ascontiguousarray(inputs[1].transpose(0, 5, 1, 4, 2, 3).reshape(o, c, k, k)))
        b = torch.from_numpy(np.ascontiguousarray(inputs[2].reshape(o)))
        f = torch.nn.functional
        return lambda: f.relu(f.conv2d(x, w, b, stride=stride, padding=pad))

    return Workload(name, mod, flops, torch_call)


def depthwise_nchwc(name: str, c: int, hw: int, stride: int, block: int) -> Workload:
    """MobileNet-V2's depthwise 3x3 conv + bias + relu6 in NCHW{block}c, as the layout pass
    hands it to the template (``tuner.layout.depthwise_conv2d_nchwc``)."""
    from tuner.graph.layout.ops import depthwise_conv2d_nchwc

    data = te.placeholder((1, c // block, hw, hw, block), name="data")
    kernel = te.placeholder((c // block, 1, 3, 3, 1, block), name="kernel")
    bias = te.placeholder((1, c // block, 1, 1, block), name="bias")
    conv = depthwise_conv2d_nchwc(data, kernel, (stride, stride), (1, 1, 1, 1), (1, 1), "float32")
    out = topi.clip(topi.add(conv, bias), 0.0, 6.0)
    mod = tvm.IRModule({"main": te.create_prim_func([data, kernel, bias, out])})
    out_hw = (hw - 1) // stride + 1
    flops = 2.0 * c * 9 * out_hw * out_hw

    def torch_call(inputs: list[np.ndarray]) -> Callable[[], object]:
        import torch

        x = torch.from_numpy(np.ascontiguousarray(inputs[0].transpose(0, 1, 4, 2, 3).reshape(1, c, hw, hw)))
        w = torch.from_numpy(np.ascontiguousarray(inputs[1].transpose(0, 5, 1, 4, 2, 3).reshape(c, 1, 3, 3)))
        b = torch.from_numpy(np.ascontiguousarray(inputs[2].reshape(c)))
        f = torch.nn.functional
        return lambda: f.hardtanh(f.conv2d(x, w, b, stride=stride, padding=1, groups=c), 0.0, 6.0)

    return Workload(name, mod, flops, torch_call)


def bert_dense(target: tvm.target.Target) -> Workload:
    """BERT-base's heaviest task: its first FFN matmul + bias + gelu, as extracted."""
    from tuner.frontends import load_model
    from tuner.graph.tasks import extract_tasks

    tasks = extract_tasks(load_model("bert-base").bound(), target)
    task = next(t for t in tasks if "gelu" in t.name and t.name.startswith("fused_matmul"))

    def torch_call(inputs: list[np.ndarray]) -> Callable[[], object]:
        import torch

        x = torch.from_numpy(inputs[0])
        w = torch.from_numpy(np.ascontiguousarray(inputs[1].T))  # Linear's (out, in) weight
        b = torch.from_numpy(inputs[2])
        f = torch.nn.functional
        return lambda: f.gelu(f.linear(x, w, b))

    return Workload(f"bert_{task.name}", task.mod, float(task.flops), torch_call)


# Each takes the target and the channel block (the layout pass's NCHW{b}c: the vector lanes).
WORKLOADS: dict[str, Callable[[tvm.target.Target, int], Workload]] = {
    "conv3x3_64": lambda t, b: conv_nchwc(f"conv3x3_64_56_{b}c", 64, 56, 64, 3, 1, 1, b, b),
    "conv3x3_128": lambda t, b: conv_nchwc(f"conv3x3_128_28_{b}c", 128, 28, 128, 3, 1, 1, b, b),
    "conv1x1_1024": lambda t, b: conv_nchwc(f"conv1x1_1024_256_14_{b}c", 1024, 14, 256, 1, 1, 0, b, b),
    "conv1x1_64_256": lambda t, b: conv_nchwc(f"conv1x1_64_256_56_{b}c", 64, 56, 256, 1, 1, 0, b, b),
    "conv3x3_256": lambda t, b: conv_nchwc(f"conv3x3_256_14_{b}c", 256, 14, 256, 3, 1, 1, b, b),
    "conv_s2": lambda t, b: conv_nchwc(f"conv3x3_128_s2_56_{b}c", 128, 56, 128, 3, 2, 1, b, b),
    "conv1": lambda t, b: conv_nchwc(f"conv7x7_3_64_s2_224_{b}c", 3, 224, 64, 7, 2, 3, ic_block=3, oc_block=b),
    "dw_144_56": lambda t, b: depthwise_nchwc(f"dw3x3_144_56_{b}c", 144, 56, 1, b),
    "dw_96_112_s2": lambda t, b: depthwise_nchwc(f"dw3x3_96_s2_112_{b}c", 96, 112, 2, b),
    "dw_576_14": lambda t, b: depthwise_nchwc(f"dw3x3_576_14_{b}c", 576, 14, 1, b),
    "bert_dense": lambda t, b: bert_dense(t),
}


def time_call(fn: Callable[[], object], *, repeat: int = 5, min_ms: float = 10.0) -> float:
    """Median over ``repeat`` runs of the mean of enough calls to last ``min_ms``."""
    fn()
    t0 = time.perf_counter()
    fn()
    once = max(time.perf_counter() - t0, 1e-7)
    number = max(1, int(min_ms / 1e3 / once))
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter() - t0) / number)
    return float(np.median(runs))


def build_checked(mod: tvm.IRModule, target: tvm.target.Target, ref: Reference, dev: tvm.runtime.Device):
    """``mod`` built and run once on ``ref``'s inputs: the library and its argument tensors,
    or None when its outputs differ from ``ref``'s."""
    lib = tvm.compile(mod, target=target)
    arrays = [tvm.runtime.tensor(a, dev) for a in ref.inputs]
    lib["main"](*arrays)
    if compare([a.numpy() for a in arrays], ref.outputs).wrong:
        return None
    return lib, arrays


def cpu_threads() -> tuple[Device, int]:
    """The CPU device with TVM and PyTorch both on its target's ``num-cores`` threads, as the
    tuner times (and that thread count)."""
    import torch

    device = parse_device("cpu")
    device.use_threads()
    threads = int(device.target_config.get("num-cores", 1))
    torch.set_num_threads(threads)
    return device, threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=32)
    parser.add_argument("--workloads", nargs="*", default=["conv3x3_64", "conv3x3_128", "conv1x1_1024", "bert_dense"],
                        choices=sorted(WORKLOADS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--block", type=int, default=None,
                        help="channel block of the conv layouts (default: the target's fp32 vector lanes)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    import torch

    from tuner.graph.layout.plan import vector_lanes

    device, threads = cpu_threads()
    target = device.target

    block = args.block or vector_lanes(target)
    gemm = np.random.default_rng(0).random((1024, 1024), dtype=np.float32)
    report: dict = {
        "benchmark": "op_ceiling", "device": device.description, "target": device.target_config,
        "threads": threads, "block": block, "points": args.points, "seed": args.seed, "tvm": tvm.__version__,
        "torch": torch.__version__, "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"), "workloads": [],
    }
    for key in args.workloads:
        wl = WORKLOADS[key](target, block)
        ref = reference(wl.mod, target)
        torch_fn = wl.torch_call(ref.inputs)
        # PyTorch computes the same function: check it before timing it.
        got = np.asarray(torch_fn())
        want = ref.outputs[-1]
        if want.ndim == 5:  # NCHW[x]c -> NCHW
            want = want.transpose(0, 1, 4, 2, 3)
        if not np.allclose(got, want.reshape(got.shape), rtol=1e-3, atol=1e-3):
            logger.warning("%s: PyTorch's output differs from TVM's reference", wl.name)
        sources = {}
        points: dict[str, list[str]] = {}
        sample_sec = {}
        for kind in search_spaces.applicable_kinds(wl.mod, target):
            t0 = time.perf_counter()
            space = search_spaces.create(wl.mod, target, kind=kind)
            rng = np.random.default_rng(args.seed)
            drawn = [space.sample(rng) for _ in range(args.points)]
            sources[kind] = [space.apply(p) for p in drawn]
            points[kind] = [p.to_json() for p in drawn]
            sample_sec[kind] = time.perf_counter() - t0
        results: dict[str, list[dict]] = {k: [] for k in sources}
        torch_sec: list[float] = []
        gemm_sec: list[float] = []
        best = float("inf")
        for i in range(args.points):
            for kind, schedules in sources.items():
                r = measure(schedules[i].mod, target, ref, best)
                results[kind].append(r)
                if "sec" in r:
                    best = min(best, r["sec"])
            torch_sec.append(time_call(torch_fn))
            gemm_sec.append(time_call(lambda: gemm @ gemm, repeat=3))
            logger.info("%s: %d/%d, best %.3f ms, torch %.3f ms", wl.name, i + 1, args.points, best * 1e3,
                        torch_sec[-1] * 1e3)
        torch_ms = float(np.median(torch_sec)) * 1e3
        entry: dict = {
            "workload": wl.name, "flops": wl.flops, "sample_sec": sample_sec,
            "torch": {"median_ms": torch_ms, "best_ms": min(torch_sec) * 1e3,
                      "gflops": wl.flops / torch_ms / 1e6},
            "sgemm_1024_gflops": {"median": 2 * 1024**3 / float(np.median(gemm_sec)) / 1e9,
                                  "best": 2 * 1024**3 / min(gemm_sec) / 1e9},
            "sources": {},
        }
        for kind, rs in results.items():
            ok = [r["sec"] for r in rs if "sec" in r]
            best_ms = min(ok) * 1e3 if ok else None
            best_i = min((i for i, r in enumerate(rs) if "sec" in r), key=lambda i: rs[i]["sec"], default=None)
            entry["sources"][kind] = {
                "best_ms": best_ms,
                "best_gflops": wl.flops / best_ms / 1e6 if best_ms else None,
                "median_ms": float(np.median(ok)) * 1e3 if ok else None,
                "failed": sum("error" in r for r in rs),
                "build_p50_s": float(np.percentile([r["build_sec"] for r in rs], 50)),
                "torch_over_best": torch_ms / best_ms if best_ms else None,
                "torch_best_over_best": min(torch_sec) * 1e3 / best_ms if best_ms else None,
                "best_point": points[kind][best_i] if best_i is not None else None,
            }
        sketch = entry["sources"].get("sketch", {}).get("best_ms")
        for s in entry["sources"].values():
            s["sketch_over_best"] = sketch / s["best_ms"] if sketch and s["best_ms"] else None
        report["workloads"].append(entry)
        logger.info("%s", json.dumps(entry, indent=1))
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
