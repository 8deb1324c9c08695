"""Cost-model quality as TenSet defines it (Zheng et al., NeurIPS 2021 datasets track).

Both metrics are computed within one task, where the model's scores are comparable, then
averaged over tasks:

- pairwise ranking accuracy: among pairs of candidates with different measured throughput,
  the share the model orders the same way (a tie in the scores counts half);
- top-k score: the best measured throughput among the model's k highest-scored candidates,
  divided by the best measured throughput of the task.

Failed candidates have throughput 0 (slower than any success); NaN labels are left out.
"""

from __future__ import annotations

import numpy as np


def pairwise_accuracy(scores: np.ndarray, throughputs: np.ndarray) -> float:
    """Share of differently-labelled pairs ordered like the labels; NaN if there is none."""
    s, y = _clean(scores, throughputs)
    dy = np.sign(y[:, None] - y[None, :])
    ds = np.sign(s[:, None] - s[None, :])
    mask = dy > 0  # each unordered pair once, oriented so that y_i > y_j
    pairs = int(mask.sum())
    if pairs == 0:
        return float("nan")
    agree = (ds[mask] > 0).sum() + 0.5 * (ds[mask] == 0).sum()
    return float(agree / pairs)


def top_k_score(scores: np.ndarray, throughputs: np.ndarray, k: int) -> float:
    """Best throughput among the ``k`` top-scored candidates over the best; NaN if all fail."""
    s, y = _clean(scores, throughputs)
    if len(y) == 0 or y.max() <= 0:
        return float("nan")
    # Stable order on the negated scores: among equal scores, the earlier candidate wins, so
    # a constant model gets no luck from the sort.
    top = np.argsort(-s, kind="stable")[:k]
    return float(y[top].max() / y.max())


def per_task(scores: np.ndarray, throughputs: np.ndarray, groups: np.ndarray) -> dict[str, dict[str, float]]:
    """``{task: {pairwise, top1, top5, n}}`` for every task in ``groups``."""
    scores, throughputs, groups = np.asarray(scores, float), np.asarray(throughputs, float), np.asarray(groups)
    out: dict[str, dict[str, float]] = {}
    for g in np.unique(groups):
        m = groups == g
        out[str(g)] = {
            "pairwise": pairwise_accuracy(scores[m], throughputs[m]),
            "top1": top_k_score(scores[m], throughputs[m], 1),
            "top5": top_k_score(scores[m], throughputs[m], 5),
            "n": float(np.isfinite(throughputs[m]).sum()),
        }
    return out


def mean_metrics(tasks: dict[str, dict[str, float]]) -> dict[str, float]:
    """Unweighted mean over tasks of each metric (tasks where it is NaN left out)."""
    out: dict[str, float] = {"tasks": float(len(tasks))}
    for key in ("pairwise", "top1", "top5"):
        vals = [t[key] for t in tasks.values() if np.isfinite(t[key])]
        out[key] = float(np.mean(vals)) if vals else float("nan")
    return out


def evaluate_scores(scores: np.ndarray, throughputs: np.ndarray, groups: np.ndarray) -> dict[str, float]:
    """Mean pairwise accuracy, top-1 and top-5 score over the tasks of ``groups``."""
    return mean_metrics(per_task(scores, throughputs, groups))


def _clean(scores: np.ndarray, throughputs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s, y = np.asarray(scores, dtype=float), np.asarray(throughputs, dtype=float)
    if s.shape != y.shape:
        raise ValueError(f"{len(s)} scores for {len(y)} throughputs")
    keep = np.isfinite(y)
    return s[keep], y[keep]
