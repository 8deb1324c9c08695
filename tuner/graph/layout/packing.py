"""Weight packing in numpy, done once at compile time for the layouts the computes read."""

from __future__ import annotations

import logging

import numpy as np

logger = logging.getLogger(__name__)


def widen_weight(weight: np.ndarray, block: int) -> np.ndarray:
    """``OIHW{i}i{o}o`` weights as ``OIHW{block}i{o}o``: ``block / i`` neighbouring input
    chunks side by side, as :func:`tuner.graph.pad_fusion.pad_interior` lays out the data."""
    oc, ic, kh, kw, ib, ob = weight.shape
    k = block // ib
    grouped = weight.reshape(oc, ic // k, k, kh, kw, ib, ob).transpose(0, 1, 3, 4, 2, 5, 6)
    return np.ascontiguousarray(grouped.reshape(oc, ic // k, kh, kw, block, ob))


def row_tap_weight(weight: np.ndarray, block: int) -> np.ndarray:
    """``OIHW{b}i{o}o`` weights of one input chunk for a conv over :func:`row_taps`:
    ``OIH1{block}i{o}o``, each channel's kernel row taps in its ``block // b`` slots."""
    oc, _, kh, kw, ib, ob = weight.shape
    slots = block // ib
    out = np.zeros((oc, 1, kh, 1, block, ob), weight.dtype)
    for c in range(ib):
        out[:, 0, :, 0, c * slots:c * slots + kw] = weight[:, 0, :, :, c]
    return out


def pack_dot_weight(weight: np.ndarray, n: int) -> np.ndarray:
    """``OIHW{i}i{o}o`` weights as ``OIHW{i/n}i{o}o{n}i``: the ``n`` input channels one lane
    of the instruction reduces are adjacent, the ``o`` lanes of one register contiguous."""
    oc, ic, kh, kw, ib, ob = weight.shape
    return np.ascontiguousarray(weight.reshape(oc, ic, kh, kw, ib // n, n, ob).transpose(0, 1, 2, 3, 4, 6, 5))


def pack_dense_weight(weight: np.ndarray, block: int) -> np.ndarray:
    """A ``[K, N]`` weight as ``[N / block, K, block]``: each block of columns one
    contiguous panel, which a register tile streams through with unit stride."""
    k, n = weight.shape
    return np.ascontiguousarray(weight.reshape(k, n // block, block).transpose(1, 0, 2))
