"""Measurement throughput: Nightshift's Ray measurer against MetaSchedule's LocalBuilder + LocalRunner.

One run, one fixed list of candidates of ResNet-50's 3x3 64->64 conv on 56x56 (+ batch-norm
and relu, as the zoo model fuses it), measured by both peers one after the other:

- candidates per minute, build/run split and device idle fraction of each peer;
- timings agreement on the candidates both time in full (median of Nightshift's repeats
  against MetaSchedule's), as measured in the two phases and again with the same binaries
  timed by both runners alternately;
- Nightshift's build throughput with one and with two concurrent build workers.

Usage (writes benchmarks/results/measure_vs_metaschedule.json):

    nice -n 10 .venv/bin/python benchmarks/measure_vs_metaschedule.py --candidates 64

Before/after a change of ``tuner.measure``, runs alternating between two checkouts (ABBA; the
benchmark's own code is this file for both; ``PYTHONPATH`` picks whose ``tuner`` runs, Ray's
workers inherit it; each run starts in its checkout, since Ray also puts the driver's working
directory on its workers' path), with the load average around each run:

    python benchmarks/measure_vs_metaschedule.py --candidates 64 --ab /path/to/base-checkout --runs 2 \
        --out benchmarks/results/measure_vs_metaschedule_ab.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import tvm

logger = logging.getLogger("benchmarks.measure")
RESULTS = Path(__file__).parent / "results"
CONV_ARGS = [(1, 64, 56, 56), (64, 64, 3, 3)]
AB_KEYS = ("nightshift_per_min", "metaschedule_per_min", "ratio", "device_idle_fraction", "device_busy_s",
           "quiet_wait_s_total", "spread_median", "interleaved_median_ratio")  # fmt: skip


def conv_task(device):
    """ResNet-50's 3x3 64->64 conv task on 56x56."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    from tuner.frontends import load_model
    from tuner.graph.layout.plan import LayoutPlan
    from tuner.graph.tasks import extract_tasks

    # NCHW: the layout the first results were taken with (the default plan blocks convs now).
    for task in extract_tasks(load_model("resnet50").bound(), device.target, LayoutPlan.parse("NCHW", device.target)):
        shapes = [tuple(int(d) for d in a.shape) for a in ArgInfo.from_prim_func(task.mod["main"])]
        if shapes[:2] == CONV_ARGS:
            return task
    raise SystemExit("no 3x3 64->64 conv task in resnet50")


def candidates(task, target, n: int, seed: int) -> tuple[list[tvm.IRModule], list[str]]:
    """``n`` distinct random points of the task's search space, applied."""
    import search_spaces

    space = search_spaces.create(task.mod, target, seed=seed + 1)
    rng = np.random.default_rng(seed)
    mods, points, seen = [], [], set()
    while len(mods) < n:
        p = space.sample(rng)
        if p.to_json() in seen:
            continue
        seen.add(p.to_json())
        mods.append(space.apply(p).mod)
        points.append(p.to_json())
    return mods, points


def run_nightshift(device, task, mods, config) -> dict:
    from tuner.measure.ray_measure import RayMeasurer

    start = time.monotonic()
    with RayMeasurer(device, config) as m:
        m.actor_info()  # the actor is up
        startup = time.monotonic() - start
        m.reset_stats()
        t0 = time.monotonic()
        results = m.measure(task, mods)
        wall = time.monotonic() - t0
        stats = m.stats
    spreads = [r.run.spread for r in results if r.run.ok and not r.run.early_stopped and r.run.spread is not None]
    return {
        "startup_s": startup,
        "wall_s": wall,
        "candidates_per_min": len(mods) / wall * 60,
        "build_cpu_s": stats.build_s,
        "device_busy_s": stats.device_busy_s,
        "device_idle_fraction": stats.device_idle_fraction,
        "errors": stats.errors,
        "early_stopped": sum(r.run.early_stopped for r in results),
        "remeasured": sum(r.run.remeasured > 0 for r in results),
        # Timing stability: IQR / median of each fully timed candidate's repeats.
        "spread_median": statistics.median(spreads) if spreads else None,
        "spread_p90": statistics.quantiles(spreads, n=10)[-1] if len(spreads) >= 2 else None,
        "quiet_wait_s_total": sum(r.run.quiet_wait_s for r in results),
        "builds_waited_total": sum(r.run.builds_waited for r in results),
        "per_candidate": [
            {"build_s": r.build.build_sec, "error": str(r.error_class) if r.error_class else None,
             "median_s": r.run.median, "spread": r.run.spread, "early_stopped": r.run.early_stopped,
             "repeats": len(r.run.run_secs)}
            for r in results
        ],
    }  # fmt: skip


