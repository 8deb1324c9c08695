"""Cost-model quality on a database's records: the old pooled model against the new ones.

Rebuilds per-store features from the records of this CPU (see ``cost_model_data.py`` to
fill a database) and reports TenSet's pairwise accuracy and top-1/top-5 per task family for:
``old`` (before issue #8: mean/max/sum pooled features, 50 trees of squared error),
``xgb-rank`` (per-store trees, pairwise loss within a task), ``xgb-mse`` (per-store trees,
MetaSchedule's weighted squared error), ``pooled-pairwise`` (XGBoost's own ``rank:pairwise``
with ``qid`` = task on the pooled features: the native ranking objective needs one row per
candidate) and ``random``; on unseen tasks, held-out models (records of ``--model`` jobs of
``cost_model_data.py``) and held-out records of known tasks, each also for sketch and
template points apart. Then the transfer study: for each task, a model trained
on k of its records alone against one trained on the same k plus every other task's records,
judged on the task's remaining records; and small sets: 48 records of one task train, 16 others
test. Writes benchmarks/results/cost_model_quality.json.

    nice -n 10 .venv/bin/python benchmarks/cost_model_quality.py --db /tmp/cm.db [--db /tmp/other.db]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import xgboost as xgb

import cost_models
from cost_models.base import CostModel, Features
from cost_models.dataset import Dataset, load_dataset
from cost_models.evaluation import evaluate
from cost_models.features import as_store_features
from cost_models.metrics import mean_metrics, per_task
from tuner.db import TuningDatabase
from tuner.device import parse_device

logger = logging.getLogger("cost_model_quality")
RESULTS = Path(__file__).parent / "results" / "cost_model_quality.json"


class OldPooledModel(CostModel):
    """The model before issue #8, verbatim: pooled features, 50 trees, retrained every call."""

    name = "old"

    def __init__(self, *, seed: int = 0) -> None:
        self._params = {"max_depth": 6, "eta": 0.2, "subsample": 1.0, "min_child_weight": 1,
                        "objective": "reg:squarederror", "seed": seed, "nthread": 1, "verbosity": 0}  # fmt: skip
        self._booster: xgb.Booster | None = None
        self._n = 0

    @staticmethod
    def _pool(features: Features) -> np.ndarray:
        f = as_store_features(features)
        out = np.zeros((len(f), 3 * f.width + 1), dtype=np.float32)
        for i in range(len(f)):
            rows = f.candidate(i)
            if rows.size:
                out[i, :-1] = np.concatenate([rows.mean(0), rows.max(0), rows.sum(0)])
            out[i, -1] = rows.shape[0]
        return out

    @property
    def num_samples(self) -> int:
        return self._n

    def fit(self, features: Features, throughputs: np.ndarray, groups: np.ndarray) -> None:
        y, g = np.asarray(throughputs, float), np.asarray(groups)
        target = np.zeros_like(y)
        for group in np.unique(g):
            m = g == group
            if y[m].max() > 0:
                target[m] = y[m] / y[m].max()
        self._booster = xgb.train(self._params, xgb.DMatrix(self._pool(features), label=target), num_boost_round=50)
        self._n = len(y)

    update = fit

    def predict(self, features: Features) -> np.ndarray:
        if self._booster is None:
            return np.zeros(len(as_store_features(features)))
        return self._booster.predict(xgb.DMatrix(self._pool(features)))

    def save(self) -> bytes:
        return b"" if self._booster is None else bytes(self._booster.save_raw(raw_format="ubj"))

    def load(self, blob: bytes) -> None:
        raise NotImplementedError


class PooledPairwiseModel(OldPooledModel):
    """XGBoost's ``rank:pairwise`` with ``qid`` = task, on the pooled per-candidate features."""

    name = "pooled-pairwise"

    def __init__(self, *, seed: int = 0) -> None:
        super().__init__(seed=seed)
        self._params = self._params | {"objective": "rank:pairwise", "lambdarank_pair_method": "mean",
                                       "lambdarank_num_pair_per_sample": 8, "max_depth": 6}  # fmt: skip

    def fit(self, features: Features, throughputs: np.ndarray, groups: np.ndarray) -> None:
        y, g = np.asarray(throughputs, float), np.asarray(groups).astype(str)
        keep = np.isfinite(y)
        order = np.flatnonzero(keep)[np.argsort(g[keep], kind="stable")]  # qid must be sorted
        _, qid = np.unique(g[order], return_inverse=True)
        target = np.zeros(len(order))
        for q in np.unique(qid):  # graded relevance 0-31 by the throughput over the task's best
            m = qid == q
            best = y[order][m].max()
            if best > 0:
                target[m] = np.floor(31 * np.maximum(y[order][m], 0) / best)
        x = self._pool(as_store_features(features)[order])
        self._booster = xgb.train(self._params, xgb.DMatrix(x, label=target, qid=qid), num_boost_round=100)
        self._n = len(order)

    update = fit


