"""What every command shares: the consoles, the model, device and database options, and turning
them into the objects the use cases take."""

from __future__ import annotations

import argparse
import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

# The checks moved to tuner.app.inputs (the Python API makes them too); their names stay here.
from tuner.app.inputs import (  # noqa: F401
    DB_ENV,
    DB_FILE_ENV,
    DEFAULT_DB,
    check_db,
    check_output,
    extract_tasks,
    open_existing,
)
from tuner.app.inputs import environment_db as _environment_db
from tuner.app.inputs import one_line as _one_line  # noqa: F401
from tuner.app.model import LoadedModel, ModelOptions, load
from tuner.errors import UserInputError
from tuner.precision import PRECISIONS

logger = logging.getLogger(__name__)


console = Console(stderr=True)


out = Console()


class ExamplesFormatter(argparse.RawDescriptionHelpFormatter):
    """argparse's help, with the epilog's example command lines kept as written (one per
    line, as RawDescriptionHelpFormatter keeps them) and the description wrapped to the
    terminal as usual."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith(EXAMPLES_HEADING):
            return super()._fill_text(text, width, indent)
        return argparse.HelpFormatter._fill_text(self, text, width, indent)


EXAMPLES_HEADING = "examples:"


def with_examples(*lines: str) -> dict[str, Any]:
    """``add_parser``/``ArgumentParser`` keywords that end a command's ``--help`` with example
    command lines (``ExamplesFormatter`` keeps them one per line)."""
    return {"epilog": "\n".join([EXAMPLES_HEADING, *(f"  {line}" for line in lines)]),
            "formatter_class": ExamplesFormatter}  # fmt: skip


def _add_model_args(p: argparse.ArgumentParser, *, required: bool = True, from_job: bool = False) -> None:
    """The model and device options; with ``from_job``, ``--job NAME`` too, which fills the
    ones not given from that tuned job (compile, bench)."""
    p.add_argument("--model", required=required,
                   help="zoo name (resnet50, ...), path to a .onnx file, torchvision:NAME, timm:NAME, hf:NAME "
                        "(random weights, nothing downloaded), or package.module:factory"
                        + ("; or --job" if from_job else ""))
    if from_job:
        p.add_argument("--job", default=None, metavar="NAME_OR_ID",
                       help="a tuned job in the database (tune --job, nightshift jobs): its model, device and "
                            "model options, where not given here")
        p.set_defaults(model_from_job=True)
    p.add_argument("--device", default=None, help="cpu or cuda:N (default: cpu)")
    p.add_argument("--target-arch", default=None,
                   help="CUDA sm_XX to cross-build for without a GPU, or an LLVM mcpu for cpu")
    p.add_argument("--num-cores", type=int, default=None, help="CPU threads to tune for")
    # None unless given: --job and tune's config file fill them (ModelOptions has the defaults).
    p.add_argument("--batch-size", type=int, default=None, help="model batch size (default 1)")
    p.add_argument("--seq-len", type=int, default=None,
                   help="tokens per sequence of a text model (hf:NAME, bert-base; default 128)")
    p.add_argument("--image-size", type=int, default=None,
                   help="height and width of an image model's input (default: the model's own, e.g. 224, "
                        "299 for torchvision:inception_v3)")
    p.add_argument("--dtype", default=None, help="zoo models' dtype (default float32)")
    p.add_argument("--layout", default=None, choices=("auto", "NCHW", "NHWC", "NCHWc", "NCHWc:w4", "NCHWc:w2"),
                   help="convs' data layout; auto (default): on x86 with AVX2/AVX-512, tune each conv in NCHWc "
                        "(blocked by the vector width), NCHWc with its 3x3 stride-1 convs by Winograd F(4, 3) or "
                        "F(2, 3) (NCHWc:w4, NCHWc:w2) and NCHW, compile each in the layout its measurements "
                        "favour; bf16 weighs NCHWc and NCHWc:w2 (its GEMMs on vdpbf16ps) where the CPU has "
                        "no AMX, int8 takes NCHWc")
    p.add_argument("--precision", default=None, choices=PRECISIONS,
                   help="fp32 (default); bf16 (needs AVX512_BF16 or AMX); int8 (VNNI or AMX; AVX-512BW or AVX2 "
                        "with 7-bit weights): a QDQ model as it is, a float one quantized first with onnxruntime")
    p.add_argument("--calibration", type=int, default=None,
                   help="random inputs that --precision int8 calibrates a float model's quantization on (default 32)")
    p.add_argument("--quantize-ops", default=None,
                   help="ONNX operator types --precision int8 quantizes in a float model, comma-separated "
                        "(default Conv,Gemm,MatMul: LayerNorm and the adds stay fp32; all: every one onnxruntime can)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def _add_db_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", default=None,
                   help=f"database URL or SQLite file (default: ${DB_ENV} or ./{DEFAULT_DB})")


def _open_db(text: str | None, *, create: bool = False):
    """The tuning database of ``--db``/the environment; only ``tune`` creates a missing one."""

    return open_existing(db_text(text), create=create)


def _load(args: argparse.Namespace) -> LoadedModel:
    """The model the command line names, on its device (``tuner.app.model.load``); a
    quantization it needed is said in one line."""
    if getattr(args, "accuracy_inputs", 1) < 1:
        raise UserInputError(f"--accuracy-inputs must be a positive count, got {args.accuracy_inputs}")
    if getattr(args, "model_from_job", False):
        fill_from_job(args)
    loaded = load(ModelOptions.from_namespace(args), status=console.status)
    if loaded.quantization is not None and loaded.fp32_spec is not None:
        console.print(loaded.quantization.describe(loaded.fp32_spec.name))
    return loaded


def fill_from_job(args: argparse.Namespace) -> None:
    """Fill the model options the command line leaves out from ``--job``'s tuned job: the
    model and device it ran on, and the options ``tune`` stored with it (batch size,
    precision, layout, ...; jobs from before those were stored give their model's name).

    Raises:
        UserInputError: neither ``--model`` nor ``--job``, or no such job in the database.
    """
    if not getattr(args, "job", None):
        if not getattr(args, "model", None):
            raise UserInputError("no model: pass --model NAME|FILE.onnx|package.module:factory, or --job NAME for "
                                 "the model of a tuned job (nightshift jobs lists them)")  # fmt: skip
        return
    from tuner.report import find_job

    db = _open_db(args.db)
    try:
        job = find_job(db, args.job)
    finally:
        db.close()
    stored = job.config.get("model_options")
    values: dict[str, Any] = {"model": job.model, "device": job.device}
    if isinstance(stored, dict):
        values |= {k: v for k, v in stored.items() if v is not None}
    else:
        logger.info("job %s stores no model options (tuned before they were kept): its model %s on %s",
                    job.label, job.model, job.device)  # fmt: skip
    from tuner.config import DEFAULTS

    # Said back as options, those at their defaults (ModelOptions', tune's) left out of the line.
    defaults = {f.name: f.default for f in dataclasses.fields(ModelOptions)} | DEFAULTS
    filled = []
    for key, value in values.items():
        if hasattr(args, key) and getattr(args, key) is None:
            setattr(args, key, value)
            if key in ("model", "device") or value != defaults.get(key):
                filled.append(f"--{key.replace('_', '-')} {value}")
    if filled:
        console.print(f"job {job.label}: {' '.join(filled)}", highlight=False, soft_wrap=True)


def _plan(loaded: LoadedModel, db=None):
    """The layout plan of ``--layout``; for ``auto`` with a database, the per-conv plan its
    measurements favour (:func:`tuner.app.plan.measured_plan`), chosen once per command and
    printed with the measured costs behind it."""
    if db is None or loaded.layout_chosen or loaded.auto_layouts() is None:
        return loaded.plan(db)
    with console.status("choosing each conv's layout from the measurements"):
        plan = loaded.plan(db)
    if loaded.choice is not None:
        print_layout_choice(loaded.choice, loaded.auto_layouts() or ())
    return plan


def print_layout_choice(choice, layouts: Sequence[str]) -> None:
    """Each conv's layout and the measured bests it was chosen from, then the plans weighed;
    nothing for a model without convs (BERT), which no layout changes."""
    if not choice.convs:
        return
    table = Table(title="--layout auto: each conv's layout from the measured bests (ms)")
    for col in ("#", "conv", "layout", *layouts):
        table.add_column(col, justify="left" if col in ("conv", "layout") else "right")
    for c in choice.convs:
        cells = [f"{c.seconds[x] * 1e3:.3f}" if x in c.seconds else "-" for x in layouts]
        table.add_row(str(c.index), c.shape, c.layout, *cells)
    out.print(table)
    source = "measured layout_transform tasks" if choice.bandwidth_measured else "no transform measured, assumed"
    # A per-conv plan spells out every conv; the table above already shows each one's layout.
    label = "per conv (the table above)" if choice.plan.layouts else str(choice.plan)
    out.print(f"layout plan {label}: {choice.describe()}; a transform moves {choice.bandwidth / 1e9:.1f} "
              f"GB/s ({source})", highlight=False, soft_wrap=True)  # fmt: skip


def _print_precision(spec, precision: str, target) -> None:
    """Say which operators the precision converted and which stay fp32 (and why)."""
    from tuner.precision import describe

    line = describe(spec.bound(), precision, target)
    if line is not None:
        out.print(line)


def db_text(arg: str | None) -> str:
    """The database URL or path: ``--db``, else ``$NIGHTSHIFT_DB``, else the first line of the
    file ``$NIGHTSHIFT_DB_FILE``, else ``./nightshift.db``.

    A password need never be on a command line (where ``ps`` and Ray's job list show it): put
    the URL in the environment or a file, or leave the password out of the URL and let libpq
    find it (``~/.pgpass``, ``PGPASSFILE``, ``?service=`` with ``~/.pg_service.conf``). A
    ``--db`` whose password reads ``***`` (as Nightshift prints and submits it) takes the
    password of the same URL in the environment, or else libpq's.
    """
    from tuner.db.url import redact, with_password

    if arg:
        if redact(arg) != arg:
            console.print(f"[yellow]warning:[/] --db {redact(arg)} has a password on the command line, where other "
                          f"users and Ray's job list can read it; use ${DB_ENV}, ${DB_FILE_ENV} or ~/.pgpass",
                          soft_wrap=True, highlight=False)  # fmt: skip
        # A hidden password (a resume hint, a job submitted to a cluster) is this machine's.
        return with_password(arg, _environment_db())
    return _environment_db() or DEFAULT_DB
