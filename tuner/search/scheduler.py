"""Task scheduler: spends the trial budget where it can save the most model latency.

The allocation is Ansor's gradient task scheduler (Zheng et al., "Ansor: Generating
High-Performance Tensor Programs for Deep Learning", OSDI 2020, section 6), written for
Nightshift's batches of unequal size, with five additions: a small first batch for tasks
that carry a negligible share of the model's FLOPs, a first round sized by each task's share
when the trial cap cannot give every task a full batch, a per-task convergence stop, a cap on
tasks that have never produced a working schedule, and alternatives: the layout variants of
a conv (:attr:`tuner.graph.tasks.Task.choice`), of which the model runs only the best.
Round-robin (``mode="round-robin"``) replaces the gradient choice, for the ablation that asks
what the gradient rule is worth.
"""

from __future__ import annotations

import logging
import math
import random
import re
import statistics
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from tuner.graph.layout.plan import io_bytes
from tuner.graph.tasks import Task

logger = logging.getLogger(__name__)

# A TVM task name is the chain of fused ops, each with a counter that makes it unique
# (``fused_conv2d15_subtract7_..._relu7``); the first op without its counter is the op kind.
_COUNTER = re.compile(r"\d+$")

#: The smallest first batch a task gets however short the budget: one schedule that fails
#: would otherwise leave it with none.
MIN_FIRST_BATCH = 2

#: Flops that take as long as moving one byte, roughly: a 2-core AVX2 or AVX-512 server's
#: float32 FMA peak (100-200 GFLOPS) over its memory bandwidth (15-25 GB/s). It weighs a
#: memory-bound task (a reshape, a layout transform, a pool) against the convs in a short
#: first round, where FLOPs alone would say it costs nothing.
FLOPS_PER_BYTE = 8.0

#: ``tune --scheduler`` choices (:attr:`tuner.job.TuneConfig.scheduler`), the default first.
SCHEDULERS: tuple[str, ...] = ("gradient", "round-robin")


class NoTaskAvailable(LookupError):
    """Every task is done (converged, failing or retired) or excluded by the caller."""


def op_kind(name: str) -> str:
    """The anchor op of a fused task name: ``fused_conv2d15_add7_relu7`` -> ``conv2d``."""
    parts = [p for p in name.split("_") if p and p != "fused"]
    return _COUNTER.sub("", parts[0]) if parts else name


@dataclass(frozen=True)
class _Step:
    """One ``update``: the task's trials so far and its best latency after them."""

    trials: int
    best_sec: float | None


