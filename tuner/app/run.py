"""Running an artifact: random inputs of its own shapes and dtypes, and the latency of many runs
summarised (median and IQR, percentiles, mean and spread, throughput).

Every latency Nightshift prints (``tune``'s closing lines, ``bench``'s table, ``run``, the
report) is timed by :func:`time_runs` and summarised by :class:`LatencyStats`: warm-up runs,
then N timed calls, each from host inputs to host outputs (what a caller of the model pays, and
what the peers' runtimes are timed doing), reported as the median and the interquartile range.

Numpy only: ``nightshift run`` and :func:`tuner.api.load` run an artifact with TVM's runtime
alone, so nothing here imports the compiler side of Nightshift.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
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


#: What one timed run is, said beside every latency figure.
TIMING_METHOD = "each run copies the inputs in and the outputs out"
#: Seconds of untimed runs before the timed ones (at least the ``warmup`` count). One run was
#: not enough after an idle pause: on the 2-core host (2026-12-02) the tiny model's run after
#: a 0.1 s sleep and one warm-up took a median 0.22 ms, after ten 0.11 ms, back to back 0.18.
WARMUP_S = 0.02


def time_runs(call: Callable[[], object], runs: int, *, warmup: int = 1, warmup_s: float = WARMUP_S) -> list[float]:
    """Seconds of each of ``runs`` timed calls of ``call``, after untimed ones: at least
    ``warmup``, and more until ``warmup_s`` seconds have passed.

    The one timing method of Nightshift's outputs: ``call`` is a whole run of the model, host
    inputs in and host outputs out (a copy to numpy waits for the device), so a TVM build and a
    peer runtime, or ``run`` and ``bench`` on the same artifact, are timed alike.
    """
    start, done = time.perf_counter(), 0
    while done < warmup or (warmup_s > 0 and time.perf_counter() - start < warmup_s):
        call()
        done += 1
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t0)
    return samples


@dataclass(frozen=True)
class LatencyStats:
    """The latency of timed runs, in milliseconds.

    Attributes:
        runs: how many runs were timed.
        p50_ms, p90_ms, p99_ms: percentiles (linear interpolation between samples); ``p50_ms``
            is the median, the figure every output leads with.
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
    #: The quartiles: ``p75_ms - p25_ms`` is the spread printed beside the median.
    p25_ms: float = 0.0
    p75_ms: float = 0.0

    @property
    def median_ms(self) -> float:
        """The median latency (``p50_ms``)."""
        return self.p50_ms

    @property
    def iqr_ms(self) -> float:
        """The interquartile range in milliseconds."""
        return self.p75_ms - self.p25_ms

    @property
    def spread(self) -> float:
        """The interquartile range over the median (0 for a zero median)."""
        return self.iqr_ms / self.p50_ms if self.p50_ms > 0 else 0.0

    def headline(self, what: str = "latency") -> str:
        """``what`` as one line: the median, the IQR and how it was measured."""
        return (f"{what} {self.p50_ms:.3f} ms (median of {self.runs} runs, IQR {self.p25_ms:.3f}-{self.p75_ms:.3f} ms "
                f"= {self.spread:.0%} of the median; {TIMING_METHOD})")

    def to_json(self) -> dict[str, float | int | str]:
        """The figures a result file records: median, quartiles, runs and the method."""
        return {"median_ms": self.p50_ms, "p25_ms": self.p25_ms, "p75_ms": self.p75_ms, "iqr_ms": self.iqr_ms,
                "min_ms": self.min_ms, "runs": self.runs, "method": f"median of {self.runs} runs; {TIMING_METHOD}"}

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
        p25, p50, p75, p90, p99 = np.percentile(ms, [25, 50, 75, 90, 99])
        std = float(np.std(ms, ddof=1)) if ms.size > 1 else 0.0
        return cls(runs=int(ms.size), p50_ms=float(p50), p90_ms=float(p90), p99_ms=float(p99),
                   mean_ms=float(np.mean(ms)), std_ms=std, min_ms=float(ms.min()), max_ms=float(ms.max()),
                   p25_ms=float(p25), p75_ms=float(p75))  # fmt: skip

    def describe(self) -> str:
        """Three lines for the user: the median with its IQR (as every output leads with), the
        percentiles, then the mean with its standard deviation and the throughput."""
        # The std is pulled up by a few slow runs (a shared host's); the IQR beside the median is not.
        return (f"{self.headline()}\n"
                f"latency over {self.runs} runs: p50 {self.p50_ms:.3f} ms, p90 {self.p90_ms:.3f} ms, "
                f"p99 {self.p99_ms:.3f} ms (min {self.min_ms:.3f}, max {self.max_ms:.3f})\n"
                f"mean {self.mean_ms:.3f} ms ± {self.std_ms:.3f} ms (std, {self.cv:.1%} of the mean); "
                f"throughput {self.throughput:,.1f} inferences/s")

    @property
    def cv(self) -> float:
        """The coefficient of variation: ``std_ms / mean_ms``."""
        return self.std_ms / self.mean_ms if self.mean_ms > 0 else 0.0
