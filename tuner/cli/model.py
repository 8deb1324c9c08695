"""``nightshift model eval`` and ``nightshift model train``: cost-model quality on the database's
own records, and a model trained on any number of databases (what the package ships).

Registered on the main parser by :func:`add_model_commands`.
"""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.table import Table

from tuner.cli.common import out, with_examples
from tuner.errors import UserInputError


def add_model_commands(
    sub: argparse._SubParsersAction, add_db_arg: Callable[[argparse.ArgumentParser], None]
) -> None:
    """Add the ``model`` command group to the ``nightshift`` subparsers."""
    model = sub.add_parser("model", help="cost-model quality and training",
                           **with_examples("nightshift model eval", "nightshift model train --db a.db -o model.json"))
    cmds = model.add_subparsers(dest="model_command", required=True)
    p = cmds.add_parser("eval", help="pairwise accuracy and top-k of each cost model on held-out records",
                        **with_examples("nightshift model eval --db nightshift.db",
                                        "nightshift model eval --models xgb-rank xgb-mse random --json e.json",
                                        "nightshift model eval --db a.db --db b.db --splits 'held-out models'"))
    p.add_argument("--db", action="append", default=None, metavar="URL",
                   help="a database URL or SQLite file; repeat to pool several (one model's job each, say): "
                   "the same task in two pools its records (default: $NIGHTSHIFT_DB or ./nightshift.db)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.add_argument("--device", default="cpu", help="cpu or cuda:N (default: cpu)")
    p.add_argument("--target-arch", default=None, help="CUDA sm_XX or LLVM mcpu instead of the detected one")
    p.add_argument("--num-cores", type=int, default=None, help="CPU threads the records were tuned for")
    p.add_argument("--holdout", type=float, default=0.2, help="share held out: of the tasks, and of each task's "
                   "records (default 0.2)")  # fmt: skip
    p.add_argument("--models", nargs="+", default=["xgb", "random"],
                   help="cost models compared: xgb (its default objective), xgb-rank, xgb-mse, random "
                   "(default xgb random)")
    p.add_argument("--splits", nargs="+", default=["unseen tasks", "held-out models", "held-out records"],
                   choices=["unseen tasks", "held-out models", "held-out records"], metavar="SPLIT",
                   help="'unseen tasks', 'held-out models' (by the job's model), 'held-out records' (default all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-records", type=int, default=20_000, help="newest records used at most")
    p.add_argument("--this-device", action="store_true", help="only this device's records, not its family's")
    p.add_argument("--json", type=Path, default=None, help="also write the table as JSON here")
    p.set_defaults(func=cmd_eval)

    t = cmds.add_parser("train", help="train a cost model on the records of any number of databases",
                        **with_examples("nightshift model train --db a.db --db postgresql://me@host/ns -o m.json",
                                        "nightshift model train --db a.db --objective mse -o mse.json"))  # fmt: skip
    t.add_argument("--db", action="append", required=True, metavar="URL",
                   help="a database URL or SQLite file (repeat for several)")
    t.add_argument("-o", "--output", type=Path, required=True, help="the model, as XGBoost JSON")
    t.add_argument("--kind", default="cpu", choices=["cpu", "cuda"], help="devices whose records train it")
    t.add_argument("--objective", default=None, choices=["rank", "mse"], help="default: the model's default")
    t.add_argument("--max-records", type=int, default=20_000, help="newest records of each device used at most")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    t.set_defaults(func=cmd_train)


def cmd_eval(args: argparse.Namespace) -> int:
    """Rebuild features from the records, evaluate each model, print a table per split."""
    import cost_models
    from cost_models.dataset import Dataset, load_dataset
    from cost_models.evaluation import evaluate
    from tuner.cli.db import _device, _known_device_id, _open

    if not 0 < args.holdout < 1:
        raise UserInputError(f"--holdout must be between 0 and 1, got {args.holdout}")
    unknown = set(args.models) - set(cost_models.kinds())
    if unknown:
        raise UserInputError(f"unknown cost models {sorted(unknown)}; known: {cost_models.kinds()}")
    device = _device(args)
    parts = []
    for text in args.db or [None]:
        db = _open(argparse.Namespace(db=text))
        _known_device_id(db, device)
        parts.append(load_dataset(db, device, same_arch=not args.this_device, max_records=args.max_records))
    data = Dataset.concat(parts)
    tasks = len(set(data.groups.tolist()))
    if tasks == 0:
        raise UserInputError(f"no usable records for {device.name} ({device.arch}) in this database")
    sources = sorted({str(s) for s in data.sources if s})
    out.print(f"{len(data)} records of {tasks} tasks ({int((data.throughputs == 0).sum())} failed); "
              f"models: {', '.join(sources) or 'none recorded'}")  # fmt: skip
    models = {name: (lambda name=name: cost_models.create(name, seed=args.seed)) for name in args.models}
    rows = evaluate(data, models, holdout=args.holdout, seed=args.seed, splits=args.splits)
    if "held-out models" in args.splits and not any(r.split == "held-out models" for r in rows):
        out.print("[yellow]held-out models: the records come from fewer than two models' jobs[/yellow]")
    for split in dict.fromkeys(r.split for r in rows):
        table = Table(title=f"{split} (holdout {args.holdout:g})" if split != "held-out models" else split)
        for col in ("family", "tasks", "model", "pairwise", "top-1", "top-5", "train s"):
            table.add_column(col, justify="left" if col in ("family", "model") else "right")
        for r in (r for r in rows if r.split == split):
            table.add_row(r.family, str(r.tasks), r.model, f"{r.pairwise:.3f}", f"{r.top1:.3f}", f"{r.top5:.3f}",
                          f"{r.train_s:.1f}")  # fmt: skip
        out.print(table)
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    """Train one model on every database's records of ``--kind`` devices; write it and its
    provenance (``<output>.provenance.json``)."""
    import time

    import cost_models
    from cost_models.dataset import Dataset, load_all
    from tuner.cli.common import open_existing
    from tuner.db import database_url, redact
    from tuner.db.schema import DeviceRow, JobRow

    start = time.perf_counter()
    parts: list[Dataset] = []
    sources: list[dict[str, Any]] = []
    for text in args.db:
        url = database_url(text)
        db = open_existing(url)
        data = load_all(db, kind=args.kind, max_records=args.max_records)
        with db.session(write=False) as s:
            devices = [{"fingerprint": d.fingerprint, "arch": d.arch, "target": json.loads(d.target),
                        "description": json.loads(d.description)}
                       for d in s.query(DeviceRow).filter(DeviceRow.kind == args.kind)]  # fmt: skip
            jobs = [{"model": j.model, "trials_done": j.trials_done, "state": j.state, "name": j.name,
                     "config": json.loads(j.config or "{}")} for j in s.query(JobRow)]  # fmt: skip
        counts = {fp: int((data.devices == fp).sum()) for fp in {d["fingerprint"] for d in devices}}
        for d in devices:
            d["records"] = counts.get(d["fingerprint"], 0)
        sources.append({"database": redact(url), "records": len(data), "devices": devices, "jobs": jobs,
                        "models": sorted({str(m) for m in data.sources if m}),
                        "tasks": len(set(data.groups.tolist()))})  # fmt: skip
        out.print(f"{redact(url)}: {len(data)} records of {len(set(data.groups.tolist()))} tasks")
        parts.append(data)
    data = Dataset.concat(parts)
    if len(data) == 0:
        raise UserInputError(f"no usable {args.kind} records in {', '.join(args.db)}")
    overrides = {"objective": args.objective} if args.objective else {}
    model = cost_models.create("xgb", seed=args.seed, **overrides)
    model.fit(data.features, data.throughputs, data.groups)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_bytes(model.save("json"))  # type: ignore[call-arg]
    provenance = {
        "format": "xgboost-json",
        "model": "xgb",
        "objective": model.config.objective,  # type: ignore[attr-defined]
        "feature_width": data.features.width,
        "kind": args.kind,
        "records": len(data),
        "failed_records": int((data.throughputs == 0).sum()),
        "tasks": len(set(data.groups.tolist())),
        "space_kinds": {str(k): int((data.spaces == k).sum()) for k in sorted(set(data.spaces.tolist()))},
        "sources": sources,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": _command(args),
        "versions": _versions(),
    }
    prov_path = args.output.with_suffix(".provenance.json")
    prov_path.write_text(json.dumps(provenance, indent=1, sort_keys=True) + "\n")
    out.print(f"trained on {len(data)} records of {provenance['tasks']} tasks in {time.perf_counter() - start:.0f} s: "
              f"{args.output} ({args.output.stat().st_size / 1024:.0f} KiB), {prov_path}")  # fmt: skip
    return 0


def _command(args: argparse.Namespace) -> str:
    """The ``model train`` command line that makes this model again (passwords hidden)."""
    from tuner.db import redact

    words = ["nightshift", "model", "train"]
    for text in args.db:
        words += ["--db", redact(text) if "://" in text else text]
    words += ["-o", str(args.output), "--kind", args.kind, "--max-records", str(args.max_records),
              "--seed", str(args.seed)]  # fmt: skip
    if args.objective:
        words += ["--objective", args.objective]
    return shlex.join(words)


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("apache-tvm", "xgboost", "xgboost-cpu", "nightshift"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            continue
    return found
