"""``nightshift db ...``: init, upgrade, stats, best, coverage, jobs, export, import, prune.

Registered on the main parser by :func:`add_db_commands`. Output goes to the CLI's rich
consoles; errors are Nightshift's own exceptions, printed by the CLI as one line.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from rich.table import Table

from tuner.cli.common import console, db_text, open_existing, out, with_examples
from tuner.cli.report import cmd_jobs
from tuner.errors import UserInputError


def add_db_commands(
    sub: argparse._SubParsersAction, add_db_arg: Callable[[argparse.ArgumentParser], None]
) -> None:
    """Add the ``db`` command group to the ``nightshift`` subparsers."""
    db = sub.add_parser("db", help="manage the tuning database",
                        **with_examples("nightshift db stats", "nightshift db init --db nightshift.db",
                                        "nightshift db prune --older-than 30d --dry-run"))  # fmt: skip
    cmds = db.add_subparsers(dest="db_command", required=True)

    def command(name: str, help_: str, func: Callable[[argparse.Namespace], int], *examples: str,
                device: bool = False) -> argparse.ArgumentParser:  # fmt: skip
        p = cmds.add_parser(name, help=help_, **with_examples(*examples))
        add_db_arg(p)
        p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
        if device:
            p.add_argument("--device", default="cpu", help="cpu or cuda:N (default: cpu)")
            p.add_argument("--target-arch", default=None, help="CUDA sm_XX or LLVM mcpu instead of the detected one")
            p.add_argument("--num-cores", type=int, default=None, help="CPU threads the records were tuned for")
        p.set_defaults(func=func)
        return p

    command("init", "create the schema in an empty database", cmd_init, "nightshift db init --db nightshift.db",
            "nightshift db init --db postgresql+psycopg://tuner@dbhost/nightshift")
    command("upgrade", "migrate the database to this Nightshift's schema", cmd_upgrade,
            "nightshift db upgrade --db nightshift.db")
    command("stats", "what the database holds", cmd_stats, "nightshift db stats", "nightshift db stats --db t.db")
    # The same list as `nightshift jobs` (one implementation: tuner.cli.report.cmd_jobs).
    command("jobs", "the same as nightshift jobs: jobs and their state (a running job whose heartbeat "
            "stopped shows as dead)", cmd_jobs, "nightshift db jobs --db nightshift.db")
    p = command("coverage", "which operators of a model are tuned for a device, and how well", cmd_coverage,
                "nightshift db coverage --model resnet50", "nightshift db coverage --model bert-base --seq-len 64",
                device=True)  # fmt: skip
    p.add_argument("--model", required=True,
                   help="zoo name, .onnx file, torchvision:NAME, timm:NAME, hf:NAME or package.module:factory")
    p.add_argument("--batch-size", type=int, default=1, help="model batch size (default 1)")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sequence of a text model (as tune's)")
    p.add_argument("--image-size", type=int, default=None, help="an image model's input size (as tune's)")
    p.add_argument("--dtype", default="float32", help="zoo models' dtype (default float32)")
    p = command("best", "best schedule of each workload for a device", cmd_best, "nightshift db best",
                "nightshift db best --workload KEY --top-k 3", device=True)
    p.add_argument("--workload", default=None, help="one workload key: list its top records")
    p.add_argument("--top-k", type=int, default=5, help="records listed with --workload (default 5)")
    p = command("export", "write a device's records as a MetaSchedule JSON database", cmd_export,
                "nightshift db export -o records/ --top-k 5", device=True)
    p.add_argument("-o", "--output", type=Path, required=True, help="folder for the two JSON files")
    p.add_argument("--top-k", type=int, default=None, help="only the k best records of each workload")
    p = command("import", "read a MetaSchedule JSON database as records of a device", cmd_import,
                "nightshift db import records/ --source-tvm-version 0.27.0", device=True)
    p.add_argument("folder", type=Path, help="folder with database_workload.json and database_tuning_record.json")
    p.add_argument("--source-tvm-version", default=None, help="TVM version that wrote the files, if known")
    p = command("prune", "delete old records, or all but the best of each workload, device and TVM version",
                cmd_prune, "nightshift db prune --older-than 30d --dry-run", "nightshift db prune --keep-top 16 --yes",
                "nightshift db prune --tvm-version 0.21.0 --device cpu")  # fmt: skip
    p.add_argument("--keep-top", type=int, default=None,
                   help="successful records kept per workload, device, TVM version and origin")
    p.add_argument("--tvm-version", default=None, help="only records written by this TVM version")
    p.add_argument("--older-than", default=None, metavar="AGE",
                   help="only records older than AGE: 30d, 7d, 12h; a plain number is days")
    p.add_argument("--keep-failed", action="store_true", help="keep failed records (they stop re-measuring)")
    p.add_argument("--device", default=None, help="only this device's records (cpu or cuda:N)")
    p.add_argument("--dry-run", action="store_true", help="count, delete nothing")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask before deleting more records than are kept")


def _url(args: argparse.Namespace):
    from tuner.db import database_url

    return database_url(db_text(args.db))


def _open(args: argparse.Namespace):
    return open_existing(_url(args))


def _device(args: argparse.Namespace):
    from tuner.device import parse_device

    return parse_device(args.device, target_arch=getattr(args, "target_arch", None),
                        num_cores=getattr(args, "num_cores", None))  # fmt: skip


def _known_device_id(db, device) -> int:
    dev_id = db.find_device_id(device)
    if dev_id is None:
        raise UserInputError(
            f"no records for {device.name} ({device.arch}, fingerprint {device.fingerprint}) in this database; "
            "`nightshift db stats` lists the devices it has"
        )
    return dev_id


def cmd_init(args: argparse.Namespace) -> int:
    """Create the schema (a no-op on a current database)."""

    from tuner.db import TuningDatabase, redact

    db = TuningDatabase(_url(args), create=True)
    out.print(f"tuning database {redact(db.url)} is at schema {db.schema.revision}")
    return 0


def cmd_upgrade(args: argparse.Namespace) -> int:
    """Migrate to the newest schema."""
    from sqlalchemy.exc import DBAPIError

    from tuner.db import migrate, redact
    from tuner.db.store import _describe, create_engine
    from tuner.errors import DatabaseError

    url = _url(args)
    if url.get_backend_name() == "sqlite" and url.database and not Path(url.database).exists():
        raise UserInputError(f"no tuning database at {url.database} to upgrade; pass the right --db "
                             f"(`nightshift db init --db {url.database}` creates a new one)")
    engine = create_engine(url)
    try:
        # The revision before is read under upgrade's lock: read apart, another process's
        # upgrade could move or drop the version table between the two reads.
        state = migrate.upgrade(engine, url)
        before, after = state.was, state.revision
    except DBAPIError as err:
        raise DatabaseError(f"cannot upgrade tuning database {redact(url)}: {_describe(err)}") from err
    finally:
        engine.dispose()
    if before == after:
        out.print(f"tuning database {redact(url)} is already at schema {after}")
    else:
        out.print(f"tuning database {redact(url)} upgraded from schema {before or 'none'} to {after}")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    """Print counts of workloads, records, jobs and devices."""
    db = _open(args)
    try:
        st = db.stats()
    finally:
        db.close()
    # The URL on a line of its own: a long path would otherwise push the counts into a wrap.
    out.print(f"{st['url']} (schema {st['schema']})", highlight=False, soft_wrap=True)
    out.print(f"{st['workloads']} workloads, {st['records']} records ({st['failed_records']} failed), "
              f"{st['cost_models']} cost models")  # fmt: skip
    out.print("jobs: " + (", ".join(f"{n} {state}" for state, n in sorted(st["jobs"].items())) or "none"))
    out.print("records by TVM version: " + (", ".join(f"{v}: {n}" for v, n in st["tvm_versions"].items()) or "none"))
    table = Table(title="devices")
    table.add_column("fingerprint", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    table.add_column("arch", no_wrap=True, overflow="ellipsis", max_width=24)
    table.add_column("records", justify="right", no_wrap=True)
    table.add_column("successful", justify="right", no_wrap=True)
    for d in st["devices"]:
        table.add_row(d["fingerprint"], d["kind"], d["arch"], str(d["records"]), str(d["ok"]))
    out.print(table)
    return 0


def cmd_best(args: argparse.Namespace) -> int:
    """Print the best record of every workload (or the top k of one) on a device, with its provenance."""
    import json

    from tvm.s_tir.meta_schedule.database import Workload

    from tuner.db.tvm_adapter import replays_cleanly

    db = _open(args)
    device = _device(args)
    dev_id = _known_device_id(db, device)
    if args.workload:
        if args.top_k <= 0:
            raise UserInputError(f"--top-k must be a positive integer, got {args.top_k}")
        stored = db.get_workload(args.workload)
        workload = Workload.from_json(json.loads(stored.workload_json)) if stored is not None else None
        found = db.lookup(args.workload, dev_id, args.top_k,
                          replays=(lambda row: replays_cleanly(row, workload)) if workload is not None else None)
        if not found:
            raise UserInputError(f"no usable record of workload {args.workload} for {device.name} or its architecture")
        # The records found are of one timing mode (cold ones first, see TuningDatabase.lookup).
        table = Table(title=f"workload {args.workload} on {device.name}, timed {found[0].row.timing}")
        for col in ("record", "mean (ms)", "source", "TVM", "job", "written by", "point"):
            table.add_column(col)
        for b in found:
            source = {"device": "this device" if b.device_fingerprint == device.fingerprint else
                      f"identical device {b.device_fingerprint}", "same-arch": f"same-arch {b.device_fingerprint}",
                      "foreign": f"FOREIGN import of {b.row.source_file}"}[b.source]  # fmt: skip
            table.add_row(str(b.row.id), f"{b.row.mean_sec * 1e3:.4f}", source, b.row.tvm_version,
                          str(b.row.job_id or "-"), _writer(b.row), b.row.point[:60])  # fmt: skip
        out.print(table)
        if db.rejected:
            out.print(f"{len(db.rejected)} record(s) rejected by the trace allow-list: "
                      + "; ".join(f"{i}: {r}" for i, r in sorted(db.rejected.items())[:5]))
        return 0
    table = Table(title=f"best schedules for {device.name} ({device.arch}, fingerprint {device.fingerprint})")
    for col in ("workload", "name", "best (ms)", "timing", "GFLOPS", "records", "TVM", "origin"):
        table.add_column(col, justify="right" if col in ("best (ms)", "GFLOPS", "records") else "left")
    for w, row, n in db.best_per_workload(dev_id):
        gflops = f"{w.flops / row.mean_sec / 1e9:,.1f}" if w.flops and row.mean_sec else "-"
        origin = "measured" if row.origin == "local" else f"FOREIGN: imported from {row.source_file}"
        table.add_row(w.key, w.summary or w.name, f"{row.mean_sec * 1e3:.4f}", row.timing, gflops, str(n),
                      row.tvm_version,
                      origin)  # fmt: skip
    out.print(table)
    return 0


def _writer(row) -> str:
    who = f"{row.os_user or '?'}@{row.host}"
    return who + (f", nightshift {row.nightshift_version}" if row.nightshift_version else "")


def cmd_coverage(args: argparse.Namespace) -> int:
    """Print which of a model's operators have a record usable on the device, and how fast."""
    import json

    from tvm.s_tir.meta_schedule.database import Workload

    from tuner.db.tvm_adapter import replays_cleanly
    from tuner.frontends import load_model
    from tuner.graph.layout.plan import LayoutPlan
    from tuner.graph.tasks import extract_tasks

    db = _open(args)
    device = _device(args)
    spec = load_model(args.model, batch_size=args.batch_size, dtype=args.dtype, seq_len=args.seq_len,
                      image_size=args.image_size)  # fmt: skip
    tasks = extract_tasks(spec.bound(), device.target)
    dev_id = db.find_device_id(device)
    table = Table(title=f"{spec.name} on {device.name} ({device.arch}): tuning coverage")
    for col in ("task", "weight", "MFLOP", "records", "best (ms)", "GFLOPS", "source"):
        table.add_column(col, justify="left" if col in ("task", "source") else "right")
    covered = weighted = total = 0.0
    for t in tasks:
        found = []
        if dev_id is not None:
            stored = db.get_workload(t.workload_key)
            wl = Workload.from_json(json.loads(stored.workload_json)) if stored is not None else None
            found = db.lookup(t.workload_key, dev_id, 1,
                              replays=(lambda row, wl=wl: replays_cleanly(row, wl)) if wl is not None else None)
        n = db.count_records(t.workload_key, dev_id) if dev_id is not None else 0
        total += t.weight * t.flops
        if found:
            b = found[0]
            covered += 1
            weighted += t.weight * t.flops
            gflops = f"{t.flops / b.row.mean_sec / 1e9:,.1f}" if t.flops else "-"
            table.add_row(t.name, str(t.weight), f"{t.flops / 1e6:,.1f}", str(n), f"{b.row.mean_sec * 1e3:.4f}",
                          gflops, b.source)  # fmt: skip
        else:
            table.add_row(t.name, str(t.weight), f"{t.flops / 1e6:,.1f}", str(n), "-", "-", "untuned")
    out.print(table)
    share = weighted / total if total else 0.0
    plan = LayoutPlan.for_target(device.target)
    out.print(f"{int(covered)} of {len(tasks)} operators (the {plan} plan's tasks) tuned for {device.name}, "
              f"{share:.0%} of the model's FLOPs")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Export a device's records to MetaSchedule's JSON files."""

    from tuner.db.interop import export_json

    if args.top_k is not None and args.top_k <= 0:
        raise UserInputError(f"--top-k must be a positive integer, got {args.top_k}")
    db = _open(args)
    dev_id = _known_device_id(db, _device(args))
    res = export_json(db, dev_id, args.output, top_k=args.top_k)
    out.print(f"exported {res.records} records of {res.workloads} workloads (the tasks with a record) to {args.output}"
              + (f"; {res.skipped} not loadable on this TVM, skipped" if res.skipped else ""))
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    """Import MetaSchedule's JSON files as records of a device."""

    from tuner.db.interop import import_json

    db = _open(args)
    device = _device(args)
    res = import_json(db, db.device_id(device), device.kind, args.folder, tvm_version=args.source_tvm_version)
    out.print(f"imported {res.records} new records of {res.workloads} workloads for {device.name} "
              f"(fingerprint {device.fingerprint}) as foreign records; {res.skipped} already present or without "
              "timings")
    for line, reason in res.rejected:
        out.print(f"rejected record on line {line}: {reason}", soft_wrap=True, highlight=False)
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    """Delete old records or all but the best; ask before deleting more than is kept."""
    import sys
    from datetime import timedelta

    from tuner.config import parse_duration

    # Durations read alike on every command (tune --time-budget 8h); a plain number stays days.
    older_than = (None if args.older_than is None else
                  timedelta(seconds=parse_duration(args.older_than, what="--older-than", plain="d")))  # fmt: skip
    db = _open(args)
    dev_id = _known_device_id(db, _device(args)) if args.device else None
    opts = {"keep_top": args.keep_top, "keep_failed": args.keep_failed, "device_id": dev_id,
            "tvm_version": args.tvm_version,
            "older_than": older_than}  # fmt: skip
    plan = db.prune(**opts, dry_run=True)
    if args.dry_run:
        out.print(f"would delete {plan.deleted} records and keep {plan.kept}")
        return 0
    if plan.deleted and (plan.deleted > plan.kept or args.keep_top == 0) and not args.yes:
        question = f"delete {plan.deleted} records and keep only {plan.kept}?"
        if not sys.stdin.isatty():
            raise UserInputError(f"{question[:-1]}: refused without confirmation; check with --dry-run, "
                                 "then pass --yes")
        console.print(f"{question} [y/N] ", end="")
        if input().strip().lower() not in ("y", "yes"):
            out.print("nothing deleted")
            return 1
    res = db.prune(**opts)
    out.print(f"deleted {res.deleted} records; {res.kept} kept")
    return 0
