"""Running an artifact: random inputs of its own shapes and dtypes, and the latency of many runs
summarised (percentiles, mean and spread, throughput).

Numpy only: ``nightshift run`` and :func:`tuner.api.load` run an artifact with TVM's runtime
alone, so nothing here imports the compiler side of Nightshift.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)


def random_inputs(metadata: Mapping[str, Any], seed: int = 0) -> list[np.ndarray]:
    """Deterministic random inputs of the artifact's shapes and dtypes (its metadata's ``inputs``).

    Floats are uniform in [-1, 1); integers in [0, 100), or within an index input's ``bounds``
    where those are narrower (an index beyond its table is refused by the artifact), as
    :meth:`tuner.frontends.model.ModelSpec.random_inputs` makes them at tuning time.
    """
    rng = np.random.default_rng(seed)
    arrays = []
    for info in metadata.get("inputs", []):
        dtype, shape = np.dtype(info["dtype"]), tuple(info["shape"])
        if dtype.kind in "iu":
            lo, hi = info.get("bounds") or (0, 100)
            lo, hi = max(int(lo), 0), min(int(hi), max(int(lo), 0) + 100)
            arrays.append(rng.integers(lo, max(hi, lo + 1), size=shape).astype(dtype))
        elif dtype.kind == "b":
            arrays.append(rng.integers(0, 2, size=shape).astype(dtype))
        else:
            arrays.append(rng.uniform(-1, 1, size=shape).astype(dtype))
    return arrays


@dataclass(frozen=True)
class LatencyStats:
    """The latency of timed runs, in milliseconds.

    Attributes:
        runs: how many runs were timed.
        p50_ms, p90_ms, p99_ms: percentiles (linear interpolation between samples).
        mean_ms: the mean; ``std_ms`` its samples' standard deviation (ddof 1).
        min_ms, max_ms: the fastest and slowest run.
        throughput: runs (inferences) per second, one at a time: 1000 / ``mean_ms``.
    """

    runs: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    std_ms: float
    min_ms: float
    max_ms: float

    @property
    def throughput(self) -> float:
        """Inferences per second, one run at a time."""
        return 1e3 / self.mean_ms if self.mean_ms > 0 else float("inf")

    @classmethod
    def of(cls, samples_s: Sequence[float]) -> LatencyStats:
        """The statistics of ``samples_s`` (seconds per run; at least one).

        Raises:
            ValueError: no samples.
        """
        if not len(samples_s):
            raise ValueError("no timed runs")
        ms = np.asarray(samples_s, dtype=np.float64) * 1e3
        p50, p90, p99 = np.percentile(ms, [50, 90, 99])
        std = float(np.std(ms, ddof=1)) if ms.size > 1 else 0.0
        return cls(runs=int(ms.size), p50_ms=float(p50), p90_ms=float(p90), p99_ms=float(p99),
                   mean_ms=float(np.mean(ms)), std_ms=std, min_ms=float(ms.min()), max_ms=float(ms.max()))  # fmt: skip

    def describe(self) -> str:
        """Two lines for the user: the percentiles, then the mean with its spread and the throughput."""
        # The spread is the samples' standard deviation; under 100 runs p99 is near the slowest run.
        return (f"latency over {self.runs} runs: p50 {self.p50_ms:.3f} ms, p90 {self.p90_ms:.3f} ms, "
                f"p99 {self.p99_ms:.3f} ms (min {self.min_ms:.3f}, max {self.max_ms:.3f})\n"
                f"mean {self.mean_ms:.3f} ms ± {self.std_ms:.3f} ms (std, {self.cv:.1%} of the mean); "
                f"throughput {self.throughput:,.1f} inferences/s")

    @property
    def cv(self) -> float:
        """The coefficient of variation: ``std_ms / mean_ms``."""
        return self.std_ms / self.mean_ms if self.mean_ms > 0 else 0.0
