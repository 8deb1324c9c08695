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
    out.print(_total_line(tasks))
    return 0


def _total_line(tasks: list) -> str:
    """The model's work per inference: a conv tuned in several layouts runs once, so each group
    of layout variants (``Task.choice``) counts once, as its costliest variant (the direct
    convolution, where Winograd variants do fewer FLOPs); an operator that only another layout
    plan runs (``Task.plans``, a ``mean`` reading NCHW8c) counts in the first plan only."""
    groups: dict[str, float] = {}
    others = 0
    for t in tasks:
        if not t.choice and t.plans and 0 not in t.plans:
            others += 1
            continue
        key = t.choice or t.workload_key
        groups[key] = max(groups.get(key, 0.0), t.weight * t.flops)
    variants = sum(1 for t in tasks if t.choice)
    total = f"total {sum(groups.values()) / 1e9:,.2f} GFLOP per inference"
    if not variants:
        return total
    convs = len({t.choice for t in tasks if t.choice})
    if others:
        return (f"{total} ({variants} tasks are layout variants of {convs} convs, each counted once; "
                f"{others} run only in another layout)")
    return f"{total} ({variants} tasks are layout variants of {convs} convs, each counted once)"