def _import_tensor_intrin() -> None:
    # MetaSchedule's default_build imports tvm.s_tir.tensor_intrin, ~40 CPU-s here. Inside a
    # build it counts against the 30 s build timeout and every first build of a fresh worker
    # times out (seen on this machine); as the pool's initializer it runs before any timeout,
    # still once per worker and build() call, and still inside MetaSchedule's wall time.
    import tvm.s_tir.tensor_intrin  # noqa: F401


def run_metaschedule(task, target, mods, timing) -> dict:
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.builder import BuilderInput, LocalBuilder
    from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, LocalRunner, RunnerInput

    builder = LocalBuilder(max_workers=2, timeout_sec=30.0, initializer=_import_tensor_intrin)
    runner = LocalRunner(timeout_sec=30.0, evaluator_config=EvaluatorConfig(
        number=1, repeat=timing.repeat, min_repeat_ms=timing.min_repeat_ms, enable_cpu_cache_flush=False))
    args_info = ArgInfo.from_prim_func(task.mod["main"])
    t0 = time.monotonic()
    built = builder.build([BuilderInput(m, target) for m in mods])
    t_build = time.monotonic() - t0
    inputs = [(i, RunnerInput(b.artifact_path, "cpu", args_info))  # TVM 0.27: a runtime device name
              for i, b in enumerate(built) if b.error_msg is None]
    t1 = time.monotonic()
    futures = runner.run([ri for _, ri in inputs])
    runs = [f.result() for f in futures]
    t_run = time.monotonic() - t1
    wall = time.monotonic() - t0
    per = [{"error": None, "median_s": None, "build_error": b.error_msg[:200] if b.error_msg else None} for b in built]
    for (i, _), r in zip(inputs, runs, strict=True):
        if r.error_msg:
            per[i]["error"] = r.error_msg[:200]
        else:
            per[i]["median_s"] = statistics.median(float(s) for s in r.run_secs)
    n_build_err = sum(b.error_msg is not None for b in built)
    return {
        "wall_s": wall, "build_phase_s": t_build, "run_phase_s": t_run,
        "candidates_per_min": len(mods) / wall * 60,
        # The device is used only in the run phase; counting all of it as busy favours MetaSchedule.
        "device_idle_fraction": 1 - t_run / wall,
        "build_errors": n_build_err,
        "build_timeouts": sum(1 for b in built if b.error_msg and "timeout" in b.error_msg.lower()),
        "run_errors": sum(1 for p in per if p["error"]),
        "per_candidate": per,
    }  # fmt: skip


def interleaved_agreement(device, task, mods, timing, rounds: int = 2) -> dict:
    """Time identical binaries with Nightshift's device actor and MetaSchedule's LocalRunner,
    alternating per candidate, so both see the same machine load (this machine is shared)."""
    import ray
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, LocalRunner, RunnerInput

    from tuner.measure.builder import build_candidate
    from tuner.measure.device_actor import DeviceActor
    from tuner.measure.ray_measure import _arg_specs

    actor = ray.remote(DeviceActor).options(
        num_cpus=0, max_concurrency=4, runtime_env={"env_vars": {"TVM_USE_RUNTIME_LIB": "1"}}
    ).remote("cpu", device.target_config, quiet=True)
    ref = build_candidate(tvm.ir.save_json(task.mod), device.target_config)
    ray.get(actor.set_reference.remote("task", ref.artifact, "main", _arg_specs(task.mod)))
    runner = LocalRunner(timeout_sec=30.0, evaluator_config=EvaluatorConfig(
        number=1, repeat=timing.repeat, min_repeat_ms=timing.min_repeat_ms, enable_cpu_cache_flush=False))
    args_info = ArgInfo.from_prim_func(task.mod["main"])
    pairs = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, mod in enumerate(mods):
            art = build_candidate(tvm.ir.save_json(mod), device.target_config).artifact
            ns, ms = [], []
            for r in range(rounds):
                res = ray.get(actor.measure.remote("task", art, "main", timing))
                ns.append(res.median)
                path = Path(tmp) / f"c{k}_{r}.so"  # LocalRunner deletes what it ran
                path.write_bytes(art)
                out = runner.run([RunnerInput(str(path), "cpu", args_info)])[0].result()
                ms.append(statistics.median(float(x) for x in out.run_secs) if not out.error_msg else None)
            if all(ns) and all(ms):
                pairs.append((statistics.median(ns), statistics.median(ms)))
    ray.kill(actor)
    ratios = [a / b for a, b in pairs]
    return {"candidates": len(pairs), "rounds": rounds,
            "median_ratio_ns_over_ms": statistics.median(ratios) if ratios else None,
            "within_2pct": sum(abs(r - 1) <= 0.02 for r in ratios),
            "within_5pct": sum(abs(r - 1) <= 0.05 for r in ratios),
            "within_10pct": sum(abs(r - 1) <= 0.10 for r in ratios),
            "ratios": ratios}


