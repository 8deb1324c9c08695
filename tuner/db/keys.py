"""Stable keys derived from database rows (kept free of TVM so migrations can import them)."""

from __future__ import annotations

import hashlib
import json


def record_key(workload_id: int, device_id: int, point: str, timing: str = "warm") -> str:
    """The identity of a record: one candidate (point) of one workload on one device, timed
    warm or cold (``records.timing``).

    The job is not part of it: a point measured by an earlier job or a teammate is the same
    record, so it is stored (and measured) once per timing mode. The ``v3`` prefix keeps these
    keys apart from :func:`record_key_v2` keys, which older records may still carry; a warm
    record's key is the one schema 5 gave it.
    """
    suffix = "" if timing == "warm" else f"|{timing}"
    return hashlib.sha256(f"v3|{workload_id}|{device_id}|{point}{suffix}".encode()).hexdigest()


def record_key_v2(workload_id: int, device_id: int, job_id: int | None, point: str) -> str:
    """Schema 2's record key, which included the job; used by the migrations only."""
    text = f"{workload_id}|{device_id}|{'' if job_id is None else job_id}|{point}"
    return hashlib.sha256(text.encode()).hexdigest()


def device_class(kind: str, target: str, description: str) -> str:
    """Devices that are the same machine type for tuning: same kind, TVM target and CPU/GPU model.

    Fingerprints also hash ISA flags (which a hypervisor may hide on one VM and not another)
    and may differ where the code and its speed do not; records of a class are looked up
    together. Arguments are the device row's JSON text.
    """
    try:
        target_obj = json.loads(target)
        desc = json.loads(description)
    except ValueError:
        target_obj, desc = target, {}
    model = desc.get("model") or desc.get("gpu") if isinstance(desc, dict) else None
    blob = json.dumps({"kind": kind, "target": target_obj, "model": model}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
