"""ONNX Runtime's CPU execution provider on the model's ONNX file."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from tuner.peers._base import Peer, PeerModel, PeerSkipped

if TYPE_CHECKING:  # listing the peers (the CLI's parser) imports no numpy
    import numpy as np

logger = logging.getLogger(__name__)


def session_options(threads: int):
    """ONNX Runtime's options for a peer run: all graph optimizations, ``threads`` intra-op
    threads, one operator at a time (as TVM's VM runs them: the threads go to each operator)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return opts


class OnnxRuntimePeer(Peer):
    """ONNX Runtime, all graph optimizations, ``threads`` intra-op threads, sequential execution."""

    name = "onnxruntime"
    module = "onnxruntime"
    install = "pip install onnxruntime"

    def prepare(self, model: PeerModel, threads: int) -> None:
        import onnxruntime as ort

        if model.onnx_path is None:
            raise PeerSkipped(model.onnx_reason or "no ONNX file of the model")
        self._session = ort.InferenceSession(str(model.onnx_path), session_options(threads),
                                             providers=["CPUExecutionProvider"])  # fmt: skip
        self._names = [i.name for i in self._session.get_inputs()]
        self.label = f"ONNX Runtime {ort.__version__}"
        logger.debug("onnxruntime session on %s, %d threads", model.onnx_path, threads)

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        return list(self._session.run(None, dict(zip(self._names, inputs, strict=True))))
