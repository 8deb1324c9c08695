"""``nightshift tasks``: a model's fused-operator tasks."""

from __future__ import annotations

import argparse
import logging

from rich.table import Table

from tuner.cli.common import _load, _print_precision, console, extract_tasks, out

logger = logging.getLogger(__name__)


def cmd_tasks(args: argparse.Namespace) -> int:
    """Print the model's fused-operator tasks."""
    loaded = _load(args)
    spec, device = loaded.spec, loaded.device
    with console.status("extracting tasks"):
        tasks = extract_tasks(loaded)
    table = Table(title=f"{spec.name} on {device.name} ({device.arch}), {loaded.precision}: {len(tasks)} tasks")
    for col in ("#", "task", "layout", "weight", "MFLOP", "workload key"):
        table.add_column(col, justify="right" if col in ("#", "weight", "MFLOP") else "left")
    for i, t in enumerate(tasks):
        table.add_row(str(i), t.name, t.layout, str(t.weight), f"{t.flops / 1e6:,.1f}", t.workload_key)
    out.print(table)
    _print_precision(spec, loaded.precision, device.target)
    total = sum(t.weight * t.flops for t in tasks)
    out.print(f"total {total / 1e9:,.2f} GFLOP per inference")
    return 0
