"""Row tiles that do not divide the rows against those that do: BERT-base's dense layers under x86-dense.

``x86-dense`` tiles ``tile_m`` rows of A x ``tile_n`` columns of C in registers. BERT's
sequence of 128 rows used to allow 1, 2, 4, 8 or 16 rows only; MLAS's AVX2 kernel is 6 rows
x 16 columns. A ``tile_m`` that does not divide the rows now leaves a shorter last tile,
peeled (:mod:`search_spaces.lowering`). For each of BERT-base's four dense shapes (packed
weights and the epilogues they are fused with, as ``dense_packing.py`` builds them) this
takes every point of the template's space with ``unroll_k`` 4 and no run-time panel copy,
checks it against the unscheduled operator and times it cold (caches flushed before each
run) in rounds, interleaved with PyTorch's ``linear`` + the same epilogue (oneDNN, timed
warm). Writes benchmarks/archive/results/dense_rows.json.

    .venv/bin/python benchmarks/archive/dense_rows.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

import numpy as np
import tvm
from dense_packing import SEQ, SHAPES, build, torch_call
from op_ceiling import build_checked, cpu_threads, time_call

from search_spaces.template_space import TemplateSpace
from tuner.measure.verify import reference
from tuner.graph.layout.plan import dense_block, vector_lanes

logger = logging.getLogger("dense_rows")
RESULTS = Path(__file__).parent / "results" / "dense_rows.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    import torch

    device, threads = cpu_threads()
    target = device.target
    lanes = vector_lanes(target)
    dev = tvm.cpu(0)
    report: dict = {
        "benchmark": "dense_rows", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": f"dense_rows.py --shapes {' '.join(args.shapes)} --rounds {args.rounds}",
        "device": device.description, "target": device.target_config, "threads": threads, "lanes": lanes,
        "tvm": tvm.__version__, "torch": torch.__version__, "load_before": list(os.getloadavg()), "shapes": [],
    }
    for name in args.shapes:
        k, n, epilogue, calls = SHAPES[name]
        block = dense_block(n, lanes)
        mod = build(k, n, epilogue, block)
        space = TemplateSpace(mod, target, "x86-dense")
        ref = reference(mod, target)
        names = [kn.name for kn in space.knobs(0)]
        timers, failed = [], 0
        for point in space.enumerate():
            v = dict(zip(names, point.decisions, strict=True))
            if v["unroll_k"] != 4 or v["pack_b"]:
                continue
            built = build_checked(space.apply(point).mod, target, ref, dev)
            if built is None:
                failed += 1
                continue
            lib, arrays = built
            timer = lib.mod.time_evaluator("main", dev, number=1, repeat=5, f_preproc="cache_flush_cpu_non_first_arg")
            timers.append((v, timer, arrays))
        peer = torch_call(epilogue, ref.inputs, block)
        secs: list[list[float]] = [[] for _ in timers]
        torch_sec: list[float] = []
        for r in range(args.rounds):
            for i, (_, timer, arrays) in enumerate(timers):
                secs[i].append(float(np.median(timer(*arrays).results)))
            torch_sec.append(time_call(peer))
            logger.info("%s: round %d/%d of %d points", name, r + 1, args.rounds, len(timers))
        torch_ms = float(np.median(torch_sec)) * 1e3
        ranked = sorted((float(np.median(s)) * 1e3, v) for s, (v, _, _) in zip(secs, timers, strict=True))
        best: dict[str, tuple[float, dict]] = {}
        for ms, v in ranked:
            best.setdefault("partial" if SEQ % v["tile_m"] else "divisor", (ms, v))
        entry: dict = {"shape": name, "k": k, "n": n, "epilogue": epilogue, "calls_in_bert": calls, "wrong": failed,
                       "torch_warm_ms": torch_ms,
                       "points": {kind: sum(1 for _, v in ranked if (SEQ % v["tile_m"] > 0) == (kind == "partial"))
                                  for kind in ("divisor", "partial")}}  # fmt: skip
        for kind, (ms, v) in best.items():
            entry[kind] = {"best_ms": ms, "best_gflops": 2.0 * SEQ * k * n / ms / 1e6, "best_point": v}
        if len(best) == 2:
            entry["partial_over_divisor"] = best["partial"][0] / best["divisor"][0]
        entry["best_over_torch_warm"] = ranked[0][0] / torch_ms
        report["shapes"].append(entry)
        logger.info("%s", json.dumps(entry))
        report["load_after"] = list(os.getloadavg())
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
