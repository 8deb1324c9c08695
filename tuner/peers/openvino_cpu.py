"""OpenVINO's CPU plugin on the model's ONNX file, at f32 or at its default precision."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from tuner.peers._base import Peer, PeerModel, PeerSkipped

if TYPE_CHECKING:  # listing the peers (the CLI's parser) imports no numpy
    import numpy as np

logger = logging.getLogger(__name__)


def compile_config(threads: int, precision: str | None, **extra: object) -> dict[str, object]:
    """OpenVINO's CPU configuration for a peer run: latency mode, ``threads`` inference
    threads, ``INFERENCE_PRECISION_HINT=precision`` (None: OpenVINO's default, bf16 on CPUs
    with AVX512_BF16 or AMX), and ``extra`` properties."""
    config: dict[str, object] = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY", **extra}
    if precision is not None:
        config["INFERENCE_PRECISION_HINT"] = precision
    return config


class OpenVinoPeer(Peer):
    """OpenVINO, latency mode, ``threads`` inference threads.

    ``precision="f32"`` asks for f32 inference; ``precision=None`` keeps OpenVINO's default,
    which is bf16 on CPUs with AVX512_BF16 or AMX: what a user gets without asking, so it is
    shown beside the f32 figure, labelled with the precision OpenVINO reports.
    """

    name = "openvino-f32"
    module = "openvino"
    install = "pip install openvino"

    def __init__(self, precision: str | None = "f32") -> None:
        super().__init__()
        self._hint = precision
        if precision is None:
            self.label = "openvino"

    def prepare(self, model: PeerModel, threads: int) -> None:
        import openvino as ov

        if model.onnx_path is None:
            raise PeerSkipped(model.onnx_reason or "no ONNX file of the model")
        compiled = ov.Core().compile_model(str(model.onnx_path), "CPU", compile_config(threads, self._hint))
        self.precision = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        which = "" if self._hint is not None else "default "
        self.label = f"OpenVINO {ov.__version__.split('-')[0]} {which}({self.precision})"
        self._request = compiled.create_infer_request()
        self._outputs = list(compiled.outputs)
        logger.debug("openvino on %s: %s, %d threads", model.onnx_path, self.precision, threads)

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        import numpy as np

        result = self._request.infer(inputs)
        # The request reuses its output buffers: copy them out.
        return [np.array(result[o], copy=True) for o in self._outputs]


class OpenVinoDefaultPeer(OpenVinoPeer):
    """OpenVINO at the precision it picks by itself."""

    name = "openvino"

    def __init__(self) -> None:
        super().__init__(precision=None)
