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


def unblock_weight(weight: np.ndarray) -> np.ndarray:
    """``OIHW{i}i{o}o`` weights back as ``OIHW``."""
    oc, ic, kh, kw, ib, ob = weight.shape
    return np.ascontiguousarray(weight.transpose(0, 5, 1, 4, 2, 3).reshape(oc * ob, ic * ib, kh, kw))


def pack_group_weight(weight: np.ndarray, groups: int, block: int) -> np.ndarray:
    """``OIHW`` weights of a grouped conv with as many input as output channels as
    ``[C/b, m, KH, KW, b, b]`` for :func:`tuner.graph.layout.ops.group_conv2d_nchwc`: for
    output block ``c``, the ``m`` input chunks from ``(c // m) * m`` on, input lane by output
    lane, zero where the two channels lie in different groups."""
    channels, per_group, kh, kw = weight.shape
    m = max(per_group // block, 1)
    out = np.zeros((channels // block, m, kh, kw, block, block), weight.dtype)
    oc = np.arange(channels)
    for r in range(per_group):
        ic = (oc // per_group) * per_group + r  # input channel r of each output channel's group
        chunk = ic // block - (oc // block // m) * m
        out[oc // block, chunk, :, :, ic % block, oc % block] = weight[:, r]
    return out
