"""Each tuned bf16 task of a model built twice from its stored record: with casts to bfloat16
on ``vcvtneps2bf16`` (``search_spaces.bf16_casts``) and with TVM's own integer rounding; both
checked for the same output bits and timed warm, interleaved, on the host's threads.

The rewrite changes no workload key, so the same records build both ways; what differs is
only the epilogues' (and copies') rounding to bf16. ``--convert-gathers`` converts values
loaded lane by lane too (a transpose's gathers), which the rewrite leaves to TVM. Needs a CPU
with AVX512_BF16. Writes
benchmarks/archive/results/bf16_casts_<model>.json (``--out``).

    .venv/bin/python benchmarks/archive/bf16_casts.py --db /work/bench/bert_bf16.db --model bert-base --rounds 25
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import tvm
from rich.console import Console

import search_spaces.x86.bf16_casts
from search_spaces.x86.intrin_amx import register_amx_intrinsics
from search_spaces.x86.intrin import target_has_bf16_dot
from tuner.db import TuningDatabase
from tuner.device import parse_device
from tuner.frontends import load_model
from tuner.graph.layout.plan import LayoutPlan
from tuner.memory import small_pages
from tuner.graph.tasks import extract_tasks

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1])]  # archive/, benchmarks/
from result_file import machine, write_result
from two_builds import built_tasks, interleaved_us, print_rows, print_weighted

console = Console()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True)
    p.add_argument("--model", default="bert-base")
    p.add_argument("--rounds", type=int, default=25, help="interleaved timings of each build")
    p.add_argument("--convert-gathers", action="store_true",
                   help="convert gathered values on vcvtneps2bf16 too, in pieces (what the rewrite does not)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    if args.convert_gathers:
        search_spaces.bf16_casts._gathers = lambda expr: False
    small_pages()
    register_amx_intrinsics()
    device = parse_device("cpu")
    device.use_threads()
    target = device.target
    if not target_has_bf16_dot(target):
        raise SystemExit("this CPU has no AVX512_BF16: nothing to compare")
    db = TuningDatabase(args.db)
    device_id = db.find_device_id(device)
    load_before = os.getloadavg()
    tasks = extract_tasks(load_model(args.model).bound(), target, LayoutPlan.for_target(target), precision="bf16")
    rows = []
    cast_rewrite = (search_spaces.bf16_casts, "native_bf16_casts")
    for task, best_sec, libs, args_of, same in built_tasks(db, device_id, tasks, target, cast_rewrite):
        number = max(1, int(2e-3 / max(best_sec, 1e-6)))
        timers = {k: lib.mod.time_evaluator("main", tvm.cpu(0), number=number, repeat=1) for k, lib in libs.items()}
        med = interleaved_us(timers, args_of, args.rounds)
        rows.append({"task": task.name, "weight": task.weight, "workload_key": task.workload_key,
                     "instructions": libs["ours"].mod.inspect_source("asm").count("vcvtneps2bf16"),
                     "same_bits": same, "tvm_us": med["tvm"], "native_us": med["ours"],
                     "native_over_tvm": med["ours"] / med["tvm"]})  # fmt: skip
    print_rows(console, f"{args.model} bf16 tasks, warm, median of {args.rounds} interleaved rounds",
               ("task", "calls", "vcvtneps2bf16", "same bits", "TVM's casts us", "native us", "ratio"), rows,
               lambda r: [r["task"][:60], str(r["weight"]), str(r["instructions"]), str(r["same_bits"]),
                          f"{r['tvm_us']:.2f}", f"{r['native_us']:.2f}", f"{r['native_over_tvm']:.3f}"])
    total = print_weighted(console, rows, ("tvm", "native"), ("TVM's casts", "native"))
    out = args.out or Path(__file__).parent / "results" / f"bf16_casts_{args.model}.json"
    write_result(out, "bf16_casts", {
        **machine(device, load_before), "db": args.db, "model": args.model, "rounds": args.rounds,
        "convert_gathers": args.convert_gathers, "tasks": rows, "weighted_ms": total,
        "native_over_tvm": total["native"] / total["tvm"],
    })  # fmt: skip
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
