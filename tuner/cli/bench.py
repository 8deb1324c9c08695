"""``nightshift bench``: the database's build and the fallback build against the installed peers."""

from __future__ import annotations

import argparse
import logging

from tuner.cli.common import _load, _open_db, _plan, check_output, console, out
from tuner.errors import UserInputError

logger = logging.getLogger(__name__)


def cmd_bench(args: argparse.Namespace) -> int:
    """Benchmark the database's build and the fallback build against the installed peers."""
    import json

    from tuner.bench import BenchConfig, bench, render

    if args.json is not None:
        check_output(args.json, "--json")
    loaded = _load(args)
    spec, device = loaded.spec, loaded.device
    db = _open_db(args.db)
    plan = _plan(loaded, db)
    config = BenchConfig(rounds=args.rounds, peers=tuple(args.peers), plan=plan, precision=loaded.precision,
                         accuracy_inputs=args.accuracy_inputs, reference_spec=loaded.fp32_spec,
                         layout_choice=loaded.choice)  # fmt: skip
    with console.status("benchmarking") as status:
        result = bench(spec, device, db, source=loaded.source, config=config,
                       on_stage=lambda text: status.update(text))  # fmt: skip
    out.print(render(result))
    if result.accuracy is not None:
        out.print(f"TVM {loaded.precision} accuracy {result.accuracy.describe()}")
    if args.json is not None:
        try:
            args.json.write_text(json.dumps(result.to_json(), indent=2) + "\n")
        except OSError as err:
            raise UserInputError(f"cannot write --json {args.json}: {err.strerror}") from err
        out.print(f"wrote {args.json}")
    for line in result.mismatch_warnings():
        console.print(f"[yellow]warning:[/] {line}", highlight=False)
    if not result.ok:
        console.print("[red]error:[/] TVM's output differs beyond tolerance (max error column)")
        return 1
    return 0
