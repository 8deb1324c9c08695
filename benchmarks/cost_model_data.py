"""Fill a tuning database with real measurements of small operators, for cost-model studies.

For each of a few small workloads (conv2d 3x3 and 1x1, matmul, dense, a reduction), samples
random points of the sketch space, builds each with ``tvm.compile`` and times it with TVM's
``time_evaluator`` on this CPU, and stores every candidate (failed builds included) as a
Nightshift record with its MetaSchedule TuningRecord JSON, as the job does. ``nightshift
model eval`` and ``benchmarks/cost_model_quality.py`` read the result.

    nice -n 10 .venv/bin/python benchmarks/cost_model_data.py --db /tmp/cm.db --points 96
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--points", type=int, default=96, help="random points per workload")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workloads", nargs="*", default=list(WORKLOADS))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    device = parse_device("cpu")
    target = device.target
    db = TuningDatabase(args.db)
    dev_id = db.device_id(device)
    for name in args.workloads:
        mod, flops = WORKLOADS[name]()
        key = workload_key(mod)
        db.workload_id(key, name, mod, flops)
        space = search_spaces.create(mod, target, seed=args.seed + 1)
        rng = np.random.default_rng(args.seed)
        args_info = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
        seen: set[str] = set()
        records: list[NewRecord] = []
        start = time.perf_counter()
        for _ in range(args.points * 3):
            if len(records) >= args.points:
                break
            point = space.sample(rng)
            if point.to_json() in seen:
                continue
            seen.add(point.to_json())
            sch = space.apply(point)
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
            records.append(NewRecord(workload_key=key, point=point.to_json(), record_json=json.dumps(rec.as_json()),
                                     run_secs=secs, error_class=error, error_msg=msg, build_sec=build_s))  # fmt: skip
        db.add_records(dev_id, None, records)
        ok = [float(np.median(r.run_secs)) for r in records if r.error_class is None]
        logger.info("%s: %d records (%d ok) in %.0f s; best %.3g ms, worst %.3g ms", name, len(records), len(ok),
                    time.perf_counter() - start, 1e3 * min(ok, default=0), 1e3 * max(ok, default=0))


if __name__ == "__main__":
    main()
