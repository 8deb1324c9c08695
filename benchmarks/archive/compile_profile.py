"""Where compiling a model from the tuning database spends its time, phase by phase and per
fused function (issue 9, item 5: compile time near the plain build's).

One process. First the whole build as ``nightshift compile`` does it
(:func:`tuner.compile.compile_model`) and the plain build (no database), for the totals (the
first build of a process also pays one-time imports); then the same
steps taken apart: Relax preparation (precision, layouts, folding), fusion, the database
lookups and trace replays (``MetaScheduleApplyDatabase``), and then every scheduled
function built alone: TIR lowering, LLVM's IR generation and optimization (``target.build``),
and machine code (the object file, as ``export_library`` writes it, which the in-process VM
does by JIT on its first call instead). Functions are ranked by their LLVM time with what they
got (record, template, fallback) and the size of their LLVM IR. Last, the scheduled functions
built as one TIR module twice: as TVM does (one LLVM module) and one LLVM module per function
(:mod:`tuner.codegen`, what ``compile_model`` does on CPUs).

    .venv/bin/python benchmarks/archive/compile_profile.py --db tuned.db --model resnet50 \\
        [--precision bf16] [--top 15] [--latency-rounds 20] [--copies 16] [--out results/compile_profile_X.json]

``--latency-rounds`` also compiles the model with TVM's one LLVM module and times both builds
of the model in interleaved rounds: the split must not cost run time. ``--copies N`` builds
1, 4, 8 and N copies of the slowest function as one LLVM module: whether TVM's build time grows
with the module rather than with any one function.

The per-function sum exceeds the build's own codegen time a little (one LLVM module per
function instead of one for all); the ranking is the point.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tvm
from rich.console import Console
from rich.table import Table
from tvm import relax
from tvm.relax.transform import MetaScheduleApplyDatabase
from tvm.tirx.build import split_host_device_mods, tir_to_runtime

from search_spaces import lowering
from search_spaces.constraints import target_with_limits
from search_spaces.preload import preload_tensor_intrinsics
from tuner.codegen import per_function, single_module
from tuner.compile import Compiled, compile_model, fallback_record
from tuner.db import TuningDatabase
from tuner.db.tvm_adapter import DEFAULT_LOWERING, MetaScheduleDatabase
from tuner.device import parse_device
from tuner.frontends import load_model
from tuner.graph.layout.plan import LayoutPlan
from tuner.graph.layout.rewrites import prepare
from tuner.precision import apply_precision
from tuner.graph.tasks import fuse

RESULTS = Path(__file__).parent / "results"
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1])]  # archive/, benchmarks/
from result_file import write_result  # noqa: E402


def _timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


def _build_alone(func: tvm.tirx.PrimFunc, name: str, target: tvm.target.Target) -> dict:
    """Lower and code-generate one scheduled function as ``tvm.tirx.build`` does, timed by stage."""
    mod = tvm.IRModule({name: func.with_attr("global_symbol", name)})
    start = time.perf_counter()
    host = target.with_host(target)
    mod = tvm.tirx.transform.BindTarget(host)(mod)
    pipeline, finalize_host, _ = tvm.tirx.get_tir_pipeline("default")
    mod = pipeline(mod)
    host_mod, devices = split_host_device_mods(mod)
    host_mod = finalize_host()(host_mod)
    lower_s = time.perf_counter() - start
    lib, codegen_s = _timed(tir_to_runtime, host_mod, devices, target)
    ir_lines = lib.inspect_source("ll").count("\n")
    with tempfile.TemporaryDirectory() as tmp:
        _, object_s = _timed(lib.write_to_file, str(Path(tmp) / "f.o"))
    return {"lower_s": lower_s, "codegen_s": codegen_s, "object_s": object_s, "llvm_ir_lines": ir_lines}


def _latencies(builds: dict[str, Compiled], spec, device, rounds: int) -> dict[str, dict[str, float]]:
    """Median and min latency (ms) of each build, timed in interleaved rounds on one input."""
    device.use_threads()
    dev = device.tvm_device()
    args = [tvm.runtime.tensor(x, dev) for x in spec.random_inputs(seed=0)]
    timers = {}
    for name, c in builds.items():
        vm = relax.VirtualMachine(c.executable, dev)
        vm.set_input("main", *args)
        vm.invoke_stateful("main")  # warm up
        timers[name] = vm.time_evaluator("invoke_stateful", dev, number=1, repeat=5)
    runs: dict[str, list[float]] = {name: [] for name in builds}
    for _ in range(rounds):
        for name, timer in timers.items():
            runs[name] += list(timer("main").results)
    return {name: {"median_ms": 1e3 * float(np.median(r)), "min_ms": 1e3 * min(r)} for name, r in runs.items()}


def profile(model: str, db_path: str, precision: str, plan_name: str | None, rounds: int,
            copies: int) -> dict:
    device = parse_device("cpu")
    spec = load_model(model)
    db = TuningDatabase(db_path)
    plan = LayoutPlan.parse(plan_name or "auto", device.target)
    out: dict = {"model": model, "precision": precision, "target": str(device.target.attrs.get("mcpu", ""))}

    plain = compile_model(spec, device, None, plan=plan, precision=precision)
    whole = compile_model(spec, device, db, plan=plan, precision=precision)
    out["plain_compile_s"] = plain.compile_s
    out["db_compile_s"] = whole.compile_s
    if rounds:
        with single_module():
            one = compile_model(spec, device, db, plan=plan, precision=precision)
        out["db_compile_one_module_s"] = one.compile_s
        out["latency"] = _latencies({"per_function": whole, "one_module": one}, spec, device, rounds)

    phases: dict[str, float] = {}
    start = time.perf_counter()
    preload_tensor_intrinsics()
    lowering.install()
    phases["intrinsics"] = time.perf_counter() - start
    mod, phases["prepare"] = _timed(
        lambda: prepare(apply_precision(spec.bound(), precision, device.target), device.target, plan))
    target = target_with_limits(device.target)
    adapter = MetaScheduleDatabase(db, db.device_id(device), policy="same-arch", read_only=True, precision=precision,
                                   fallback=lambda w: fallback_record(w, target), untuned=DEFAULT_LOWERING)  # fmt: skip
    fused, phases["fuse"] = _timed(fuse, mod, target)
    with target, adapter, tvm.transform.PassContext(opt_level=3):
        scheduled, phases["apply_database"] = _timed(MetaScheduleApplyDatabase(), fused)
    out["phases_s"] = phases

    decisions = {d.name: d for d in adapter.decisions.values()}
    funcs = []
    with tvm.transform.PassContext(opt_level=3):
        for gv, func in scheduled.functions.items():
            if not isinstance(func, tvm.tirx.PrimFunc):
                continue
            name = gv.name_hint
            row = {"name": name, **_build_alone(func, name, target)}
            d = decisions.get(name)
            row["got"] = f"{d.kind}: {d.detail}" if d else "no decision"
            funcs.append(row)
    funcs.sort(key=lambda r: -(r["codegen_s"] + r["object_s"]))
    # The scheduled functions as one TIR module: TVM's single LLVM module against one per
    # function (what compile_model does, tuner.codegen).
    tir = tvm.IRModule({gv: f.with_attr("global_symbol", gv.name_hint) for gv, f in scheduled.functions.items()
                        if isinstance(f, tvm.tirx.PrimFunc)})  # fmt: skip
    with tvm.transform.PassContext(opt_level=3):
        _, out["tir_build_one_module_s"] = _timed(tvm.tirx.build, tir, target)
        with per_function():
            _, out["tir_build_per_function_s"] = _timed(tvm.tirx.build, tir, target)
    if copies:
        # The function that took LLVM longest, n times in one module: how TVM's one-module
        # build grows with the module, not with any one function.
        worst = funcs[0]["name"]
        func = next(f for gv, f in scheduled.functions.items() if gv.name_hint == worst)
        out["copies"] = {"function": worst, "one_module_s": {}}
        with tvm.transform.PassContext(opt_level=3):
            for n in (1, 4, 8, copies):
                mod_n = tvm.IRModule({f"copy{i}": func.with_attr("global_symbol", f"copy{i}") for i in range(n)})
                _, out["copies"]["one_module_s"][n] = _timed(tvm.tirx.build, mod_n, target)
    out["functions"] = funcs
    out["sum_s"] = {k: sum(r[k] for r in funcs) for k in ("lower_s", "codegen_s", "object_s")}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--layout", default=None, help="one layout for every conv (default: the target's plan)")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--latency-rounds", type=int, default=0,
                   help="also build with one LLVM module and time both builds in this many interleaved rounds")
    p.add_argument("--copies", type=int, default=0,
                   help="also build 1, 4, 8 and this many copies of the slowest function as one LLVM module")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    result = profile(args.model, args.db, args.precision, args.layout, args.latency_rounds, args.copies)
    result["machine"] = {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count()}
    console = Console()
    console.print(f"compile_model: plain {result['plain_compile_s']:.1f} s, database {result['db_compile_s']:.1f} s")
    console.print(f"TIR build of the scheduled functions: one LLVM module {result['tir_build_one_module_s']:.1f} s, "
                  f"one per function {result['tir_build_per_function_s']:.1f} s")
    if "latency" in result:
        lat = result["latency"]
        console.print(f"one LLVM module: compile {result['db_compile_one_module_s']:.1f} s; latency (median/min ms): "
                      + ", ".join(f"{k} {v['median_ms']:.2f}/{v['min_ms']:.2f}" for k, v in lat.items()))
    if "copies" in result:
        c = result["copies"]
        console.print(f"copies of {c['function']} as one LLVM module: "
                      + ", ".join(f"{n}: {t:.2f} s" for n, t in c["one_module_s"].items()))
    console.print("phases (s): " + ", ".join(f"{k} {v:.2f}" for k, v in result["phases_s"].items()))
    console.print("functions built alone (s): " + ", ".join(f"{k} {v:.2f}" for k, v in result["sum_s"].items()))
    table = Table(title=f"slowest functions to compile of {len(result['functions'])}")
    for col in ("function", "lower s", "LLVM opt s", "object s", "IR lines", "got"):
        table.add_column(col)
    for r in result["functions"][: args.top]:
        table.add_row(r["name"], f"{r['lower_s']:.2f}", f"{r['codegen_s']:.2f}", f"{r['object_s']:.2f}",
                      str(r["llvm_ir_lines"]), r["got"][:60])  # fmt: skip
    console.print(table)
    out = args.out or RESULTS / f"compile_profile_{args.model}_{args.precision}.json"
    write_result(out, "compile_profile", result)
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
