"""The points of one template's space on each of a tuning database's tasks, timed beside the
task's stored best.

A job gives each task a few dozen trials out of hundreds or thousands of points, so whether a
task's best is the space's best is a question for a sweep. For each task of ``--db`` that
``--template`` applies to (``--tasks``: only those whose names contain one of its strings)
this builds and times every point of the space, or ``--sample`` of them drawn at random, plus
the template's start points and the task's stored best (``best`` in the output, timed in the
same sweep so that both meet the same moments of the host). Each point is built and timed on
the host's threads, inputs random: warm with TVM's ``time_evaluator`` (20 runs, median of 5
repeats), or with ``--timing cold`` as a job times it (``TimingConfig.of_mode("cold")``: the
caches flushed before each of 10 one-call runs, median). Writes
benchmarks/archive/results/template_sweep.json (``--out``). Until the fortieth session this was
``winograd_sweep.py``, for ``x86-conv2d-winograd`` alone (its results keep that name).

    .venv/bin/python benchmarks/archive/template_sweep.py --db /work/bench/resnet50_bf16.db \
        --out benchmarks/archive/results/winograd_sweep_resnet50_bf16_zen4.json
    .venv/bin/python benchmarks/archive/template_sweep.py --db /work/bench/r50_int8.db --template x86-conv2d-nchwc-dot \
        --tasks dot16 --sample 150 --timing cold --out benchmarks/archive/results/template_sweep_....json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import numpy as np
import tvm
from sqlalchemy import select
from tvm.s_tir.meta_schedule.database import Workload

from search_spaces import lowering
from search_spaces.base import Point
from search_spaces.preload import preload_tensor_intrinsics
from search_spaces.template_space import TemplateSpace
from tuner.measure.verify import arg_specs
from tuner.db import TuningDatabase
from tuner.db.schema import WorkloadRow
from tuner.device import parse_device
from tuner.measure.runner import TimingConfig, random_args

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1])]  # archive/, benchmarks/
from result_file import write_result
from two_builds import interleaved_us

RESULTS = Path(__file__).parent / "results" / "template_sweep.json"


def stored_best(db: TuningDatabase, workload_key: str, device_id: int | None, space: TemplateSpace) -> Point | None:
    """The task's stored best record's point, where it is a point of ``space`` (not one of
    another template, nor one stored before the template gained a knob)."""
    best = db.best(workload_key, device_id, k=1) if device_id is not None else []
    point = json.loads(best[0].point) if best else {}
    if point.get("kind") != space.kind or len(point["decisions"]) != len(space.knobs(0)):
        return None
    return Point(0, tuple(point["decisions"]))


def timer(lib: tvm.runtime.Module, timing: str):
    """``lib``'s timer: cold as a job times (``TimingConfig.of_mode("cold")``), or warm."""
    if timing == "cold":
        cold = TimingConfig.of_mode("cold")
        return cold.evaluator(lib.mod, "main", tvm.cpu(0), cold.repeat)
    return lib.mod.time_evaluator("main", tvm.cpu(0), number=20, repeat=5)


