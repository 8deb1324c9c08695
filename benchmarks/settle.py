"""Waiting for a quiet machine before timing: the scripts that time whole models call it."""

from __future__ import annotations

import logging
import os
import time

from rich.console import Console

logger = logging.getLogger(__name__)


def settle(limit_s: float, console: Console, below: float = 1.0) -> float:
    """Wait until the 1-minute load average is under ``below`` or ``limit_s`` has passed (right
    after a job its Ray cluster is still shutting down); the load it ends at."""
    start = time.monotonic()
    with console.status("waiting for the load to settle") as status:
        while (load := os.getloadavg()[0]) >= below and time.monotonic() - start < limit_s:
            status.update(f"waiting for the load to settle: {load:.2f} (1 min), {time.monotonic() - start:.0f} s")
            time.sleep(5)
    if load >= below:
        logger.warning("load still %.2f after %.0f s; timing anyway (the JSON records it)", load, limit_s)
    return load
