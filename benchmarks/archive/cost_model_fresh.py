"""Old against new cost model on freshly timed schedules of one dense operator (the quality
test's set): 128 random sketch-space points of a 16x512->256 dense, built and timed here;
train on the first 48 or 96, judge pairwise accuracy and top-1 on the last 32. Logs the figures.

    nice -n 10 .venv/bin/python benchmarks/archive/cost_model_fresh.py --draws 3
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np
import tvm
from tvm.s_tir import meta_schedule as ms

import cost_models
import search_spaces
from cost_models.metrics import pairwise_accuracy, top_k_score
from tuner.device import parse_device

logger = logging.getLogger("cost_model_fresh")
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1])]  # archive/, benchmarks/
from cost_model_data import matmul  # noqa: E402
from cost_model_quality import OldPooledModel  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=3, help="independent sets of 128 points")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    device = parse_device("cpu")
    target, dev = device.target, device.tvm_device()
    mod, _ = matmul(16, 256, 512, "dense")
    inputs = [tvm.runtime.tensor(np.random.default_rng(1).uniform(-1, 1, [int(x) for x in a.shape]).astype(a.dtype),
                                 dev) for a in ms.arg_info.ArgInfo.from_prim_func(mod["main"])]  # fmt: skip
    for draw in range(args.draws):
        space = search_spaces.create(mod, target, seed=1)
        rng = np.random.default_rng(draw)
        points: dict = {}
        while len(points) < 128:
            p = space.sample(rng)
            points.setdefault(p.to_json(), p)
        schedules = [space.apply(p) for p in points.values()]
        secs = []
        for sch in schedules:
            try:
                lib = tvm.compile(sch.mod, target=target).jit()
                evaluator = lib.time_evaluator("main", dev, number=1, repeat=5, min_repeat_ms=2)
                secs.append(float(np.min(evaluator(*inputs).results)))
            except Exception:  # a failed build is a failed candidate: throughput 0
                secs.append(float("inf"))
        y = 1.0 / np.array(secs)
        feats = cost_models.extract_features(mod, target, schedules)
        groups = np.zeros(len(y), dtype=int)
        test = np.arange(96, 128)
        for name, factory in {"old": OldPooledModel, "xgb": lambda: cost_models.create("xgb"),
                              "random": lambda: cost_models.create("random")}.items():  # fmt: skip
            for n_train in (48, 96):
                model = factory()
                train = np.arange(n_train)
                model.fit(feats[train], y[train], groups[train])
                s = model.predict(feats[test])
                logger.info("draw %d train %d %s: pairwise %.3f top1 %.3f", draw, n_train, name,
                            pairwise_accuracy(s, y[test]), top_k_score(s, y[test], 1))  # fmt: skip


if __name__ == "__main__":
    main()