def transfer(data, factory, ks: list[int], seed: int) -> list[dict]:
    """Per k: mean metrics over tasks of a model trained on k records of the task, alone or
    with all other tasks' records, tested on the task's other records."""
    rng = np.random.default_rng(seed)
    out = []
    for k in ks:
        alone: dict = {}
        joint: dict = {}
        for g in np.unique(data.groups):
            idx = rng.permutation(np.flatnonzero(data.groups == g))
            own, test = idx[:k], idx[k:]
            others = np.flatnonzero(data.groups != g)
            for store, train in ((alone, own), (joint, np.concatenate([own, others]))):
                if len(train) == 0:
                    continue
                m = factory()
                m.fit(data.features[train], data.throughputs[train], data.groups[train])
                store |= per_task(m.predict(data.features[test]), data.throughputs[test], data.groups[test])
        out.append({"k": k, "task_only": mean_metrics(alone) if alone else None,
                    "with_other_tasks": mean_metrics(joint)})
        logger.info("transfer k=%d: %s", k, out[-1])
    return out


def small_sets(data, models: dict, seeds: int = 4) -> dict[str, dict[str, float]]:
    """The job's early case (and the quality test's): per task, 64 random records, a model
    trained on 48 of them alone, judged on the other 16; means over tasks and seeds."""
    out = {}
    for name, factory in models.items():
        tasks: dict = {}
        for seed in range(seeds):
            for g in np.unique(data.groups):
                idx = np.random.default_rng(seed).permutation(np.flatnonzero(data.groups == g))[:64]
                train, test = idx[:48], idx[48:]
                m = factory()
                m.fit(data.features[train], data.throughputs[train], data.groups[train])
                tasks |= {f"{k}#{seed}": v for k, v in
                          per_task(m.predict(data.features[test]), data.throughputs[test], data.groups[test]).items()}
        out[name] = mean_metrics(tasks)
        logger.info("small sets %s: %s", name, out[name])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, action="append", help="a database (repeat for several)")
    parser.add_argument("--holdout", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--transfer-k", type=int, nargs="*", default=[0, 16, 48])
    parser.add_argument("--no-extras", action="store_true", help="only the held-out table (no small sets, transfer)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    device = parse_device("cpu")
    start = time.perf_counter()
    data = Dataset.concat([load_dataset(TuningDatabase(db, create=False), device) for db in args.db])
    logger.info("%d records of %d tasks in %.0f s", len(data), len(set(data.groups.tolist())),
                time.perf_counter() - start)  # fmt: skip
    models = {
        "old": lambda: OldPooledModel(seed=args.seed),
        "pooled-pairwise": lambda: PooledPairwiseModel(seed=args.seed),
        "xgb-rank": lambda: cost_models.create("xgb-rank", seed=args.seed),
        "xgb-mse": lambda: cost_models.create("xgb-mse", seed=args.seed),
        "random": lambda: cost_models.create("random", seed=args.seed),
    }
    rows = evaluate(data, models, holdout=args.holdout, seed=args.seed)
    for r in rows:
        logger.info("%-16s %-12s %-8s tasks %d pairwise %.3f top1 %.3f top5 %.3f (train %.1f s)", r.split, r.family,
                    r.model, r.tasks, r.pairwise, r.top1, r.top5, r.train_s)  # fmt: skip
    report = {
        "benchmark": "cost_model_quality", "device": device.description, "records": len(data),
        "tasks": sorted(set(data.names.values())), "holdout": args.holdout, "seed": args.seed,
        "command": "nice -n 10 .venv/bin/python benchmarks/cost_model_quality.py " + " ".join(sys.argv[1:]),
        "models_of_records": {str(m): int((data.sources == m).sum()) for m in sorted(set(data.sources.tolist()))},
        "spaces": {str(k): int((data.spaces == k).sum()) for k in sorted(set(data.spaces.tolist()))},
        "rows": [asdict(r) for r in rows],
        "small_sets": None if args.no_extras else small_sets(data, models),
        "transfer": None if args.no_extras else {
            "xgb-rank": transfer(data, models["xgb-rank"], args.transfer_k, args.seed)},
    }  # fmt: skip
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1))
    logger.info("wrote %s", args.output)


if __name__ == "__main__":
    main()