def retimed(points: list[dict], libs: dict[int, tvm.runtime.Module], top: int, rounds: int, arrays: list,
            timing: str) -> list[dict]:  # fmt: skip
    """The ``top`` fastest points and the stored best (their builds in ``libs``, by index in
    ``points``) timed again in ``rounds`` interleaved rounds (order reversed every other round):
    a sweep's single timing of each point meets whatever state the host is in, its minimum the
    fast moments."""
    built = [i for i, r in enumerate(points) if r["ms"] is not None]
    chosen = built[:top] + [i for i in built[top:] if points[i]["role"] == "best"]
    timers = {i: timer(libs[i], timing) for i in chosen}
    us = interleaved_us(timers, dict.fromkeys(chosen, arrays), rounds, alternate=True, median_of_repeats=True)
    out = sorted(({**points[i], "retimed_ms": us[i] / 1e3} for i in chosen), key=lambda r: r["retimed_ms"])
    for r in out:
        print(f"  retimed {r['role']:6s} {tuple(r['values'].values())}: {r['retimed_ms']:.3f} ms (swept {r['ms']:.3f})")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--template", default="x86-conv2d-winograd")
    p.add_argument("--timing", choices=("warm", "cold"), default="warm")
    p.add_argument("--tasks", nargs="*", default=None, help="substrings of the task names to sweep")
    p.add_argument("--sample", type=int, default=None, help="points drawn at random (default: every point)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--retime", type=int, default=0, help="the fastest points timed again with the stored best")
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds of --retime")
    args = p.parse_args()
    preload_tensor_intrinsics()
    lowering.install()
    device = parse_device("cpu")
    device.use_threads()  # the target's num-cores threads, as a job times them (TVM's default: half)
    target = device.target
    dev = tvm.cpu(0)
    db = TuningDatabase(args.db)
    device_id = db.find_device_id(device)
    with db.session(write=False) as session:
        workloads = session.execute(select(WorkloadRow.name, WorkloadRow.workload_json, WorkloadRow.flops,
                                           WorkloadRow.key)).all()  # fmt: skip
    rng = np.random.default_rng(args.seed)
    tasks = {}
    for name, workload_json, flops, key in workloads:
        if args.tasks and not any(t in name for t in args.tasks):
            continue
        mod = Workload.from_json(json.loads(workload_json)).mod
        try:
            space = TemplateSpace(mod, target, args.template)
        except ValueError:
            continue  # the template does not apply to this task
        arrays = [tvm.runtime.tensor(a, dev) for a in random_args(arg_specs(mod), seed=0)]
        best = stored_best(db, key, device_id, space)
        starts = space.starts()
        if args.sample is None:
            swept = list(space.enumerate())
        else:  # drawn from the grid's points that pass the static constraints (the valid ones are far fewer)
            grid = [Point(0, values) for values in itertools.product(*(k.choices for k in space.knobs(0)))]
            grid = [pt for pt in grid if space.static_violation(pt) is None]
            swept = [grid[i] for i in rng.permutation(len(grid))[: args.sample]]
        roles = {pt: "start" for pt in starts} | ({best: "best"} if best is not None else {})
        swept_rows: list[tuple[dict, tvm.runtime.Module | None]] = []
        for point in [*roles, *(pt for pt in swept if pt not in roles)]:
            row = {"values": dict(space.values(point)), "role": roles.get(point, "swept")}
            try:
                lib = tvm.compile(space.apply(point).mod, target=target)
                runs = timer(lib, args.timing)(*arrays).results
                swept_rows.append(({**row, "ms": float(np.median(runs)) * 1e3}, lib))
            except Exception as err:  # a point that fails to build is a datum of the sweep
                swept_rows.append(({**row, "ms": None, "error": f"{type(err).__name__}: {err}"[:200]}, None))
        swept_rows.sort(key=lambda rl: rl[0]["ms"] if rl[0]["ms"] is not None else float("inf"))
        points = [r for r, _ in swept_rows]
        built = {i: lib for i, (_, lib) in enumerate(swept_rows) if lib is not None}
        tasks[name] = {"flops": flops, "space_size": space.size(), "points": points}
        if args.retime:
            tasks[name]["retimed"] = retimed(points, built, args.retime, args.rounds, arrays, args.timing)
        fastest = [(r["role"], tuple(r["values"].values())[:4], round(r["ms"], 3)) for r in points[:5] if r["ms"]]
        stored = [round(r["ms"], 3) for r in points if r["role"] == "best" and r["ms"]]
        print(
            f"{name}: {len(points)} of {space.size()} points; stored best {stored} ms; fastest "
            f"(role, first four knobs, ms): {fastest}",
            flush=True,
        )
    write_result(
        args.out,
        "template_sweep",
        {
            "db": args.db,
            "template": args.template,
            "timing": args.timing,
            "sample": args.sample,
            "seed": args.seed,
            "tasks": tasks,
        },
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
