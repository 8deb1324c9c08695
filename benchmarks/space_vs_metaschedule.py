"""Best of N random points: Nightshift's spaces vs MetaSchedule's initial population.

For three ResNet-50 conv tasks, in one process on this machine, draws N points from
  - ``sketch``: ``search_spaces.create(kind="sketch")``, each knob uniform;
  - ``metaschedule``: MetaSchedule's initial population, drawn the way its evolutionary
    search seeds itself (a design space uniformly, every decision left to TVM's own sampling
    instructions, then the target's postprocessors; failures redrawn);
  - ``x86-conv2d-nchw``: the hand-written template, where it applies;
builds each with ``tvm.compile``, checks it against the unscheduled build, and times it
with ``time_evaluator``. Candidates of the three sources are interleaved so machine noise
hits them alike. Writes benchmarks/results/space_vs_metaschedule.json.

    nice -n 10 .venv/bin/python benchmarks/space_vs_metaschedule.py --points 64
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np
import tvm
from tvm.s_tir import Schedule
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.schedule import Trace

import search_spaces
from tuner.device import parse_device
from tuner.frontends import load_model
from tuner.graph.tasks import extract_tasks
from tuner.measure.verify import compare, reference

logger = logging.getLogger("space_vs_metaschedule")
RESULTS = Path(__file__).parent / "results" / "space_vs_metaschedule.json"


def metaschedule_population(mod: tvm.IRModule, target: tvm.target.Target, n: int, seed: int) -> list[Schedule]:
    """N schedules sampled like MetaSchedule's EvolutionarySearch initial population."""
    ctx = ms.TuneContext(mod=mod, target=search_spaces.target_with_limits(target),
                         space_generator="post-order-apply", task_name="ms", rand_state=seed, num_threads=1)
    designs = [d.trace for d in ctx.space_generator.generate_design_space(mod)]
    postprocs = list(ctx.space_generator.postprocs)
    rng = np.random.default_rng(seed)
    out: list[Schedule] = []
    while len(out) < n:
        trace = designs[int(rng.integers(len(designs)))]
        sch = Schedule(mod, seed=int(rng.integers(1, 2**31 - 1)))
        try:
            Trace(trace.insts, {}).apply_to_schedule(sch, remove_postproc=True)
        except (RuntimeError, ValueError):
            continue
        sch.enter_postproc()
        if all(p.apply(sch) for p in postprocs):
            out.append(sch)
    return out


def measure(mod: tvm.IRModule, target: tvm.target.Target, ref, best_so_far: float) -> dict:
    """Build, check and time one candidate."""
    t0 = time.perf_counter()
    try:
        lib = tvm.compile(mod, target=target)
    except Exception as err:  # a failed build is a result
        return {"error": "build", "detail": str(err)[:300], "build_sec": time.perf_counter() - t0}
    build_sec = time.perf_counter() - t0
    dev = tvm.cpu(0)
    arrays = [tvm.runtime.tensor(a, dev) for a in ref.inputs]
    lib["main"](*arrays)
    verdict = compare([a.numpy() for a in arrays], ref.outputs)
    if verdict.wrong:
        return {"error": "wrong", "detail": verdict.detail, "build_sec": build_sec}
    extra = {} if verdict.elementwise_ok else {"elementwise_mismatch": verdict.detail}
    once = lib.mod.time_evaluator("main", dev, number=1, repeat=1)(*arrays).results[0]
    if once > 20 * best_so_far:
        # Far slower than the best already seen: one run is enough to rank it.
        return {"sec": float(once), "build_sec": build_sec, "runs": 1, **extra}
    res = lib.mod.time_evaluator("main", dev, number=1, repeat=5, min_repeat_ms=10)(*arrays).results
    return {"sec": float(np.median(res)), "build_sec": build_sec, "runs": len(res), **extra}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=64)
    parser.add_argument("--tasks", type=int, nargs="*", default=None,
                        help="indices into ResNet-50's conv tasks (default: three 3x3/1x1 convs)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    device = parse_device("cpu")
    device.use_threads()  # time on the target's num-cores threads, as the tuner does
    target = device.target
    tasks = [t for t in extract_tasks(load_model("resnet50").bound(), target) if "conv2d" in t.name]
    chosen = args.tasks or [1, 2, 4]
    report: dict = {"benchmark": "space_vs_metaschedule", "device": device.description, "target": device.target_config,
                    "points": args.points, "seed": args.seed, "tvm": tvm.__version__, "tasks": []}
    for index in chosen:
        task = tasks[index]
        ref = reference(task.mod, target)
        sources: dict[str, list[Schedule]] = {}
        t0 = time.perf_counter()
        sources["metaschedule"] = metaschedule_population(task.mod, target, args.points, args.seed + 1)
        ms_sec = time.perf_counter() - t0
        kind_sec = {}
        for kind in search_spaces.applicable_kinds(task.mod, target):
            t0 = time.perf_counter()
            space = search_spaces.create(task.mod, target, kind=kind)
            rng = np.random.default_rng(args.seed)
            sources[kind] = [space.apply(space.sample(rng)) for _ in range(args.points)]
            kind_sec[kind] = time.perf_counter() - t0
        results: dict[str, list[dict]] = {k: [] for k in sources}
        best = float("inf")
        for i in range(args.points):
            for name, schedules in sources.items():
                r = measure(schedules[i].mod, target, ref, best)
                results[name].append(r)
                if "sec" in r:
                    best = min(best, r["sec"])
            logger.info("%s: %d/%d, best %.3f ms", task.name, i + 1, args.points, best * 1e3)
        entry = {"task": task.name, "flops": task.flops, "sample_sec": {"metaschedule": ms_sec, **kind_sec},
                 "sources": {}}
        for name, rs in results.items():
            ok = [r["sec"] for r in rs if "sec" in r]
            builds = [r["build_sec"] for r in rs]
            entry["sources"][name] = {
                "best_ms": min(ok) * 1e3 if ok else None,
                "best_gflops": task.flops / min(ok) / 1e9 if ok else None,
                "median_ms": float(np.median(ok)) * 1e3 if ok else None,
                "build_failed": sum(r.get("error") == "build" for r in rs),
                "wrong": sum(r.get("error") == "wrong" for r in rs),
                # Right by the scaled test, outside tuner.measure's elementwise tolerance.
                "elementwise_tolerance_misses": sum("elementwise_mismatch" in r for r in rs),
                "build_p50_s": float(np.percentile(builds, 50)), "build_p95_s": float(np.percentile(builds, 95)),
                "build_max_s": float(max(builds)),
            }
        base = entry["sources"]["metaschedule"]["best_ms"]
        for s in entry["sources"].values():
            s["speedup_vs_metaschedule"] = base / s["best_ms"] if base and s["best_ms"] else None
        report["tasks"].append(entry)
        logger.info("%s", json.dumps(entry["sources"], indent=1))
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