class TaskScheduler:
    """Ansor's gradient task scheduler over the tasks of one model.

    The objective is the model's estimated latency, ``sum(weight_i * best_sec_i)``. After a
    first round in which every task gets one batch, each batch goes to the task whose next
    trials are expected to lower the objective most per trial:

        grad_i = weight_i * (alpha * backward_i + (1 - alpha) * forward_i)

    ``backward_i`` is the observed slope of the task's best latency over its last
    ``backward_window`` updates (seconds per trial). ``forward_i`` is the more optimistic of
    two estimates: the best latency falling by ``best / trials`` per trial (Ansor's 1/t
    model), and reaching, within one more batch, the latency the task would have at
    ``1 / beta`` of the best GFLOPS measured on a similar task (same op kind, e.g. every
    ``conv2d`` task). With probability ``epsilon`` a random live task is chosen instead.

    A task stops getting trials (:meth:`is_done`) when it has converged (its best latency did
    not improve by more than ``min_improvement`` over its last ``patience`` trials), when it
    has only failed for ``max_failed_trials`` trials without a single success, or when the
    caller calls :meth:`retire` (space exhausted, no reference output).

    How a job drives it::

        while budget_left and not scheduler.all_done:
            i = scheduler.next_task(exclude=busy)   # busy: first batches in flight
            n = min(scheduler.first_batch_size(i, batch), budget_left)
            ... measure n candidates of task i ...
            scheduler.update(i, n_measured, best_sec_of_batch, failed=n_failed)

    The state is plain lists, so a resumed job can replay its history through ``update``.
    Not thread-safe: one job loop owns it.

    Args:
        tasks: the model's tasks (weight and FLOPs are read).
        alpha: weight of the backward gradient against the forward estimate.
        beta: how far below the best similar task's GFLOPS a task is assumed to reach.
        backward_window: updates the backward gradient looks back over.
        epsilon: probability of choosing a random live task.
        patience: trials without improvement after which a task is converged.
        min_improvement: relative gain below which a new best does not count as one
            (measurement noise would otherwise keep a flat task alive forever).
        max_failed_trials: failed trials after which a task that never succeeded is dead.
        tiny_share: a task whose ``weight x FLOPs`` is below this share of the model's
            gets a first batch of at most ``tiny_first_batch``.
        tiny_first_batch: first-batch size of such tasks.
        probe_first_batch: first-batch size of an alternative that is not the preferred one
            (``choice_rank > 0``): enough to see whether its layout competes.
        layout_probes: probes of each trailing layout that the first round makes, heaviest
            conv first; the layout's other alternatives earn theirs by the gradient rule.
        catch_up_share: a trailing alternative with fewer trials than this share of its
            leader's is judged by what its layout reaches on similar tasks (``beta`` 1), not
            by half of it: its few trials say little of what its layout can do.
        seed: seed of the epsilon-greedy choice.
        mode: ``gradient``, the rule above; ``round-robin``, after the first round the live
            task with the fewest trials (ties by index), no epsilon: the ablation's baseline.
            The first round, convergence, failures and retiring are the same in both.
        budget: the job's trial cap (None: a time budget, or no cap). Where it is below the
            first round's demand (every task owed a first batch getting its full one), no first
            batch is above the task's share of the cap, in proportion to the square root of
            its ``weight x max(FLOPs, FLOPS_PER_BYTE x bytes)`` over the tasks owed a first
            batch (no fewer than ``MIN_FIRST_BATCH``): such a budget goes less to the light
            tasks and more, through the gradient rule, to the heavy ones
            (:meth:`first_batch_size`).

    Alternatives. Tasks sharing a :attr:`~tuner.graph.tasks.Task.choice` compute the same convs in
    different layouts, and the model runs one of them: their contribution to the objective
    is ``weight x min(best + transforms)``, where ``transforms`` is what running the conv
    outside the layout the model prefers (the one whose alternatives sum lowest) costs: its
    input and output moved twice each (:attr:`~tuner.graph.tasks.Task.io_bytes`) at the bandwidth
    of the model's measured ``layout_transform`` tasks. The leading alternative's gradient is
    as above; a trailing one's counts only the part of its expected gain over its next batch
    that exceeds its margin behind the leader, so a clearly losing layout gets no trials
    while a close or barely explored one keeps them. A trailing layout's first
    ``layout_probes`` alternatives are probed in the first round; each other one only where
    what its layout reaches elsewhere could beat its leader (:meth:`_probe_gradient`). The
    other tasks of a trailing plan (its pools, gates, transforms) wait until a conv leads in it.
    "Barely explored" is judged against the task's own layout: until it has
    ``catch_up_share`` of its leader's trials, a trailing alternative is expected to reach
    the best GFLOPS of the similar tasks in its layout. A ResNet-50 job at 2,048 trials on an
    AVX2 Zen 3 gave a 3x3 64->64 conv 157 trials in NCHW and 16 in NCHW8c, whose 81 GFLOPS
    (other NCHW8c convs reached 160) then promised nothing at half of 160; the model ran the
    conv at 112 GFLOPS, where 40-minute jobs reached 144.

    Attributes:
        trials: trials accounted to each task (all ``update`` calls, failed ones included).
        best_sec: best latency of each task in seconds, None before its first success.
    """

    def __init__(
        self,
        tasks: Sequence[Task],
        *,
        alpha: float = 0.2,
        beta: float = 2.0,
        backward_window: int = 3,
        epsilon: float = 0.05,
        patience: int = 128,
        min_improvement: float = 0.005,
        max_failed_trials: int = 64,
        tiny_share: float = 0.005,
        tiny_first_batch: int = 4,
        probe_first_batch: int = 8,
        layout_probes: int = 2,
        catch_up_share: float = 0.5,
        seed: int = 0,
        mode: str = "gradient",
        budget: int | None = None,
    ) -> None:
        if not 0.0 <= alpha <= 1.0 or not 0.0 <= epsilon <= 1.0 or not 0.0 <= catch_up_share <= 1.0:
            raise ValueError(f"alpha, epsilon and catch_up_share must lie in [0, 1], got {alpha}, {epsilon} "
                             f"and {catch_up_share}")  # fmt: skip
        if beta < 1.0 or min(backward_window, patience, max_failed_trials, tiny_first_batch, probe_first_batch,
                             layout_probes) < 1:
            raise ValueError("beta must be >= 1; backward_window, patience, max_failed_trials, "
                             "tiny_first_batch, probe_first_batch and layout_probes must be >= 1")  # fmt: skip
        if mode not in SCHEDULERS:
            raise ValueError(f"mode must be one of {', '.join(SCHEDULERS)}, got {mode!r}")
        self.mode = mode
        self.tasks = list(tasks)
        self.alpha, self.beta, self.epsilon = alpha, beta, epsilon
        self.backward_window = backward_window
        self.patience = patience
        self.min_improvement = min_improvement
        self.max_failed_trials = max_failed_trials
        self.tiny_first_batch = tiny_first_batch
        self.probe_first_batch = probe_first_batch
        self.layout_probes = layout_probes
        self.catch_up_share = catch_up_share
        self.budget = budget
        self.trials = [0] * len(self.tasks)
        self.best_sec: list[float | None] = [None] * len(self.tasks)
        self._rng = random.Random(seed)
        self._history: list[list[_Step]] = [[] for _ in self.tasks]
        # Trials at the last improvement that counted (see min_improvement).
        self._improved_at = [0] * len(self.tasks)
        self._last_batch = [0] * len(self.tasks)
        self._failed = [0] * len(self.tasks)  # failed trials before the first success
        self._done: dict[int, str] = {}
        self._kind = [op_kind(t.name) if t.flops > 0 else None for t in self.tasks]
        total = sum(t.weight * max(t.flops, 0.0) for t in self.tasks)
        self._tiny = [total > 0 and t.weight * max(t.flops, 0.0) < tiny_share * total for t in self.tasks]
        groups: dict[str, list[int]] = {}
        for i, t in enumerate(self.tasks):
            if t.choice:
                groups.setdefault(t.choice, []).append(i)
        #: Per task, the indices of its alternatives (itself included); None without any.
        self._alternatives: list[list[int] | None] = [None] * len(self.tasks)
        for members in groups.values():
            if len(members) > 1:
                for i in members:
                    self._alternatives[i] = members
        self._groups = [m for m in groups.values() if len(m) > 1]
        # Layout transform tasks measure what moving a tensor costs (see _bandwidth).
        moved = [io_bytes(t.mod) for t in self.tasks]
        self._moved = [b if "layout_transform" in t.name else 0 for t, b in zip(self.tasks, moved, strict=True)]
        # The tasks owed a first batch from the start (not probes, not waiting for their plan):
        # the first round the budget is shared out over.
        self._owed = [j for j in range(len(self.tasks))
                      if not self._is_probe(j) and not self._waits_for_its_plan(j, {0})]  # fmt: skip
        roots = [math.sqrt(t.weight * max(t.flops, FLOPS_PER_BYTE * b)) for t, b in zip(self.tasks, moved, strict=True)]
        total_root = sum(roots[j] for j in self._owed)
        #: Per task, the most of ``budget`` its first batch may take (inf without a budget).
        self._budget_share = [budget * r / total_root if budget is not None and total_root > 0 else math.inf
                              for r in roots]  # fmt: skip
        self._short: dict[int, bool] = {}  # per nominal batch: whether budget is below the first round

    # --- what the job calls ------------------------------------------------------------------

    def next_task(self, *, exclude: Collection[int] = ()) -> int:
        """Index of the task to give the next batch to.

        Tasks never updated come first, in the order given (the job passes them heaviest
        first), then the first ``layout_probes`` probes of each trailing layout; the other
        probes earn theirs by their gradient (:meth:`_probe_gradient`), and the tasks of
        plans no conv runs in wait (:meth:`_waits_for_its_plan`). Then the steepest
        gradient, or with
        probability ``epsilon`` a random task (``round-robin`` mode: the task with the fewest
        trials, ties by index).

        Args:
            exclude: indices not to choose now (e.g. tasks whose first batch is in flight).

        Raises:
            NoTaskAvailable: every task is done or excluded; when :attr:`all_done` is false,
                only excluded, so collect a batch in flight and ask again.
        """
        live = [i for i in range(len(self.tasks)) if i not in self._done and i not in exclude]
        if not live:
            raise NoTaskAvailable(f"all {len(self.tasks)} tasks are done or excluded")
        # Probes of alternatives come last: on a small budget the preferred layout gets measured.
        probed, in_play = self._probed_layouts(exclude), self._plans_in_play()
        fresh = [i for i in live if not self._history[i] and not self._waits_for_its_plan(i, in_play)
                 and (not self._is_probe(i) or probed.get(self.tasks[i].layout, 0) < self.layout_probes)]  # fmt: skip
        if fresh:
            return min(fresh, key=lambda i: (self._is_probe(i), i))
        if self.mode == "round-robin":
            return min(live, key=lambda i: (self.trials[i], i))
        if self._rng.random() < self.epsilon:
            return self._rng.choice(live)
        grads = {i: self.gradient(i) for i in live}
        steepest = min(grads.values())
        if steepest == max(grads.values()):
            return self._rng.choice(live)  # no information to prefer one
        return min(live, key=lambda i: (grads[i], i))

    def first_batch_size(self, index: int, batch: int, trials_left: int | None = None,
                         in_flight: Collection[int] = ()) -> int:  # fmt: skip
        """How many candidates task ``index`` gets in a batch of nominal size ``batch``.

        A task whose share of the model's FLOPs is negligible (pooling, reshapes,
        elementwise ops) gets a small first batch: enough for a working schedule, not
        enough to take trials from the operators that matter. Later batches are ``batch``.

        Under a ``budget`` (the job's trial cap) below what the first round would take at
        those sizes, each first batch is at most the task's share of it in proportion to
        ``sqrt(weight x cost)``, ``cost`` its FLOPs or, for a memory-bound task,
        ``FLOPS_PER_BYTE`` x the bytes of its arguments: the split that minimises
        ``sum(a_i / n_i)`` (a task's excess latency falling as ``1 / trials``, Ansor's model)
        for a fixed ``sum(n_i)``; at least ``MIN_FIRST_BATCH``. A heavy task whose share
        exceeds one batch gets its batch now and the rest through the gradient rule. A budget
        the first round fits keeps the sizes above: there, shares moved trials from mid-sized
        convs to memory-bound tasks and cost a mobile CNN 5% at 512 trials
        (``benchmarks/archive/README.md``, "First batches by share").

        With ``trials_left`` (a trial cap) still too small for the first batches of every task
        not yet measured, each such batch shrinks in proportion (to no fewer than
        ``MIN_FIRST_BATCH``), so every task gets measured schedules before any gets a second
        batch; ``in_flight``: tasks whose batch is out (already taken from ``trials_left``).
        """
        size = self._first_batch_size(index, batch)
        if trials_left is None or self._history[index]:
            return size
        # Probes, and the tasks of plans no conv runs in, are not owed a batch (next_task), so
        # the first round does not shrink for them.
        in_play = self._plans_in_play()
        demand = sum(self._first_batch_size(j, batch) for j in range(len(self.tasks))
                     if j == index or not (self._history[j] or j in self._done or j in in_flight
                                           or self._is_probe(j) or self._waits_for_its_plan(j, in_play)))  # fmt: skip
        if trials_left >= demand:
            return size
        return min(size, max(MIN_FIRST_BATCH, size * trials_left // demand))

    def _first_batch_size(self, index: int, batch: int) -> int:
        if self._history[index]:
            return batch
        size = self._full_first_batch(index, batch)
        share = self._budget_share[index]
        if share >= size or not self._short_of(batch):
            return size
        return min(size, max(MIN_FIRST_BATCH, int(share)))

    def _full_first_batch(self, index: int, batch: int) -> int:
        """Task ``index``'s first batch without a trial cap."""
        if self._tiny[index]:
            return min(batch, self.tiny_first_batch)
        if self._is_probe(index):
            return min(batch, self.probe_first_batch)
        return batch

    def _short_of(self, batch: int) -> bool:
        """Whether ``budget`` is below the first round's demand at nominal batch ``batch``
        (every task owed a first batch getting its full one)."""
        if batch not in self._short:
            demand = sum(self._full_first_batch(j, batch) for j in self._owed)
            self._short[batch] = self.budget is not None and self.budget < demand
        return self._short[batch]

    def _is_probe(self, index: int) -> bool:
        """Whether task ``index`` is an alternative in a layout the model does not prefer a priori."""
        return self._alternatives[index] is not None and self.tasks[index].choice_rank > 0

    def _plans_in_play(self) -> set[int]:
        """The layout plans (ranks) the model may run a conv in: the preferred one, and each
        whose alternative is the fastest measured of its set (transforms aside, to err on the
        side of measuring)."""
        ranks = {0}
        for members in self._groups:
            timed = [j for j in members if self.best_sec[j] is not None]
            if timed:
                leader = min(timed, key=lambda j: self.best_sec[j] or 0.0)
                ranks.add(self.tasks[leader].choice_rank)
        return ranks

    def _waits_for_its_plan(self, index: int, in_play: set[int]) -> bool:
        """Whether task ``index`` is no conv's alternative and belongs only to plans the model
        runs no conv in (an NCHW plan's pools, gates and transforms under a blocked model): it
        gets trials once a conv of its plans leads. A 512-trial DenseNet-121 job on a Zen 3 gave
        such tasks 114 of its trials, while most of its blocked convs got first batches of 2."""
        task = self.tasks[index]
        return self._alternatives[index] is None and task.choice_rank > 0 and not in_play.intersection(task.plans)

    def _probed_layouts(self, in_flight: Collection[int]) -> dict[str, int]:
        """Per trailing layout, how many of its alternatives are measured or in flight."""
        counts: dict[str, int] = {}
        for j in range(len(self.tasks)):
            if self._is_probe(j) and (self._history[j] or j in in_flight):
                counts[self.tasks[j].layout] = counts.get(self.tasks[j].layout, 0) + 1
        return counts

    def update(self, index: int, trials: int, best_sec: float | None, *, failed: int | None = None) -> None:
        """Account a measured batch of task ``index``.

        Args:
            index: the task.
            trials: candidates measured in the batch (failed ones included).
            best_sec: the batch's best latency, None when nothing in it succeeded.
            failed: how many of the batch failed; by default all of it when ``best_sec`` is
                None, else none. Only failures of a task that never succeeded count
                towards ``max_failed_trials``.
        """
        if trials < 0:
            raise ValueError(f"trials must be >= 0, got {trials}")
        self.trials[index] += trials
        self._last_batch[index] = trials or self._last_batch[index]
        old = self.best_sec[index]
        if best_sec is not None and (old is None or best_sec < old):
            self.best_sec[index] = best_sec
            if old is None or best_sec < old * (1.0 - self.min_improvement):
                self._improved_at[index] = self.trials[index]
        self._history[index].append(_Step(self.trials[index], self.best_sec[index]))
        if index in self._done:
            return
        if self.best_sec[index] is None:
            self._failed[index] += trials if failed is None else failed
            if self._failed[index] >= self.max_failed_trials:
                self._finish(index, f"no success, {self._failed[index]} failed trials")
        elif self.trials[index] - self._improved_at[index] >= self.patience:
            self._finish(index, f"converged: no gain over {self.trials[index] - self._improved_at[index]} trials")
        self._adjust_similarity(index)

    def retire(self, index: int, reason: str) -> None:
        """Give task ``index`` no more trials (its space is exhausted, it cannot be verified)."""
        self._finish(index, reason)

    def is_done(self, index: int) -> bool:
        """Whether task ``index`` gets no more trials."""
        return index in self._done

    def done_reason(self, index: int) -> str | None:
        """Why task ``index`` is done, or None while it is live."""
        return self._done.get(index)

    @property
    def all_done(self) -> bool:
        """Whether no task gets more trials; the job should stop proposing."""
        return len(self._done) == len(self.tasks)

    # --- the estimates --------------------------------------------------------------------

    def objective(self) -> float | None:
        """The model's estimated latency, ``sum(weight * best_sec)`` over tasks without
        alternatives plus each set of alternatives' best (transforms included); None until
        every task, or one alternative of each set, has succeeded."""
        total = 0.0
        for i, (t, b) in enumerate(zip(self.tasks, self.best_sec, strict=True)):
            if self._alternatives[i] is None:
                if b is None:
                    return None
                total += t.weight * b
        for members in self._groups:
            costs = [c for j in members if (c := self.contribution(j)) is not None]
            if not costs:
                return None
            total += min(costs)
        return total

    def contribution(self, index: int) -> float | None:
        """What task ``index`` adds to the model's latency if the model runs it: weight x
        (best + the transforms its layout implies, for an alternative); None before a success."""
        best = self.best_sec[index]
        if best is None:
            return None
        return self.tasks[index].weight * (best + self._transform_sec(index))

    def in_model(self, index: int) -> bool:
        """Whether the model runs task ``index`` as things stand: a task without alternatives
        that has succeeded, or the alternative whose contribution is the lowest of its set."""
        mine = self.contribution(index)
        members = self._alternatives[index]
        if mine is None or members is None:
            return mine is not None
        return all(mine <= c for j in members if (c := self.contribution(j)) is not None)

    def preferred_rank(self) -> int:
        """The layout rank the model's alternatives favour: the one whose alternatives' bests
        sum lowest over the sets measured in every rank (0 until such a set exists)."""
        totals: dict[int, float] = {}
        for members in self._groups:
            if any(self.best_sec[j] is None for j in members):
                continue
            for j in members:
                rank = self.tasks[j].choice_rank
                totals[rank] = totals.get(rank, 0.0) + self.tasks[j].weight * self.best_sec[j]  # type: ignore[operator]
        return min(totals, key=lambda r: (totals[r], r)) if totals else 0

    def _transform_sec(self, index: int) -> float:
        if self._alternatives[index] is None or self.tasks[index].choice_rank == self.preferred_rank():
            return 0.0
        # In front of the conv and behind it, each transform reads and writes its tensor.
        return 2.0 * self.tasks[index].io_bytes / self._bandwidth()

    def _bandwidth(self) -> float:
        """Bytes/s of the model's measured layout transforms (median), else a default."""
        from tuner.graph.layout.choose import DEFAULT_BANDWIDTH

        rates = sorted(m / b for m, b in zip(self._moved, self.best_sec, strict=True) if m and b)
        return rates[len(rates) // 2] if rates else DEFAULT_BANDWIDTH

    def gradient(self, index: int) -> float:
        """d(objective)/d(trials of task ``index``): negative, steeper is more promising.

        A trailing alternative's gradient counts only the expected gain of its next batch
        beyond its margin behind the leading one (see the class docstring).
        """
        if self._is_probe(index) and not self._history[index]:
            return self._probe_gradient(index)
        rate = self._own_gradient(index)
        members = self._alternatives[index]
        mine = self.contribution(index)
        if members is None or mine is None or rate == 0.0:
            return rate
        rivals = {j: c for j in members if j != index and (c := self.contribution(j)) is not None}
        margin = mine - min(rivals.values()) if rivals else 0.0
        if margin <= 0.0:
            return rate
        # Ansor's forward term (the latency could vanish within as many trials again) promises
        # a young task more than any margin: a ResNet-50 job at 2048 trials gave 40% of them
        # to layouts 3x behind. A trailing layout gets what its recent progress and the
        # tasks of its own layout make plausible.
        leader = min(rivals, key=lambda j: rivals[j])
        catching_up = self.trials[index] < self.catch_up_share * self.trials[leader]
        rate = self._own_gradient(index, optimistic=False, beta=1.0 if catching_up else self.beta)
        horizon = max(self._last_batch[index], 1)
        return -max(0.0, -rate * horizon - margin) / horizon

    def _probe_gradient(self, index: int) -> float:
        """The gradient of an alternative not yet probed: what its probe could save, were its
        layout to reach the best GFLOPS of its layout's measured tasks of the same op kind, over
        the probe's trials; 0 where that does not beat the leading alternative, or nothing is
        known. The first round probes ``layout_probes`` alternatives of each layout. Probing every
        conv in every layout cost a 512-trial ResNeXt-50 job on a Zen 3 (2026-12-07) 172 of its
        trials, and in 23 of its 24 convs NCHW then ran 1.4-5.3x the blocked time (at most 47
        GFLOPS, the blocked convs 40-119); the 24th, 0.97x, was a blocked conv still at 42
        GFLOPS after its first batch."""
        members = self._alternatives[index] or []
        rivals = [c for j in members if j != index and (c := self.contribution(j)) is not None]
        similar, flops = self._similar_gflops(index), self.tasks[index].flops
        if not rivals or similar is None or flops <= 0:
            return 0.0
        reachable = self.tasks[index].weight * (flops / (similar * 1e9) + self._transform_sec(index))
        gain = min(rivals) - reachable
        return -gain / self._first_batch_size(index, self.probe_first_batch) if gain > 0 else 0.0

    def _own_gradient(self, index: int, *, optimistic: bool = True, beta: float | None = None) -> float:
        """Ansor's gradient of task ``index``, as if it had no alternatives (without
        ``optimistic``, the forward term is only what similar tasks have reached, at ``1 /
        beta`` of their GFLOPS; ``self.beta`` by default)."""
        task = self.tasks[index]
        best = self.best_sec[index]
        latency = best if best is not None else self._estimate(index)
        if latency is None or self.trials[index] == 0:
            return 0.0
        backward = 0.0
        hist = self._history[index]
        if len(hist) > self.backward_window:
            new, old = hist[-1], hist[-1 - self.backward_window]
            if new.best_sec is not None and old.best_sec is not None and new.trials > old.trials:
                backward = (new.best_sec - old.best_sec) / (new.trials - old.trials)
        forward = -latency / self.trials[index] if optimistic else 0.0
        similar = self._similar_gflops(index)
        if similar is not None and self._last_batch[index] > 0:
            reachable = (self.beta if beta is None else beta) * task.flops / (similar * 1e9)
            forward = min(forward, (reachable - latency) / self._last_batch[index])
        return task.weight * (self.alpha * backward + (1.0 - self.alpha) * forward)

    def _similar_gflops(self, index: int) -> float | None:
        """Best GFLOPS measured on another task of the same op kind in the same layout (a
        blocked conv's rate says little of what an NCHW one can reach)."""
        kind, layout = self._kind[index], self.tasks[index].layout
        if kind is None:
            return None
        rates = [self._gflops(j) for j in range(len(self.tasks))
                 if j != index and self._kind[j] == kind and self.tasks[j].layout == layout]  # fmt: skip
        rates = [r for r in rates if r is not None]
        return max(rates) if rates else None

    def _gflops(self, index: int) -> float | None:
        best, flops = self.best_sec[index], self.tasks[index].flops
        return flops / best / 1e9 if best is not None and flops > 0 else None

    def _estimate(self, index: int) -> float | None:
        """Latency of a task without a success, at the GFLOPS similar (else all) tasks reach."""
        flops = self.tasks[index].flops
        if flops <= 0:
            return None
        rate = self._similar_gflops(index)
        if rate is None:
            rates = [r for j in range(len(self.tasks)) if (r := self._gflops(j)) is not None]
            rate = statistics.median(rates) if rates else None
        return flops / (rate * 1e9) if rate else None

    def _adjust_similarity(self, index: int) -> None:
        """Take a task out of its op kind's group when it is plainly not like the others.

        As in Ansor: a task tuned much longer than its peers that still runs below
        ``1 / beta`` of their best GFLOPS (a depthwise conv among dense ones) would
        otherwise keep a forward estimate it can never reach.
        """
        kind, rate = self._kind[index], self._gflops(index)
        if kind is None or rate is None:
            return
        peers = [j for j in range(len(self.tasks)) if j != index and self._kind[j] == kind]
        best_peer = self._similar_gflops(index)
        if not peers or best_peer is None:
            return
        lead = self.trials[index] - max(self.trials[j] for j in peers)
        if rate < best_peer / self.beta and lead > 5 * max(self._last_batch[index], 1):
            logger.info("task %s leaves the %s group (%.1f GFLOPS, peers reach %.1f)",
                        self.tasks[index].name, kind, rate, best_peer)  # fmt: skip
            self._kind[index] = None

    def _finish(self, index: int, reason: str) -> None:
        if index not in self._done:
            self._done[index] = reason
            logger.info("task %s done after %d trials: %s", self.tasks[index].name, self.trials[index], reason)
