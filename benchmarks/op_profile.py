"""Where a compiled model's time goes, per fused operator, beside ONNX Runtime's own profile.

Compiles ``--model`` from ``--db`` (as ``nightshift compile`` does), runs it ``--rounds``
times under the Relax VM's instrument hook (each call of a compiled function is timed on the
host clock; CPU kernels are synchronous) and reports per function: calls, milliseconds per
inference, share of the total, GFLOPS, and what the compiler gave it (tuned, fallback). The
same network runs in ONNX Runtime with its profiler on, and its per-node times are summed
by operator type, so the gap between the two has names: "convs take 14.2 ms here, 11.0 ms
there". Writes benchmarks/results/op_profile_<model>.json.

    nice -n 10 .venv/bin/python benchmarks/op_profile.py --db tuned.db --model resnet50
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import tvm
from rich.console import Console
from rich.table import Table
from tvm import relax

from tuner.bench import peer_model
from tuner.compile import compile_model
from tuner.db import TuningDatabase
from tuner.device import parse_device
from tuner.frontends import load_model
from tuner.layout import LayoutPlan, prepare
from tuner.precision import apply_precision
from tuner.precision.quantize import quantized_model
from tuner.tasks import fuse, workload_key

RESULTS = Path(__file__).parent / "results"
console = Console()


def fused_functions(spec, device, plan, precision: str = "fp32") -> dict[str, tuple[str, float]]:
    """Workload key and FLOPs of one call of every fused PrimFunc, by the name the VM calls it.

    Keys are computed as task extraction computes them (on MetaSchedule's dispatched module),
    so they match the compiler's decisions.
    """
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.analysis import estimate_tir_flops

    fused = fuse(prepare(apply_precision(spec.bound(), precision), device.target, plan), device.target)
    out = {}
    for ext in ms.relax_integration.extract_tasks(fused, device.target):
        mod = ext.dispatched[0]
        try:
            flops = float(estimate_tir_flops(mod))
        except (RuntimeError, ValueError):
            flops = 0.0
        out[str(ext.task_name)] = (workload_key(mod, precision), flops)
    return out


def tvm_profile(compiled, device, inputs: list[np.ndarray], rounds: int) -> dict[str, dict]:
    """Per compiled function: calls per inference and the median milliseconds per inference."""
    device.use_threads()
    dev = device.tvm_device()
    vm = relax.VirtualMachine(compiled.executable, dev)
    args = [tvm.runtime.tensor(x, dev) for x in inputs]
    vm["main"](*args)  # warm up: first-touch allocations, thread pool
    per_round: list[dict[str, float]] = []
    calls: dict[str, int] = defaultdict(int)
    started: dict[str, float] = {}
    current: dict[str, float] = defaultdict(float)

    def instrument(func, name, before_run, ret_value, *call_args):
        if before_run:
            started[name] = time.perf_counter()
        else:
            current[name] += time.perf_counter() - started.pop(name)
            calls[name] += 1
        return 0  # VMInstrumentReturnKind.NO_OP

    vm.set_instrument(instrument)
    for _ in range(rounds):
        current.clear()
        vm["main"](*args)
        per_round.append(dict(current))
    names = {n for r in per_round for n in r}
    return {
        n: {"calls": calls[n] // rounds, "ms": 1e3 * statistics.median(r.get(n, 0.0) for r in per_round)} for n in names
    }


def ort_profile(onnx_path: Path, inputs: list[np.ndarray], threads: int, rounds: int) -> dict[str, float]:
    """ONNX Runtime's per-node kernel times, summed by operator type, ms per inference."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.enable_profiling = True
    opts.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "ort")
    session = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
    feed = dict(zip([i.name for i in session.get_inputs()], inputs, strict=True))
    session.run(None, feed)
    for _ in range(rounds):
        session.run(None, feed)
    events = json.loads(Path(session.end_profiling()).read_text())
    by_op: dict[str, float] = defaultdict(float)
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            by_op[e["args"].get("op_name", "?")] += e["dur"] / 1e3  # µs -> ms
    return {op: ms / (rounds + 1) for op, ms in sorted(by_op.items(), key=lambda kv: -kv[1])}


def op_family(name: str) -> str:
    """A coarse family of a fused function's name, to set beside ONNX Runtime's op types."""
    for family in ("conv2d", "dense", "matmul", "pool", "softmax", "layer_norm", "layout_transform"):
        if family in name:
            return family
    return "other"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--layout", default="auto", choices=["auto", "NCHW", "NHWC", "NCHWc"])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "int8"],
                   help="int8: the model quantized as tune --precision int8 quantizes it (ONNX Runtime runs that file)")
    args = p.parse_args()
    device = parse_device("cpu")
    threads = int(device.target.attrs.get("num-cores", os.cpu_count() or 1))
    spec, source = load_model(args.model), args.model
    if args.precision == "int8":
        source = str(quantized_model(spec, args.model))
        spec = load_model(source)
    plan = LayoutPlan.parse(args.layout, device.target)
    db = TuningDatabase(args.db)
    compiled = compile_model(spec, device, db, plan=plan, precision=args.precision)
    functions = fused_functions(spec, device, plan, args.precision)
    inputs = spec.random_inputs()
    load_before = os.getloadavg()
    prof = tvm_profile(compiled, device, inputs, args.rounds)
    rows = []
    for name, entry in sorted(prof.items(), key=lambda kv: -kv[1]["ms"]):
        key, flops = functions.get(name, ("", 0.0))
        decision = compiled.decisions.get(key)
        f = flops * entry["calls"]
        rows.append({"function": name, "workload_key": key, "calls": entry["calls"], "ms": entry["ms"],
                     "kind": decision.kind if decision else ("tvm-default" if key else "vm-builtin"),
                     "gflops": f / (entry["ms"] * 1e-3) / 1e9 if f and entry["ms"] else None})  # fmt: skip
    total = sum(r["ms"] for r in rows)
    families: dict[str, float] = defaultdict(float)
    for r in rows:
        families[op_family(r["function"])] += r["ms"]
    with tempfile.TemporaryDirectory() as tmp:
        peer = peer_model(spec, source, Path(tmp))
        ort_ops = ort_profile(peer.onnx_path, inputs, threads, args.rounds) if peer.onnx_path else {}
    table = Table(title=f"{args.model} {args.precision}: {total:.2f} ms in compiled functions ({args.rounds} rounds)")
    for col in ("function", "kind", "calls", "ms", "share", "GFLOPS"):
        table.add_column(col, justify="left" if col in ("function", "kind") else "right")
    for r in rows[: args.top]:
        gf = f"{r['gflops']:.0f}" if r["gflops"] else "-"
        table.add_row(r["function"], r["kind"], str(r["calls"]), f"{r['ms']:.3f}", f"{r['ms'] / total:.1%}", gf)
    console.print(table)
    console.print(
        "TVM by family (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(families.items(), key=lambda kv: -kv[1]))
    )
    console.print("ONNX Runtime by op type (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in ort_ops.items()))
    doc = {
        "benchmark": "op_profile",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "machine": {"cpu": device.description.get("model", platform.processor()), "threads": threads,
                    "target": str(device.target), "load_before": load_before, "load_after": os.getloadavg()},
        "model": args.model, "precision": args.precision, "db": args.db, "tuned": len(compiled.tuned),
        "fallback": len(compiled.fallback),
        "tvm_total_ms": total, "tvm_functions": rows, "tvm_by_family_ms": families, "onnxruntime_by_op_ms": ort_ops,
    }  # fmt: skip
    out = RESULTS / f"op_profile_{args.model}{'' if args.precision == 'fp32' else '_' + args.precision}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
