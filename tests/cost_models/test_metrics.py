import numpy as np
import pytest

from cost_models.metrics import evaluate_scores, pairwise_accuracy, top_k_score


def test_pairwise_accuracy_counts_ordered_pairs():
    y = np.array([1.0, 2.0, 3.0, 0.0])
    assert pairwise_accuracy(y, y) == 1.0
    assert pairwise_accuracy(-y, y) == 0.0
    assert pairwise_accuracy(np.zeros(4), y) == 0.5  # ties count half
    # One swapped pair of six.
    assert pairwise_accuracy(np.array([2.0, 1.0, 3.0, 0.0]), y) == pytest.approx(5 / 6)
    assert np.isnan(pairwise_accuracy(np.ones(3), np.ones(3)))


def test_top_k_score_is_best_pick_over_best():
    y = np.array([10.0, 5.0, 2.0, 1.0, 0.0, 8.0])
    scores = np.array([0.0, 9.0, 8.0, 7.0, 6.0, 5.0])
    assert top_k_score(scores, y, 1) == 0.5
    assert top_k_score(scores, y, 5) == 0.8
    assert top_k_score(y, y, 1) == 1.0
    assert np.isnan(top_k_score(scores, np.zeros(6), 1))


def test_metrics_are_per_task_and_skip_nan_labels():
    y = np.array([1.0, 2.0, np.nan, 100.0, 200.0])
    g = np.array(["a", "a", "a", "b", "b"])
    # Across tasks the order is wrong, within each task right: only within counts.
    scores = np.array([10.0, 20.0, -5.0, 1.0, 2.0])
    got = evaluate_scores(scores, y, g)
    assert got == {"tasks": 2.0, "pairwise": 1.0, "top1": 1.0, "top5": 1.0}
