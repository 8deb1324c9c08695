"""Fill a tuning database with real measurements of small operators, for cost-model studies.

For each of a few small workloads (conv2d 3x3 and 1x1, matmul, dense, a reduction), samples
random points of the sketch space, builds each with ``tvm.compile`` and times it with TVM's
``time_evaluator`` on this CPU, and stores every candidate (failed builds included) as a
Nightshift record with its MetaSchedule TuningRecord JSON, as the job does. ``nightshift
model eval`` and ``benchmarks/cost_model_quality.py`` read the result.

With ``--model NAME`` (repeatable), the workloads are instead the heaviest ``--tasks`` tasks
of those models (``tuner.graph.tasks.extract_tasks``), each sampled in every space that
applies (the sketch space and the x86 templates, points shared out evenly), and each model's
records belong to a job of that model: ``nightshift model eval`` then also holds out whole
models.

    nice -n 10 .venv/bin/python benchmarks/cost_model_data.py --db /tmp/cm.db --points 96
    nice -n 10 .venv/bin/python benchmarks/cost_model_data.py --db /tmp/cm.db --model resnet18 \
        --model mobilenet_v2 --tasks 6 --points 32
"""

from __future__ import annotations

import argparse
import json
import logging
import time

import numpy as np
import tvm
from tvm import te
from tvm.s_tir import meta_schedule as ms

import search_spaces
from tuner.db import NewRecord, TuningDatabase
from tuner.device import parse_device
from tuner.graph.keys import workload_key
from tuner.trace_json import record_as_json

logger = logging.getLogger("cost_model_data")


def _prim(args: list, name: str) -> tvm.IRModule:
    return tvm.IRModule({"main": te.create_prim_func(args).with_attr("global_symbol", name)})


