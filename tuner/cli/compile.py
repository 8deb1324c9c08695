"""``nightshift compile``: a model with the database's best schedules, as a deployable library."""

from __future__ import annotations

import argparse
import logging

from rich.table import Table

from tuner.cli.common import _load, _open_db, _plan, check_output, console, out

logger = logging.getLogger(__name__)


def cmd_compile(args: argparse.Namespace) -> int:
    """Compile a model with the database's best schedules into a deployable library."""
    from tuner.compile import compile_model

    check_output(args.output)  # before the compile it would lose
    loaded = _load(args)
    spec, device = loaded.spec, loaded.device
    db = _open_db(args.db)
    plan = _plan(loaded, db)
    with console.status("compiling"):
        compiled = compile_model(spec, device, db, policy=args.policy, plan=plan, precision=loaded.precision)
    table = Table(title=f"{spec.name} on {device.name} ({device.arch}), {loaded.precision}: what each operator got")
    for col in ("operator", "schedule", "detail"):
        table.add_column(col)
    order = {"tuned": 0, "same-arch": 1, "foreign": 2, "fallback": 3, "tvm-default": 4}
    for d in sorted(compiled.decisions.values(), key=lambda d: (order.get(d.kind, 9), d.name)):
        table.add_row(d.name, d.kind, d.detail)
    kinds = [d.kind for d in compiled.decisions.values()]
    out.print(f"{kinds.count('tuned')} operators tuned on this device, {kinds.count('same-arch')} from another "
              f"device of the same architecture, {kinds.count('foreign')} from imported records, "
              f"{kinds.count('fallback')} with the fallback schedule, {kinds.count('tvm-default')} with TVM's "
              "default lowering")
    out.print(table)
    stale = compiled.tuned_in_another_form(db)
    if stale:
        from tuner.compile import retune_hint

        console.print(f"[yellow]warning:[/] {retune_hint(stale)}", soft_wrap=True, highlight=False)
    if db.rejected:
        console.print(f"[yellow]warning:[/] {len(db.rejected)} record(s) rejected by the trace allow-list: "
                      + "; ".join(f"record {i}: {r}" for i, r in sorted(db.rejected.items())[:5]),
                      soft_wrap=True, highlight=False)  # fmt: skip
    from tuner.artifact import Verification, write_artifact
    from tuner.compile import VERIFY_TOLERANCE, max_difference, verify_wanted

    checked = None
    if verify_wanted(args.verify, spec, device):
        with console.status("checking the output against the untuned build"):
            worst = max_difference(spec, device, compiled, plan=plan)
        checked = Verification("untuned TVM build", worst, VERIFY_TOLERANCE)
        if not checked.ok:
            console.print(f"[red]error:[/] the compiled model's output differs from the untuned build's "
                          f"(max relative difference {worst:.2e}); {args.output} not written")
            return 1
        out.print(f"output checked against the untuned build (max relative difference {worst:.1e})")
    # The same artifact as `tune -o` writes: `nightshift run` needs its metadata.
    meta = write_artifact(args.output, compiled, spec, device, latency_s=None, verification=checked,
                          source=loaded.source)
    out.print(f"wrote {args.output} (metadata {meta}) in {compiled.compile_s:.1f} s; run it with: "
              f"nightshift run {args.output} --input x.npy")
    return 0
