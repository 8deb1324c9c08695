"""Feature vectors of candidate schedules, from TVM's per-store feature extractor."""

from __future__ import annotations

import numpy as np
import tvm
from tvm.s_tir import Schedule
from tvm.s_tir import meta_schedule as ms

# PerStoreFeature gives one 164-wide row per buffer store; a schedule has a variable number
# of stores, so rows are pooled into a fixed-width vector.
_PER_STORE = 164
FEATURE_WIDTH = 3 * _PER_STORE + 1


def extract_features(
    mod: tvm.IRModule, target: tvm.target.Target, schedules: list[Schedule]
) -> np.ndarray:
    """Pooled (mean, max, sum) per-store features, plus the store count, per schedule."""
    if not schedules:
        return np.zeros((0, FEATURE_WIDTH), dtype=np.float32)
    ctx = ms.TuneContext(mod=mod, target=target, task_name="features", num_threads=1)
    args = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    cands = [ms.MeasureCandidate(s, args) for s in schedules]
    extractor = ms.feature_extractor.PerStoreFeature(extract_workload=False)
    out = np.zeros((len(schedules), FEATURE_WIDTH), dtype=np.float32)
    for i, feat in enumerate(extractor.extract_from(ctx, cands)):
        rows = feat.numpy()
        if rows.size:
            out[i, :-1] = np.concatenate([rows.mean(0), rows.max(0), rows.sum(0)])
        out[i, -1] = rows.shape[0]
    return out
