"""Each tuned task that rounds (``nearbyint``: int8 requantize epilogues) built twice from its
stored record: with the rounding on LLVM's intrinsic, which TVM vectorizes
(``search_spaces.lowering.llvm_nearbyint``), and with TVM's own op, whose loops TVM's
vectorizer leaves scalar for LLVM to vectorize again. Both builds are checked for the same
output bits, their code is searched for byte-by-byte work (``vpinsrb`` gathers, ``movb`` stores
of a register, ``vpextrb``: what LLVM leaves where it does not vectorize the loop again), and
they are timed cold (every argument but the first flushed, as ``tune`` times) in interleaved
rounds on the host's threads. Writes benchmarks/archive/results/vector_rounding_<model>_<precision>.json
(``--out``).

    .venv/bin/python benchmarks/archive/vector_rounding.py --db /work/bench/r50_int8.db --model resnet50 --rounds 20
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

import tvm
from rich.console import Console

from search_spaces import lowering
from search_spaces.preload import preload_tensor_intrinsics
from tuner.db import TuningDatabase
from tuner.device import parse_device
from tuner.frontends import load_model
from tuner.graph.layout.plan import LayoutPlan
from tuner.measure.runner import TimingConfig
from tuner.precision import check_device
from tuner.precision.quantize import DEFAULT_CALIBRATION, quantized_model
from tuner.graph.tasks import extract_tasks

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1])]  # archive/, benchmarks/
from result_file import machine, write_result
from two_builds import built_tasks, interleaved_us, print_rows, print_weighted

console = Console()
# Byte-by-byte work in x86 code: a byte inserted into a vector, a byte register stored, a byte extracted.
_BYTEWISE = re.compile(r"^\s+(vpinsrb|vpextrb|movb\s+%)", re.MULTILINE)


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
    rounding = (lowering, "llvm_nearbyint")
    cold = TimingConfig.of_mode("cold")
    for task, _, libs, args_of, same in built_tasks(db, device_id, tasks, target, rounding,
                                                    lambda prog: "nearbyint" in prog.script()):  # fmt: skip
        timers = {k: cold.evaluator(lib.mod, "main", tvm.cpu(0), cold.repeat) for k, lib in libs.items()}
        med = interleaved_us(timers, args_of, args.rounds, alternate=True, median_of_repeats=True)
        bytewise = {k: len(_BYTEWISE.findall(lib.mod.inspect_source("asm"))) for k, lib in libs.items()}
        rows.append({"task": task.name, "weight": task.weight, "workload_key": task.workload_key,
                     "bytewise": {"scalar": bytewise["tvm"], "vector": bytewise["ours"]},
                     "same_bits": same, "scalar_us": med["tvm"], "vector_us": med["ours"],
                     "vector_over_scalar": med["ours"] / med["tvm"]})  # fmt: skip
    print_rows(console, f"{args.model} {args.precision} tasks that round, cold, median of {args.rounds} rounds",
               ("task", "calls", "bytewise instr. (TVM's / LLVM's)", "same bits", "TVM's op us", "LLVM's us", "ratio"),
               rows, lambda r: [r["task"][:60], str(r["weight"]), "{scalar} / {vector}".format(**r["bytewise"]),
                                str(r["same_bits"]), f"{r['scalar_us']:.1f}", f"{r['vector_us']:.1f}",
                                f"{r['vector_over_scalar']:.3f}"])
    total = print_weighted(console, rows, ("scalar", "vector"), ("TVM's op", "LLVM's"))
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
