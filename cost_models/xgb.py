"""XGBoost over TVM's per-store features: one prediction per store, summed per candidate."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, fields, replace
from typing import Literal

import numpy as np
import xgboost as xgb

from cost_models.base import CostModel, Features
from cost_models.features import StoreFeatures, as_store_features

logger = logging.getLogger(__name__)

# Booster attributes saved inside the UBJ bytes, so a stored model says what it is.
_ATTR_SAMPLES = "nightshift_num_samples"
_ATTR_OBJECTIVE = "nightshift_objective"


@dataclass(frozen=True)
class XGBConfig:
    """Training settings of :class:`XGBCostModel`.

    Attributes:
        objective: ``"rank"``: pairwise logistic loss between candidates of the same task on
            their summed scores (RankNet's loss); ``"mse"``: MetaSchedule's squared error on
            the throughput normalized by the task's best, weighted by that throughput.
        max_depth, eta, min_child_weight, gamma: XGBoost tree parameters.
        max_rounds: boosting rounds at most.
        early_stopping_rounds: stop when the held-out pairwise error has not improved in
            this many rounds.
        valid_fraction: share of candidates held out for early stopping.
        min_valid: below this many labelled candidates there is no held-out set and
            ``small_rounds`` rounds are trained: a held-out set of fewer than 40 candidates
            stops too early (96 measured dense schedules, 3 draws: held-out pairwise 0.691
            with early stopping from 64 candidates, 0.732 from 200).
        small_rounds: rounds trained without a held-out set.
        small_max_depth: tree depth without a held-out set: with nothing to stop early on,
            shallow trees overfit a few dozen candidates less (held-out pairwise accuracy
            0.705 against 0.674 at depth 8, 48 candidates of a task, 8 tasks x 4 seeds).
        refit: after early stopping, train again on all candidates (held-out ones included)
            for the rounds found best.
        retrain_growth: ``update`` retrains once the labelled data has grown by this share
            since the last training...
        retrain_min_new: ...and by at least this many candidates.
        max_pairs_per_candidate: ``rank`` samples at most this many pairs per candidate of a
            task (all pairs of a large task would be quadratic).
        nthread: XGBoost threads (1 keeps results identical across machines and runs).
    """

    objective: Literal["rank", "mse"] = "rank"
    max_depth: int = 8
    eta: float = 0.2
    min_child_weight: float = 0.0
    gamma: float = 0.001
    max_rounds: int = 300
    early_stopping_rounds: int = 30
    valid_fraction: float = 0.2
    min_valid: int = 200
    small_rounds: int = 40
    small_max_depth: int = 4
    refit: bool = True
    retrain_growth: float = 0.2
    retrain_min_new: int = 16
    max_pairs_per_candidate: int = 64
    nthread: int = 1


class _Pack:
    """Candidates' store rows as one DMatrix, their labels, and same-task pairs for ``rank``."""

    def __init__(self, feats: StoreFeatures, labels: np.ndarray | None = None, groups: np.ndarray | None = None,
                 *, max_pairs: int = 64, rng: np.random.Generator | None = None) -> None:  # fmt: skip
        self.n = len(feats)
        self.ids = feats.ids
        self.dmatrix = xgb.DMatrix(feats.rows, nthread=1)
        self.labels = labels
        self.pairs = _pairs(labels, groups, max_pairs, rng or np.random.default_rng(0)) if labels is not None else None

    def scores(self, store_preds: np.ndarray) -> np.ndarray:
        return np.bincount(self.ids, weights=store_preds, minlength=self.n)

    def pair_error(self, store_preds: np.ndarray) -> float:
        """Share of sampled same-task pairs ordered wrong (ties count half)."""
        s = self.scores(store_preds)
        hi, lo = self.pairs
        if len(hi) == 0:
            return 0.0
        d = s[hi] - s[lo]
        return float(((d < 0).sum() + 0.5 * (d == 0).sum()) / len(hi))


def _pairs(
    labels: np.ndarray, groups: np.ndarray, max_per: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs (hi, lo) of the same group with labels[hi] > labels[lo]."""
    his, los = [], []
    for g in np.unique(groups):
        idx = np.flatnonzero(groups == g)
        if len(idx) < 2:
            continue
        if len(idx) <= 2 * max_per + 1:
            a, b = np.triu_indices(len(idx), k=1)
        else:
            # Each candidate paired with max_per random others of its task.
            a = np.repeat(np.arange(len(idx)), max_per)
            b = rng.integers(0, len(idx), size=len(a))
        a, b = idx[a], idx[b]
        la, lb = labels[a], labels[b]
        keep = la != lb
        a, b, la, lb = a[keep], b[keep], la[keep], lb[keep]
        flip = la < lb
        his.append(np.where(flip, b, a))
        los.append(np.where(flip, a, b))
    if not his:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(his), np.concatenate(los)


class XGBCostModel(CostModel):
    """Gradient-boosted trees scoring each buffer store; a candidate's score is the sum.

    Labels are throughputs normalized by the best of their task, so tasks of very different
    sizes share one model (failed candidates: 0). The objective (``XGBConfig.objective``) is
    either a pairwise ranking loss within each task or MetaSchedule's weighted squared
    error; ``benchmarks/cost_model_quality.py`` compares them. Training holds out a share of
    the candidates and stops early on their pairwise ranking error. A loaded model (see
    :meth:`load`) is kept as the base that later training adds trees to.

    Args:
        seed: seeds the held-out split, pair sampling and XGBoost.
        config: training settings; keyword overrides of single fields also work
            (``XGBCostModel(objective="mse")``).
    """

    name = "xgb"

    def __init__(self, *, seed: int = 0, config: XGBConfig | None = None, **overrides) -> None:
        known = {f.name for f in fields(XGBConfig)}
        unknown = set(overrides) - known
        if unknown:
            raise TypeError(f"unknown XGBCostModel options {sorted(unknown)}; known: {sorted(known)}")
        self.config = replace(config or XGBConfig(), **overrides)
        self.seed = seed
        self._x: list[StoreFeatures] = []
        self._y: list[np.ndarray] = []
        self._g: list[np.ndarray] = []
        self._booster: xgb.Booster | None = None
        self._base: xgb.Booster | None = None  # loaded model that training continues from
        self._base_samples = 0
        self._trained_on = 0

    # --- data -----------------------------------------------------------------------------

    @property
    def num_samples(self) -> int:
        return self._base_samples + self._trained_on if self._booster is not None else 0

    @property
    def num_labelled(self) -> int:
        """Labelled candidates held (NaN labels excluded)."""
        return int(sum(np.isfinite(y).sum() for y in self._y))

    def fit(self, features: Features, throughputs: np.ndarray, groups: np.ndarray) -> None:
        self._x, self._y, self._g = [], [], []
        self._add(features, throughputs, groups)
        self._train()

    def update(self, features: Features, throughputs: np.ndarray, groups: np.ndarray) -> None:
        self._add(features, throughputs, groups)
        n = self.num_labelled
        grown = n - self._trained_on
        if grown <= 0:
            return
        if self._booster is None or grown >= max(self.config.retrain_growth * self._trained_on,
                                                 self.config.retrain_min_new):  # fmt: skip
            self._train()
        else:
            logger.debug("cost model: %d new samples since training on %d; not retrained", grown, self._trained_on)

    def _add(self, features: Features, throughputs: np.ndarray, groups: np.ndarray) -> None:
        feats = as_store_features(features)
        y = np.asarray(throughputs, dtype=np.float64).reshape(-1)
        g = np.asarray(groups).reshape(-1).astype(str)
        if not len(feats) == len(y) == len(g):
            raise ValueError(f"{len(feats)} candidates, {len(y)} throughputs and {len(g)} groups")
        if len(y):
            self._x.append(feats)
            self._y.append(y)
            self._g.append(g)

    # --- training -------------------------------------------------------------------------

    def _params(self, small: bool = False) -> dict:
        c = self.config
        return {
            "max_depth": min(c.max_depth, c.small_max_depth) if small else c.max_depth, "eta": c.eta,
            "min_child_weight": c.min_child_weight, "gamma": c.gamma,
            "seed": self.seed, "nthread": c.nthread, "verbosity": 0, "base_score": 0.0,
            "disable_default_eval_metric": 1,
        }  # fmt: skip

    def _train(self) -> None:
        if not self._y:
            return
        start = time.perf_counter()
        y_all = np.concatenate(self._y)
        keep = np.isfinite(y_all)
        feats = StoreFeatures.concat(self._x)
        if not keep.all():
            feats = feats[keep]
        y, g = y_all[keep], np.concatenate(self._g)[keep]
        if len(y) == 0:
            return
        labels = _normalize(y, g)
        c = self.config
        rng = np.random.default_rng(self.seed)
        rounds = c.small_rounds
        if len(y) >= c.min_valid:
            order = rng.permutation(len(y))
            n_valid = max(1, round(c.valid_fraction * len(y)))
            valid, train = np.sort(order[:n_valid]), np.sort(order[n_valid:])
            tr = _Pack(feats[train], labels[train], g[train], max_pairs=c.max_pairs_per_candidate, rng=rng)
            va = _Pack(feats[valid], labels[valid], g[valid], max_pairs=c.max_pairs_per_candidate, rng=rng)
            booster = self._boost(tr, c.max_rounds, va)
            best = int(booster.best_iteration) + 1  # counts the base model's rounds too
            rounds = best - self._base_rounds()
            if not c.refit:
                self._finish(booster[:best], len(y), start)
                return
        full = _Pack(feats, labels, g, max_pairs=c.max_pairs_per_candidate, rng=rng)
        self._finish(self._boost(full, max(rounds, 1), small=len(y) < c.min_valid), len(y), start)

    def _base_rounds(self) -> int:
        return self._base.num_boosted_rounds() if self._base is not None else 0

    def _boost(self, tr: _Pack, rounds: int, va: _Pack | None = None, *, small: bool = False) -> xgb.Booster:
        objective = self._rank_objective if self.config.objective == "rank" else self._mse_objective

        def obj(preds: np.ndarray, _d: xgb.DMatrix) -> tuple[np.ndarray, np.ndarray]:
            return objective(tr, preds)

        kwargs: dict = {}
        if va is not None:
            kwargs = {
                "evals": [(va.dmatrix, "valid")],
                "custom_metric": lambda preds, _d: ("pair-error", va.pair_error(preds)),
                "early_stopping_rounds": self.config.early_stopping_rounds,
                "verbose_eval": False,
            }
        return xgb.train(self._params(small), tr.dmatrix, num_boost_round=rounds, obj=obj, xgb_model=self._base,
                         **kwargs)  # fmt: skip

    @staticmethod
    def _rank_objective(tr: _Pack, preds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # RankNet on summed store scores: loss log(1 + exp(-(s_hi - s_lo))) per pair. Every
        # store of a candidate gets the candidate's gradient (d s / d store = 1).
        s = tr.scores(preds)
        hi, lo = tr.pairs
        p = 1.0 / (1.0 + np.exp(np.clip(s[hi] - s[lo], -50, 50)))  # sigma(-(s_hi - s_lo))
        grad = np.bincount(lo, weights=p, minlength=tr.n) - np.bincount(hi, weights=p, minlength=tr.n)
        h = np.maximum(p * (1 - p), 1e-6)
        hess = np.bincount(lo, weights=h, minlength=tr.n) + np.bincount(hi, weights=h, minlength=tr.n)
        hess = np.maximum(hess, 1e-6)  # candidates in no pair (a task of one) still need a finite step
        return grad[tr.ids], hess[tr.ids]

    @staticmethod
    def _mse_objective(tr: _Pack, preds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # MetaSchedule's pack-sum objective: squared error of the summed score against the
        # normalized throughput, weighted by that throughput (fast candidates matter most).
        y = tr.labels
        s = tr.scores(preds)
        grad = (s - y) * y
        hess = np.maximum(y, 1e-6)  # failed candidates (y=0) keep a tiny pull towards 0
        return grad[tr.ids], hess[tr.ids]

    def _finish(self, booster: xgb.Booster, n: int, start: float) -> None:
        self._trained_on = n
        booster.set_attr(**{_ATTR_SAMPLES: str(self._base_samples + n), _ATTR_OBJECTIVE: self.config.objective})
        self._booster = booster
        logger.debug("cost model trained on %d samples: %d rounds in %.1f s", n, booster.num_boosted_rounds(),
                     time.perf_counter() - start)  # fmt: skip

    # --- prediction and persistence ---------------------------------------------------------

    def predict(self, features: Features) -> np.ndarray:
        feats = as_store_features(features)
        if self._booster is None or len(feats) == 0:
            return np.zeros(len(feats))
        preds = self._booster.predict(xgb.DMatrix(feats.rows, nthread=1))
        return np.bincount(feats.ids, weights=preds, minlength=len(feats))

    @property
    def num_features(self) -> int | None:
        """Feature width the trained model reads (None when untrained)."""
        return int(self._booster.num_features()) if self._booster is not None else None

    def save(self, raw_format: Literal["ubj", "json"] = "ubj") -> bytes:
        """XGBoost's UBJSON (``save_raw("ubj")``; ``"json"``: its JSON, for files people read
        and diff), with the sample count and objective as attributes."""
        if self._booster is None:
            return b""
        return bytes(self._booster.save_raw(raw_format=raw_format))

    def load(self, blob: bytes) -> None:
        """Load UBJSON or JSON bytes of :meth:`save`; later training adds trees to this model."""
        if not blob:
            self._booster = self._base = None
            self._base_samples = self._trained_on = 0
            return
        booster = xgb.Booster(params={"nthread": self.config.nthread})
        try:
            booster.load_model(bytearray(blob))
        except xgb.core.XGBoostError as err:
            raise ValueError(f"not an XGBoost model: {str(err).splitlines()[0]}") from err
        self._booster = self._base = booster
        self._base_samples = int(booster.attr(_ATTR_SAMPLES) or 0)
        self._trained_on = 0
        # Data held before the load was trained into another model; the next update
        # retrains with it on top of the loaded trees.
        logger.debug("cost model loaded: %d rounds, trained on %d samples", booster.num_boosted_rounds(),
                     self._base_samples)  # fmt: skip


def _normalize(y: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Throughput over the best of its group; 0 for failures and for all-failed groups."""
    out = np.zeros_like(y)
    for group in np.unique(g):
        m = g == group
        best = y[m].max()
        if best > 0:
            out[m] = np.maximum(y[m], 0) / best
    return out
