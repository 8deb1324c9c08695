"""--layout auto (each conv's layout chosen from measurements) against one blocked layout.

Two databases tuned at the same budget, one with ``tune --layout auto`` (every conv tuned
in NCHW{lanes}c and NCHW, the scheduler weighing the two as alternatives) and one with
``tune --layout NCHWc``. Each is compiled as ``nightshift compile/bench`` would (auto: the
plan ``tuner.layout.choose_from_database`` picks from the auto database), and both builds
run interleaved in one ``tuner.bench`` run beside ONNX Runtime and OpenVINO f32
(``INFERENCE_PRECISION_HINT=f32``, which tuner.bench sets), on one
random input, on the device's ``num-cores`` threads. Also written: the chosen plan with
its measured costs, how each job split its trials between the layouts, and the machine's
load average. Ratios carry over between runs; milliseconds do not.

    rm -f /tmp/auto.db /tmp/nchwc.db
    tune --model resnet50 --trials 512 --layout auto --db /tmp/auto.db --no-verify
    tune --model resnet50 --trials 512 --layout NCHWc --db /tmp/nchwc.db --no-verify
    nice -n 5 .venv/bin/python benchmarks/archive/layout_choice.py --auto-db /tmp/auto.db --nchwc-db /tmp/nchwc.db
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
from rich.console import Console
from sqlalchemy import text

from tuner.bench import BenchConfig, TvmRunner, bench, render
from tuner.app.plan import choose_layout
from tuner.cli.common import print_layout_choice
from tuner.compile import compile_model
from tuner.db import TuningDatabase
from tuner.device import parse_device
from tuner.frontends import load_model
from tuner.graph.layout.plan import LayoutPlan, auto_layouts
from tuner.graph.layout.choose import stored_layouts
from tuner.peers._base import Peer, PeerModel

RESULTS = Path(__file__).parent / "results" / "layout_choice_resnet50.json"
console = Console()


class _SecondBuild(Peer):
    """Another TVM build, run by the harness as if it were a peer (so it is interleaved)."""

    name = "tvm-nchwc"
    module = "tvm"
    install = ""

    def __init__(self, runner: TvmRunner) -> None:
        super().__init__()
        self._runner = runner
        self.label = runner.label

    def prepare(self, model: PeerModel, threads: int) -> None:
        """Nothing to load: the build is compiled already."""

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """One run of the build."""
        return self._runner.run(inputs)


def _job(db: TuningDatabase) -> dict:
    """The database's job and how its records split over the conv layouts."""
    layouts = stored_layouts(db)
    with db.session(write=False) as s:
        job = s.execute(text("SELECT name, state, trials_done, elapsed_sec FROM jobs ORDER BY id DESC")).first()
        rows = s.execute(text("SELECT w.key, count(r.id) FROM records r JOIN workloads w ON w.id = r.workload_id "
                              "GROUP BY w.key")).all()  # fmt: skip
    trials: Counter[str] = Counter()
    for key, n in rows:
        trials[layouts.get(key, "other")] += n
    return {"job": dict(job._mapping) if job is not None else None, "trials_by_layout": dict(trials)}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--auto-db", required=True, help="database of the --layout auto job")
    p.add_argument("--nchwc-db", required=True, help="database of the --layout NCHWc job")
    p.add_argument("--model", default="resnet50")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()

    device = parse_device("cpu")
    spec = load_model(args.model)
    auto_db, nchwc_db = TuningDatabase(args.auto_db), TuningDatabase(args.nchwc_db)
    layouts = auto_layouts(device.target)
    choice = choose_layout(spec, device, auto_db, layouts)
    print_layout_choice(choice, layouts)
    fixed = LayoutPlan.parse("NCHWc", device.target)
    with console.status("compiling the NCHWc database's build"):
        nchwc = compile_model(spec, device, nchwc_db, plan=fixed)
    second = _SecondBuild(TvmRunner(nchwc, device, f"TVM, --layout NCHWc ({fixed})"))
    config = BenchConfig(rounds=args.rounds, peers=("onnxruntime", "openvino-f32", second), fallback=False,
                         plan=choice.plan, layout_choice=choice)  # fmt: skip
    result = bench(spec, device, auto_db, source=args.model, config=config,
                   on_stage=lambda s: console.log(s))  # fmt: skip
    console.print(render(result))
    med = {e.key: e.median_s for e in result.entries}
    auto_s, nchwc_s = med["tvm"], med["tvm-nchwc"]
    doc = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "load_average": os.getloadavg(),
        "model": args.model,
        "cpu": device.description.get("model"),
        "mcpu": device.arch,
        "candidate_layouts": list(layouts),
        "nchwc_plan": str(fixed),
        "nchwc_tuned_ops": len(nchwc.tuned),
        "auto_over_nchwc": auto_s / nchwc_s if auto_s and nchwc_s else None,
        "ratio_to_openvino_f32": {k: _ratio(v, med.get("openvino-f32")) for k, v in med.items()},
        "auto_job": _job(auto_db),
        "nchwc_job": _job(nchwc_db),
        "bench": result.to_json(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2, default=float) + "\n")
    console.print(f"auto / NCHWc {doc['auto_over_nchwc']:.3f}; wrote {args.out}")


if __name__ == "__main__":
    main()
