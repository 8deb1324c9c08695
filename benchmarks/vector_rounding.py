"""Each tuned task that rounds (``nearbyint``: int8 requantize epilogues) built twice from its
stored record: with the rounding on LLVM's intrinsic, which TVM vectorizes
(``search_spaces.lowering.llvm_nearbyint``), and with TVM's own op, whose loops TVM's
vectorizer leaves scalar for LLVM to vectorize again. Both builds are checked for the same
output bits, their code is searched for byte-by-byte work (``vpinsrb`` gathers, ``movb`` stores
of a register, ``vpextrb``: what LLVM leaves where it does not vectorize the loop again), and
they are timed cold (every argument but the first flushed, as ``tune`` times) in interleaved
rounds on the host's threads. Writes benchmarks/results/vector_rounding_<model>_<precision>.json
(``--out``).

    .venv/bin/python benchmarks/vector_rounding.py --db /work/bench/r50_int8.db --model resnet50 --rounds 20
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
from pathlib import Path

import numpy as np
import tvm
from rich.console import Console
from rich.table import Table

from search_spaces import lowering
from search_spaces.preload import preload_tensor_intrinsics
from search_spaces.verify import arg_specs, random_args
from tuner.db import TuningDatabase
from tuner.device import parse_device
from tuner.frontends import load_model
from tuner.layout import LayoutPlan
from tuner.precision import check_device
from tuner.precision.quantize import DEFAULT_CALIBRATION, quantized_model
from tuner.rerank import record_program
from tuner.tasks import extract_tasks

sys.path.insert(0, str(Path(__file__).parent))
from result_file import machine, write_result

console = Console()
# Byte-by-byte work in x86 code: a byte inserted into a vector, a byte register stored, a byte extracted.
_BYTEWISE = re.compile(r"^\s+(vpinsrb|vpextrb|movb\s+%)", re.MULTILINE)


def build_both(prog: tvm.IRModule, target: tvm.target.Target) -> dict[str, tvm.runtime.Module]:
    """``prog`` built with LLVM's rounding (``vector``) and with TVM's op (``scalar``)."""
    ours = lowering.llvm_nearbyint
    lowering.llvm_nearbyint = lambda mod: mod
    try:
        scalar = tvm.compile(prog, target=target)
    finally:
        lowering.llvm_nearbyint = ours
    return {"scalar": scalar, "vector": tvm.compile(prog, target=target)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True)
    p.add_argument("--model", default="resnet50", help="a zoo name (quantized as tune quantizes it) or a QDQ file")
    p.add_argument("--precision", default="int8", choices=["int8", "bf16", "fp32"])
    p.add_argument("--rounds", type=int, default=20, help="interleaved cold timings of each build")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    preload_tensor_intrinsics()
    lowering.install()
    device = parse_device("cpu")
    device.use_threads()
    check_device(args.precision, device)
    target = device.target
    source = args.model
    if args.precision == "int8" and not source.lower().endswith(".onnx"):
        source = str(quantized_model(load_model(source), source, DEFAULT_CALIBRATION))
    db = TuningDatabase(args.db)
    device_id = db.find_device_id(device)
    load_before = os.getloadavg()
    tasks = extract_tasks(load_model(source).bound(), target, LayoutPlan.for_target(target),
                          precision=args.precision)  # fmt: skip
    rows = []
    for task in tasks:
        best = db.best(task.workload_key, device_id, k=1) if device_id is not None else []
        prog = record_program(task, best[0].record_json) if best else None
        if prog is None or "nearbyint" not in prog.script():
            continue
        libs = build_both(prog, target)
        inputs = random_args(arg_specs(task.mod), seed=0)
        args_of = {k: [tvm.runtime.tensor(a, tvm.cpu(0)) for a in inputs] for k in libs}
        for k, lib in libs.items():
            lib["main"](*args_of[k])
        same = all(np.array_equal(a.numpy(), b.numpy())
                   for a, b in zip(args_of["scalar"], args_of["vector"], strict=True))  # fmt: skip
        timers = {k: lib.mod.time_evaluator("main", tvm.cpu(0), number=1, repeat=10,
                                            f_preproc="cache_flush_cpu_non_first_arg")
                  for k, lib in libs.items()}  # fmt: skip
        us: dict[str, list[float]] = {k: [] for k in libs}
        for r in range(args.rounds):
            for k in (list(libs) if r % 2 == 0 else list(libs)[::-1]):
                us[k].append(float(np.median(timers[k](*args_of[k]).results)) * 1e6)
        med = {k: statistics.median(v) for k, v in us.items()}
        rows.append({"task": task.name, "weight": task.weight, "workload_key": task.workload_key,
                     "bytewise": {k: len(_BYTEWISE.findall(lib.mod.inspect_source("asm"))) for k, lib in libs.items()},
                     "same_bits": same, "scalar_us": med["scalar"], "vector_us": med["vector"],
                     "vector_over_scalar": med["vector"] / med["scalar"]})  # fmt: skip
    total = {k: sum(r[f"{k}_us"] * r["weight"] for r in rows) / 1e3 for k in ("scalar", "vector")}
    table = Table(title=f"{args.model} {args.precision} tasks that round, cold, median of {args.rounds} rounds")
    for col in ("task", "calls", "bytewise instr. (TVM's / LLVM's)", "same bits", "TVM's op us", "LLVM's us", "ratio"):
        table.add_column(col, justify="left" if col == "task" else "right")
    for r in rows:
        table.add_row(r["task"][:60], str(r["weight"]), f"{r['bytewise']['scalar']} / {r['bytewise']['vector']}",
                      str(r["same_bits"]), f"{r['scalar_us']:.1f}", f"{r['vector_us']:.1f}",
                      f"{r['vector_over_scalar']:.3f}")  # fmt: skip
    console.print(table)
    console.print(f"weighted by calls: TVM's op {total['scalar']:.3f} ms, LLVM's {total['vector']:.3f} ms "
                  f"({total['vector'] / total['scalar']:.3f}x)")  # fmt: skip
    name = Path(args.model).stem if args.model.lower().endswith(".onnx") else args.model
    out = args.out or Path(__file__).parent / "results" / f"vector_rounding_{name}_{args.precision}.json"
    write_result(out, "vector_rounding", {
        **machine(device, load_before), "db": args.db, "model": args.model, "precision": args.precision,
        "rounds": args.rounds, "tasks": rows, "weighted_ms": total,
        "vector_over_scalar": total["vector"] / total["scalar"],
    })  # fmt: skip
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
