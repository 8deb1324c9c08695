"""Does a cheap first ranking on the knob vector pay before TVM's feature extraction?

    nice -n 5 .venv/bin/python benchmarks/archive/knob_prerank.py --db /tmp/a.db /tmp/b.db --kind sketch

For one task's records of one space kind (the workload with the most records, unless
``--workload``), in k folds: an XGBoost ranking model on TVM's per-store features (the
job's model) and the same model on the knob vector alone (each knob's index in its domain,
scaled to [0, 1], plus log2 of every tile factor; a one-store "feature" row, so the same
``XGBCostModel`` trains on it). On each held-out fold: pairwise accuracy and top-1/top-5
score of either, and of the two-stage ranking that keeps the knob model's best ``q`` share
and ranks those with the feature model. The saving is the seconds of applying and
featurizing the ``1 - q`` share dropped, per candidate, as timed here. Writes
benchmarks/archive/results/knob_prerank.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sqlite3
import time
from pathlib import Path

import numpy as np
from tvm.s_tir import meta_schedule as ms

import cost_models
import search_spaces
from cost_models.metrics import pairwise_accuracy, top_k_score
from search_spaces import Point
from tuner.device import parse_device
from tuner.job import parse_record_point

RESULTS = Path(__file__).parent / "results" / "knob_prerank.json"


def knob_vector(space: search_spaces.SearchSpace, point: Point) -> np.ndarray:
    """The knob vector of ``point``, laid out per sketch (zeros for the other sketches)."""
    parts = []
    for s in range(space.num_sketches):
        row = []
        for i, knob in enumerate(space.knobs(s)):
            value = point.decisions[i] if s == point.sketch else None
            row.append(0.0 if value is None or len(knob) < 2 else knob.index(value) / (len(knob) - 1))
            if knob.kind == "tile":
                width = len(knob.choices[0])
                row += [math.log2(f) if value is not None else 0.0 for f in (value or (1,) * width)]
        parts.append([1.0 if s == point.sketch else 0.0, *row])
    return np.concatenate([np.asarray(p, dtype=np.float32) for p in parts])


def records(dbs: list[Path], workload: str | None, kind: str) -> tuple[str, str, list[tuple[str, float]]]:
    """The workload key, its stored workload JSON, and ``(point id, throughput)`` of each of
    its records of space ``kind`` (0 for a failure)."""
    rows = []
    for db in dbs:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            rows += conn.execute("SELECT w.key, w.workload_json, r.point, r.error_class, r.run_secs "
                                 "FROM records r JOIN workloads w ON w.id = r.workload_id").fetchall()  # fmt: skip
    counts: dict[str, int] = {}
    for key, _, point, *_ in rows:
        if parse_record_point(point)[0] == kind:
            counts[key] = counts.get(key, 0) + 1
    key = workload or max(counts, key=counts.__getitem__)
    workload_json = next(m for k, m, *_ in rows if k == key)
    out: dict[str, float] = {}
    for k, _, point, error, run_secs in rows:
        pk, cid = parse_record_point(point)
        if k != key or pk != kind:
            continue
        secs = json.loads(run_secs or "[]")
        out[cid] = 0.0 if error or not secs else 1.0 / float(np.median(secs))
    return key, workload_json, list(out.items())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db", type=Path, nargs="+", required=True)
    p.add_argument("--workload", default=None)
    p.add_argument("--kind", default="sketch")
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--keep", type=float, nargs="+", default=[0.25, 0.5, 0.75])
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    device = parse_device("cpu")
    key, workload_json, labelled = records(args.db, args.workload, args.kind)
    mod = ms.database.Workload.from_json(json.loads(workload_json)).mod
    space = search_spaces.create(mod, device.target, kind=args.kind)
    points = [Point.from_json(cid) for cid, _ in labelled]
    y = np.array([t for _, t in labelled])
    start = time.perf_counter()
    knobs = np.stack([knob_vector(space, pt) for pt in points])
    knob_s = (time.perf_counter() - start) / len(points)
    space._cache.clear()
    start = time.perf_counter()
    schedules = [space.apply(pt) for pt in points]
    apply_s = (time.perf_counter() - start) / len(points)
    start = time.perf_counter()
    feats = cost_models.extract_features(space.mod, space.target, schedules)
    feature_s = (time.perf_counter() - start) / len(points)
    knob_feats = cost_models.StoreFeatures.from_matrix(knobs)
    rng = np.random.default_rng(0)
    folds = np.array_split(rng.permutation(len(points)), args.folds)
    results: dict[str, list[float]] = {}

    def note(name: str, scores: np.ndarray, truth: np.ndarray) -> None:
        results.setdefault(f"{name}.pairwise", []).append(pairwise_accuracy(scores, truth))
        results.setdefault(f"{name}.top1", []).append(top_k_score(scores, truth, 1))
        results.setdefault(f"{name}.top5", []).append(top_k_score(scores, truth, 5))

    groups = np.zeros(len(points))
    for fold in folds:
        train = np.setdiff1d(np.arange(len(points)), fold)
        by_features = cost_models.create("xgb", seed=0)
        by_features.update(feats[train], y[train], groups[train])
        by_knobs = cost_models.create("xgb", seed=0)
        by_knobs.update(knob_feats[train], y[train], groups[train])
        sf = np.asarray(by_features.predict(feats[fold]))
        sk = np.asarray(by_knobs.predict(knob_feats[fold]))
        note("features", sf, y[fold])
        note("knobs", sk, y[fold])
        for q in args.keep:
            kept = np.argsort(-sk, kind="stable")[: max(1, round(q * len(fold)))]
            two = np.full(len(fold), -np.inf)
            two[kept] = sf[kept]
            note(f"knobs{q:g}+features", two, y[fold])
    summary = {k: float(np.nanmean(v)) for k, v in results.items()}
    out = {
        "command": "benchmarks/archive/knob_prerank.py " + " ".join(
            f"--{k} {' '.join(map(str, v)) if isinstance(v, list) else v}"
            for k, v in vars(args).items() if k != "out" and v is not None),
        "workload": key, "kind": args.kind, "records": len(points), "failed": int((y == 0).sum()),
        "seconds_per_candidate": {"knob_vector": knob_s, "apply": apply_s, "features": feature_s},
        "saved_share_of_apply_and_features": {f"{q:g}": 1 - q for q in args.keep},
        "metrics": summary, "load": os.getloadavg(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(json.dumps({k: out[k] for k in ("records", "failed", "seconds_per_candidate")}, indent=1))
    for k, v in sorted(summary.items()):
        print(f"{k:28s} {v:.3f}")


if __name__ == "__main__":
    main()
