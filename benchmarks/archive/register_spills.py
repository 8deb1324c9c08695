"""Do the tuned int8 convs whose hot loop spills registers lose in the model?

On AVX2 the dot-product conv template (``x86-conv2d-nchwc-dot``) has 16 vector registers for
its accumulators, the weights it reuses across the tile's pixels, the broadcast input and
the instruction's scratch. Its budget counts the accumulators only, so some tiles make LLVM
store accumulators to the stack inside the reduction loop. Re-timed in a slow phase of the
host, such records lost more than the others (``cold_input.py`` on an AVX2 Zen 3,
2026-11-29). This finds, for each tuned conv task of ``--model`` in ``--db``, whether its
stored best stores to the stack in its hottest block (the basic block with the most dot
instructions), and where it does, the fastest of its ``--candidates`` best records that does
not. Those are forced in a copy of the database (``--out-db``; the faster records dropped,
as ``in_model_choice.py`` does), for ``db_ab.py --db OUT_DB --db-b DB`` to time both models
in the same rounds. Writes benchmarks/archive/results/register_spills.json (``--out``).

    .venv/bin/python benchmarks/archive/register_spills.py --db r50_int8.db --out-db r50_int8_nospill.db --model resnet50
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

import tvm
from rich.console import Console

from search_spaces import lowering
from search_spaces.preload import preload_tensor_intrinsics
from search_spaces.templates import x86_conv2d_nchwc_dot as dot_template
from tuner.rerank import record_program

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1])]  # archive/, benchmarks/
from in_model_choice import forced_copy
from result_file import machine, write_result
from tuned_tasks import add_copy_arguments, tuned_tasks

console = Console()
RESULTS = Path(__file__).parent / "results" / "register_spills.json"
DOT = re.compile(r"\b(vpmaddubsw|vpdpbusd|vdpbf16ps)\b")
STACK_STORE = re.compile(r"^\s*vmov\w*\s+%[xyz]mm\d+,\s*-?\d*\(%rsp\)")


def hot_block_spills(asm: str) -> tuple[int, int]:
    """(dot instructions, vector stores to the stack) of the basic block with the most dot
    instructions in ``asm``."""
    blocks: list[list[str]] = [[]]
    for line in asm.splitlines():
        if line.startswith(".LBB"):
            blocks.append([])
        blocks[-1].append(line)
    hot = max(blocks, key=lambda b: sum(bool(DOT.search(x)) for x in b))
    return sum(bool(DOT.search(x)) for x in hot), sum(bool(STACK_STORE.match(x)) for x in hot)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_copy_arguments(p)
    p.add_argument("--candidates", type=int, default=12, help="best records per task looked at")
    p.add_argument("--within", type=float, default=0.15, help="a forced record's stored time over the best's, at most")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    preload_tensor_intrinsics()
    lowering.install()  # records are built as the job built them
    tuned = tuned_tasks(args.db, args.model, top=args.candidates, precision=args.precision)
    target = tuned.device.target
    rows, drops = [], []
    load_before = os.getloadavg()
    for task in tuned.tasks:
        records = tuned.rows[task.workload_key]
        if json.loads(records[0].point).get("kind") != dot_template.NAME:
            continue
        looked = []
        for rec in records:
            if json.loads(rec.point).get("kind") != dot_template.NAME:
                continue
            program = record_program(task, rec.record_json)
            if program is None:
                continue
            dots, stores = hot_block_spills(tvm.compile(program, target=target).mod.inspect_source("asm"))
            looked.append({"record_id": rec.id, "decisions": json.loads(rec.point)["decisions"],
                           "stored_ms": 1e3 * rec.mean_sec, "hot_dots": dots, "hot_stack_stores": stores})  # fmt: skip
            if not looked[0]["hot_stack_stores"] or not stores:
                break  # the best does not spill, or this is the fastest that does not
        best, last = looked[0], looked[-1]
        forced = None
        if (best["hot_stack_stores"] and not last["hot_stack_stores"]
                and last["stored_ms"] <= best["stored_ms"] * (1 + args.within)):  # fmt: skip
            forced = last["record_id"]
            rec = next(r for r in records if r.id == forced)
            drops.append((task.workload_key, rec.mean_sec, rec.timing))
        rows.append({"task": task.name, "calls": task.weight, "records": looked, "forced": forced})
        console.print(f"{task.name[:60]} x{task.weight}: best {best['decisions'][:3]} {best['stored_ms']:.3f} ms, "
                      f"{best['hot_stack_stores']} stack stores a hot block of {best['hot_dots']} dots"
                      + (f"; forced {last['decisions'][:3]} {last['stored_ms']:.3f} ms" if forced else ""))  # fmt: skip
    forced_copy(Path(args.db), args.out_db, drops)
    spilled = [r for r in rows if r["records"][0]["hot_stack_stores"]]
    cost = sum(r["calls"] * (r["records"][-1]["stored_ms"] - r["records"][0]["stored_ms"]) for r in rows if r["forced"])
    console.print(f"{len(rows)} dot-template tasks; {len(spilled)} bests spill in their hot block; "
                  f"{len(drops)} forced to a record without (+{cost:.3f} ms per inference by the stored times) "
                  f"in {args.out_db}")  # fmt: skip
    write_result(args.out, "register_spills", {
        "machine": machine(tuned.device, load_before), "db": args.db, "out_db": str(args.out_db), "model": args.model,
        "precision": args.precision, "candidates": args.candidates, "within": args.within, "tasks": rows,
        "forced": len(drops), "stored_cost_ms": cost,
    })  # fmt: skip
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
