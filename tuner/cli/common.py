"""What every command shares: the consoles, the model, device and database options, and turning
them into the objects the use cases take."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tuner.app.plan import measured_plan
from tuner.errors import UserInputError
from tuner.precision import PRECISIONS, Precision

logger = logging.getLogger(__name__)


console = Console(stderr=True)


out = Console()


DEFAULT_DB = "nightshift.db"


DB_ENV = "NIGHTSHIFT_DB"


def _add_model_args(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    p.add_argument("--model", required=required,
                   help="zoo name (resnet50, ...), path to a .onnx file, or package.module:factory")
    p.add_argument("--device", default=None, help="cpu or cuda:N (default: cpu)")
    p.add_argument("--target-arch", default=None,
                   help="CUDA sm_XX to cross-build for without a GPU, or an LLVM mcpu for cpu")
    p.add_argument("--num-cores", type=int, default=None, help="CPU threads to tune for")
    p.add_argument("--batch-size", type=int, default=1, help="model batch size (default 1)")
    p.add_argument("--dtype", default="float32", help="zoo models' dtype (default float32)")
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


def _load(args: argparse.Namespace):
    from tuner.device import parse_device

    args.device = args.device or "cpu"
    from tuner.frontends import load_model
    from tuner.precision import check_device

    device = parse_device(args.device, target_arch=args.target_arch, num_cores=args.num_cores)
    args.precision = Precision.parse(args.precision)
    if getattr(args, "accuracy_inputs", 1) < 1:
        raise UserInputError(f"--accuracy-inputs must be a positive count, got {args.accuracy_inputs}")
    check_device(args.precision, device)  # before any work: no silent slow emulation
    spec = load_model(args.model, batch_size=args.batch_size, dtype=args.dtype)
    args.fp32_spec = None
    if args.precision.needs_quantized_model:
        spec = _quantized(args, spec, device)
    return device, spec


def _quantized(args: argparse.Namespace, spec, device):
    """``spec`` when it is a quantized (QDQ) model; a float one quantized first, said so."""
    from tuner.frontends import load_model
    from tuner.precision import int8_weight_bits
    from tuner.precision.quantize import DEFAULT_CALIBRATION, has_qdq, parse_ops, quantized_model

    if has_qdq(spec.bound()):
        return spec
    n = args.calibration or DEFAULT_CALIBRATION
    ops = parse_ops(getattr(args, "quantize_ops", None))
    bits = int8_weight_bits(device.target)
    with console.status(f"quantizing {spec.name} with onnxruntime on {n} random inputs"):
        path = quantized_model(spec, args.model, n, op_types=ops, weight_bits=bits)
    which = f"{', '.join(ops)} only" if ops is not None else "every operator it quantizes"
    weights = ("per-channel int8 weights" if bits == 8 else
               "per-channel 7-bit weights (reduce_range: this CPU's int8 dot product, vpmaddubsw, adds pairs "
               "of products in int16, which 8-bit weights can saturate)")  # fmt: skip
    console.print(f"int8: {spec.name} is a float model; quantized with onnxruntime's quantize_static (QDQ, "
                  f"{weights}, uint8 activations; {which}), calibrated on {n} random inputs: {path}")
    args.fp32_spec, args.model = spec, str(path)
    return load_model(str(path))


def _auto_layouts(args: argparse.Namespace, device) -> tuple[str, ...] | None:
    """The layouts ``--layout auto`` tunes and chooses between for this device, or None where
    it is a fixed plan (an explicit --layout, or one candidate layout: a reduced precision)."""
    from tuner.graph.layout.plan import auto_layouts

    if (getattr(args, "layout", None) or "auto") != "auto":
        return None
    layouts = auto_layouts(device.target, args.precision or "fp32")
    return layouts if len(layouts) > 1 else None


def _extract(args: argparse.Namespace, device, spec):
    """The tasks to tune: with a measured ``--layout auto``, every conv in each candidate layout."""
    from tuner.graph.tasks import extract_layout_tasks, extract_tasks

    layouts = _auto_layouts(args, device)
    if layouts is not None:
        return extract_layout_tasks(spec.bound(), device.target, layouts, precision=args.precision)
    return extract_tasks(spec.bound(), device.target, _plan(args, device), precision=args.precision)


def _plan(args: argparse.Namespace, device, db=None, spec=None):
    """The layout plan of ``--layout``; for ``auto`` with a database, the per-conv plan its
    measurements favour (:func:`tuner.graph.layout.choose.choose_from_database`), chosen once per command
    and printed with the measured costs behind it."""
    from tuner.graph.layout.plan import LayoutPlan

    if db is None or spec is None or _auto_layouts(args, device) is None:
        return LayoutPlan.parse(getattr(args, "layout", None) or "auto", device.target)
    chosen = getattr(args, "chosen_layout", None)
    if chosen is None:
        with console.status("choosing each conv's layout from the measurements"):
            chosen = args.chosen_layout = measured_plan(spec, device, db, args.precision)
        if chosen is not None:
            print_layout_choice(chosen, _auto_layouts(args, device) or ())
    return chosen.plan


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


DB_FILE_ENV = "NIGHTSHIFT_DB_FILE"


def db_text(arg: str | None) -> str:
    """The database URL or path: ``--db``, else ``$NIGHTSHIFT_DB``, else the first line of the
    file ``$NIGHTSHIFT_DB_FILE``, else ``./nightshift.db``.

    A password need never be on a command line (where ``ps`` and Ray's job list show it): put
    the URL in the environment or a file, or leave the password out of the URL and let libpq
    find it (``~/.pgpass``, ``PGPASSFILE``, ``?service=`` with ``~/.pg_service.conf``).
    """
    from tuner.db.url import redact

    if arg:
        if redact(arg) != arg:
            console.print(f"[yellow]warning:[/] --db {redact(arg)} has a password on the command line, where other "
                          f"users and Ray's job list can read it; use ${DB_ENV}, ${DB_FILE_ENV} or ~/.pgpass",
                          soft_wrap=True, highlight=False)  # fmt: skip
        return arg
    if os.environ.get(DB_ENV):
        return os.environ[DB_ENV]
    path = os.environ.get(DB_FILE_ENV)
    if path:
        try:
            text = next((ln.strip() for ln in Path(path).read_text().splitlines() if ln.strip()), "")
        except OSError as err:
            raise UserInputError(f"${DB_FILE_ENV}: cannot read {path} ({err.strerror})") from err
        if not text:
            raise UserInputError(f"${DB_FILE_ENV}: {path} is empty; write the database URL in it")
        return text
    return DEFAULT_DB


def open_existing(text_or_url, *, create: bool = False):
    """Open the tuning database; only with ``create`` may a missing SQLite file or an empty
    database be initialised (``tune`` and ``db init``), else a one-line error says so."""
    from tuner.db import TuningDatabase, database_url

    url = database_url(text_or_url) if isinstance(text_or_url, str) else text_or_url
    if not create and url.get_backend_name() == "sqlite" and url.database and not Path(url.database).exists():
        # Connecting would leave an empty file behind.
        raise UserInputError(f"no tuning database at {url.database}; run `nightshift db init --db {url.database}` "
                             "or pass another --db")
    return TuningDatabase(url, create=create)
