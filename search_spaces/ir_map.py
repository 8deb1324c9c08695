"""Applying a rewrite to each PrimFunc of a module that is built for a wanted target."""

from __future__ import annotations

import logging
from collections.abc import Callable

import tvm
import tvm_ffi
from tvm import tirx

logger = logging.getLogger(__name__)


def map_functions(mod: tvm.IRModule, wanted: Callable[[tvm.target.Target], bool], callback: tuple) -> tvm.IRModule:
    """``mod`` with ``tvm_ffi.structural_map(func, callback)`` applied to each PrimFunc whose
    ``target`` attribute ``wanted`` takes (``mod`` itself where none changes)."""
    updates = {}
    for gv, func in mod.functions.items():
        target = func.attrs.get("target") if isinstance(func, tirx.PrimFunc) and func.attrs else None
        if target is None or not wanted(target):
            continue
        new = tvm_ffi.structural_map(func, callback)
        if not new.same_as(func):
            updates[gv] = new
    if not updates:
        return mod
    logger.debug("%s rewrote %d functions", getattr(callback[1], "__name__", callback), len(updates))
    out = tvm.IRModule(dict(mod.functions.items()), attrs=mod.attrs)
    for gv, func in updates.items():
        out[gv] = func
    return out
