"""What a search space knows about the machine it runs on, below the device layer.

``tuner.device`` builds devices (targets, fingerprints) on top of this; search spaces and
their intrinsics read the host's CPU flags from here, never from ``tuner.device``.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path


@cache
def host_cpu_flags() -> tuple[str, ...]:
    """Every flag /proc/cpuinfo lists for the first CPU (``flags`` on x86, ``Features`` on
    ARM), sorted; empty where there is no /proc/cpuinfo."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("flags", "Features"):
                return tuple(sorted(set(value.split())))
    return ()
