"""Where a compiled model's time goes, per fused operator, beside the peers' own profiles.

Compiles ``--model`` from ``--db`` (as ``nightshift compile`` does), runs it ``--rounds``
times under the Relax VM's instrument hook (each call of a compiled function is timed on the
host clock; CPU kernels are synchronous) and reports per function: calls, milliseconds per
inference, share of the total, GFLOPS, and what the compiler gave it (tuned, fallback). The
same network runs in ONNX Runtime with its profiler on and in OpenVINO with its performance
counters on (``INFERENCE_PRECISION_HINT`` f32, bf16 for ``--precision bf16``, f32 on the int8 QDQ file, whose int8
kernels it runs). Their per-node times are summed by operator type, and every conv and
matmul of the three is matched by its shape (peer_profiles.py), so the gap has names (ResNet-50
after 2 hours on a Zen 4: "the five 3x3 256->256 14x14 convs take 6.44 ms here, 5.05 ms in
OpenVINO"). Writes
benchmarks/results/op_profile_<model>[_<precision>].json (``--out`` to name another file).

    nice -n 10 .venv/bin/python benchmarks/op_profile.py --db tuned.db --model resnet50
"""

from __future__ import annotations

import argparse
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

from tuner.app.plan import measured_plan
from tuner.bench import peer_model
from tuner.compile import compile_model
from tuner.db import TuningDatabase
from tuner.device import parse_device
from tuner.frontends import load_model
from tuner.graph.keys import workload_key
from tuner.graph.layout.plan import LayoutPlan
from tuner.graph.layout.rewrites import prepare
from tuner.graph.tasks import fuse
from tuner.precision import PRECISIONS, apply_precision
from tuner.precision.quantize import quantized_model

RESULTS = Path(__file__).parent / "results"
console = Console()
sys.path.insert(0, str(Path(__file__).parent))
from peer_profiles import (  # noqa: E402
    HeavyOp,
    heavy_ops,
    match,
    onnxruntime_owners,
    onnxruntime_profile,
    openvino_profile,
    pytorch_profile,
    reduction_size,
)
from result_file import write_result  # noqa: E402


def fused_functions(spec, device, plan, precision: str = "fp32") -> dict[str, tuple[str, float, tuple | None]]:
    """Workload key, FLOPs and reduction size (see ``peer_profiles.reduction_size``) of one
    call of every fused PrimFunc, by the name the VM calls it.

    Keys are computed as task extraction computes them (on MetaSchedule's dispatched module),
    so they match the compiler's decisions.
    """
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.analysis import estimate_tir_flops

    fused = fuse(prepare(apply_precision(spec.bound(), precision, device.target), device.target, plan), device.target)
    out = {}
    for ext in ms.relax_integration.extract_tasks(fused, device.target):
        mod = ext.dispatched[0]
        try:
            flops = float(estimate_tir_flops(mod))
        except (RuntimeError, ValueError):
            flops = 0.0
        out[str(ext.task_name)] = (workload_key(mod, precision), flops, reduction_size(mod))
    return out


