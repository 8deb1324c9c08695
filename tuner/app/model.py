"""The model a command works on: typed options in, a loaded model on its device out.

:class:`ModelOptions` is what ``--model``, ``--device``, ``--layout``, ``--precision`` and their
neighbours say, checked and typed once; :func:`load` turns it into a :class:`LoadedModel` (the
device, the model, its precision, and a float model quantized first for int8), which every use
case takes instead of the command line's namespace. What a step did that a user should know
(a quantization) comes back as data for the caller to show; nothing here prints.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from tuner.errors import UserInputError
from tuner.precision import Precision

if TYPE_CHECKING:
    from tuner.db import TuningDatabase
    from tuner.device import Device
    from tuner.frontends.model import ModelSpec
    from tuner.graph.layout.choose import PlanChoice
    from tuner.graph.layout.plan import LayoutPlan
    from tuner.graph.tasks import Task

logger = logging.getLogger(__name__)

#: A context manager factory that shows a long step (``rich``'s ``console.status``); the default shows nothing.
Status = Callable[[str], contextlib.AbstractContextManager[Any]]


def no_status(_text: str) -> contextlib.AbstractContextManager[Any]:
    """A :data:`Status` that shows nothing (the default of every use case)."""
    return contextlib.nullcontext()


@dataclass(frozen=True, kw_only=True)
class ModelOptions:
    """What to load and how: the options every model command shares.

    Attributes:
        model: a zoo name, a path to an ``.onnx`` file, or ``package.module:factory``.
        device: ``cpu`` or ``cuda:N``.
        target_arch: CUDA ``sm_XX`` to cross-build for, or an LLVM ``mcpu``.
        num_cores: CPU threads to tune and run on (default: the physical cores).
        batch_size: the model's batch size.
        seq_len: tokens per sequence of a text model (None: the model's default).
        image_size: height and width of an image model's input (None: the model's default).
        dtype: a zoo model's dtype.
        layout: each conv's data layout: ``auto`` (measured per conv) or a fixed plan.
        precision: fp32, bf16 or int8.
        calibration: random inputs int8 calibrates a float model on (default 32).
        quantize_ops: ONNX operator types int8 quantizes in a float model, comma-separated.
    """

    model: str
    device: str = "cpu"
    target_arch: str | None = None
    num_cores: int | None = None
    batch_size: int = 1
    seq_len: int | None = None
    image_size: int | None = None
    dtype: str = "float32"
    layout: str = "auto"
    precision: Precision = Precision.FP32
    calibration: int | None = None
    quantize_ops: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "precision", Precision.parse(self.precision))
        if self.batch_size < 1:
            raise UserInputError(f"--batch-size must be a positive integer, got {self.batch_size}")
        if self.num_cores is not None and self.num_cores < 1:
            raise UserInputError(f"--num-cores must be a positive integer, got {self.num_cores}")

    @classmethod
    def from_namespace(cls, args: argparse.Namespace) -> ModelOptions:
        """The options an ``argparse`` namespace holds (absent or None ones take the defaults)."""
        given = {f.name: getattr(args, f.name) for f in fields(cls) if getattr(args, f.name, None) is not None}
        return cls(**given)

    def stored(self) -> dict[str, Any]:
        """The options as a tuning job keeps them in its configuration, for ``compile --job`` and
        ``bench --job`` to load the same model: plain JSON values, a model file's path made
        absolute (the job may be compiled from another folder)."""
        from pathlib import Path

        values: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        values["precision"] = str(self.precision)
        with contextlib.suppress(OSError):
            if Path(self.model).is_file():
                values["model"] = str(Path(self.model).resolve())
        return values


@dataclass(kw_only=True)
class Quantization:
    """What ``--precision int8`` did to a float model before tuning it."""

    path: str
    calibration: int
    weight_bits: int
    op_types: tuple[str, ...] | None

    def describe(self, name: str) -> str:
        """One line for the user."""
        which = f"{', '.join(self.op_types)} only" if self.op_types is not None else "every operator it quantizes"
        weights = ("per-channel int8 weights" if self.weight_bits == 8 else
                   "per-channel 7-bit weights (reduce_range: this CPU's int8 dot product, vpmaddubsw, adds pairs "
                   "of products in int16, which 8-bit weights can saturate)")  # fmt: skip
        return (f"int8: {name} is a float model; quantized with onnxruntime's quantize_static (QDQ, {weights}, "
                f"uint8 activations; {which}), calibrated on {self.calibration} random inputs: {self.path}")


@dataclass(kw_only=True)
class LoadedModel:
    """A model on its device, ready for the use cases.

    Attributes:
        options: what it was loaded from.
        device: the device it is tuned and compiled for.
        spec: the model (for int8 from a float model: the quantized one).
        source: what ``spec`` was loaded from (the quantized file, for int8 from a float model).
        fp32_spec: the float model a quantized ``spec`` was made from, the accuracy reference.
        quantization: what the int8 quantization did; None when the model was not quantized here.
        choice: the per-conv layout choice the database's measurements favour, once made
            (:func:`tuner.app.plan.layout_plan`); every later use in the same command reuses it.
    """

    options: ModelOptions
    device: Device
    spec: ModelSpec
    source: str
    fp32_spec: ModelSpec | None = None
    quantization: Quantization | None = None
    choice: PlanChoice | None = field(default=None, repr=False)
    _chosen: bool = field(default=False, repr=False)

    @property
    def precision(self) -> Precision:
        """The precision it is tuned and compiled in."""
        return self.options.precision

    def auto_layouts(self) -> tuple[str, ...] | None:
        """The layouts ``--layout auto`` tunes and chooses between for this device, or None where
        it is a fixed plan (an explicit ``--layout``, or one candidate layout)."""
        from tuner.graph.layout.plan import auto_layouts

        if self.options.layout != "auto":
            return None
        layouts = auto_layouts(self.device.target, self.precision)
        return layouts if len(layouts) > 1 else None

    def tasks(self) -> list[Task]:
        """The tasks to tune: under a measured ``--layout auto``, every conv in each candidate layout."""
        from tuner.graph.tasks import extract_layout_tasks, extract_tasks

        layouts = self.auto_layouts()
        if layouts is not None:
            return extract_layout_tasks(self.spec.bound(), self.device.target, layouts, precision=self.precision)
        return extract_tasks(self.spec.bound(), self.device.target, self.plan(), precision=self.precision)

    def plan(self, db: TuningDatabase | None = None) -> LayoutPlan:
        """The layout plan of ``--layout``; for ``auto`` with a database, the per-conv plan its
        measurements favour (chosen once, kept in :attr:`choice`)."""
        from tuner.app.plan import measured_plan
        from tuner.graph.layout.plan import LayoutPlan

        if db is None or self.auto_layouts() is None:
            return LayoutPlan.parse(self.options.layout, self.device.target)
        if not self._chosen:
            self.choice = measured_plan(self.spec, self.device, db, self.precision)
            self._chosen = True
        if self.choice is None:
            return LayoutPlan.parse(self.options.layout, self.device.target)
        return self.choice.plan

    @property
    def layout_chosen(self) -> bool:
        """Whether :meth:`plan` has chosen from a database yet (the choice is made once)."""
        return self._chosen


def load(options: ModelOptions, *, status: Status = no_status) -> LoadedModel:
    """The model ``options`` name on its device; for int8, a float model quantized first.

    The device is checked for the precision before any work (no silent slow emulation).

    Raises:
        UserInputError: an unknown model or device, a device without the precision's
            instructions, a model the precision cannot take.
    """
    from tuner.device import parse_device
    from tuner.frontends import load_model
    from tuner.precision import check_device

    device = parse_device(options.device, target_arch=options.target_arch, num_cores=options.num_cores)
    check_device(options.precision, device)
    spec = load_model(options.model, batch_size=options.batch_size, dtype=options.dtype, seq_len=options.seq_len,
                      image_size=options.image_size)  # fmt: skip
    loaded = LoadedModel(options=options, device=device, spec=spec, source=options.model)
    if options.precision.needs_quantized_model:
        _quantize(loaded, status)
    return loaded


def _quantize(loaded: LoadedModel, status: Status) -> None:
    """A float model replaced by its quantized (QDQ) form; a QDQ model kept as it is."""
    from tuner.frontends import load_model
    from tuner.precision import int8_weight_bits
    from tuner.precision.quantize import DEFAULT_CALIBRATION, has_qdq, parse_ops, quantized_model

    spec, options = loaded.spec, loaded.options
    if has_qdq(spec.bound()):
        return
    n = options.calibration or DEFAULT_CALIBRATION
    ops = parse_ops(options.quantize_ops)
    bits = int8_weight_bits(loaded.device.target)
    with status(f"quantizing {spec.name} with onnxruntime on {n} random inputs"):
        path = quantized_model(spec, options.model, n, op_types=ops, weight_bits=bits)
    loaded.quantization = Quantization(path=str(path), calibration=n, weight_bits=bits,
                                       op_types=tuple(ops) if ops is not None else None)  # fmt: skip
    loaded.fp32_spec, loaded.source = spec, str(path)
    loaded.spec = load_model(str(path))
