"""What a build and a measurement produce. Failures are data: an error class, never a raise."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

# How a candidate was timed (records.timing): "warm", repeated calls on warm caches, or
# "cold", the caches flushed before every run (TimingConfig.flush_cache on a CPU). Warm times
# are lower, so the two are never ranked against each other.
Timing = Literal["warm", "cold"]


class ErrorClass(StrEnum):
    """Why a candidate has no valid timing."""

    BUILD_ERROR = "build_error"
    BUILD_TIMEOUT = "build_timeout"
    RUN_ERROR = "run_error"
    RUN_CRASH = "run_crash"
    RUN_TIMEOUT = "run_timeout"
    WRONG_RESULT = "wrong_result"
    LOST = "lost"
    # A CPU timing that did not get its node's lease within its bound (the node stayed busy
    # with builds or searches): says nothing of the candidate.
    LEASE_TIMEOUT = "lease_timeout"
    # Measured, but its trace fails tuner.db.validate's allow-list: no compile would use it.
    REFUSED_TRACE = "refused_trace"


@dataclass(frozen=True)
class BuildResult:
    """A built candidate: a shared library as bytes, or why it did not build.

    ``artifact`` is None both for failed builds and for builds whose bytes stayed in Ray's
    object store (the measurer passes those to the device actor by reference).
    """

    artifact: bytes | None
    build_sec: float
    error_class: ErrorClass | None = None
    error_msg: str | None = None
    node_id: str | None = None
    size: int = 0

    @property
    def ok(self) -> bool:
        """Whether the candidate built."""
        return self.error_class is None


@dataclass(frozen=True)
class RunResult:
    """Every repeat's time in seconds, or why there is none.

    Attributes:
        run_secs: every repeat kept, re-measurements included, in the order taken.
        early_stopped: the candidate was far slower than the task's best so far; ``run_secs``
            holds only the short probe, whose minimum is a lower bound of its time.
        remeasured: how many extra rounds of repeats a noisy first round triggered.
        quiet_wait_s: time the timing waited for the node's running builds to end (CPU).
        builds_waited: how many builds (or searching drivers) it waited for.
        busy_s: time the device actor spent on this candidate (load, check, timing).
        node_id: the Ray node that timed it.
        device_fingerprint: the fingerprint of the device that timed it, as its node sees it.
    """

    run_secs: list[float] = field(default_factory=list)
    error_class: ErrorClass | None = None
    error_msg: str | None = None
    early_stopped: bool = False
    remeasured: int = 0
    quiet_wait_s: float = 0.0
    builds_waited: int = 0
    busy_s: float = 0.0
    node_id: str | None = None
    device_fingerprint: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the candidate has valid timings (an early-stopped probe counts)."""
        return self.error_class is None and bool(self.run_secs)

    @property
    def median(self) -> float | None:
        """Median of all repeats, or None without timings."""
        return statistics.median(self.run_secs) if self.run_secs else None

    @property
    def spread(self) -> float | None:
        """Interquartile range over the median: the repeats' relative noise."""
        return relative_spread(self.run_secs) if self.run_secs else None


@dataclass(frozen=True)
class Measurement:
    """One candidate's build and run, as the measurer returns them."""

    build: BuildResult
    run: RunResult

    @property
    def error_class(self) -> ErrorClass | None:
        """The first error along the way, or None for a valid timing."""
        return self.build.error_class or self.run.error_class

    @property
    def error_msg(self) -> str | None:
        """What went wrong, for the record."""
        return self.build.error_msg or self.run.error_msg


def relative_spread(secs: list[float]) -> float:
    """(p75 - p25) / median of ``secs``; 0 for fewer than two values."""
    if len(secs) < 2:
        return 0.0
    q1, med, q3 = statistics.quantiles(secs, n=4, method="inclusive")
    return (q3 - q1) / med if med > 0 else 0.0