def matmul(n: int, m: int, k: int, name: str) -> tuple[tvm.IRModule, float]:
    a = te.placeholder((n, k), name="A")
    b = te.placeholder((k, m), name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((n, m), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    return _prim([a, b, c], name), 2.0 * n * m * k


def conv2d(c_in: int, c_out: int, hw: int, ksize: int, name: str) -> tuple[tvm.IRModule, float]:
    pad = ksize // 2
    data = te.placeholder((1, c_in, hw, hw), name="data")
    weight = te.placeholder((c_out, c_in, ksize, ksize), name="weight")
    padded = te.compute(
        (1, c_in, hw + 2 * pad, hw + 2 * pad),
        lambda n, c, y, x: te.if_then_else(
            te.all(y >= pad, y < hw + pad, x >= pad, x < hw + pad), data[n, c, y - pad, x - pad], 0.0
        ),
        name="pad",
    )
    rc, ry, rx = te.reduce_axis((0, c_in), "rc"), te.reduce_axis((0, ksize), "ry"), te.reduce_axis((0, ksize), "rx")
    out = te.compute(
        (1, c_out, hw, hw),
        lambda n, f, y, x: te.sum(padded[n, rc, y + ry, x + rx] * weight[f, rc, ry, rx], axis=[rc, ry, rx]),
        name="conv",
    )
    relu = te.compute(out.shape, lambda *i: te.max(out(*i), 0.0), name="relu")
    return _prim([data, weight, relu], name), 2.0 * c_in * c_out * hw * hw * ksize * ksize


def reduction(n: int, m: int, name: str) -> tuple[tvm.IRModule, float]:
    a = te.placeholder((n, m), name="A")
    r = te.reduce_axis((0, m), name="r")
    s = te.compute((n,), lambda i: te.sum(te.exp(a[i, r]), axis=r), name="S")
    return _prim([a, s], name), 2.0 * n * m


WORKLOADS = {
    "conv2d_3x3_32": lambda: conv2d(32, 32, 28, 3, "conv2d_3x3_32"),
    "conv2d_1x1_64": lambda: conv2d(64, 64, 14, 1, "conv2d_1x1_64"),
    "matmul_128": lambda: matmul(128, 128, 128, "matmul_128"),
    "dense_16x512x256": lambda: matmul(16, 256, 512, "dense_16x512x256"),
    "reduce_exp_sum": lambda: reduction(256, 512, "reduce_exp_sum"),
    "conv2d_3x3_64_14": lambda: conv2d(64, 64, 14, 3, "conv2d_3x3_64_14"),
    "matmul_64x256x128": lambda: matmul(64, 256, 128, "matmul_64x256x128"),
    "reduce_exp_sum_small": lambda: reduction(64, 1024, "reduce_exp_sum_small"),
}


def time_lib(lib, dev, mod: tvm.IRModule, *, repeat: int = 5, min_repeat_ms: int = 10) -> list[float]:
    """Seconds per call of the built ``main`` on random inputs, ``repeat`` times."""
    rng = np.random.default_rng(0)
    args = [
        tvm.runtime.tensor(rng.uniform(-1, 1, [int(d) for d in a.shape]).astype(a.dtype), dev)
        for a in ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    ]
    evaluator = lib.time_evaluator("main", dev, number=1, repeat=repeat, min_repeat_ms=min_repeat_ms)
    return [float(s) for s in evaluator(*args).results]


def model_tasks(model: str, target: tvm.target.Target, count: int) -> list[tuple[str, tvm.IRModule, float, str]]:
    """``(name, mod, flops, key)`` of the ``count`` heaviest tasks of a zoo model."""
    from tuner.frontends import load_model
    from tuner.graph.tasks import extract_tasks

    spec = load_model(model)
    return [(t.name, t.mod, t.flops, t.workload_key) for t in extract_tasks(spec.mod, target)[:count]]


def measure_task(db: TuningDatabase, dev_id: int, job_id: int | None, name: str, mod: tvm.IRModule, key: str,
                 kinds: list[str], points: int, seed: int, device) -> None:  # fmt: skip
    """Sample ``points`` random points shared out over ``kinds``, build and time each, store them."""
    target = device.target
    args_info = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    records: list[NewRecord] = []
    start = time.perf_counter()
    for i, kind in enumerate(kinds):
        try:
            space = search_spaces.create(mod, target, kind=kind, seed=seed + 1)
        except ValueError as err:
            logger.info("%s: space %s does not apply (%s)", name, kind, err)
            continue
        quota = points // len(kinds) + (1 if i < points % len(kinds) else 0)
        rng = np.random.default_rng(seed)
        seen: set[str] = set()
        made = 0
        for _ in range(quota * 4):
            if made >= quota:
                break
            point = space.sample(rng)
            if point.to_json() in seen:
                continue
            seen.add(point.to_json())
            try:
                sch = space.apply(point)
            except search_spaces.InvalidPointError:
                continue
            made += 1
            secs: list[float] = []
            error = msg = None
            t0 = time.perf_counter()
            try:
                lib = tvm.compile(sch.mod, target=target)
                build_s = time.perf_counter() - t0
                secs = time_lib(lib.jit(), device.tvm_device(), mod)
            except Exception as err:  # an unbuildable or crashing schedule is a failed record
                build_s = time.perf_counter() - t0
                error, msg = "BUILD_ERROR", f"{type(err).__name__}: {err}"[:500]
            rec = ms.database.TuningRecord(sch.trace, ms.database.Workload(mod), secs or None, target, args_info)
            text = point.to_json() if kind == "sketch" else f'{{"kind":{json.dumps(kind)},{point.to_json()[1:]}'
            records.append(NewRecord(workload_key=key, point=text, record_json=json.dumps(record_as_json(rec)),
                                     run_secs=secs, error_class=error, error_msg=msg, build_sec=build_s))  # fmt: skip
    db.add_records(dev_id, job_id, records)
    ok = [float(np.median(r.run_secs)) for r in records if r.error_class is None]
    logger.info("%s (%s): %d records (%d ok) in %.0f s; best %.3g ms, worst %.3g ms", name, "+".join(kinds),
                len(records), len(ok), time.perf_counter() - start, 1e3 * min(ok, default=0),
                1e3 * max(ok, default=0))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--points", type=int, default=96, help="random points per workload")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workloads", nargs="*", default=list(WORKLOADS))
    parser.add_argument("--model", action="append", default=[], help="a zoo model whose tasks to sample (repeat)")
    parser.add_argument("--tasks", type=int, default=6, help="heaviest tasks of each --model")
    parser.add_argument("--sketch-only", action="store_true", help="no template spaces for --model tasks")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    device = parse_device("cpu")
    target = device.target
    db = TuningDatabase(args.db)
    dev_id = db.device_id(device)
    for model in args.model:
        tasks = model_tasks(model, target, args.tasks)
        job_id = db.start_job(model, dev_id, {"source": "benchmarks/cost_model_data.py", "points": args.points},
                              args.points * len(tasks), name=f"cost-model-data-{model}")  # fmt: skip
        for name, mod, flops, key in tasks:
            db.workload_id(key, name, mod, flops)
            kinds = ["sketch"] if args.sketch_only else search_spaces.applicable_kinds(mod, target)
            measure_task(db, dev_id, job_id, name, mod, key, kinds, args.points, args.seed, device)
        db.update_job(job_id, trials_done=db.job_trials(job_id), state="done")
    for name in args.workloads if not args.model else []:
        mod, flops = WORKLOADS[name]()
        key = workload_key(mod)
        db.workload_id(key, name, mod, flops)
        measure_task(db, dev_id, None, name, mod, key, ["sketch"], args.points, args.seed, device)


if __name__ == "__main__":
    main()