def build_throughput(device, task, mods, workers: int, config) -> dict:
    import dataclasses

    from tuner.measure.ray_measure import RayMeasurer

    with RayMeasurer(device, dataclasses.replace(config, max_builds_in_flight=workers)) as m:
        m.build(task, mods[:workers])  # warm the worker processes up (TVM imported)
        m.reset_stats()
        t0 = time.monotonic()
        res = m.build(task, mods)
        wall = time.monotonic() - t0
    return {"workers": workers, "wall_s": wall, "builds_per_min": len(mods) / wall * 60,
            "built": sum(r.ok for r in res), "build_s_sum": sum(r.build_sec for r in res),
            # Mean number of builds running at once: ~workers if Ray ran them concurrently.
            "concurrency": sum(r.build_sec for r in res) / wall}


def two_workers(device, task, mods, config, args) -> None:
    """Nightshift alone on ``ray.cluster_utils.Cluster``: a head (builds only) and two workers
    offering the device; writes the timings per device node."""
    import collections

    import ray
    from ray.cluster_utils import Cluster

    from tuner.measure.base import device_resource
    from tuner.measure.ray_measure import RayMeasurer, connect

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    workers = [cluster.add_node(num_cpus=1, resources={device_resource(device): 1}) for _ in range(2)]
    cluster.wait_for_nodes()
    connect(cluster.address)
    try:
        t0 = time.monotonic()
        with RayMeasurer(device, config) as m:
            m.devices_info()
            startup = time.monotonic() - t0
            m.reset_stats()
            t1 = time.monotonic()
            results = m.measure(task, mods)
            wall = time.monotonic() - t1
    finally:
        ray.shutdown()
        cluster.shutdown()
    per_node = collections.Counter(r.run.node_id for r in results if r.run.ok)
    names = {w.node_id: f"worker{i + 1}" for i, w in enumerate(workers)}
    result = {
        "benchmark": "measure_vs_metaschedule --two-workers",
        "command": f".venv/bin/python benchmarks/measure_vs_metaschedule.py --two-workers --candidates {len(mods)}",
        "candidates": len(mods), "startup_s": startup, "wall_s": wall, "candidates_per_min": len(mods) / wall * 60,
        "timed_per_device_node": {names.get(k, str(k)): v for k, v in per_node.items()},
        "errors": collections.Counter(str(r.error_class) for r in results if r.error_class),
        "load_avg_after": os.getloadavg(),
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    logger.info("two workers: %s", json.dumps({k: v for k, v in result.items() if k != "command"}))


def _ab_row(side: str, checkout: Path, result: dict, load_before: tuple[float, ...]) -> dict:
    ns, ms, inter = result["nightshift"], result["metaschedule"], result["timings_agreement_interleaved"]
    return {
        "side": side, "checkout": str(checkout), "load_avg_before": load_before,
        "load_avg_after": result["machine"]["load_avg_after"],
        "nightshift_per_min": ns["candidates_per_min"], "metaschedule_per_min": ms["candidates_per_min"],
        "ratio": result["ratio_candidates_per_min"], "nightshift_wall_s": ns["wall_s"],
        "device_idle_fraction": ns["device_idle_fraction"], "device_busy_s": ns["device_busy_s"],
        "build_cpu_s": ns["build_cpu_s"], "quiet_wait_s_total": ns["quiet_wait_s_total"],
        "builds_waited_total": ns["builds_waited_total"], "early_stopped": ns["early_stopped"],
        "remeasured": ns["remeasured"], "errors": ns["errors"], "spread_median": ns["spread_median"],
        "spread_p90": ns["spread_p90"], "repeats_total": sum(p["repeats"] for p in ns["per_candidate"]),
        "interleaved_median_ratio": inter["median_ratio_ns_over_ms"], "interleaved_within_2pct": inter["within_2pct"],
        "interleaved_within_5pct": inter["within_5pct"], "interleaved_candidates": inter["candidates"],
        "interleaved_ratios": inter["ratios"],
    }  # fmt: skip


def alternate(args: argparse.Namespace) -> None:
    """``--ab``: before, after, after, before, ... (a load that drifts during the runs favours
    neither side), each a fresh process and Ray cluster."""
    import subprocess
    import sys

    here = Path(__file__).resolve().parents[1]
    sides = [("before", args.ab.resolve()), ("after", here)]
    commits = {side: subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True,
                                    text=True, check=True).stdout.strip() for side, tree in sides}  # fmt: skip
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.runs):
            for side, tree in sides if k % 2 == 0 else sides[::-1]:
                out = Path(tmp) / f"{side}{k}.json"
                cmd = [sys.executable, __file__, "--candidates", str(args.candidates), "--seed", str(args.seed),
                       "--agreement-candidates", str(args.agreement_candidates), "--skip-build-throughput",
                       "--out", str(out)]  # fmt: skip
                load = os.getloadavg()
                logger.info("run %d, %s (%s), load %s", k + 1, side, tree, load)
                # Ray puts the driver's working directory first on its workers' sys.path: run
                # in the checkout, or the workers import this checkout's tuner beside the other's.
                subprocess.run(cmd, env=os.environ | {"PYTHONPATH": str(tree)}, cwd=tree, check=True)
                runs.append(_ab_row(side, tree, json.loads(out.read_text()), load))
                logger.info("%s", {key: v for key, v in runs[-1].items() if key != "interleaved_ratios"})
    summary = {}
    for side, _ in sides:
        mine = [r for r in runs if r["side"] == side]
        summary[side] = {key: statistics.median(v) if (v := [r[key] for r in mine if r[key] is not None]) else None
                         for key in AB_KEYS}  # fmt: skip
    result = {
        "benchmark": "measure_vs_metaschedule --ab",
        "command": f"python benchmarks/measure_vs_metaschedule.py --candidates {args.candidates} --ab {args.ab} "
                   f"--runs {args.runs} --out {args.out}",
        "commits": commits, "runs": runs, "median_by_side": summary,
        "after_over_before_nightshift_per_min": summary["after"]["nightshift_per_min"]
        / summary["before"]["nightshift_per_min"],
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    logger.info("medians: %s", json.dumps(summary))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidates", type=int, default=64)
    parser.add_argument("--build-candidates", type=int, default=16,
                        help="candidates for the 1 vs 2 build workers comparison (those that built)")
    parser.add_argument("--agreement-candidates", type=int, default=12,
                        help="candidates re-timed by both runners, alternating, on the same binaries")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "measure_vs_metaschedule.json")
    parser.add_argument("--skip-build-throughput", action="store_true",
                        help="leave out the 1 vs 2 build workers comparison")
    parser.add_argument("--ab", type=Path, default=None, metavar="BASE_CHECKOUT",
                        help="alternate runs of this benchmark with BASE_CHECKOUT's tuner (before) and this "
                             "checkout's (after); --out gets every run and the ratios")
    parser.add_argument("--runs", type=int, default=2, help="runs of each side with --ab")
    parser.add_argument("--two-workers", action="store_true",
                        help="only Nightshift, on a three-process cluster (head, two workers with the device "
                             "resource): how the timings spread over the two device actors")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.ab is not None:
        alternate(args)
        return

    from tuner.device import parse_device
    from tuner.measure.base import MeasureConfig
    from tuner.measure.ray_measure import connect
    from tuner.measure.runner import TimingConfig

    device = parse_device("cpu")
    target = device.target
    # MetaSchedule's builder and runner processes inherit this. Without it TVM runs kernels on
    # half the logical CPUs (it assumes hyper-threading; 1 thread on a 2-core machine), while
    # Nightshift's device actor runs them on the target's num-cores: both peers must time the
    # candidates on the threads they were built for.
    threads = int(device.target_config["num-cores"])
    os.environ["TVM_NUM_THREADS"] = str(threads)
    t = time.monotonic()
    task = conv_task(device)
    mods, points = candidates(task, target, args.candidates, args.seed)
    logger.info("task %s, %d candidates in %.1f s", task.name, len(mods), time.monotonic() - t)
    timing = TimingConfig()
    config = MeasureConfig(build_timeout_s=30.0, run_timeout_s=30.0, timing=timing)
    if args.two_workers:
        two_workers(device, task, mods, config, args)
        return
    connect(num_cpus=2)

    ns = run_nightshift(device, task, mods, config)
    logger.info("nightshift: %.1f candidates/min, idle %.2f", ns["candidates_per_min"], ns["device_idle_fraction"])
    ms = run_metaschedule(task, target, mods, timing)
    logger.info("metaschedule: %.1f candidates/min, idle %.2f", ms["candidates_per_min"], ms["device_idle_fraction"])

    both = [(a["median_s"], b["median_s"]) for a, b in zip(ns["per_candidate"], ms["per_candidate"], strict=True)
            if a["median_s"] and b["median_s"] and not a["error"] and not b["error"] and not a["early_stopped"]]
    ratios = [a / b for a, b in both]
    agreement = {
        "candidates": len(both),
        "median_ratio_ns_over_ms": statistics.median(ratios) if ratios else None,
        "within_5pct": sum(abs(r - 1) <= 0.05 for r in ratios),
        "max_abs_deviation": max((abs(r - 1) for r in ratios), default=None),
        "best_ns_s": min((a for a, _ in both), default=None),
        "best_ms_s": min((b for _, b in both), default=None),
    }
    fast = [m for m, p in zip(mods, ns["per_candidate"], strict=True) if not p["error"] or p["error"] not in
            ("build_error", "build_timeout")][: args.build_candidates]  # fmt: skip
    agree_mods = [m for m, a, b in zip(mods, ns["per_candidate"], ms["per_candidate"], strict=True)
                  if a["median_s"] and b["median_s"] and not a["error"] and not b["error"]
                  and not a["early_stopped"]][: args.agreement_candidates]  # fmt: skip
    interleaved = interleaved_agreement(device, task, agree_mods, timing)
    logger.info("interleaved agreement: %s", {k: v for k, v in interleaved.items() if k != "ratios"})
    if args.skip_build_throughput:
        one = two = {"builds_per_min": float("nan")}
    else:
        one = build_throughput(device, task, fast, 1, config)
        two = build_throughput(device, task, fast, 2, config)
    result = {
        "benchmark": "measure_vs_metaschedule",
        "command": f"nice -n 10 .venv/bin/python benchmarks/measure_vs_metaschedule.py --candidates {args.candidates}",
        "machine": {"cpu": device.description.get("model"), "cores": device.description.get("cores"),
                    "tvm_num_threads": threads, "load_avg_after": os.getloadavg(),
                    "python": platform.python_version(), "tvm": tvm.__version__},
        "task": {"name": task.name, "gflop": task.flops / 1e9, "workload_key": task.workload_key},
        "candidates": len(mods), "seed": args.seed, "points": points,
        "timing": {"repeat": timing.repeat, "min_repeat_ms": timing.min_repeat_ms,
                   "hopeless_factor": timing.hopeless_factor},
        "nightshift": ns, "metaschedule": ms,
        "ratio_candidates_per_min": ns["candidates_per_min"] / ms["candidates_per_min"],
        "timings_agreement": agreement,
        "timings_agreement_interleaved": interleaved,
        "build_throughput": {"one": one, "two": two, "ratio": two["builds_per_min"] / one["builds_per_min"]},
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    summary = {k: result[k] for k in ("ratio_candidates_per_min", "timings_agreement")}
    summary["build_ratio"] = result["build_throughput"]["ratio"]
    summary["interleaved"] = {k: v for k, v in interleaved.items() if k != "ratios"}
    logger.info("summary: %s", json.dumps(summary))


if __name__ == "__main__":
    main()
