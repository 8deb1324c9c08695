"""Command line: ``tune`` (the tuning job) and ``nightshift`` (tasks, compile, tune).

Configuration flows from here into typed objects; library code never reads the
environment. Errors Nightshift raises on purpose print as one line and exit with code 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.logging import RichHandler
from rich.markup import escape

from tuner.cli.bench import cmd_bench
from tuner.cli.common import _add_db_arg, _add_model_args, _one_line, console, out, with_examples
from tuner.cli.compile import cmd_compile
from tuner.cli.db import add_db_commands
from tuner.cli.model import add_model_commands
from tuner.cli.report import add_report_commands
from tuner.cli.tasks import cmd_tasks
from tuner.cli.tune import TUNE_DESCRIPTION, _add_tune_args, cmd_tune, tune_examples
from tuner.errors import NightshiftError

__all__ = ["build_parser", "build_tune_parser", "console", "main", "out", "tune_main"]

logger = logging.getLogger("tuner")


def _parser(prog: str) -> argparse.ArgumentParser:
    from tuner.peers import PEERS

    parser = argparse.ArgumentParser(
        prog=prog, description="Nightshift: tune models with TVM on Ray.",
        **with_examples("nightshift tune --model resnet50 --time-budget 8h --job nightly",
                        "nightshift jobs",
                        "nightshift compile --job nightly -o resnet50.so"),
    )  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("tune", help="run a tuning job", description=TUNE_DESCRIPTION, **tune_examples(f"{prog} tune"))
    _add_tune_args(p)
    p.set_defaults(func=cmd_tune)
    p = sub.add_parser(
        "tasks", help="list a model's fused-operator tasks",
        description="List the fused operators (tasks) TVM extracts from a model for a device: each one's "
                    "layout, how often the model calls it (weight), its MFLOP and workload key.",
        **with_examples("nightshift tasks --model resnet50",
                        "nightshift tasks --model model.onnx --precision int8 --layout NCHWc"),
    )  # fmt: skip
    _add_model_args(p)
    p.set_defaults(func=cmd_tasks)
    p = sub.add_parser(
        "compile", help="compile a model with the database's best schedules",
        description="Compile a model with the database's best schedules into a library that nightshift "
                    "run (or TVM's runtime) loads, and check its output against the untuned build. "
                    "--job NAME takes the model, device and model options of a tuned job.",
        **with_examples("nightshift compile --job nightly -o resnet50.so",
                        "nightshift compile --model resnet50 --db nightshift.db -o resnet50.so",
                        "nightshift compile --model bert-base --precision bf16 -o bert.so --no-verify"),
    )  # fmt: skip
    _add_model_args(p, required=False, from_job=True)
    _add_db_arg(p)
    p.add_argument("-o", "--output", type=Path, required=True, help="output library (.so)")
    p.add_argument("--policy", choices=("same-arch", "device"), default="same-arch",
                   help="same-arch (default): records of another device of the same architecture may stand in")
    p.add_argument("--no-verify", dest="verify", action="store_const", const="off",
                   help="skip checking the output against the untuned build (default: checked when that "
                        "build is cheap)")  # fmt: skip
    # The spelling before --no-verify (as tune's); "on" forces the check on a large model.
    p.add_argument("--verify", choices=("auto", "on", "off"), help=argparse.SUPPRESS)
    p.set_defaults(verify="auto")  # for both: argparse would take the first option's default (None)
    p.set_defaults(func=cmd_compile)
    p = sub.add_parser(
        "bench", help="time the tuned and fallback builds against ONNX Runtime, OpenVINO "
                      "(INFERENCE_PRECISION_HINT f32 for fp32) and PyTorch",
        description="Time the database's tuned build and the fallback build (no tuning) against the "
                    "installed peers, in interleaved rounds, and compare their outputs. --job NAME "
                    "takes the model, device and model options of a tuned job.",
        **with_examples("nightshift bench --job nightly",
                        "nightshift bench --model resnet50 --rounds 20 --json bench.json",
                        "nightshift bench --model resnet50 --peers onnxruntime torch"),
    )  # fmt: skip
    _add_model_args(p, required=False, from_job=True)
    _add_db_arg(p)
    p.add_argument("--json", type=Path, default=None, help="also write the results as JSON to this file")
    p.add_argument("--rounds", type=int, default=10, help="interleaved timed rounds (default 10)")
    p.add_argument("--accuracy-inputs", type=int, default=8,
                   help="random inputs the accuracy vs fp32 is measured on, for bf16/int8 (default 8)")
    p.add_argument("--peers", nargs="+", choices=list(PEERS), default=list(PEERS), metavar="PEER",
                   help=f"peers to run (default all: {' '.join(PEERS)})")
    p.set_defaults(func=cmd_bench)
    add_db_commands(sub, _add_db_arg)
    add_model_commands(sub, _add_db_arg)
    add_report_commands(sub, _add_db_arg)
    return parser


def _run(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.DEBUG if getattr(args, "verbose", False) else logging.WARNING,
        format="%(message)s", handlers=[RichHandler(console=console, show_path=False)],
    )  # fmt: skip
    # The commands import tvm_ffi lazily, after this: the driver skips the torch add-on's JIT
    # build as the workers do (WORKER_ENV), unless the user's environment says otherwise.
    os.environ.setdefault("TVM_FFI_DISABLE_TORCH_C_DLPACK", "1")
    start = time.perf_counter()
    try:
        return func(args)
    except NightshiftError as err:
        if getattr(args, "verbose", False) and err.__cause__ is not None:
            console.print_exception()  # the TVM or library failure behind the message
        console.print(f"[red]error:[/] {escape(str(err))}", soft_wrap=True, highlight=False)
        return 2
    except KeyboardInterrupt:
        console.print(f"interrupted after {time.perf_counter() - start:.0f} s; measurements so far are saved")
        return 130
    except Exception as err:  # TVM's or a library's failure: one line here, the trace with -v
        if getattr(args, "verbose", False):
            console.print_exception()
        console.print(f"[red]error:[/] {escape(_one_line(err))}; nothing measured is lost. "
                      + ("The trace is above." if getattr(args, "verbose", False) else
                         "Run again with -v for the trace, and report it with the model if it persists."),
                      soft_wrap=True, highlight=False)  # fmt: skip
        return 2


def build_parser(prog: str = "nightshift") -> argparse.ArgumentParser:
    """The ``nightshift`` command line's parser (every command and option)."""
    return _parser(prog)


def build_tune_parser() -> argparse.ArgumentParser:
    """The ``tune`` command line's parser."""
    parser = argparse.ArgumentParser(prog="tune", description=TUNE_DESCRIPTION, **tune_examples("tune"))
    _add_tune_args(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``nightshift``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser("nightshift").parse_args(argv)
    args.argv = argv
    return _run(args.func, args)


def tune_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``tune`` (same as ``nightshift tune``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_tune_parser().parse_args(argv)
    args.argv = ["tune", *argv]
    return _run(cmd_tune, args)


if __name__ == "__main__":
    sys.exit(main())
