"""Per-store features of candidate schedules: TVM's ``PerStoreFeature`` rows, each followed by
the target's hardware descriptor (:mod:`cost_models.hardware`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import tvm
from tvm.s_tir import Schedule
from tvm.s_tir import meta_schedule as ms

from cost_models.hardware import HARDWARE_WIDTH, hardware_descriptor
from search_spaces.preload import preload_tensor_intrinsics

# Width of one PerStoreFeature row (extract_workload=False), the layout MetaSchedule's own
# XGBModel is trained on.
STORE_WIDTH = 164
# Width of one row as models see it: TVM's store features, then the hardware descriptor, so
# records of several devices train one model and its scores differ between them.
FEATURE_WIDTH = STORE_WIDTH + HARDWARE_WIDTH


class StoreFeatures:
    """Feature rows of several candidates; each candidate has one row per buffer store.

    A schedule has a variable number of stores, so rows of all candidates are kept in one
    ``(total_stores, width)`` matrix with offsets, which is what a per-store model trains on
    (MetaSchedule's pack-sum layout). Supports ``len`` and indexing by an int, a slice, or a
    sequence/array of indices or booleans, each giving a new ``StoreFeatures``.

    Args:
        rows: ``(total_stores, width)`` float32 matrix.
        offsets: ``(n + 1,)`` row offsets; candidate ``i`` owns ``rows[offsets[i]:offsets[i+1]]``.
    """

    __slots__ = ("offsets", "rows")

    def __init__(self, rows: np.ndarray, offsets: np.ndarray) -> None:
        self.rows = np.ascontiguousarray(rows, dtype=np.float32)
        self.offsets = np.asarray(offsets, dtype=np.int64)
        if self.rows.ndim != 2 or self.offsets.ndim != 1 or self.offsets[-1] != len(self.rows):
            raise ValueError(f"inconsistent store features: rows {self.rows.shape}, offsets {self.offsets.shape}")

    @classmethod
    def from_matrix(cls, x: np.ndarray) -> StoreFeatures:
        """One store per row: a plain ``(n, d)`` feature matrix as store features."""
        x = np.asarray(x, dtype=np.float32)
        if x.ndim != 2:
            raise ValueError(f"features must be 2-D, got shape {x.shape}")
        return cls(x, np.arange(len(x) + 1))

    @classmethod
    def from_list(cls, per_candidate: Sequence[np.ndarray], width: int = FEATURE_WIDTH) -> StoreFeatures:
        """From one ``(stores_i, width)`` matrix per candidate."""
        counts = [len(r) for r in per_candidate]
        offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        rows = np.concatenate(per_candidate) if any(counts) else np.zeros((0, width), dtype=np.float32)
        return cls(rows, offsets)

    @classmethod
    def concat(cls, parts: Iterable[StoreFeatures]) -> StoreFeatures:
        """All candidates of ``parts``, in order."""
        parts = list(parts)
        if not parts:
            return cls(np.zeros((0, FEATURE_WIDTH), dtype=np.float32), np.zeros(1, dtype=np.int64))
        widths = {p.width for p in parts}
        if len(widths) > 1:
            raise ValueError(f"cannot concatenate store features of widths {sorted(widths)}")
        shift = np.cumsum([0] + [len(p.rows) for p in parts[:-1]])
        offsets = np.concatenate([[0]] + [p.offsets[1:] + s for p, s in zip(parts, shift, strict=True)])
        return cls(np.concatenate([p.rows for p in parts]), offsets)

    @property
    def width(self) -> int:
        return int(self.rows.shape[1])

    @property
    def ids(self) -> np.ndarray:
        """Candidate index of every row (for summing per-store predictions)."""
        return np.repeat(np.arange(len(self)), np.diff(self.offsets))

    def candidate(self, i: int) -> np.ndarray:
        """The store rows of candidate ``i``."""
        return self.rows[self.offsets[i] : self.offsets[i + 1]]

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index) -> StoreFeatures:
        picked = np.arange(len(self))[index]
        picked = np.atleast_1d(picked)
        return StoreFeatures.from_list([self.candidate(int(i)) for i in picked], self.width)

    def __repr__(self) -> str:
        return f"StoreFeatures({len(self)} candidates, {len(self.rows)} stores x {self.width})"


def as_store_features(features: StoreFeatures | np.ndarray) -> StoreFeatures:
    """``features`` as ``StoreFeatures``; a 2-D array counts as one store per row."""
    if isinstance(features, StoreFeatures):
        return features
    x = np.asarray(features, dtype=np.float32)
    if x.size == 0:
        # The search code's "nothing proposed" is a (0, 0) array.
        x = x.reshape(0, x.shape[1] if x.ndim == 2 else 0)
    return StoreFeatures.from_matrix(x)


def extract_features(mod: tvm.IRModule, target: tvm.target.Target, schedules: list[Schedule]) -> StoreFeatures:
    """TVM's per-store features (164 per buffer store) of each schedule of ``mod``, each row
    followed by ``target``'s hardware descriptor (``FEATURE_WIDTH`` in all)."""
    if not schedules:
        return StoreFeatures.from_list([])
    preload_tensor_intrinsics()
    ctx = ms.TuneContext(mod=mod, target=target, task_name="features", num_threads=1)
    args = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    cands = [ms.MeasureCandidate(s, args) for s in schedules]
    extractor = ms.feature_extractor.PerStoreFeature(extract_workload=False)
    hw = hardware_descriptor(target)
    rows = []
    for f in extractor.extract_from(ctx, cands):
        store = f.numpy().astype(np.float32)
        rows.append(np.hstack([store, np.broadcast_to(hw, (len(store), len(hw)))]))
    return StoreFeatures.from_list(rows)
