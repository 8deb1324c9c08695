"""``nightshift tasks``: a model's fused-operator tasks."""

from __future__ import annotations

import argparse
import logging

from rich.table import Table

from tuner.cli.common import _load, _print_precision, console, extract_tasks, out

logger = logging.getLogger(__name__)

#: Terminal width from which the tasks table shows whole workload keys.
_FULL_KEY_WIDTH = 140
#: Characters of a workload key shown below that width.
_SHORT_KEY = 10


def cmd_tasks(args: argparse.Namespace) -> int:
    """Print the model's fused-operator tasks."""
    loaded = _load(args)
    spec, device = loaded.spec, loaded.device
    with console.status("extracting tasks"):
        tasks = extract_tasks(loaded)
    table = Table(title=f"{spec.name} on {device.name} ({device.arch}), {loaded.precision}: {len(tasks)} tasks")
    # Below _FULL_KEY_WIDTH columns the workload key shows its first characters (as git shows
    # a commit's), and the task's name takes the width the others leave (cut with an
    # ellipsis), so that no cell wraps.
    full_key = out.width >= _FULL_KEY_WIDTH
    rows = [[str(i), t.name, t.layout, str(t.weight), f"{t.flops / 1e6:,.1f}",
             t.workload_key if full_key else t.workload_key[:_SHORT_KEY]] for i, t in enumerate(tasks)]  # fmt: skip
    headers = ["#", "task", "layout", "weight", "MFLOP", "workload key" if full_key else "key"]
    natural = [max(len(h), *(len(r[c]) for r in rows)) for c, h in enumerate(headers)]
    # Each column takes 3 more characters in rich's boxed table (its rule and padding), plus the last rule.
    room = out.width - (sum(natural) - natural[1]) - 3 * len(headers) - 1
    for c, h in enumerate(headers):
        width = max(min(natural[c], room), 12) if h == "task" else None
        table.add_column(h, justify="right" if h in ("#", "weight", "MFLOP") else "left", no_wrap=True,
                         overflow="ellipsis", width=width)  # fmt: skip
    for r in rows:
        table.add_row(*r)
    out.print(table)
    _print_precision(spec, loaded.precision, device.target)
    total = sum(t.weight * t.flops for t in tasks)
    out.print(f"total {total / 1e9:,.2f} GFLOP per inference")
    return 0
