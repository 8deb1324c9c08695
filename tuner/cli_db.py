"""``nightshift db ...``: init, upgrade, stats, best, export, import, prune.

Registered on the main parser by :func:`add_db_commands`. Output goes to the CLI's rich
consoles; errors are Nightshift's own exceptions, printed by the CLI as one line.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from rich.table import Table

from tuner.errors import UserInputError


def add_db_commands(
    sub: argparse._SubParsersAction, add_db_arg: Callable[[argparse.ArgumentParser], None]
) -> None:
    """Add the ``db`` command group to the ``nightshift`` subparsers."""
    db = sub.add_parser("db", help="manage the tuning database")
    cmds = db.add_subparsers(dest="db_command", required=True)

    def command(name: str, help_: str, func: Callable[[argparse.Namespace], int], device: bool = False):
        p = cmds.add_parser(name, help=help_)
        add_db_arg(p)
        p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
        if device:
            p.add_argument("--device", default="cpu", help="cpu or cuda:N (default: cpu)")
            p.add_argument("--target-arch", default=None, help="CUDA sm_XX or LLVM mcpu instead of the detected one")
            p.add_argument("--num-cores", type=int, default=None, help="CPU threads the records were tuned for")
        p.set_defaults(func=func)
        return p

    command("init", "create the schema in an empty database", cmd_init)
    command("upgrade", "migrate the database to this Nightshift's schema", cmd_upgrade)
    command("stats", "what the database holds", cmd_stats)
    p = command("best", "best schedule of each workload for a device", cmd_best, device=True)
    p.add_argument("--workload", default=None, help="one workload key: list its top records")
    p.add_argument("--top-k", type=int, default=5, help="records listed with --workload (default 5)")
    p = command("export", "write a device's records as a MetaSchedule JSON database", cmd_export, device=True)
    p.add_argument("-o", "--output", type=Path, required=True, help="folder for the two JSON files")
    p.add_argument("--top-k", type=int, default=None, help="only the k best records of each workload")
    p = command("import", "read a MetaSchedule JSON database as records of a device", cmd_import, device=True)
    p.add_argument("folder", type=Path, help="folder with database_workload.json and database_tuning_record.json")
    p = command("prune", "delete all but the best records of each workload and device", cmd_prune)
    p.add_argument("--keep-top", type=int, required=True, help="successful records kept per workload and device")
    p.add_argument("--keep-failed", action="store_true", help="keep failed records (they stop re-measuring)")
    p.add_argument("--device", default=None, help="only this device's records (cpu or cuda:N)")
    p.add_argument("--dry-run", action="store_true", help="count, delete nothing")


def _url(args: argparse.Namespace):
    from tuner.cli import DB_ENV, DEFAULT_DB
    from tuner.db import database_url

    return database_url(args.db or os.environ.get(DB_ENV) or DEFAULT_DB)


def _open(args: argparse.Namespace):
    from tuner.db import TuningDatabase

    url = _url(args)
    if url.get_backend_name() == "sqlite" and url.database and not Path(url.database).exists():
        # Connecting would leave an empty file behind.
        raise UserInputError(f"no tuning database at {url.database}; run `nightshift db init --db {url.database}` "
                             "or pass another --db")
    return TuningDatabase(url, create=False)


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
    from tuner.cli import out
    from tuner.db import TuningDatabase, redact

    db = TuningDatabase(_url(args), create=True)
    out.print(f"tuning database {redact(db.url)} is at schema {db.schema.revision}")
    return 0


def cmd_upgrade(args: argparse.Namespace) -> int:
    """Migrate to the newest schema."""
    from sqlalchemy.exc import DBAPIError

    from tuner.cli import out
    from tuner.db import migrate, redact
    from tuner.db.database import _describe, create_engine
    from tuner.errors import DatabaseError

    url = _url(args)
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            before = migrate.schema_state(conn).revision
        after = migrate.upgrade(engine, url).revision
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
    from tuner.cli import out

    st = _open(args).stats()
    out.print(f"{st['url']} (schema {st['schema']}): {st['workloads']} workloads, {st['records']} records "
              f"({st['failed_records']} failed), {st['cost_models']} cost models")
    out.print("jobs: " + (", ".join(f"{n} {state}" for state, n in sorted(st["jobs"].items())) or "none"))
    out.print("records by TVM version: " + (", ".join(f"{v}: {n}" for v, n in st["tvm_versions"].items()) or "none"))
    table = Table(title="devices")
    for col in ("fingerprint", "kind", "arch", "records", "successful"):
        table.add_column(col, justify="right" if col in ("records", "successful") else "left")
    for d in st["devices"]:
        table.add_row(d["fingerprint"], d["kind"], d["arch"], str(d["records"]), str(d["ok"]))
    out.print(table)
    return 0


def cmd_best(args: argparse.Namespace) -> int:
    """Print the best record of every workload (or the top k of one) on a device."""
    from tuner.cli import out

    db = _open(args)
    device = _device(args)
    dev_id = _known_device_id(db, device)
    if args.workload:
        if args.top_k <= 0:
            raise UserInputError(f"--top-k must be a positive integer, got {args.top_k}")
        found = db.lookup(args.workload, dev_id, args.top_k)
        if not found:
            raise UserInputError(f"no usable record of workload {args.workload} for {device.name} or its architecture")
        table = Table(title=f"workload {args.workload} on {device.name}")
        for col in ("record", "mean (ms)", "source", "TVM", "job", "point"):
            table.add_column(col)
        for b in found:
            table.add_row(str(b.row.id), f"{b.row.mean_sec * 1e3:.4f}", b.source if b.source == "device" else
                          f"same-arch {b.device_fingerprint}", b.row.tvm_version, str(b.row.job_id or "-"),
                          b.row.point[:60])  # fmt: skip
        out.print(table)
        return 0
    table = Table(title=f"best schedules for {device.name} ({device.arch}, fingerprint {device.fingerprint})")
    for col in ("workload", "name", "best (ms)", "GFLOPS", "records"):
        table.add_column(col, justify="right" if col in ("best (ms)", "GFLOPS", "records") else "left")
    for w, row, n in db.best_per_workload(dev_id):
        gflops = f"{w.flops / row.mean_sec / 1e9:,.1f}" if w.flops and row.mean_sec else "-"
        table.add_row(w.key, w.summary or w.name, f"{row.mean_sec * 1e3:.4f}", gflops, str(n))
    out.print(table)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Export a device's records to MetaSchedule's JSON files."""
    from tuner.cli import out
    from tuner.db.interop import export_json

    if args.top_k is not None and args.top_k <= 0:
        raise UserInputError(f"--top-k must be a positive integer, got {args.top_k}")
    db = _open(args)
    dev_id = _known_device_id(db, _device(args))
    res = export_json(db, dev_id, args.output, top_k=args.top_k)
    out.print(f"exported {res.records} records of {res.workloads} workloads to {args.output}"
              + (f"; {res.skipped} not loadable on this TVM, skipped" if res.skipped else ""))
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    """Import MetaSchedule's JSON files as records of a device."""
    from tuner.cli import out
    from tuner.db.interop import import_json

    db = _open(args)
    device = _device(args)
    res = import_json(db, db.device_id(device), device.kind, args.folder)
    out.print(f"imported {res.records} new records of {res.workloads} workloads for {device.name} "
              f"(fingerprint {device.fingerprint}); {res.skipped} already present or without timings")
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    """Delete all but the best records."""
    from tuner.cli import out

    db = _open(args)
    dev_id = _known_device_id(db, _device(args)) if args.device else None
    n = db.prune(keep_top=args.keep_top, keep_failed=args.keep_failed, device_id=dev_id, dry_run=args.dry_run)
    out.print(f"{'would delete' if args.dry_run else 'deleted'} {n} records")
    return 0
