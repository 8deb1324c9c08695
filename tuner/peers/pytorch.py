"""PyTorch eager and ``torch.compile`` on the same network as a ``torch.nn.Module``."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from tuner.peers._base import Peer, PeerModel, PeerSkipped

if TYPE_CHECKING:  # listing the peers (the CLI's parser) imports no numpy
    import numpy as np

logger = logging.getLogger(__name__)


class TorchEagerPeer(Peer):
    """PyTorch eager mode under ``inference_mode``, ``torch.set_num_threads(threads)``."""

    name = "torch"
    module = "torch"
    install = "pip install 'torch>=2.13,<2.14'"

    def prepare(self, model: PeerModel, threads: int) -> None:
        import torch

        if model.torch_module is None:
            raise PeerSkipped(model.torch_reason or "no PyTorch module of the model")
        # Process-wide, as every peer here runs on the same thread count.
        torch.set_num_threads(threads)
        self._torch = torch
        self._fn = self._wrap(model.torch_module.eval())
        self.label = f"PyTorch {torch.__version__.split('+')[0]} eager"

    def _wrap(self, module: Any) -> Any:
        return module

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        torch = self._torch
        with torch.inference_mode():
            out = self._fn(*(torch.from_numpy(x) for x in inputs))
        return [t.numpy().copy() for t in _flatten(out)]


class TorchCompilePeer(TorchEagerPeer):
    """``torch.compile`` (Inductor, default mode); the first run compiles, and a failure there is a skip."""

    name = "torch.compile"

    def prepare(self, model: PeerModel, threads: int) -> None:
        super().prepare(model, threads)
        self.label = self.label.replace("eager", "torch.compile")

    def _wrap(self, module: Any) -> Any:
        return self._torch.compile(module)


def _flatten(out: Any) -> list[Any]:
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flatten(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in _flatten(o)]
    return [out]