def tvm_profile(compiled, device, inputs: list[np.ndarray], rounds: int) -> tuple[dict[str, dict], dict[str, float]]:
    """Per compiled function: calls per inference and the median milliseconds per inference;
    and the whole inference: ``whole_ms``, the median of uninstrumented runs, against
    ``functions_ms``, the median over the profiled runs of each run's summed function time
    (what the functions' medians add up to can sit below it when timings vary)."""
    device.use_threads()
    dev = device.tvm_device()
    vm = relax.VirtualMachine(compiled.executable, dev)
    args = [tvm.runtime.tensor(x, dev) for x in inputs]
    vm["main"](*args)  # warm up: first-touch allocations, thread pool
    whole: list[float] = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        vm["main"](*args)
        whole.append(time.perf_counter() - t0)
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
    totals = {"whole_ms": 1e3 * statistics.median(whole),
              "functions_ms": 1e3 * statistics.median(sum(r.values()) for r in per_round)}  # fmt: skip
    return {
        n: {"calls": calls[n] // rounds, "ms": 1e3 * statistics.median(r.get(n, 0.0) for r in per_round)} for n in names
    }, totals


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
    p.add_argument("--layout", default="auto", choices=["auto", "NCHW", "NHWC", "NCHWc", "NCHWc:w4", "NCHWc:w2"],
                   help="auto: each conv in the layout the database's measurements favour, as bench")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out", type=Path, default=None, help="JSON file (default: results/op_profile_<model>...json)")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS,
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
    chosen = measured_plan(spec, device, db, args.precision) if args.layout == "auto" else None
    if chosen is not None:
        plan = chosen.plan
    compiled = compile_model(spec, device, db, plan=plan, precision=args.precision)
    functions = fused_functions(spec, device, plan, args.precision)
    inputs = spec.random_inputs()
    load_before = os.getloadavg()
    prof, totals = tvm_profile(compiled, device, inputs, args.rounds)
    device_id = db.find_device_id(device)
    rows = []
    for name, entry in sorted(prof.items(), key=lambda kv: -kv[1]["ms"]):
        key, flops, size = functions.get(name, ("", 0.0, None))
        decision = compiled.decisions.get(key)
        f = flops * entry["calls"]
        # The record's own timing (the function alone, run again and again on warm caches)
        # times the calls: what the model would take if each call ran as it did when tuned.
        tuned_here = key and device_id is not None and decision is not None and decision.kind == "tuned"
        best = db.best(key, device_id) if tuned_here else []
        isolated = best[0].mean_sec * 1e3 * entry["calls"] if best and best[0].mean_sec else None
        rows.append({"function": name, "workload_key": key, "calls": entry["calls"], "ms": entry["ms"],
                     "kind": decision.kind if decision else ("tvm-default" if key else "vm-builtin"),
                     "gflops": f / (entry["ms"] * 1e-3) / 1e9 if f and entry["ms"] else None,
                     "size": size, "tuned_ms": isolated})  # fmt: skip
    total = sum(r["ms"] for r in rows)
    in_model = sum(r["ms"] for r in rows if r["tuned_ms"])
    tuned = sum(r["tuned_ms"] for r in rows if r["tuned_ms"])
    families: dict[str, float] = defaultdict(float)
    for r in rows:
        families[op_family(r["function"])] += r["ms"]
    peers: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        peer = peer_model(spec, source, Path(tmp))
        if peer.onnx_path is not None:
            peers = profile_peers(peer.onnx_path, inputs, threads, args.rounds, args.precision, peer.torch_module)
            shapes = by_shape(rows, heavy_ops(peer.onnx_path), peers)
        else:
            shapes = []
    table = Table(title=f"{args.model} {args.precision}: {total:.2f} ms in compiled functions ({args.rounds} rounds)")
    for col in ("function", "kind", "calls", "ms", "share", "GFLOPS", "tuned ms", "in model / tuned"):
        table.add_column(col, justify="left" if col in ("function", "kind") else "right")
    for r in rows[: args.top]:
        gf = f"{r['gflops']:.0f}" if r["gflops"] else "-"
        iso = (f"{r['tuned_ms']:.3f}", f"{r['ms'] / r['tuned_ms']:.2f}") if r["tuned_ms"] else ("-", "-")
        table.add_row(r["function"], r["kind"], str(r["calls"]), f"{r['ms']:.3f}", f"{r['ms'] / total:.1%}", gf, *iso)
    console.print(table)
    if tuned:
        console.print(f"tuned functions: {in_model:.2f} ms in the model, {tuned:.2f} ms as timed when tuned "
                      f"({in_model / tuned:.2f}x)")
    console.print(f"whole inference: {totals['whole_ms']:.2f} ms uninstrumented (median of {args.rounds}); its "
                  f"functions {totals['functions_ms']:.2f} ms (median of each profiled run's sum), "
                  f"{total:.2f} ms as the sum of their medians")
    console.print(
        "TVM by family (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(families.items(), key=lambda kv: -kv[1]))
    )
    for name, prof_ in peers.items():
        if "error" in prof_:
            console.print(f"{name}: {prof_['error']}")
            continue
        rest = sorted(prof_["rest_ms"].items(), key=lambda kv: -kv[1])
        heavy = sum(prof_["heavy_ms"].values())
        console.print(f"{prof_['label']}: {heavy:.2f} ms in convs and matmuls; rest (ms): "
                      + ", ".join(f"{k} {v:.2f}" for k, v in rest if v >= 0.01))
    if shapes:
        console.print(shape_table(shapes, list(peers)))
    suffix = "" if args.precision == "fp32" else "_" + args.precision
    out = args.out or RESULTS / f"op_profile_{args.model}{suffix}.json"
    write_result(out, "op_profile", {
        "machine": {"cpu": device.description.get("model", platform.processor()), "threads": threads,
                    "target": str(device.target), "load_before": load_before, "load_after": os.getloadavg()},
        "model": args.model, "precision": args.precision, "db": args.db, "tuned": len(compiled.tuned),
        "fallback": len(compiled.fallback),
        "tvm_total_ms": total, "tvm_whole_run_ms": totals["whole_ms"], "tvm_function_sum_ms": totals["functions_ms"],
        "tvm_tuned_in_model_ms": in_model, "tvm_tuned_as_timed_ms": tuned,
        "tvm_functions": rows, "tvm_by_family_ms": families,
        "onnxruntime_by_op_ms": peers.get("onnxruntime", {}).get("by_type_ms", {}),
        "peers": peers, "by_shape": shapes,
    })  # fmt: skip
    console.print(f"wrote {out}")


def profile_peers(onnx_path: Path, inputs: list[np.ndarray], threads: int, rounds: int, precision: str,
                  torch_module=None) -> dict:  # fmt: skip
    """ONNX Runtime's, OpenVINO's and PyTorch's per-operator profiles: ms by heavy ONNX node
    and by the rest's op type. OpenVINO runs bf16 for ``bf16`` and f32 otherwise (on an
    int8 file its int8 kernels, the rest f32), labelled with the precision it reports;
    PyTorch (a zoo model's twin) runs eager, under bf16 autocast for bf16, and not for
    int8."""
    import onnxruntime as ort

    out: dict = {}
    nodes = onnxruntime_profile(onnx_path, inputs, threads, rounds)
    heavy, rest = onnxruntime_owners(nodes, onnx_path)
    by_type: dict[str, float] = defaultdict(float)
    for key, ms in nodes.items():
        by_type[key.split("\t", 1)[0]] += ms
    out["onnxruntime"] = {"label": f"ONNX Runtime {ort.__version__}", "heavy_ms": heavy, "rest_ms": rest,
                          "by_type_ms": dict(sorted(by_type.items(), key=lambda kv: -kv[1]))}  # fmt: skip
    try:
        import openvino as ov

        # Asked for explicitly: OpenVINO's default is bf16 where the CPU has it. On an int8
        # file f32 is what precision_vs_peers.py asks for too (the file's int8 kernels run).
        hint = "bf16" if precision == "bf16" else "f32"
        heavy, rest, ran_at, kernels = openvino_profile(onnx_path, inputs, threads, rounds, hint)
        out["openvino"] = {"label": f"OpenVINO {ov.__version__.split('-')[0]} ({ran_at})", "heavy_ms": heavy,
                           "rest_ms": rest,
                           "kernels_ms": dict(sorted(kernels.items(), key=lambda kv: -kv[1]))}  # fmt: skip
    except Exception as err:  # not installed, or it cannot load the file (BERT's QDQ file)
        out["openvino"] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"}
    if torch_module is not None and precision != "int8":
        import torch

        heavy, rest = pytorch_profile(torch_module, inputs, threads, rounds, heavy_ops(onnx_path),
                                      bf16=precision == "bf16")  # fmt: skip
        label = f"PyTorch {torch.__version__.split('+')[0]} eager{' bf16 autocast' if precision == 'bf16' else ''}"
        out["pytorch"] = {"label": label, "heavy_ms": heavy, "rest_ms": rest}
    return out


def by_shape(rows: list[dict], ops: dict[str, HeavyOp], peers: dict) -> list[dict]:
    """TVM's functions and the peers' heavy nodes grouped by operator shape, the largest gap
    to the faster peer first."""
    groups: dict[tuple[str, ...], dict] = {}
    for r in rows:
        found = match(tuple(r["size"]), ops) if r["size"] else []
        if not found:
            continue
        names = tuple(sorted(o.name for o in found))
        g = groups.setdefault(names, {"shape": " | ".join(sorted({o.label for o in found})), "nodes": len(names),
                                      "gflop": sum(2 * o.macs for o in found) / 1e9, "tvm_functions": [],
                                      "tvm_ms": 0.0})  # fmt: skip
        g["tvm_functions"].append(r["function"])
        g["tvm_ms"] += r["ms"]
    for g_names, g in groups.items():
        for peer, prof in peers.items():
            if "heavy_ms" in prof:
                g[f"{peer}_ms"] = sum(prof["heavy_ms"].get(n, 0.0) for n in g_names)
        best = min((g[f"{p}_ms"] for p in peers if f"{p}_ms" in g), default=None)
        g["tvm_vs_best_peer"] = g["tvm_ms"] / best if best else None
        g["gap_ms"] = g["tvm_ms"] - best if best is not None else None
    return sorted(groups.values(), key=lambda g: -(g["gap_ms"] or 0.0))


def shape_table(shapes: list[dict], peers: list[str]) -> Table:
    """The by-shape comparison as a rich table."""
    table = Table(title="convs and matmuls by shape, largest gap to the faster peer first")
    cols = ["shape", "nodes", "TVM ms", *[f"{p} ms" for p in peers], "TVM GFLOPS", "TVM / best", "gap ms"]
    for col in cols:
        table.add_column(col, justify="left" if col == "shape" else "right")
    for g in shapes:
        cells = [g["shape"], str(g["nodes"]), f"{g['tvm_ms']:.3f}"]
        cells += [f"{g[f'{p}_ms']:.3f}" if f"{p}_ms" in g else "-" for p in peers]
        cells += [f"{g['gflop'] / g['tvm_ms'] * 1e3:.0f}" if g["tvm_ms"] else "-",
                  f"{g['tvm_vs_best_peer']:.2f}" if g["tvm_vs_best_peer"] else "-",
                  f"{g['gap_ms']:+.3f}" if g["gap_ms"] is not None else "-"]  # fmt: skip
        table.add_row(*cells)
    return table


if __name__ == "__main__":
    main()
