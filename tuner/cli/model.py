"""``nightshift model eval``: cost-model quality on the database's own records.

Registered on the main parser by :func:`add_model_commands`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from rich.table import Table

from tuner.cli.common import out, with_examples
from tuner.errors import UserInputError


def add_model_commands(
    sub: argparse._SubParsersAction, add_db_arg: Callable[[argparse.ArgumentParser], None]
) -> None:
    """Add the ``model`` command group to the ``nightshift`` subparsers."""
    model = sub.add_parser("model", help="cost-model quality", **with_examples("nightshift model eval"))
    cmds = model.add_subparsers(dest="model_command", required=True)
    p = cmds.add_parser("eval", help="pairwise accuracy and top-k of each cost model on held-out records",
                        **with_examples("nightshift model eval --db nightshift.db",
                                        "nightshift model eval --models xgb random --holdout 0.3 --json eval.json"))
    add_db_arg(p)
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.add_argument("--device", default="cpu", help="cpu or cuda:N (default: cpu)")
    p.add_argument("--target-arch", default=None, help="CUDA sm_XX or LLVM mcpu instead of the detected one")
    p.add_argument("--num-cores", type=int, default=None, help="CPU threads the records were tuned for")
    p.add_argument("--holdout", type=float, default=0.2, help="share held out: of the tasks, and of each task's "
                   "records (default 0.2)")  # fmt: skip
    p.add_argument("--models", nargs="+", default=["xgb", "random"], help="cost models compared (default xgb random)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-records", type=int, default=20_000, help="newest records used at most")
    p.add_argument("--this-device", action="store_true", help="only this device's records, not its family's")
    p.add_argument("--json", type=Path, default=None, help="also write the table as JSON here")
    p.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    """Rebuild features from the records, evaluate each model, print a table per split."""
    import cost_models
    from cost_models.dataset import load_dataset
    from cost_models.evaluation import evaluate
    from tuner.cli.db import _device, _known_device_id, _open

    if not 0 < args.holdout < 1:
        raise UserInputError(f"--holdout must be between 0 and 1, got {args.holdout}")
    unknown = set(args.models) - set(cost_models.kinds())
    if unknown:
        raise UserInputError(f"unknown cost models {sorted(unknown)}; known: {cost_models.kinds()}")
    db = _open(args)
    device = _device(args)
    _known_device_id(db, device)
    data = load_dataset(db, device, same_arch=not args.this_device, max_records=args.max_records)
    tasks = len(set(data.groups.tolist()))
    if tasks == 0:
        raise UserInputError(f"no usable records for {device.name} ({device.arch}) in this database")
    out.print(f"{len(data)} records of {tasks} tasks ({int((data.throughputs == 0).sum())} failed)")
    models = {name: (lambda name=name: cost_models.create(name, seed=args.seed)) for name in args.models}
    rows = evaluate(data, models, holdout=args.holdout, seed=args.seed)
    for split in dict.fromkeys(r.split for r in rows):
        table = Table(title=f"{split} (holdout {args.holdout:g})")
        for col in ("family", "tasks", "model", "pairwise", "top-1", "top-5", "train s"):
            table.add_column(col, justify="left" if col in ("family", "model") else "right")
        for r in (r for r in rows if r.split == split):
            table.add_row(r.family, str(r.tasks), r.model, f"{r.pairwise:.3f}", f"{r.top1:.3f}", f"{r.top5:.3f}",
                          f"{r.train_s:.1f}")  # fmt: skip
        out.print(table)
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0
