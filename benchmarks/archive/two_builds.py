"""Each tuned task of a model built from its stored record twice, with a rewrite of Nightshift's
TIR pipeline (``ours``) and without it (``tvm``), checked for the same output bits and timed in
interleaved rounds: the machinery of ``bf16_casts.py`` and ``vector_rounding.py``."""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tvm

from tuner.measure.verify import arg_specs, random_args
from tuner.db import TuningDatabase
from tuner.rerank import record_program
from tuner.graph.tasks import Task


@contextlib.contextmanager
def swapped(module: Any, name: str, value: Any) -> Iterator[None]:
    """``module.name`` set to ``value`` within (a function Nightshift looks up by name when it
    lowers or legalizes; ``db_ab.py``'s variants too)."""
    ours = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, ours)


def built_tasks(db: TuningDatabase, device_id: int | None, tasks: list[Task], target: tvm.target.Target,
                rewrite: tuple[Any, str], wanted: Callable[[tvm.IRModule], bool] = lambda prog: True,
                ) -> Iterator[tuple[Task, float, dict[str, Any], dict[str, list], bool]]:  # fmt: skip
    """For each task with a stored best record whose program ``wanted`` takes: the task, the
    record's timing (s), both builds (``tvm``, ``ours``), each build's arguments after one run on the
    same random inputs, and whether all of their bits agree."""
    for task in tasks:
        best = db.best(task.workload_key, device_id, k=1) if device_id is not None else []
        prog = record_program(task, best[0].record_json) if best else None
        if prog is None or not wanted(prog):
            continue
        with swapped(*rewrite, lambda mod: mod):
            libs = {"tvm": tvm.compile(prog, target=target)}
        libs["ours"] = tvm.compile(prog, target=target)
        inputs = random_args(arg_specs(task.mod), seed=0)
        args_of = {k: [tvm.runtime.tensor(a, tvm.cpu(0)) for a in inputs] for k in libs}
        for k, lib in libs.items():
            lib["main"](*args_of[k])
        same = all(np.array_equal(a.numpy().view(np.uint8), b.numpy().view(np.uint8))
                   for a, b in zip(args_of["tvm"], args_of["ours"], strict=True))  # fmt: skip
        yield task, best[0].mean_sec, libs, args_of, same


def interleaved_us(timers: dict[str, Any], args_of: dict[str, list], rounds: int, *, alternate: bool = False,
                   median_of_repeats: bool = False) -> dict[str, float]:  # fmt: skip
    """The median microseconds of each ``time_evaluator`` over ``rounds`` rounds, one timing of
    each per round (the order reversed every other round with ``alternate``); a timing is its
    runs' mean, or their median with ``median_of_repeats``."""
    us: dict[str, list[float]] = {k: [] for k in timers}
    for r in range(rounds):
        for k in list(timers)[::-1] if alternate and r % 2 else list(timers):
            result = timers[k](*args_of[k])
            us[k].append((float(np.median(result.results)) if median_of_repeats else result.mean) * 1e6)
    return {k: statistics.median(v) for k, v in us.items()}


def weighted_ms(rows: list[dict], keys: tuple[str, str]) -> dict[str, float]:
    """Each build's total over the rows (``<key>_us`` times calls), in ms."""
    return {k: sum(r[f"{k}_us"] * r["weight"] for r in rows) / 1e3 for k in keys}


def print_rows(console: Any, title: str, columns: tuple[str, ...], rows: list[dict],
               cells: Callable[[dict], list[str]]) -> None:  # fmt: skip
    """A table of the rows, the first column (the task) left-aligned."""
    from rich.table import Table

    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="left" if col == columns[0] else "right")
    for r in rows:
        table.add_row(*cells(r))
    console.print(table)


def print_weighted(console: Any, rows: list[dict], keys: tuple[str, str], labels: tuple[str, str]) -> dict[str, float]:
    """Each build's total over the rows weighted by calls (ms, :func:`weighted_ms`), printed."""
    total = weighted_ms(rows, keys)
    (a, b), (label_a, label_b) = keys, labels
    console.print(f"weighted by calls: {label_a} {total[a]:.3f} ms, {label_b} {total[b]:.3f} ms "
                  f"({total[b] / total[a]:.3f}x)")  # fmt: skip
    return total
