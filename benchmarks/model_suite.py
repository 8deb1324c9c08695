"""The public model suite: models Nightshift was not developed against, each tuned from an empty
database and then timed against ONNX Runtime, OpenVINO (f32) and PyTorch eager in one run.

Per model, in this order:

1. ``tune --model SOURCE --device cpu`` in a process of its own, on a new SQLite database, with
   the budget (``--trials 512`` or ``--time-budget 20m``): its exit code, its last error line
   when it fails, its wall time and the trials it measured (from its ``--log-json`` events).
2. ``nightshift bench``'s comparison (tuner/bench.py) in another process: the database's build
   and the zero-trial fallback against the peers, interleaved in rounds on one random input,
   each entry's output error against ONNX Runtime's.
3. The input's own sensitivity: how far ONNX Runtime's output moves for another random input,
   on the same scale as the error. An error is only evidence of a correct build where it is
   far below this; a model whose output hardly depends on its input checks nothing.

Results go into ``benchmarks/results/model_suite_<budget>_<arch>.json``, rewritten after every
model, so a killed run keeps what finished; ``--resume`` skips the models already there.

    nice -n 10 .venv/bin/python benchmarks/model_suite.py --trials 512
    nice -n 10 .venv/bin/python benchmarks/model_suite.py --time-budget 20m
    .venv/bin/python benchmarks/model_suite.py --trials 16 --models squeezenet1_1 onnx-squeezenet   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).parent))
from result_file import machine, run_commands, write_result
from settle import settle

console = Console(width=150)  # the table is read in log files too
RESULTS = Path(__file__).parent / "results"
# openvino-f32 sets INFERENCE_PRECISION_HINT=f32: OpenVINO's default is bf16 on CPUs with
# AVX512_BF16 or AMX, and the suite compares fp32 builds.
PEERS = ("onnxruntime", "openvino-f32", "torch")

#: The suite: a short name and what ``--model`` is given. ``onnx-data:NAME`` is a graph of
#: the onnx wheel's backend test data (resolved where the wheel is installed), run with
#: seeded random weights in place of its one-value ones (:func:`seeded_weights`).
SUITE: dict[str, str] = {
    "mobilenet_v3_large": "torchvision:mobilenet_v3_large",
    "shufflenet_v2_x1_0": "torchvision:shufflenet_v2_x1_0",
    "mnasnet1_0": "torchvision:mnasnet1_0",
    "densenet121": "torchvision:densenet121",
    "googlenet": "torchvision:googlenet",
    "inception_v3": "torchvision:inception_v3",
    "squeezenet1_1": "torchvision:squeezenet1_1",
    "resnext50_32x4d": "torchvision:resnext50_32x4d",
    "swin_t": "torchvision:swin_t",
    "deeplabv3_mobilenet_v3_large": "torchvision:deeplabv3_mobilenet_v3_large",
    "gpt2": "hf:gpt2",
    "distilbert": "hf:distilbert-base-uncased",
    "onnx-resnet50": "onnx-data:light_resnet50",
    "onnx-squeezenet": "onnx-data:light_squeezenet",
}


def resolve(source: str, workdir: Path) -> str:
    """``--model`` text for a suite entry: an ``onnx-data:`` name becomes a copy of the test
    graph in ``workdir`` with seeded random weights (:func:`seeded_weights`)."""
    if not source.startswith("onnx-data:"):
        return source
    import onnx

    name = source.partition(":")[2]
    path = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"{name}.onnx"
    if not path.is_file():
        raise SystemExit(f"{path} is missing: the installed onnx wheel has no {name} test graph")
    return str(seeded_weights(path, workdir / f"{name}.onnx"))


def seeded_weights(path: Path, out: Path, seed: int = 0) -> Path:
    """``path`` written to ``out`` with every weight that a ``ConstantOfShape`` node fills with
    one value (the onnx wheel's "light" graphs hold no other) replaced by seeded random values.

    A weight of one value makes every channel alike, and those graphs' outputs do not move
    with the input at all: an output check on them proves nothing. Matrices and kernels get
    He-normal values (unit-scale activations through ReLUs), batch norm scales values in
    [0.2, 0.5) (a residual network's sums would otherwise double per block and saturate its
    softmax), variances in [0.5, 1.5), everything else (biases, means) a small normal. The graph, its
    operators and shapes are unchanged.
    """
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    consts = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    users: dict[str, list[tuple[str, int]]] = {}
    for node in graph.node:
        for i, name in enumerate(node.input):
            users.setdefault(name, []).append((node.op_type, i))
    rng = np.random.default_rng(seed)
    keep = []
    for node in graph.node:
        if node.op_type != "ConstantOfShape" or node.input[0] not in consts:
            keep.append(node)
            continue
        shape = tuple(int(d) for d in consts[node.input[0]])
        if len(shape) >= 2:
            value = rng.normal(0.0, np.sqrt(2.0 / max(1, int(np.prod(shape[1:])))), shape)
        elif ("BatchNormalization", 1) in users.get(node.output[0], []):
            value = rng.uniform(0.2, 0.5, shape)  # below 1, as trained: residual sums stay in range
        elif ("BatchNormalization", 4) in users.get(node.output[0], []):
            value = rng.uniform(0.5, 1.5, shape)
        else:
            value = rng.normal(0.0, 0.1, shape)
        fill = next((numpy_helper.to_array(a.t) for a in node.attribute if a.name == "value"), np.zeros(1, np.float32))
        graph.initializer.append(numpy_helper.from_array(value.astype(fill.dtype), node.output[0]))
        if model.ir_version < 4:  # before IR 4 an initializer must be a graph input too (the light graphs are IR 3)
            elem = onnx.helper.np_dtype_to_tensor_dtype(fill.dtype)
            graph.input.append(onnx.helper.make_tensor_value_info(node.output[0], elem, shape))
    del graph.node[:]
    graph.node.extend(keep)
    used = {name for node in graph.node for name in node.input}
    unused = [i for i in graph.initializer if i.name not in used and i.name not in {o.name for o in graph.output}]
    for init in unused:  # the replaced nodes' shape inputs (listed as graph inputs too, in old files)
        graph.initializer.remove(init)
    gone = {i.name for i in unused}
    for value in [v for v in graph.input if v.name in gone]:
        graph.input.remove(value)
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(out))
    return out


def tune(source: str, budget: list[str], workdir: Path, seq_len: int | None) -> dict[str, Any]:
    """Run ``tune`` on an empty database; its outcome, wall time and trials."""
    db, out, log = workdir / "tuning.db", workdir / "model.so", workdir / "events.jsonl"
    cmd = [sys.executable, "-m", "tuner.cli", "tune", "--model", source, "--device", "cpu", "--db", str(db),
           "-o", str(out), "--log-json", str(log), *budget]  # fmt: skip
    if seq_len is not None and source.startswith("hf:"):
        cmd += ["--seq-len", str(seq_len)]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - start
    end = _last_event(log, "job_end")
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if "error" in line.lower()]
    tracebacks = (proc.stdout + proc.stderr).count("Traceback (most recent call last)")
    return {
        "command": " ".join(cmd[2:]), "exit_code": proc.returncode, "wall_s": round(wall, 1),
        "trials": end.get("trials_done") if end else None, "job_state": end.get("state") if end else None,
        "error": errors[-1].strip() if proc.returncode and errors else None, "tracebacks_shown": tracebacks,
        "db": str(db),
    }  # fmt: skip


def _last_event(log: Path, kind: str) -> dict[str, Any] | None:
    if not log.is_file():
        return None
    found = None
    for line in log.read_text().splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a kill
            continue
        if event.get("event") == kind:
            found = event
    return found


def bench_one(source: str, db: str, rounds: int, seq_len: int | None, *, peers: tuple[str, ...] = PEERS,
              fallback: bool = True, with_sensitivity: bool = True) -> dict[str, Any]:  # fmt: skip
    """The comparison and the input's sensitivity, in this process (the ``--bench-one`` mode);
    ``fallback=False`` leaves out the zero-trial build, ``with_sensitivity=False`` the second input."""
    import dataclasses

    from tuner.app.plan import measured_plan
    from tuner.bench import BenchConfig, bench, peer_model, scaled_max_error
    from tuner.db import TuningDatabase
    from tuner.device import parse_device
    from tuner.frontends import load_model
    from tuner.peers import create

    kwargs: dict[str, Any] = {"seq_len": seq_len} if seq_len is not None and source.startswith("hf:") else {}
    spec = load_model(source, **kwargs)
    device = parse_device("cpu")
    database = TuningDatabase(db)
    config = BenchConfig(rounds=rounds, peers=peers, fallback=fallback)
    chosen = measured_plan(spec, device, database)
    if chosen is not None:
        config = dataclasses.replace(config, plan=chosen.plan, layout_choice=chosen)
    result = bench(spec, device, database, source=source, config=config).to_json()
    if not with_sensitivity:
        return result

    # How much the reference's output moves for another input: the scale the errors are read on.
    sensitivity: dict[str, Any] = {"value": None, "runtime": None, "reason": None}
    threads = int(device.target_config.get("num-cores") or 1)
    with tempfile.TemporaryDirectory(prefix="nightshift-suite-") as tmp:
        model = peer_model(spec, source, Path(tmp))
        for name in ("onnxruntime", "torch"):
            peer = create(name)
            if not peer.available():
                continue
            try:
                peer.prepare(model, threads)
                first, second = peer.run(spec.random_inputs(seed=0)), peer.run(spec.random_inputs(seed=1))
            except Exception as err:  # a peer that cannot run the model: try the next
                sensitivity["reason"] = f"{name}: {type(err).__name__}: {err}"
                continue
            sensitivity.update(value=scaled_max_error(first, second), runtime=name, reason=None)
            break
    result["input_sensitivity"] = sensitivity
    return result


def bench_in_child(script: Path, source: str, db: str, part: Path, rounds: int,
                   seq_len: int | None) -> tuple[dict[str, Any] | None, str | None]:  # fmt: skip
    """``script --bench-one`` in a process of its own (no tuning job's threads or memory beside
    the timing): its result, or None and the last line of its error."""
    cmd = [sys.executable, str(script), "--bench-one", source, db, str(part), "--rounds", str(rounds)]
    if seq_len is not None:
        cmd += ["--seq-len", str(seq_len)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode == 0:
        return json.loads(part.read_text()), None
    return None, (proc.stderr.strip().splitlines() or ["(no output)"])[-1]


def profile(source: str, db: str, name: str, rounds: int, arch: str) -> str:
    """Where the tuned model's time goes (op_profile.py in a process of its own): the JSON's
    path (named for the model and the CPU kind), or the error's last line."""
    out = RESULTS / f"op_profile_{name}_{arch}.json"
    cmd = [sys.executable, str(Path(__file__).with_name("op_profile.py")), "--db", db, "--model", source,
           "--rounds", str(rounds), "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return "failed: " + (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
    return str(out.relative_to(RESULTS.parent.parent)) if out.is_relative_to(RESULTS.parent.parent) else str(out)


def code_version() -> dict[str, Any]:
    """The commit the model was tuned and timed with, and whether the tree had changes: a
    suite run spans hours, and the rows of one file may come from several commits."""
    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {"commit": git("rev-parse", "--short", "HEAD") or None, "dirty": bool(git("status", "--porcelain", "-uno"))}


def summarize(name: str, source: str, tuned: dict[str, Any], bench: dict[str, Any] | None) -> dict[str, Any]:
    """One row of the table: the ratios the issue asks for, taken from the bench entries."""
    row: dict[str, Any] = {"model": name, "source": source, "code": code_version(), "tune": tuned, "bench": bench}
    if bench is None:
        return row
    from tuner.bench import TVM_DB, TVM_FALLBACK

    entries = {e["key"]: e for e in bench["entries"]}
    tvm = entries.get(TVM_DB) if entries.get(TVM_DB, {}).get("median_ms") else None
    fallback = entries.get(TVM_FALLBACK, {}).get("median_ms")
    ms = {k: e["median_ms"] for k, e in entries.items() if e.get("median_ms")}
    row["tvm_ms"] = tvm["median_ms"] if tvm else None
    row["ratio_vs_fallback"] = (row["tvm_ms"] / fallback) if row["tvm_ms"] and fallback else None
    for peer in PEERS:
        row[f"ratio_vs_{peer}"] = (row["tvm_ms"] / ms[peer]) if row["tvm_ms"] and peer in ms else None
    fastest = bench.get("fastest_peer")
    row["fastest_peer"] = fastest
    row["ratio_vs_fastest_peer"] = tvm.get("ratio_to_fastest_peer") if tvm else None
    row["max_error_vs_reference"] = tvm.get("max_error") if tvm else None
    row["output_ok"] = tvm.get("agrees") if tvm else None
    # A peer whose output differs from the reference's is left out of the fastest peer.
    row["peer_mismatches"] = bench.get("peer_mismatches", [])
    row["input_sensitivity"] = bench.get("input_sensitivity", {}).get("value")
    return row


def render(rows: list[dict[str, Any]], title: str) -> Table:
    """The suite's table: latency ratios (lower is better), error beside sensitivity, time, trials."""
    table = Table(title=title)
    for col in ("model", "tune", "x fastest peer", "x ORT", "x OpenVINO", "x eager", "error", "sensitivity",
                "minutes", "trials"):  # fmt: skip
        table.add_column(col, justify="left" if col in ("model", "tune") else "right")

    def ratio(v: float | None) -> str:
        return "" if v is None else f"{v:.2f}x"

    def sci(v: float | None) -> str:
        return "" if v is None else f"{v:.1e}"

    for r in rows:
        t = r["tune"]
        state = "ok" if t["exit_code"] == 0 else f"exit {t['exit_code']}"
        table.add_row(r["model"], state, ratio(r.get("ratio_vs_fastest_peer")), ratio(r.get("ratio_vs_onnxruntime")),
                      ratio(r.get("ratio_vs_openvino-f32")), ratio(r.get("ratio_vs_torch")),
                      sci(r.get("max_error_vs_reference")), sci(r.get("input_sensitivity")),
                      f"{t['wall_s'] / 60:.1f}", str(t.get("trials") or ""))  # fmt: skip
    return table


def geomean(values: list[float]) -> float | None:
    """Geometric mean, or None for no values."""
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--trials", type=int, help="trials per model (the suite's first budget: 512)")
    budget.add_argument("--time-budget", help="wall time per model (the suite's second budget: 20m)")
    p.add_argument("--models", nargs="+", default=list(SUITE), help=f"suite names (default all: {' '.join(SUITE)})")
    p.add_argument("--seq-len", type=int, default=128, help="sequence length of the hf: models (default 128)")
    p.add_argument("--rounds", type=int, default=20, help="interleaved timing rounds per model (default 20)")
    p.add_argument("--workdir", type=Path, default=None, help="keep each model's database and artifact here")
    p.add_argument("--out", type=Path, default=None, help="JSON (default results/model_suite_<budget>_<arch>.json)")
    p.add_argument("--resume", action="store_true", help="skip the models already in --out")
    p.add_argument("--profile", action="store_true", help="also profile each tuned model per operator beside the "
                   "peers (op_profile.py; results/op_profile_<model>_<arch>.json)")
    p.add_argument("--settle", type=float, default=300.0, help="wait up to this long for a quiet machine before timing")
    p.add_argument("--bench-one", nargs=3, metavar=("SOURCE", "DB", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.bench_one:
        source, db, out = args.bench_one
        Path(out).write_text(json.dumps(bench_one(source, db, args.rounds, args.seq_len)))
        return

    if not (args.trials or args.time_budget):
        p.error("give the budget: --trials N or --time-budget DURATION")
    unknown = [m for m in args.models if m not in SUITE]
    if unknown:
        raise SystemExit(f"unknown suite models {unknown}; known: {' '.join(SUITE)}")
    from tuner.device import parse_device

    device = parse_device("cpu")
    label = f"{args.trials}trials" if args.trials else args.time_budget
    out = args.out or RESULTS / f"model_suite_{label}_{device.arch}.json"
    budget_args = ["--trials", str(args.trials)] if args.trials else ["--time-budget", args.time_budget]
    rows: list[dict[str, Any]] = []
    earlier_commands: list[str] = []  # the runs a --resume continues; the file's `command` is this one
    if args.resume and out.is_file():
        earlier = json.loads(out.read_text())
        rows, earlier_commands = earlier.get("models", []), run_commands(earlier)
    done = {r["model"] for r in rows}
    load_before = os.getloadavg()
    root = args.workdir or Path(tempfile.mkdtemp(prefix="nightshift-suite-"))
    for name in args.models:
        if name in done:
            continue
        workdir = root / name
        workdir.mkdir(parents=True, exist_ok=True)
        source = resolve(SUITE[name], workdir)
        for stale in ("tuning.db", "model.so", "events.jsonl"):  # each model tunes from an empty database
            (workdir / stale).unlink(missing_ok=True)
        console.print(f"[bold]{name}[/]: tune {source} {' '.join(budget_args)}", highlight=False)
        tuned = tune(source, budget_args, workdir, args.seq_len)
        bench = None
        if tuned["exit_code"] == 0:
            if args.settle:
                settle(args.settle, console)
            bench, error = bench_in_child(Path(__file__), source, tuned["db"], workdir / "bench.json",
                                          args.rounds, args.seq_len)  # fmt: skip
            if error is not None:
                tuned["bench_error"] = error
            if args.profile:
                tuned["op_profile"] = profile(source, tuned["db"], name, args.rounds, device.arch)
        else:
            console.print(f"  [red]tune failed[/]: {tuned['error']}", highlight=False)
        rows.append(summarize(name, source, tuned, bench))
        ratios = [r["ratio_vs_fastest_peer"] for r in rows if r.get("ratio_vs_fastest_peer")]
        write_result(out, "model_suite", {
            "earlier_commands": earlier_commands,
            "budget": budget_args, "peers": list(PEERS), "seq_len": args.seq_len, "rounds": args.rounds,
            "machine": machine(device, load_before),
            "summary": {"models": len(rows), "tune_failures": sum(r["tune"]["exit_code"] != 0 for r in rows),
                        "wrong_outputs": sum(r.get("output_ok") is False for r in rows),
                        "geomean_ratio_vs_fastest_peer": geomean(ratios),
                        "worst_ratio_vs_fastest_peer": max(ratios) if ratios else None},
            "models": rows,
        })  # fmt: skip
        console.print(render(rows[-1:], name))
    console.print(render(rows, f"model suite, {' '.join(budget_args)}"))
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
