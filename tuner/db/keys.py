"""Stable keys derived from database rows (kept free of TVM so migrations can import them)."""

from __future__ import annotations

import hashlib


def record_key(workload_id: int, device_id: int, job_id: int | None, point: str) -> str:
    """The idempotency key of a record: equal for a retried write of the same measurement."""
    text = f"{workload_id}|{device_id}|{'' if job_id is None else job_id}|{point}"
    return hashlib.sha256(text.encode()).hexdigest()
