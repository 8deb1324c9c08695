"""Convs split between the threads by pixels instead of by output channels: what would it buy in the model?

Split by channels (``x86-conv2d-nchwc-dot``'s ``split`` 0), each thread computes a range of
output channels over every pixel: it reads all of the input, half of which the producer's
other thread just wrote, and writes a half of the output that both of the next conv's
threads read. Split by pixels (``split`` 1), each thread writes and reads the same rows from
one conv to the next, so the activations stay in its core's cache. A job's cold timing
cannot see this (the input is in both cores' caches), so this measures it from a finished
database: for each tuned conv task of ``--model`` whose stored best is a dot-template point
split by channels, with at least ``--min-pixels`` output pixels, no partial pixel tile and
at most ``--max-weight-kib`` of weights, the same knobs split by pixels are built, checked
for the same output bits as the stored best, and both are timed alone in ``--rounds``
interleaved cold rounds. Each variant is stored in a copy of the database (``--out-db``)
just under the stored best's time, so that a compile takes it; ``db_ab.py --db DB --db-b
OUT_DB`` then times the two models in the same rounds. Writes
benchmarks/archive/results/parallel_split.json (``--out``).

    .venv/bin/python benchmarks/archive/parallel_split.py --db r50_int8.db --out-db r50_int8_pixels.db --model resnet50
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from pathlib import Path

import numpy as np
import tvm
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.schedule import Trace

from search_spaces import lowering
from search_spaces.base import Point
from search_spaces.preload import preload_tensor_intrinsics
from search_spaces.template_space import TemplateSpace
from search_spaces.templates import x86_conv2d_nchwc_dot as dot_template
from tuner.measure.verify import arg_specs
from tuner.db import NewRecord, TuningDatabase
from tuner.job import record_point
from tuner.measure.runner import TimingConfig, random_args
from tuner.rerank import record_program, time_interleaved
from tuner.search.remote import trace_json

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1])]  # archive/, benchmarks/
from result_file import machine, write_result
from tuned_tasks import add_copy_arguments, tuned_tasks

RESULTS = Path(__file__).parent / "results" / "parallel_split.json"
TEMPLATE = dot_template.NAME


def knob_values(space: TemplateSpace, decisions: list) -> dict:
    """A stored point's knob values; a point stored before the template had ``split`` was
    split by channels."""
    names = [k.name for k in space.knobs(0)]
    if len(decisions) == len(names) - 1:
        names.remove("split")
        return {**dict(zip(names, decisions, strict=True)), "split": 0}
    return dict(zip(names, decisions, strict=True))


def weight_bytes(mod: tvm.IRModule) -> int:
    """Bytes of the conv's int8 (or bf16) weight: its function's 7-dimensional argument."""
    return max(int(np.prod(a.shape)) * (2 if a.dtype == "bfloat16" else 1) for a in arg_specs(mod) if len(a.shape) == 7)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_copy_arguments(p)
    p.add_argument("--min-pixels", type=int, default=28 * 28)
    p.add_argument("--max-weight-kib", type=int, default=256)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    preload_tensor_intrinsics()
    lowering.install()
    tuned = tuned_tasks(args.db, args.model, precision=args.precision)
    device, target = tuned.device, tuned.device.target
    shutil.copyfile(args.db, args.out_db)
    out_db = TuningDatabase(str(args.out_db))
    cold = TimingConfig.of_mode("cold")
    load_before = os.getloadavg()
    rows, new = [], []
    for task in tuned.tasks:
        best = tuned.rows[task.workload_key]
        point = json.loads(best[0].point)
        if point.get("kind") != TEMPLATE:
            continue
        space = TemplateSpace(task.mod, target, TEMPLATE)
        values = knob_values(space, point["decisions"])
        pixels = values["out_h"] * values["out_w"]
        weight_kib = weight_bytes(task.mod) / 1024
        partial = values["fuse_pixels"] and pixels % values["reg_n"]
        if values["split"] or pixels < args.min_pixels or weight_kib > args.max_weight_kib or partial:
            continue
        split = Point(0, tuple({**values, "split": 1}[k.name] for k in space.knobs(0)))
        sch = space.apply(split)
        stored_program = record_program(task, best[0].record_json)
        libs = [tvm.compile(stored_program, target=target), tvm.compile(sch.mod, target=target)]
        inputs = random_args(arg_specs(task.mod), seed=0)
        outs = []
        for lib in libs:
            arrays = [tvm.runtime.tensor(a) for a in inputs]
            lib["main"](*arrays)
            outs.append(arrays[-1].numpy())
        same = bool(np.array_equal(outs[0], outs[1]))
        times = time_interleaved([lib.mod for lib in libs], [tvm.runtime.tensor(a) for a in inputs], cold, args.rounds)
        stored_ms, split_ms = (1e3 * statistics.median(t) for t in times)
        rows.append({"task": task.name, "calls": task.weight, "values": values, "weight_kib": float(weight_kib),
                     "same_bits": same, "channels_ms": stored_ms, "pixels_ms": split_ms,
                     "pixels_over_channels": split_ms / stored_ms})  # fmt: skip
        print(f"{task.name[:70]}: x{task.weight} {tuple(values.values())[:8]} weights {weight_kib:.0f} KiB, "
              f"same bits {same}; alone, cold: by channels {stored_ms:.3f} ms, by pixels {split_ms:.3f}", flush=True)
        if not same:
            continue
        args_info = ms.arg_info.ArgInfo.from_prim_func(task.mod["main"])
        rec = ms.database.TuningRecord(Trace([], {}), ms.database.Workload(task.mod), None, target, args_info).as_json()
        rec[0] = trace_json(sch)
        new.append(NewRecord(workload_key=task.workload_key, record_json=json.dumps(rec),
                             point=record_point(TEMPLATE, split),
                             run_secs=[float(best[0].mean_sec) * 0.999], timing=best[0].timing))  # fmt: skip
    out_device = out_db.find_device_id(device)
    stored = out_db.add_records(out_device, None, new) if out_device is not None else 0
    weighted = {k: sum(r[f"{k}_ms"] * r["calls"] for r in rows) for k in ("channels", "pixels")}
    print(f"{len(rows)} tasks; alone, weighted by calls: by channels {weighted['channels']:.2f} ms, by pixels "
          f"{weighted['pixels']:.2f}; {stored} records stored in {args.out_db}")
    write_result(args.out, "parallel_split", {
        **machine(device, load_before), "db": args.db, "out_db": str(args.out_db), "model": args.model,
        "precision": args.precision, "rounds": args.rounds, "tasks": rows, "weighted_ms": weighted,
    })  # fmt: skip
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
