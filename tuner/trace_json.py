"""MetaSchedule's tuning records as plain JSON, for traces with any instruction inputs.

``TuningRecord.as_json()`` unpacks TVM containers in Python and raises ``TypeError`` on an
``IndexMap`` input, which ``transform_layout`` and ``transform_block_layout`` carry (the x86
conv template's fused pixel axis). TVM's C++ JSON database writes such an input as the
string of its TVM JSON (``JSONDumps``), and ``Trace.apply_json_to_schedule`` reads a string
that starts with ``{`` back as an ``IndexMap``: this module writes it the same way.
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm.s_tir.meta_schedule import _ffi_api
from tvm.s_tir.meta_schedule.database import TuningRecord
from tvm.tirx import FloatImm, IndexMap, IntImm
from tvm_ffi import Array, Map


def record_as_json(record: TuningRecord) -> list:
    """``record.as_json()``, with every ``IndexMap`` written as its TVM JSON string."""
    return _plain(_ffi_api.TuningRecordAsJSON(record))  # type: ignore[attr-defined]


def _plain(obj: Any) -> Any:
    if obj is None or isinstance(obj, bool | int | float):
        return obj
    if isinstance(obj, IntImm | FloatImm):
        return obj.value
    if isinstance(obj, str):
        return str(obj)
    if isinstance(obj, IndexMap):
        return tvm.ir.save_json(obj)
    if isinstance(obj, Array):
        return [_plain(x) for x in obj]
    if isinstance(obj, Map):
        return {_plain(k): _plain(v) for k, v in obj.items()}
    raise TypeError(f"a tuning record holds a {type(obj).__name__}, which has no JSON form")
