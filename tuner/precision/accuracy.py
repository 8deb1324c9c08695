"""Accuracy of a reduced-precision build, measured against the float32 build of the same model.

Never assumed: both builds run on the same ``N`` random inputs, and the report gives the
largest relative error of any output and how often the top-1 class (argmax over the last
axis of each output row) agrees.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import tvm
from tvm import relax

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Accuracy:
    """How a build's outputs compare with the float32 reference's over ``inputs`` inputs.

    Attributes:
        inputs: number of random inputs both builds ran.
        max_rel_error: the largest ``max |out - ref| / max |ref|`` over inputs and outputs.
        top1_agreement: fraction of output rows (all leading axes, per input) whose argmax
            over the last axis is the reference's; None when no output has two axes or more.
        rows: how many rows ``top1_agreement`` counts.
    """

    inputs: int
    max_rel_error: float
    top1_agreement: float | None
    rows: int

    def to_json(self) -> dict[str, Any]:
        """The fields as a JSON-able dict."""
        return asdict(self)

    def describe(self) -> str:
        """One line for the terminal."""
        top1 = "n/a" if self.top1_agreement is None else f"{self.top1_agreement:.1%} of {self.rows} rows"
        return f"vs fp32 over {self.inputs} inputs: max relative error {self.max_rel_error:.2e}, top-1 agreement {top1}"


def compare(reference: list[list[np.ndarray]], got: list[list[np.ndarray]]) -> Accuracy:
    """:class:`Accuracy` of ``got`` against ``reference`` (per input, the list of outputs)."""
    if len(reference) != len(got) or not reference:
        raise ValueError(f"{len(got)} results for {len(reference)} reference results")
    worst, agree, rows = 0.0, 0, 0
    for ref_outs, outs in zip(reference, got, strict=True):
        for r, g in zip(ref_outs, outs, strict=True):
            r64, g64 = r.astype(np.float64), g.astype(np.float64)
            scale = max(float(np.max(np.abs(r64))) if r64.size else 0.0, 1e-12)
            err = float(np.max(np.abs(g64 - r64))) / scale if r64.size else 0.0
            worst = max(worst, err if np.all(np.isfinite(g64)) else float("inf"))
            if r.ndim >= 2 and r.shape[-1] > 1:
                flat_r, flat_g = r64.reshape(-1, r.shape[-1]), g64.reshape(-1, r.shape[-1])
                agree += int(np.count_nonzero(np.argmax(flat_r, axis=1) == np.argmax(flat_g, axis=1)))
                rows += flat_r.shape[0]
    return Accuracy(len(reference), worst, agree / rows if rows else None, rows)


def run_outputs(executable: relax.VMExecutable, device, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """The outputs of one run of a compiled model (a :class:`tuner.compile.Compiled`'s executable)."""
    from tuner.native_log import native_output

    dev = device.tvm_device()
    with native_output():  # TVM's "Scope Loaded" lines go to the log, not the terminal
        vm = relax.VirtualMachine(executable, dev)
    out = vm["main"](*[tvm.runtime.tensor(x, dev) for x in inputs])
    return _flatten(out)


def _flatten(out) -> list[np.ndarray]:
    if isinstance(out, tvm.runtime.Tensor):
        return [out.numpy()]
    return [x for o in out for x in _flatten(o)]


def measure_accuracy(spec, device, reference, reduced, *, num_inputs: int, seed: int = 1) -> Accuracy:
    """Run the float32 ``reference`` and the ``reduced`` build (both :class:`tuner.compile.Compiled`)
    of ``spec`` on ``num_inputs`` random inputs and compare them."""
    if num_inputs < 1:
        raise ValueError("accuracy needs at least one input")
    device.use_threads()
    ref_outs, outs = [], []
    for i in range(num_inputs):
        inputs = spec.random_inputs(seed=seed + i)
        ref_outs.append(run_outputs(reference.executable, device, inputs))
        outs.append(run_outputs(reduced.executable, device, inputs))
    acc = compare(ref_outs, outs)
    logger.info("accuracy %s", acc.describe())
    return acc
