"""Held-out evaluation of cost models on a dataset, per task family (``nightshift model eval``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from cost_models.base import CostModel
from cost_models.dataset import FAMILIES, Dataset
from cost_models.metrics import mean_metrics, per_task

logger = logging.getLogger(__name__)

Factory = Callable[[], CostModel]
SPLITS = ("unseen tasks", "held-out models", "held-out records")


@dataclass(frozen=True)
class EvalRow:
    """Mean metrics of one model over the test tasks of one family in one split."""

    split: str  # "unseen tasks", "held-out models" or "held-out records"
    family: str  # a task family, "all", or "sketch points" / "template points" (those candidates alone)
    model: str
    tasks: int
    pairwise: float
    top1: float
    top5: float
    train_s: float


def split_records(data: Dataset, holdout: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) indices: ``holdout`` of each task's records held out at random."""
    rng = np.random.default_rng(seed)
    test = []
    for g in np.unique(data.groups):
        idx = np.flatnonzero(data.groups == g)
        k = round(holdout * len(idx))
        if len(idx) >= 4 and k >= 2:
            test.append(rng.choice(idx, size=k, replace=False))
    test_idx = np.sort(np.concatenate(test)) if test else np.zeros(0, dtype=int)
    mask = np.zeros(len(data), dtype=bool)
    mask[test_idx] = True
    return np.flatnonzero(~mask), test_idx


def task_folds(data: Dataset, holdout: float, seed: int) -> list[np.ndarray]:
    """Tasks split into about ``1 / holdout`` folds; each fold's records are one test set.

    Every task is then judged once by a model that never saw any of its records.
    """
    tasks = np.unique(data.groups)
    if len(tasks) < 2:
        return []
    rng = np.random.default_rng(seed)
    folds = min(len(tasks), max(2, round(1 / holdout)))
    order = rng.permutation(tasks)
    return [np.flatnonzero(np.isin(data.groups, order[f::folds])) for f in range(folds)]


def model_folds(data: Dataset) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train, test) per model the records came from: the test set is that model's records,
    the training set every other model's records of other tasks (a task the held-out model
    shares with another would otherwise be seen). Empty with fewer than two models."""
    sources = sorted({str(s) for s in data.sources if s})
    if len(sources) < 2:
        return []
    out = []
    for source in sources:
        test = np.flatnonzero(data.sources == source)
        seen = np.isin(data.groups, np.unique(data.groups[test]))
        out.append((np.flatnonzero(~seen & (data.sources != "")), test))
    return out


def _space_class(space: str) -> str:
    return "sketch points" if space == "sketch" else "template points"


def evaluate(data: Dataset, models: dict[str, Factory], *, holdout: float = 0.2, seed: int = 0,
             splits: Sequence[str] = SPLITS) -> list[EvalRow]:  # fmt: skip
    """TenSet's metrics for each model on held-out data, per task family and per space kind.

    ``unseen tasks``: cross-validation over whole tasks (transfer to a new operator).
    ``held-out models``: each model's records judged by a model trained on the other models'
    other tasks (transfer to a new network; needs records of jobs of two models or more).
    ``held-out records``: a share of every task's records, the rest trains (a job's case).
    Rows ``sketch points`` and ``template points`` rank those candidates of each task alone.
    """
    rows: list[EvalRow] = []
    for name, factory in models.items():
        for split in splits:
            tasks: dict[str, dict[str, float]] = {}
            by_space: dict[str, dict[str, dict[str, float]]] = {}
            train_s = 0.0
            if split == "unseen tasks":
                tests = task_folds(data, holdout, seed)
                pairs = [(np.flatnonzero(~np.isin(np.arange(len(data)), t)), t) for t in tests]
            elif split == "held-out models":
                pairs = model_folds(data)
            else:
                pairs = [split_records(data, holdout, seed)]
            for train, test in pairs:
                if len(train) == 0 or len(test) == 0:
                    continue
                model = factory()
                start = time.perf_counter()
                model.fit(data.features[train], data.throughputs[train], data.groups[train])
                train_s += time.perf_counter() - start
                scores = model.predict(data.features[test])
                tasks |= per_task(scores, data.throughputs[test], data.groups[test])
                space = np.asarray([_space_class(str(k)) for k in data.spaces[test]])
                for cls in np.unique(space):
                    m = space == cls
                    by_space.setdefault(str(cls), {}).update(
                        per_task(scores[m], data.throughputs[test][m], data.groups[test][m]))
            for family in (*FAMILIES, "all"):
                chosen = {g: m for g, m in tasks.items() if family == "all" or data.family(g) == family}
                if not chosen:
                    continue
                mean = mean_metrics(chosen)
                rows.append(EvalRow(split, family, name, len(chosen), mean["pairwise"], mean["top1"], mean["top5"],
                                    train_s))  # fmt: skip
            for cls, chosen in sorted(by_space.items()):
                if len(by_space) < 2:
                    break  # one kind of space: the "all" row says it
                mean = mean_metrics(chosen)
                rows.append(EvalRow(split, cls, name, len(chosen), mean["pairwise"], mean["top1"], mean["top5"],
                                    train_s))  # fmt: skip
            logger.info("%s on %s: trained in %.1f s", name, split, train_s)
    return rows
