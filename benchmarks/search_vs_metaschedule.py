"""Search quality per task: Nightshift's strategies against MetaSchedule's ``tune_tir``.

The same PrimFuncs go to both: ResNet-50's conv 3x3 64->64 56x56, conv 3x3 128->128 28x28,
conv 1x1 1024->256 14x14 (each with its folded batch norm as a bias add, and relu) and
BERT-base's 768x768 dense on 128 tokens (+ bias), all NCHW / row-major as written. Phases:

- ``metaschedule``: ``tune_tir`` per task at the trial budget (32 per iteration, its
  defaults otherwise, on the target's threads); wall time and the per-trial curve.
- ``nightshift``: ``tuner.job.tune_tasks`` on each task, per strategy and seed, fresh
  SQLite database each; wall time and the per-trial curve.
- ``compare``: every best schedule found is rebuilt and timed again in this one process,
  interleaved, on the target's threads, beside PyTorch's operator (oneDNN) on as many
  threads: that is the latency compared. Curves keep each tool's own timings.

- ``warmstart``: a second job on a copy of the first evolutionary run's database (a new job
  name, so it is warm-started from the first job's records: population seeds and the
  pre-trained cost model) with ``--warm-trials`` trials, beside a cold job with as many trials
  on an empty database; the best each finds among its *own* records, against the first job's
  best at ``--trials``.
- ``plot``: the curves (best latency against trials and against wall time, per task) as a
  PNG beside the JSON (needs matplotlib, in the ``bench`` extra).

Results are keyed ``<task>/<trials>``, so runs at several budgets sit side by side. Usage
(writes ``--out``, default benchmarks/results/search_vs_metaschedule.json; each phase adds to it):

    nice -n 10 .venv/bin/python benchmarks/search_vs_metaschedule.py --phase metaschedule --trials 64
    nice -n 10 .venv/bin/python benchmarks/search_vs_metaschedule.py --phase nightshift --trials 64
    nice -n 10 .venv/bin/python benchmarks/search_vs_metaschedule.py --phase warmstart --trials 64
    nice -n 10 .venv/bin/python benchmarks/search_vs_metaschedule.py --phase compare --trials 64
    nice -n 10 .venv/bin/python benchmarks/search_vs_metaschedule.py --phase plot
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import tvm
from tvm import te, topi

logger = logging.getLogger("benchmarks.search")
RESULTS = Path(__file__).parent / "results"
OUT = RESULTS / "search_vs_metaschedule.json"  # --out
WORK = Path(tempfile.gettempdir()) / "nightshift-search-bench"


def _conv(c_in: int, c_out: int, hw: int, k: int, stride: int = 1):
    data = te.placeholder((1, c_in, hw, hw), name="data")
    weight = te.placeholder((c_out, c_in, k, k), name="weight")
    bias = te.placeholder((1, c_out, 1, 1), name="bias")
    conv = topi.nn.conv2d_nchw(data, weight, stride, k // 2, 1)
    out = topi.nn.relu(topi.add(conv, bias))
    return te.create_prim_func([data, weight, bias, out]), _torch_conv(c_in, c_out, hw, k, stride)


def _torch_conv(c_in: int, c_out: int, hw: int, k: int, stride: int) -> dict:
    """PyTorch's conv + bias + relu, NCHW as written (oneDNN picks its own layout inside)."""
    return {"kind": "conv", "args": [(1, c_in, hw, hw), (c_out, c_in, k, k), (1, c_out, 1, 1)],
            "stride": stride, "padding": k // 2}  # fmt: skip


def _conv_nchwc(c_in: int, c_out: int, hw: int, k: int, stride: int = 1):
    """The same conv as ``tune --layout auto`` extracts it on this CPU: blocked ``NCHW{b}c``
    data and ``OIHW{b}i{b}o`` weights, ``b`` the fp32 lanes of the vector registers."""
    from tuner.device import parse_device
    from tuner.graph.layout.plan import vector_lanes

    target = parse_device("cpu").target
    b = vector_lanes(target)
    data = te.placeholder((1, c_in // b, hw, hw, b), name="data")
    kernel = te.placeholder((c_out // b, c_in // b, k, k, b, b), name="kernel")
    bias = te.placeholder((1, c_out // b, 1, 1, b), name="bias")
    with target:  # conv2d_NCHWc asks for a current target
        conv = topi.nn.conv2d_NCHWc(data, kernel, stride, k // 2, 1, layout=f"NCHW{b}c", out_layout=f"NCHW{b}c")
    out = topi.nn.relu(topi.add(conv, bias))
    return te.create_prim_func([data, kernel, bias, out]), _torch_conv(c_in, c_out, hw, k, stride)


def _dense(m: int, k: int, n: int):
    x = te.placeholder((m, k), name="x")
    w = te.placeholder((k, n), name="w")  # as Relax lays out a constant nn.Linear weight
    b = te.placeholder((n,), name="b")
    out = topi.add(topi.matmul(x, w), b)
    return te.create_prim_func([x, w, b, out]), {"kind": "dense", "args": [(m, k), (k, n), (n,)]}


WORKLOADS = {
    "conv3x3_64_56": lambda: _conv(64, 64, 56, 3),
    "conv3x3_128_28": lambda: _conv(128, 128, 28, 3),
    "conv1x1_1024_256_14": lambda: _conv(1024, 256, 14, 1),
    "bert_dense_768": lambda: _dense(128, 768, 768),
    # The convs in the layout Nightshift's job tunes them in (``--layout auto``, the default).
    "conv3x3_64_56_nchwc": lambda: _conv_nchwc(64, 64, 56, 3),
    "conv3x3_128_28_nchwc": lambda: _conv_nchwc(128, 128, 28, 3),
    "conv1x1_1024_256_14_nchwc": lambda: _conv_nchwc(1024, 256, 14, 1),
}
DEFAULT_TASKS = ["conv3x3_64_56", "conv3x3_128_28", "conv1x1_1024_256_14", "bert_dense_768"]


def _task(name: str):
    from tvm.s_tir.analysis import estimate_tir_flops

    from tuner.graph.keys import workload_key
    from tuner.graph.tasks import Task

    func, torch_op = WORKLOADS[name]()
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    return Task(name, mod, 1, float(estimate_tir_flops(mod)), workload_key(mod)), torch_op


def _load(out: Path) -> dict:
    return json.loads(out.read_text()) if out.exists() else {"benchmark": "search_vs_metaschedule", "phases": {}}


def _save(result: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))


def _key(name: str, trials: int) -> str:
    return f"{name}/{trials}"


def _cores(device) -> int:
    return int(device.target_config.get("num-cores", 1))


def _machine(device) -> dict:
    return {"cpu": device.description.get("model"), "arch": device.arch, "cores": _cores(device),
            "load_avg": os.getloadavg(), "python": platform.python_version(), "tvm": tvm.__version__}


def phase_metaschedule(args, device) -> dict:
    from tvm.s_tir import meta_schedule as ms

    from tuner.compile import preload_tensor_intrinsics

    preload_tensor_intrinsics()
    os.environ["TVM_NUM_THREADS"] = str(_cores(device))  # MetaSchedule's runner processes inherit it
    out = {}
    for name in args.tasks:
        task, _ = _task(name)
        work = WORK / f"ms_{name}_{args.trials}"
        if work.exists():
            for f in work.iterdir():
                f.unlink() if f.is_file() else None
        t0 = time.monotonic()
        with _LineCounter(work / "database_tuning_record.json", t0) as counter:
            db = ms.tune_tir(task.mod, device.target, str(work), max_trials_global=args.trials,
                             num_trials_per_iter=32, seed=args.seed,
                             builder=ms.builder.LocalBuilder(timeout_sec=args.ms_build_timeout))  # fmt: skip
        wall = time.monotonic() - t0
        curve = ms_curve(work / "database_tuning_record.json")
        best = curve[-1] if curve else None
        top = db.get_top_k(db.commit_workload(task.mod), 1)
        out[_key(name, args.trials)] = {
            "wall_s": wall, "trials": len(curve), "best_s": best, "curve_best_s": curve,
            # When each record reached MetaSchedule's database file (polled every 0.5 s).
            "curve_t_s": counter.times(len(curve), wall),
            "best_trace": json.dumps(top[0].as_json()) if top else None}  # fmt: skip
        logger.info("metaschedule %s: %d trials in %.0f s, best %.3g s", name, len(curve), wall, best or 0)
    return out


def ms_curve(records_file: Path) -> list[float | None]:
    """Best latency so far after each trial, in trial order: the order MetaSchedule appended
    its records to the file (``get_all_tuning_records`` returns them sorted by latency)."""
    curve, best = [], None
    for line in records_file.read_text().splitlines():
        run_secs = json.loads(line)[1][1]
        sec = float(np.mean([float(s) for s in run_secs])) if run_secs else None
        if sec is not None and sec < 1e9:  # failed builds and runs are stored as 1e10
            best = sec if best is None else min(best, sec)
        curve.append(best)
    return curve


def phase_nightshift(args, device, save=None) -> dict:
    from tuner.db import TuningDatabase
    from tuner.job import TuneConfig, tune_tasks
    from tuner.measure.ray_measure import connect

    connect(None)
    out: dict = {}
    for name in args.tasks:
        task, _ = _task(name)
        for strategy in args.strategies:
            for seed in range(args.seeds):
                path = WORK / f"ns_{name}_{strategy}_{seed}.db"
                path.unlink(missing_ok=True)
                db = TuningDatabase(str(path))
                t0, started = time.monotonic(), _utcnow()
                config = TuneConfig(trials=args.trials, seed=seed, strategy=strategy)
                summary = tune_tasks([task], device, db, config, model_name=f"bench-{name}")
                wall = time.monotonic() - t0
                curve, times = _curve(db, task, started)
                out.setdefault(_key(name, args.trials), {}).setdefault(strategy, []).append({
                    "seed": seed, "wall_s": wall, "trials": summary.trials, "errors": summary.errors,
                    "best_s": _last(curve), "curve_best_s": curve, "curve_t_s": times,
                    "db": str(path)})  # fmt: skip
                logger.info("nightshift %s %s seed %d: %.0f s, best %.3g s", name, strategy, seed, wall,
                            _last(curve) or 0)  # fmt: skip
                if save is not None:
                    save(out)  # a long phase keeps what it has measured
                db.close()
    return out


def _utcnow():
    from datetime import UTC, datetime

    return datetime.now(UTC).replace(tzinfo=None)  # the database stores naive UTC


def _last(curve: list[float | None]) -> float | None:
    return curve[-1] if curve else None


def _curve(db, task, started, *, job_id: int | None = None) -> tuple[list[float | None], list[float]]:
    """Best-so-far latency after each record (in the order stored) and the seconds since
    ``started`` at which each was stored; only job ``job_id``'s records when given."""
    from sqlalchemy import select

    from tuner.db.schema import RecordRow, WorkloadRow

    with db.session(write=False) as s:
        wid = s.scalar(select(WorkloadRow.id).where(WorkloadRow.key == task.workload_key))
        q = select(RecordRow.mean_sec, RecordRow.error_class, RecordRow.error_msg, RecordRow.created_at).where(
            RecordRow.workload_id == wid)
        if job_id is not None:
            q = q.where(RecordRow.job_id == job_id)
        rows = s.execute(q.order_by(RecordRow.id)).all()
    curve, times, best = [], [], None
    for m, e, msg, at in rows:
        # An early-stopped probe is a lower bound, not a latency; it never counts as a best.
        if m is not None and e is None and not (msg or "").startswith("stopped early"):
            best = m if best is None else min(best, m)
        curve.append(best)
        times.append((at.replace(tzinfo=None) - started).total_seconds())
    return curve, times


class _LineCounter:
    """Polls a JSON-lines file in a thread: when its line count grew (MetaSchedule appends a
    tuning record per line as each batch completes)."""

    def __init__(self, path: Path, t0: float) -> None:
        import threading

        self.path, self.t0, self.seen = path, t0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        n = 0
        while not self._stop.wait(0.5):
            try:
                lines = sum(1 for line in self.path.read_text().splitlines() if line.strip())
            except OSError:
                continue
            if lines > n:
                self.seen.extend([time.monotonic() - self.t0] * (lines - n))
                n = lines

    def times(self, count: int, wall: float) -> list[float]:
        return (self.seen + [wall] * count)[:count]


def phase_warmstart(args, device, result: dict) -> dict:
    """A second evolutionary job warm-started from the first one's database, and a cold one."""
    import shutil

    from tuner.db import TuningDatabase
    from tuner.job import TuneConfig, tune_tasks
    from tuner.measure.ray_measure import connect

    connect(None)
    out: dict = {}
    for name in args.tasks:
        key = _key(name, args.trials)
        task, _ = _task(name)
        first = result["phases"].get("nightshift", {}).get(key, {}).get("evolutionary")
        stored = WORK / f"ns_{name}_evolutionary_0.db"
        if not first and stored.exists():
            # A first job whose phase was cut short: its database holds everything it measured.
            db = TuningDatabase(str(stored))
            job = min(j for j, _ in db.jobs())
            curve, times = _curve(db, task, job.created_at.replace(tzinfo=None))
            first = [{"seed": 0, "best_s": _last(curve), "trials": len(curve), "db": str(stored), "curve_best_s": curve,
                      "curve_t_s": times, "wall_s": times[-1] if times else None}]  # fmt: skip
            result["phases"].setdefault("nightshift", {}).setdefault(key, {})["evolutionary"] = first
            db.close()
        if not first:
            logger.warning("warmstart %s: no evolutionary run at %d trials to start from", name, args.trials)
            continue
        row: dict = {"first_best_s": first[0]["best_s"], "first_trials": first[0]["trials"]}
        for mode in ("warm", "cold"):
            path = WORK / f"ns_{name}_{mode}_{args.trials}.db"
            path.unlink(missing_ok=True)
            if mode == "warm":
                shutil.copy(first[0]["db"], path)
            db = TuningDatabase(str(path))
            t0, started = time.monotonic(), _utcnow()
            config = TuneConfig(trials=args.warm_trials, seed=7, strategy="evolutionary", name=f"{mode}-start")
            summary = tune_tasks([task], device, db, config, model_name=f"bench-{name}")
            job_id = max(j.id for j, _ in db.jobs())
            curve, times = _curve(db, task, started, job_id=job_id)
            row[mode] = {"wall_s": time.monotonic() - t0, "trials": summary.trials, "best_s": _last(curve),
                         "curve_best_s": curve, "curve_t_s": times}  # fmt: skip
            db.close()
        first_best, warm_best = row["first_best_s"], row["warm"]["best_s"]
        row["warm_vs_first"] = warm_best / first_best if warm_best and first_best else None
        logger.info("warmstart %s: first %s trials %.3g s; warm %d trials %.3g s; cold %.3g s", name,
                    row["first_trials"], first_best or 0, row["warm"]["trials"], warm_best or 0,
                    row["cold"]["best_s"] or 0)  # fmt: skip
        out[key] = row
    return out


def phase_plot(result: dict, out: Path) -> None:
    """Per task and budget: best latency against trials and against wall time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({*result["phases"].get("metaschedule", {}), *result["phases"].get("nightshift", {})})
    fig, axes = plt.subplots(len(keys), 2, figsize=(11, 3.2 * len(keys)), squeeze=False)
    for row, key in zip(axes, keys, strict=True):
        lines = {}
        ms_run = result["phases"].get("metaschedule", {}).get(key)
        if ms_run:
            lines["MetaSchedule"] = ms_run
        for strategy, runs in result["phases"].get("nightshift", {}).get(key, {}).items():
            for run in runs:
                lines[f"Nightshift {strategy}" + (f" s{run['seed']}" if len(runs) > 1 else "")] = run
        warm = result["phases"].get("warmstart", {}).get(key)
        if warm:
            lines["warm-started 2nd job"] = warm["warm"]
            lines["cold job, as many trials"] = warm["cold"]
        for label, run in lines.items():
            ys = [y * 1e3 if y is not None else np.nan for y in run["curve_best_s"]]
            # Markers: a job of one batch stores its records at one instant.
            row[0].plot(range(1, len(ys) + 1), ys, label=label, drawstyle="steps-post", marker=".")
            if run.get("curve_t_s"):
                row[1].plot(run["curve_t_s"], ys, label=label, drawstyle="steps-post", marker=".")
        for ax, xlabel in zip(row, ("trials", "wall time (s)"), strict=True):
            ax.set_xlabel(xlabel)
            ax.set_ylabel("best latency (ms)")
            ax.set_yscale("log")
            ax.set_title(key)
            ax.grid(alpha=0.3)
        row[0].legend(fontsize=7)
    fig.tight_layout()
    png = out.with_suffix(".png")
    fig.savefig(png, dpi=90)
    logger.info("wrote %s", png)


def phase_compare(args, device, result: dict) -> dict:
    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

    from tuner.compile import preload_tensor_intrinsics
    from tuner.db import TuningDatabase

    preload_tensor_intrinsics()
    device.use_threads()
    dev = tvm.cpu()
    out = {}
    for name in args.tasks:
        key = _key(name, args.trials)
        task, torch_op = _task(name)
        builds: dict[str, tvm.runtime.Module] = {}
        ms_res = result["phases"].get("metaschedule", {}).get(key)
        if ms_res and ms_res.get("best_trace"):
            rec = TuningRecord.from_json(json.loads(ms_res["best_trace"]), Workload(task.mod))
            sch = Schedule(task.mod)
            rec.trace.apply_to_schedule(sch, remove_postproc=False)
            builds["metaschedule"] = tvm.compile(sch.mod, target=device.target)
        runs_of = dict(result["phases"].get("nightshift", {}).get(key, {}))
        warm = result["phases"].get("warmstart", {}).get(key)
        if warm:
            runs_of["warm-started"] = [{"seed": 7, "db": str(WORK / f"ns_{name}_warm_{args.trials}.db"),
                                        "job": "warm-start"}]  # fmt: skip
        for strategy, runs in runs_of.items():
            for run in runs:
                if not Path(run["db"]).exists():
                    continue
                db = TuningDatabase(run["db"])
                best = _best_of_job(db, task, device, run.get("job"))
                if best:
                    rec = TuningRecord.from_json(json.loads(best[0].record_json), Workload(task.mod))
                    sch = Schedule(task.mod)
                    rec.trace.apply_to_schedule(sch, remove_postproc=False)
                    builds[f"{strategy}/seed{run['seed']}"] = tvm.compile(sch.mod, target=device.target)
                db.close()
        from tvm.s_tir.meta_schedule.arg_info import ArgInfo

        args_np = [np.random.default_rng(0).uniform(-1, 1, [int(d) for d in a.shape]).astype("float32")
                   for a in ArgInfo.from_prim_func(task.mod["main"])]  # fmt: skip
        tensors = [tvm.runtime.tensor(a, dev) for a in args_np]
        timers = {k: m.jit().time_evaluator("main", dev, number=5, repeat=1, min_repeat_ms=50)
                  for k, m in builds.items()}
        torch_fn = _torch_op(torch_op, _cores(device))
        samples: dict[str, list[float]] = {k: [] for k in [*timers, "pytorch"]}
        for _ in range(args.rounds):  # interleaved: noise hits every entry alike
            for k, timer in timers.items():
                samples[k].append(float(timer(*tensors).mean))
            samples["pytorch"].append(torch_fn())
        med = {k: float(np.median(v)) for k, v in samples.items() if v}
        out[key] = {"gflop": task.flops / 1e9, "median_s": med,
                     "gflops": {k: task.flops / v / 1e9 for k, v in med.items()}}  # fmt: skip
        logger.info("compare %s: %s", name, {k: f"{v * 1e3:.3f} ms" for k, v in med.items()})
    return out


def _best_of_job(db, task, device, job_name: str | None) -> list:
    """The fastest record of the task (only job ``job_name``'s when given)."""
    if job_name is None:
        return db.best(task.workload_key, db.device_id(device), k=1)
    job_id = max(j.id for j, _ in db.jobs() if j.name == job_name)
    return [r for r in db.best(task.workload_key, db.device_id(device), k=10_000) if r.job_id == job_id][:1]


def _torch_op(spec: dict, threads: int):
    import torch

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    args = [torch.rand(*s, generator=g) for s in spec["args"]]
    if spec["kind"] == "conv":
        def fn():
            return torch.relu(torch.nn.functional.conv2d(args[0], args[1], stride=spec["stride"],
                                                         padding=spec["padding"]) + args[2])
    else:
        def fn():
            return torch.addmm(args[2], args[0], args[1])

    def timed() -> float:
        with torch.no_grad():
            fn()
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < 0.05 or n < 5:
                fn()
                n += 1
            return (time.perf_counter() - t0) / n

    return timed


def phase_table(result: dict) -> str:
    """Markdown: per task and budget, each re-timed best against MetaSchedule's and PyTorch's,
    and each tool's wall time for the trials against MetaSchedule's."""
    rows = ["| task / trials | tool | re-timed ms | / MetaSchedule | / PyTorch | wall s | wall / MS |",
            "|---|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    phases = result["phases"]
    for key, cmp in sorted(phases.get("compare", {}).items()):
        med = cmp["median_s"]
        ms, torch_s = med.get("metaschedule"), med.get("pytorch")
        walls = {"metaschedule": phases.get("metaschedule", {}).get(key, {}).get("wall_s")}
        for strategy, runs in phases.get("nightshift", {}).get(key, {}).items():
            for run in runs:
                walls[f"{strategy}/seed{run['seed']}"] = run["wall_s"]
        for tool, sec in med.items():
            wall = walls.get(tool)
            ratio = f"{sec / ms:.2f}" if ms else "-"
            wall_ratio = f"{wall / walls['metaschedule']:.2f}" if wall and walls["metaschedule"] else "-"
            rows.append(f"| {key} | {tool} | {sec * 1e3:.3f} | {ratio} | {sec / torch_s:.2f} | "
                        f"{'-' if wall is None else f'{wall:.0f}'} | {wall_ratio} |")  # fmt: skip
    return "\n".join(rows)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--phase", choices=("metaschedule", "nightshift", "warmstart", "compare", "plot", "table"),
                   required=True)  # fmt: skip
    p.add_argument("--tasks", nargs="+", default=DEFAULT_TASKS, choices=list(WORKLOADS))
    p.add_argument("--trials", type=int, default=64)
    p.add_argument("--strategies", nargs="+", default=["evolutionary", "random", "optuna-tpe"])
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--warm-trials", type=int, default=8)
    # MetaSchedule's LocalBuilder default. Each builder process of each search round first
    # imports tvm.s_tir.tensor_intrin, 33-36 s of CPU on a 2-core AMD EPYC (2026-11-24), and
    # that import counts against the timeout: at 30 s every build of every round was killed,
    # on a quiet machine too. 120 lets MetaSchedule build; its wall time includes the import.
    p.add_argument("--ms-build-timeout", type=float, default=30.0)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    from tuner.device import parse_device

    device = parse_device("cpu")
    result = _load(args.out)
    if args.phase == "plot":
        phase_plot(result, args.out)
        return
    if args.phase == "table":
        print(phase_table(result))
        return
    if args.phase == "metaschedule":
        data = phase_metaschedule(args, device)
    elif args.phase == "nightshift":
        def save(partial: dict) -> None:
            result["phases"].setdefault("nightshift", {}).update(partial)
            _save(result, args.out)

        data = phase_nightshift(args, device, save)
    elif args.phase == "warmstart":
        data = phase_warmstart(args, device, result)
    else:
        data = phase_compare(args, device, result)
    phase = result["phases"].setdefault(args.phase, {})
    phase.update(data)
    result.setdefault("runs", []).append({"phase": args.phase, "argv": os.sys.argv[1:], "machine": _machine(device),
                                          "finished": time.strftime("%Y-%m-%d %H:%M:%S")})  # fmt: skip
    _save(result, args.out)


if __name__ == "__main__":
    main()
