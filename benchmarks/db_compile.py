"""What compiling ResNet-50 costs with the tuning database in the loop, and what it gives.

One process, three builds of the zoo ResNet-50 for the host CPU, each then run:

- ``tvm-default``: ``tvm.compile`` without a database (TVM's naive loop nests);
- ``db-no-fallback``: through the database adapter, no fallback: the cost of the database
  lookups alone (an empty database, or ``--db``'s records);
- ``db-fallback``: through the adapter with the fallback schedule for untuned operators
  (what ``nightshift compile`` does).

Writes benchmarks/results/db_compile.json. Latencies are medians of repeated runs; the
machine is shared, so compare the ratios within one run.

    nice -n 10 .venv/bin/python benchmarks/db_compile.py [--db tuned.db]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tvm

from tuner.compile import compile_model, preload_tensor_intrinsics, run_model
from tuner.db import TuningDatabase
from tuner.device import parse_device
from tuner.frontends import load_model

RESULTS = Path(__file__).parent / "results" / "db_compile.json"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--db", default=None, help="database with records (default: a fresh, empty SQLite file)")
    p.add_argument("--budget-s", type=float, default=10.0, help="timing budget per build")
    args = p.parse_args()
    device = parse_device("cpu")
    spec = load_model(args.model)
    inputs = spec.random_inputs(seed=0)
    t = time.perf_counter()
    preload_tensor_intrinsics()
    preload_s = time.perf_counter() - t
    with tempfile.TemporaryDirectory() as tmp:
        db = TuningDatabase(args.db or str(Path(tmp) / "empty.db"))
        builds = {}
        outs = {}
        for name, kwargs in (("tvm-default", None), ("db-no-fallback", {"fallback": False}),
                             ("db-fallback", {"fallback": True})):  # fmt: skip
            if kwargs is None:
                compiled = compile_model(spec, device, None)
            else:
                compiled = compile_model(spec, device, db, **kwargs)
            out, latency = run_model(compiled, device, inputs, budget_s=args.budget_s)
            outs[name] = out
            kinds: dict[str, int] = {}
            for d in compiled.decisions.values():
                kinds[d.kind] = kinds.get(d.kind, 0) + 1
            builds[name] = {"compile_s": compiled.compile_s, "latency_ms": latency * 1e3, "operators": kinds}
            sys.stdout.write(f"{name}: {json.dumps(builds[name])}\n")
            sys.stdout.flush()
        db.close()
    ref = outs["tvm-default"]
    for name in ("db-no-fallback", "db-fallback"):
        scale = max(float(np.max(np.abs(ref[0]))), 1e-6)
        builds[name]["max_rel_diff_vs_default"] = float(np.max(np.abs(ref[0] - outs[name][0]))) / scale
    base = builds["tvm-default"]
    ratios = {
        "compile_time_db_no_fallback_over_default": builds["db-no-fallback"]["compile_s"] / base["compile_s"],
        "compile_time_db_fallback_over_default": builds["db-fallback"]["compile_s"] / base["compile_s"],
        "latency_default_over_db_fallback": base["latency_ms"] / builds["db-fallback"]["latency_ms"],
        "latency_default_over_db_no_fallback": base["latency_ms"] / builds["db-no-fallback"]["latency_ms"],
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "benchmark": "db_compile",
        "command": "nice -n 10 .venv/bin/python benchmarks/db_compile.py " + " ".join(sys.argv[1:]),
        "model": args.model, "db": "records from --db" if args.db else "empty",
        "machine": {"cpu": device.description.get("model"), "mcpu": device.arch,
                    "cores": device.description.get("cores"), "python": platform.python_version()},
        "tvm": tvm.__version__, "tensor_intrin_preload_s": preload_s,
        "builds": builds, "ratios": ratios,
    }, indent=2) + "\n")  # fmt: skip
    sys.stdout.write(json.dumps(ratios) + "\n")


if __name__ == "__main__":
    main()
