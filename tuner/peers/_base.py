"""What every peer runtime implements: availability, preparation on a model, and a run."""

from __future__ import annotations

import importlib.util
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # listing the peers (the CLI's parser) imports no numpy
    import numpy as np


class PeerSkipped(Exception):
    """A peer cannot run this model here (no torch module, compiler missing); the message says why."""


@dataclass(frozen=True)
class PeerModel:
    """The one network every peer runs, in the forms peers take.

    Attributes:
        name: the model's name.
        onnx_path: the network as an ONNX file (the user's file, or an export of ``torch_module``);
            None when no export was possible (``onnx_reason`` says why).
        torch_module: the same network as a ``torch.nn.Module`` in eval mode, or None.
        torch_reason: why there is no torch module (empty when there is one).
        onnx_reason: why there is no ONNX file (empty when there is one).
    """

    name: str
    onnx_path: Path | None
    torch_module: Any | None = None
    torch_reason: str = ""
    onnx_reason: str = ""


@dataclass(frozen=True)
class Availability:
    """Whether a peer's runtime is installed; ``reason`` says why not, ``install`` how to fix it."""

    ok: bool
    reason: str = ""
    install: str = ""

    def __bool__(self) -> bool:
        return self.ok


class Peer(ABC):
    """A runtime that Nightshift's builds are compared with.

    Contract: ``available()`` is cheap and imports nothing heavy; ``prepare`` is called once,
    before any ``run``, loads the model and fixes the thread count (it may raise
    :class:`PeerSkipped`, or the runtime's own errors, which the harness reports as a skip);
    ``run`` takes the model's data inputs in ``main``'s order and returns its outputs as new
    numpy arrays, and may be called any number of times from the thread that prepared it.
    A peer instance serves one model. ``label`` and ``precision`` may change in ``prepare``
    (a runtime reports the precision it chose).
    """

    #: Registry name, also the default label.
    name: ClassVar[str]
    #: The module whose presence makes the peer available.
    module: ClassVar[str]
    #: The command that installs the runtime.
    install: ClassVar[str]

    def __init__(self) -> None:
        self.label = self.name
        self.precision = "f32"

    @classmethod
    def available(cls) -> Availability:
        """Whether the runtime is importable (without importing it)."""
        if importlib.util.find_spec(cls.module) is None:
            return Availability(False, f"{cls.module} is not installed", cls.install)
        return Availability(True)

    @abstractmethod
    def prepare(self, model: PeerModel, threads: int) -> None:
        """Load ``model`` to run on ``threads`` threads.

        Raises:
            PeerSkipped: the peer cannot run this model here.
        """

    @abstractmethod
    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Run once on ``inputs``; the outputs, flattened, in the model's order."""
