"""What BERT-base bf16's two vector-arithmetic epilogues cost, warm, on this host's threads.

1. **GELU**: the FFN's first matmul + bias + GELU + cast (its stored best record in ``--db``)
   built with GELU's erf as ``tune`` writes it (TOPI's ``fast_erf``: a rational polynomial and
   one division), with the division replaced by a reciprocal from an integer guess and 3 or 2
   Newton steps, and with a trivial erf (``x / 2``: what the epilogue costs without GELU's
   arithmetic). The same trace builds every variant; they are timed interleaved, and each
   one's largest difference from ``fast_erf``'s output is recorded.
2. **Softmax** at BERT's shape (12 x 128 rows of 128, then the cast to bf16): the distinct
   points among ``--points`` drawn from ``x86-softmax``, with a division per element (TOPI's
   ``fast_softmax``) and with each row's reciprocal (``tuner.layout.fast_softmax_last_axis``).

Writes benchmarks/archive/results/bert_epilogues.json (``--out``).

    .venv/bin/python benchmarks/archive/bert_epilogues.py --db /work/bench/bert_bf16.db
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tvm
from rich.console import Console
from tvm import te, topi

from search_spaces.template_space import TemplateSpace
from search_spaces.x86.intrin_amx import register_amx_intrinsics
from tuner.measure.verify import arg_specs, random_args
from tuner.db import TuningDatabase
from tuner.device import parse_device
from tuner.frontends import load_model
from tuner.graph.layout.plan import LayoutPlan
from tuner.graph.layout.ops import fast_softmax_last_axis
from tuner.memory import small_pages
from tuner.rerank import record_program
from tuner.graph.tasks import extract_tasks

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1])]  # archive/, benchmarks/
from result_file import machine, write_result

console = Console()
# TOPI's fast_erf (include/tvm/topi/elemwise.h): numerator x * P(x^2), denominator Q(x^2).
_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
      -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
      -1.42647390514189e-02)


def newton_erf(steps: int) -> Callable[[te.Tensor], te.Tensor]:
    """TOPI's ``fast_erf`` with ``p / q`` as ``p`` times a reciprocal of ``q``: an integer
    guess refined by ``steps`` Newton steps (3 reach float32's precision, 2 do not)."""

    def erf(x: te.Tensor) -> te.Tensor:
        def body(*i):
            f = lambda v: tvm.tirx.const(v, "float32")  # noqa: E731
            v = te.max(te.min(x(*i), f(4.0)), f(-4.0))
            x2 = v * v
            p, q = f(_P[0]), f(_Q[0])
            for a in _P[1:]:
                p = x2 * p + f(a)
            for b in _Q[1:]:
                q = x2 * q + f(b)
            nq = f(0.0) - q  # q < 0 on [-4, 4]
            r = tvm.tirx.reinterpret("float32", tvm.tirx.const(0x7EF311C7, "int32") - tvm.tirx.reinterpret("int32", nq))
            for _ in range(steps):
                r = r * (f(2.0) - nq * r)
            return f(0.0) - v * p * r

        return te.compute(x.shape, body, name="T_fast_erf", tag="elemwise")

    return erf


def _trivial_erf(x: te.Tensor) -> te.Tensor:
    return te.compute(x.shape, lambda *i: x(*i) * tvm.tirx.const(0.5, "float32"), name="T_fast_erf", tag="elemwise")


def _median_us(lib, args: list, number: int) -> Callable[[], float]:
    timer = lib.mod.time_evaluator("main", tvm.cpu(0), number=number, repeat=1)
    return lambda: timer(*args).mean * 1e6


def gelu(db_path: str, target: tvm.target.Target, device, rounds: int) -> dict:
    db = TuningDatabase(db_path)
    device_id = db.find_device_id(device)
    bert = load_model("bert-base").bound()
    variants = {"fast_erf": topi.fast_erf, "newton3": newton_erf(3), "newton2": newton_erf(2),
                "trivial_erf": _trivial_erf}  # fmt: skip
    libs, record, task = {}, None, None
    original = topi.fast_erf
    try:
        for name, erf in variants.items():
            topi.fast_erf = erf  # tuner.layout's GELU legalization calls topi.fast_erf
            task = next(t for t in extract_tasks(bert, target, LayoutPlan.for_target(target), precision="bf16")
                        if "gelu" in t.name)  # fmt: skip
            if record is None:
                rows = db.best(task.workload_key, device_id, k=1) if device_id is not None else []
                if not rows:
                    raise SystemExit(f"{db_path} has no record of BERT-base bf16's {task.name} on this CPU")
                record = rows[0].record_json
            prog = record_program(task, record)
            if prog is None:
                raise SystemExit(f"the record of {task.name} does not replay on the {name} variant")
            libs[name] = tvm.compile(prog, target=target)
    finally:
        topi.fast_erf = original
    inputs = random_args(arg_specs(task.mod), seed=0)
    args = {n: [tvm.runtime.tensor(a, tvm.cpu(0)) for a in inputs] for n in libs}
    outs = {}
    for n, lib in libs.items():
        lib["main"](*args[n])
        outs[n] = args[n][-1].numpy().astype(np.float32)
    timers = {n: _median_us(lib, args[n], 20) for n, lib in libs.items()}
    us: dict[str, list[float]] = {n: [] for n in libs}
    for _ in range(rounds):
        for n in libs:
            us[n].append(timers[n]())
    diff = {n: float(np.abs(o - outs["fast_erf"]).max()) for n, o in outs.items()}
    return {"task": task.name, "variants": {n: {"median_us": statistics.median(v), "max_abs_diff_vs_fast_erf": diff[n]}
                                            for n, v in us.items()}}  # fmt: skip


def softmax(target: tvm.target.Target, points: int) -> dict:
    x = te.placeholder((1, 12, 128, 128), name="x")
    forms = {"division": lambda t: topi.nn.fast_softmax(t, 3), "reciprocal": fast_softmax_last_axis}
    mods = {n: tvm.IRModule({"main": te.create_prim_func([x, topi.cast(f(x), "bfloat16")])}) for n, f in forms.items()}
    inputs = random_args(arg_specs(mods["division"]))
    out = {}
    for name, mod in mods.items():
        space = TemplateSpace(mod, target, "x86-softmax")
        rng = np.random.default_rng(0)
        distinct = {tuple(sorted(space.values(p).items())): p for p in (space.sample(rng) for _ in range(points))}
        timed = []
        for values, point in distinct.items():
            lib = tvm.compile(space.apply(point).mod, target=target)
            timer = _median_us(lib, [tvm.runtime.tensor(a, tvm.cpu(0)) for a in inputs], 50)
            timed.append({"values": dict(values), "median_us": statistics.median(timer() for _ in range(5))})
        timed.sort(key=lambda r: r["median_us"])
        out[name] = {"points": timed, "best_us": timed[0]["median_us"]}
    out["reciprocal_over_division"] = out["reciprocal"]["best_us"] / out["division"]["best_us"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True, help="a BERT-base bf16 database with a record of the FFN + GELU task")
    p.add_argument("--rounds", type=int, default=15, help="interleaved timings of each GELU variant")
    p.add_argument("--points", type=int, default=40, help="x86-softmax points drawn for each form")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "bert_epilogues.json")
    args = p.parse_args()
    small_pages()
    register_amx_intrinsics()
    device = parse_device("cpu")
    device.use_threads()
    load_before = os.getloadavg()
    g = gelu(args.db, device.target, device, args.rounds)
    for n, r in g["variants"].items():
        console.print(f"GELU {n:12s} {r['median_us']:8.1f} us, max |diff| from fast_erf's "
                      f"{r['max_abs_diff_vs_fast_erf']:.2e}")  # fmt: skip
    s = softmax(device.target, args.points)
    console.print(f"softmax best of {len(s['division']['points'])} points: division {s['division']['best_us']:.1f} us, "
                  f"reciprocal {s['reciprocal']['best_us']:.1f} us ({s['reciprocal_over_division']:.3f}x)")  # fmt: skip
    write_result(args.out, "bert_epilogues", {**machine(device, load_before), "db": args.db, "gelu": g, "softmax": s})
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
