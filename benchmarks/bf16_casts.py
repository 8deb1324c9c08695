"""Each tuned bf16 task of a model built twice from its stored record: with casts to bfloat16
on ``vcvtneps2bf16`` (``search_spaces.bf16_casts``) and with TVM's own integer rounding; both
checked for the same output bits and timed warm, interleaved, on the host's threads.

The rewrite changes no workload key, so the same records build both ways; what differs is
only the epilogues' (and copies') rounding to bf16. ``--convert-gathers`` converts values
loaded lane by lane too (a transpose's gathers), which the rewrite leaves to TVM. Needs a CPU
with AVX512_BF16. Writes
benchmarks/results/bf16_casts_<model>.json (``--out``).

    .venv/bin/python benchmarks/bf16_casts.py --db /work/bench/bert_bf16.db --model bert-base --rounds 25
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import numpy as np
import tvm
from rich.console import Console
from rich.table import Table

import search_spaces.bf16_casts
from search_spaces.templates.intrin_amx import register_amx_intrinsics
from search_spaces.templates.intrin_x86 import target_has_bf16_dot
from search_spaces.verify import arg_specs, random_args
from tuner.db import TuningDatabase
from tuner.device import parse_device
from tuner.frontends import load_model
from tuner.layout import LayoutPlan
from tuner.memory import small_pages
from tuner.rerank import record_program
from tuner.tasks import extract_tasks

sys.path.insert(0, str(Path(__file__).parent))
from result_file import machine, write_result

console = Console()


def build_both(prog: tvm.IRModule, target: tvm.target.Target) -> dict[str, object]:
    """``prog`` built with the rewrite (``native``) and without it (``tvm``)."""
    native = search_spaces.bf16_casts.native_bf16_casts
    search_spaces.bf16_casts.native_bf16_casts = lambda mod: mod
    try:
        plain = tvm.compile(prog, target=target)
    finally:
        search_spaces.bf16_casts.native_bf16_casts = native
    return {"tvm": plain, "native": tvm.compile(prog, target=target)}


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
    for task in tasks:
        best = db.best(task.workload_key, device_id, k=1) if device_id is not None else []
        prog = record_program(task, best[0].record_json) if best else None
        if prog is None:
            continue
        libs = build_both(prog, target)
        inputs = random_args(arg_specs(task.mod), seed=0)
        args_of = {k: [tvm.runtime.tensor(a, tvm.cpu(0)) for a in inputs] for k in libs}
        for k, lib in libs.items():
            lib["main"](*args_of[k])
        same = all(np.array_equal(a.numpy().view(np.uint8), b.numpy().view(np.uint8))
                   for a, b in zip(args_of["tvm"], args_of["native"], strict=True))  # fmt: skip
        number = max(1, int(2e-3 / max(best[0].mean_sec, 1e-6)))
        timers = {k: lib.mod.time_evaluator("main", tvm.cpu(0), number=number, repeat=1) for k, lib in libs.items()}
        us: dict[str, list[float]] = {k: [] for k in libs}
        for _ in range(args.rounds):
            for k in libs:
                us[k].append(timers[k](*args_of[k]).mean * 1e6)
        med = {k: statistics.median(v) for k, v in us.items()}
        rows.append({"task": task.name, "weight": task.weight, "workload_key": task.workload_key,
                     "instructions": libs["native"].mod.inspect_source("asm").count("vcvtneps2bf16"),
                     "same_bits": same, "tvm_us": med["tvm"], "native_us": med["native"],
                     "native_over_tvm": med["native"] / med["tvm"]})  # fmt: skip
    total = {k: sum(r[f"{k}_us"] * r["weight"] for r in rows) / 1e3 for k in ("tvm", "native")}
    table = Table(title=f"{args.model} bf16 tasks, warm, median of {args.rounds} interleaved rounds")
    for col in ("task", "calls", "vcvtneps2bf16", "same bits", "TVM's casts us", "native us", "ratio"):
        table.add_column(col, justify="left" if col == "task" else "right")
    for r in rows:
        table.add_row(r["task"][:60], str(r["weight"]), str(r["instructions"]), str(r["same_bits"]),
                      f"{r['tvm_us']:.2f}", f"{r['native_us']:.2f}", f"{r['native_over_tvm']:.3f}")  # fmt: skip
    console.print(table)
    console.print(f"weighted by calls: TVM's casts {total['tvm']:.3f} ms, native {total['native']:.3f} ms "
                  f"({total['native'] / total['tvm']:.3f}x)")  # fmt: skip
    out = args.out or Path(__file__).parent / "results" / f"bf16_casts_{args.model}.json"
    write_result(out, "bf16_casts", {
        **machine(device, load_before), "db": args.db, "model": args.model, "rounds": args.rounds,
        "convert_gathers": args.convert_gathers, "tasks": rows, "weighted_ms": total,
        "native_over_tvm": total["native"] / total["tvm"],
    })  # fmt: skip
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
