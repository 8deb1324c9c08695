"""A tuning job's events and the progress they add up to.

The job emits one plain dict per event (``{"event": "batch_done", "t": ..., ...}``); what
shows progress reads them: the live terminal view, the ``--log-json`` file (one JSON object
a line), and anything that reads that file later (the report). :class:`JobProgress` is the
state the events add up to, so every reader computes trials per minute, estimated latency
and the rest the same way.

Events, in order: ``job_start`` (job id and name, resumed or not, budget, trials cap, the
tasks with their weight, FLOPs and reuse rule), ``batch_submitted`` (a batch proposed and
sent to be built and timed, with ``propose_s``: where proposing it went), ``batch_done``
(per measured batch: task, trials, errors by class, the task's best, ``device_s``/``build_s``:
the device's busy and the builds' CPU seconds, ``wait_s``: how long the job waited for it),
``task_done`` (a task gets no more trials, and why), ``retry`` (the database or the Ray
cluster is unreachable; waiting), ``task_reranked`` (after the search, a task's fastest
records timed in interleaved rounds: its stored best, its best now, how many were re-timed,
whether another record is now the best; ``tuner.rerank``), ``job_end`` (state
``done``/``stopped``/``failed``, why, totals).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

Event = dict[str, Any]
EventSink = Callable[[Event], None]


def per_operator(costs: Iterable[tuple[str, float | None]]) -> list[float | None]:
    """Each operator's cost from its tasks' ``(choice, cost)``: a task without a ``choice``
    is its own operator; layout variants of one (one ``choice``) count once, the lowest
    known cost among them (None when none is known)."""
    groups: dict[str, float | None] = {}
    for i, (choice, cost) in enumerate(costs):
        key = choice or f"#{i}"
        old = groups.get(key)
        groups[key] = cost if old is None else old if cost is None else min(old, cost)
    return list(groups.values())


def preferred_plan(tasks: Iterable[tuple[tuple[int, ...], str, float | None]]) -> int | None:
    """The uniform layout plan an estimate follows, from the tasks' ``(plans, choice, cost)``.

    A job tuning convs in several layouts also tunes each layout's own other operators (a
    ``mean`` reading NCHW8c beside one reading NCHW); the model runs one set of them. The plan
    is the one whose conv variants cost least over the conv groups measured in every plan
    (the scheduler's rule), else the first. None when no task is tied to a plan.
    """
    items = list(tasks)
    ranks = sorted({r for plans, _choice, _cost in items for r in plans})
    if not ranks:
        return None
    groups: dict[str, dict[int, float | None]] = {}
    for plans, choice, cost in items:
        if choice:
            for r in plans or ranks:
                groups.setdefault(choice, {})[r] = cost
    totals = dict.fromkeys(ranks, 0.0)
    measured = False
    for costs in groups.values():
        if set(costs) >= set(ranks) and all(c is not None for c in costs.values()):
            measured = True
            for r in ranks:
                totals[r] += costs[r]  # type: ignore[operator]
    return min(ranks, key=lambda r: (totals[r], r)) if measured else ranks[0]


def in_plan(plans: tuple[int, ...], choice: str, plan: int | None) -> bool:
    """Whether a task counts in an estimate following ``plan`` (:func:`preferred_plan`): conv
    variants always do (:func:`per_operator` keeps the fastest), other operators only when
    ``plan`` runs them."""
    return bool(choice) or plan is None or not plans or plan in plans


def event(kind: str, **fields: Any) -> Event:
    """An event dict: its kind, the wall-clock time, and ``fields``."""
    return {"event": kind, "t": time.time(), **fields}


@dataclass
class TaskProgress:
    """One task as the events tell it."""

    name: str
    workload_key: str
    weight: int
    flops: float
    reuse: str = "new"
    #: Layout-variant group (``Task.choice``): the model runs one task of a group.
    choice: str = ""
    #: Uniform layout plans running the task (``Task.plans``); empty: every plan.
    plans: tuple[int, ...] = ()
    trials: int = 0
    errors: int = 0
    #: Best latency when the job started (stored records), else its first measured best.
    start_sec: float | None = None
    best_sec: float | None = None
    done: str | None = None

    @property
    def gflops(self) -> float | None:
        if self.best_sec is None or not self.flops:
            return None
        return self.flops / self.best_sec / 1e9


@dataclass
class JobProgress:
    """The state a job's events add up to (see the module docstring)."""

    job_id: int | None = None
    name: str = ""
    model: str = ""
    device: str = ""
    resumed: bool = False
    time_budget_s: float | None = None
    trials_cap: int | None = None
    #: Trials and tuning seconds of earlier runs of this job (a resumed job).
    trials_before: int = 0
    elapsed_before_s: float = 0.0
    trials_done: int = 0
    elapsed_s: float = 0.0
    started_t: float = 0.0
    tasks: list[TaskProgress] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    state: str = "running"
    reason: str = ""
    retrying: str | None = None
    #: Seconds spent proposing batches (``batch_submitted.propose_s.total``) and the device's
    #: busy seconds on measured batches (``batch_done.device_s``), over this run.
    propose_s: float = 0.0
    device_s: float = 0.0

    def apply(self, ev: Event) -> None:
        """Take one event into account."""
        kind = ev["event"]
        if kind == "job_start":
            self.job_id, self.name, self.model = ev["job_id"], ev["name"], ev["model"]
            self.device, self.resumed = ev["device"], ev["resumed"]
            self.time_budget_s, self.trials_cap = ev.get("time_budget_s"), ev.get("trials_cap")
            self.trials_before = self.trials_done = ev.get("trials_before", 0)
            self.elapsed_before_s = self.elapsed_s = ev.get("elapsed_before_s", 0.0)
            self.started_t = ev["t"]
            self.tasks = [TaskProgress(t["name"], t["workload_key"], t["weight"], t["flops"], t.get("reuse", "new"),
                                       t.get("choice", ""), tuple(t.get("plans") or ()), t.get("trials", 0), 0,
                                       t.get("best_sec"), t.get("best_sec"), t.get("done"))
                          for t in ev["tasks"]]  # fmt: skip
        elif kind == "batch_submitted":
            self.propose_s += float((ev.get("propose_s") or {}).get("total", 0.0))
        elif kind == "batch_done":
            self.device_s += float(ev.get("device_s", 0.0))
            t = self.tasks[ev["task"]]
            t.trials += ev["trials"]
            t.errors += sum(ev["errors"].values())
            for cls, n in ev["errors"].items():
                self.errors[cls] = self.errors.get(cls, 0) + n
            if ev.get("best_sec") is not None and (t.best_sec is None or ev["best_sec"] < t.best_sec):
                t.best_sec = ev["best_sec"]
            if t.start_sec is None:
                t.start_sec = t.best_sec
            self.trials_done, self.elapsed_s = ev["trials_done"], ev["elapsed_s"]
            self.retrying = None
        elif kind == "task_done":
            self.tasks[ev["task"]].done = ev["reason"]
        elif kind == "task_reranked":
            # The new best may be slower: the stored one met the fastest moment of many timings.
            self.tasks[ev["task"]].best_sec = ev["best_sec"]
            self.elapsed_s = ev.get("elapsed_s", self.elapsed_s)
        elif kind == "retry":
            self.retrying = f"{ev['what']} unreachable ({ev['error']}); retry {ev['attempt']} in {ev['delay_s']:.0f} s"
        elif kind == "job_end":
            self.state, self.reason = ev["state"], ev["reason"]
            self.trials_done, self.elapsed_s = ev["trials_done"], ev["elapsed_s"]

    @property
    def estimate_sec(self) -> tuple[float | None, float | None]:
        """Estimated end-to-end latency ``sum(weight * best)`` at the start and now, over the
        tasks that have a best schedule (a task's start is its first best when it had none).
        Layout variants of one operator count once, the fastest of them (the layout
        transforms a variant implies are left out); operators that only one layout plan runs
        count in the preferred plan only (:func:`preferred_plan`)."""
        plan = preferred_plan((t.plans, t.choice, t.best_sec) for t in self.tasks)
        known = [t for t in self.tasks
                 if t.best_sec is not None and t.start_sec is not None and in_plan(t.plans, t.choice, plan)]
        if not known:
            return None, None
        start = per_operator((t.choice, t.weight * t.start_sec) for t in known)  # type: ignore[operator]
        now = per_operator((t.choice, t.weight * t.best_sec) for t in known)  # type: ignore[operator]
        return sum(start), sum(now)  # type: ignore[arg-type]

    @property
    def trials_per_min(self) -> float | None:
        """Trials per minute of this run."""
        run_s = self.elapsed_s - self.elapsed_before_s
        return None if run_s <= 0 else (self.trials_done - self.trials_before) / run_s * 60

    @property
    def time_left_s(self) -> float | None:
        """Budget left, or (without one) the time the trials cap needs at this pace."""
        if self.time_budget_s is not None:
            return max(0.0, self.time_budget_s - self.elapsed_s)
        rate = self.trials_per_min
        if self.trials_cap is None or not rate:
            return None
        return max(0, self.trials_cap - self.trials_done) / rate * 60


def _ms(sec: float | None) -> str:
    return "-" if sec is None else f"{sec * 1e3:,.3f}"


def _dur(sec: float | None) -> str:
    if sec is None:
        return "?"
    sec = int(sec)
    return f"{sec // 3600}h{sec % 3600 // 60:02d}m" if sec >= 3600 else f"{sec // 60}m{sec % 60:02d}s"


def render(p: JobProgress) -> Group:
    """The live view: one row per task, then the job's totals."""
    table = Table(title=f"job {p.name} (#{p.job_id}): {p.model} on {p.device}", expand=False)
    for col in ("task", "weight", "trials", "errors", "best ms", "GFLOPS", "state"):
        table.add_column(col, justify="left" if col in ("task", "state") else "right")
    for t in p.tasks:
        g = t.gflops
        table.add_row(t.name[:40], str(t.weight), str(t.trials), str(t.errors), _ms(t.best_sec),
                      "-" if g is None else f"{g:,.1f}", t.done or t.reuse)  # fmt: skip
    start, now = p.estimate_sec
    rate = p.trials_per_min
    cap = f"/{p.trials_cap}" if p.trials_cap else ""
    errors = ", ".join(f"{k} {v}" for k, v in sorted(p.errors.items())) or "none"
    lines = [
        f"trials {p.trials_done}{cap}, {'-' if rate is None else f'{rate:.1f}'}/min; elapsed {_dur(p.elapsed_s)}"
        f"{'' if p.time_budget_s is None else f' of {_dur(p.time_budget_s)}'}; left {_dur(p.time_left_s)}",
        f"estimated latency (tuned tasks): start {_ms(start)} ms, now {_ms(now)} ms; errors: {errors}",
        f"proposing {_dur(p.propose_s)}, device busy {_dur(p.device_s)}",
    ]
    if p.retrying:
        lines.append(f"[yellow]{p.retrying}[/]")
    return Group(table, *(Text.from_markup(line) for line in lines))


class JsonLog:
    """Writes each event as one JSON line to a file (flushed, so a killed job leaves it whole)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] = path.open("a", encoding="utf-8")

    def __call__(self, ev: Event) -> None:
        self._file.write(json.dumps(ev, default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class LiveView:
    """The terminal's view of a job: a live table on a terminal, a line per batch otherwise,
    nothing but the reuse rules and the end with ``quiet``."""

    def __init__(self, console: Console, *, quiet: bool = False) -> None:
        self.console = console
        self.quiet = quiet
        self.progress = JobProgress()
        self._live: Live | None = None

    def __call__(self, ev: Event) -> None:
        self.progress.apply(ev)
        kind, p = ev["event"], self.progress
        if kind == "job_start":
            what = f"job {p.name} (#{p.job_id})"
            if p.resumed:
                what = f"resuming {what} after {_dur(p.elapsed_before_s)} and {p.trials_before} trials"
            self.console.print(what, highlight=False)
            for t in ev["tasks"]:
                if t.get("reuse_rule"):
                    self.console.print(f"  {t['name']} : {t['reuse_rule']}", highlight=False)
            if not self.quiet and self.console.is_terminal:
                self._live = Live(render(p), console=self.console, refresh_per_second=2, transient=False)
                self._live.start()
        elif kind == "job_end":
            self.close()
            if not self.quiet:
                self.console.print(render(p))
        elif self._live is not None:
            self._live.update(render(p))
        elif not self.quiet and kind in ("batch_done", "task_done", "task_reranked", "retry"):
            self.console.print(self._line(ev), highlight=False)

    def _line(self, ev: Event) -> str:
        p = self.progress
        if ev["event"] == "retry":
            return p.retrying or ""
        t = p.tasks[ev["task"]]
        if ev["event"] == "task_done":
            return f"task {t.name} done: {ev['reason']}"
        if ev["event"] == "task_reranked":
            which = "another record" if ev["changed"] else "the same record"
            return (f"task {t.name} re-ranked: {ev['retimed']} timed in rounds, best {_ms(ev['stored_sec'])} -> "
                    f"{_ms(ev['best_sec'])} ms ({which})")
        start, now = p.estimate_sec
        cap = f"/{p.trials_cap}" if p.trials_cap else ""
        return (f"trials {p.trials_done}{cap} ({t.name}: best {_ms(t.best_sec)} ms) elapsed {_dur(p.elapsed_s)}, "
                f"left {_dur(p.time_left_s)}, estimate {_ms(start)} -> {_ms(now)} ms, errors {sum(p.errors.values())}")

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
