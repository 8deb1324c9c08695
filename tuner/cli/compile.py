"""``nightshift compile``: a model with the database's best schedules, as a deployable library."""

from __future__ import annotations

import argparse
import logging

from rich.table import Table

from tuner.cli.common import _load, _open_db, _plan, check_output, console, out

logger = logging.getLogger(__name__)


def cmd_compile(args: argparse.Namespace) -> int:
    """Compile a model with the database's best schedules into a deployable library.

    The work is :func:`tuner.app.compile.compile_artifact`'s, as :func:`tuner.api.compile_model`
    runs it; this shows what each operator got and what was written.
    """
    from tuner.app.compile import compile_artifact

    check_output(args.output)  # before the compile it would lose
    loaded = _load(args)
    spec, device = loaded.spec, loaded.device
    db = _open_db(args.db)
    _plan(loaded, db)  # says which layout each conv gets, and why
    result = compile_artifact(loaded, db, args.output, policy=args.policy, verify=args.verify, status=console.status)
    compiled = result.compiled
    table = Table(title=f"{spec.name} on {device.name} ({device.arch}), {loaded.precision}: what each operator got")
    for col in ("operator", "schedule", "detail"):
        table.add_column(col)
    order = {"tuned": 0, "same-arch": 1, "foreign": 2, "fallback": 3, "tvm-default": 4}
    for d in sorted(compiled.decisions.values(), key=lambda d: (order.get(d.kind, 9), d.name)):
        table.add_row(d.name, d.kind, d.detail)
    counts = result.counts()
    out.print(f"{counts['tuned']} operators tuned on this device, {counts['same-arch']} from another "
              f"device of the same architecture, {counts['foreign']} from imported records, "
              f"{counts['fallback']} with the fallback schedule, {counts['tvm-default']} with TVM's "
              "default lowering")
    out.print(table)
    if result.stale:
        from tuner.compile import retune_hint

        console.print(f"[yellow]warning:[/] {retune_hint(result.stale)}", soft_wrap=True, highlight=False)
    if result.rejected:
        console.print(f"[yellow]warning:[/] {len(result.rejected)} record(s) rejected by the trace allow-list: "
                      + "; ".join(f"record {i}: {r}" for i, r in sorted(result.rejected.items())[:5]),
                      soft_wrap=True, highlight=False)  # fmt: skip
    checked = result.verification
    if checked is not None and not checked.ok:
        console.print(f"[red]error:[/] the compiled model's output differs from the untuned build's "
                      f"(max relative difference {checked.max_error:.2e}); {args.output} not written")
        return 1
    if checked is not None:
        out.print(f"output checked against the untuned build (max relative difference {checked.max_error:.1e})")
    out.print(f"wrote {args.output} (metadata {result.metadata}) in {compiled.compile_s:.1f} s; run it with: "
              f"nightshift run {args.output} --random-input --rounds 100")
    return 0
