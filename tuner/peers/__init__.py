"""Peer runtimes that Nightshift's builds are measured against, one module per runtime.

Each peer implements :class:`Peer` (``available()``, ``prepare(model, threads)``,
``run(inputs)``); :func:`create` makes one by name. Runtimes are imported only in
``prepare``, so listing peers costs nothing where they are not installed. OpenVINO comes twice:
``openvino-f32`` sets ``INFERENCE_PRECISION_HINT=f32``; ``openvino`` keeps the default (bf16 on
CPUs with AVX512_BF16 or AMX) and reports the precision it ran in.
"""

from __future__ import annotations

from collections.abc import Callable

from tuner.peers._base import Availability, Peer, PeerModel, PeerSkipped
from tuner.peers.onnx_runtime import OnnxRuntimePeer
from tuner.peers.openvino_cpu import OpenVinoDefaultPeer, OpenVinoPeer
from tuner.peers.pytorch import TorchCompilePeer, TorchEagerPeer

__all__ = [
    "PEERS", "Availability", "OnnxRuntimePeer", "OpenVinoDefaultPeer", "OpenVinoPeer", "Peer",
    "PeerModel", "PeerSkipped", "TorchCompilePeer", "TorchEagerPeer", "create",
]  # fmt: skip

#: Every peer, by name, in the order a benchmark lists them.
PEERS: dict[str, Callable[[], Peer]] = {
    OnnxRuntimePeer.name: OnnxRuntimePeer,
    OpenVinoPeer.name: OpenVinoPeer,
    OpenVinoDefaultPeer.name: OpenVinoDefaultPeer,
    TorchEagerPeer.name: TorchEagerPeer,
    TorchCompilePeer.name: TorchCompilePeer,
}


def create(peer: str | Peer) -> Peer:
    """A peer by registry name, or ``peer`` itself if it is already one.

    Raises:
        ValueError: the name is not in :data:`PEERS`.
    """
    if isinstance(peer, Peer):
        return peer
    try:
        return PEERS[peer]()
    except KeyError:
        raise ValueError(f"unknown peer {peer!r}; known peers: {', '.join(PEERS)}") from None
