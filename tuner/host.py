"""The host CPU's flags, read from /proc/cpuinfo: a leaf module without TVM or any other import
of the project.

``tuner.device`` builds devices (targets, fingerprints) on top of it, and search spaces read
the host's flags from here, never from ``tuner.device``; a runtime-only device actor (TVM's
runtime without the compiler) imports it too, so it must stay free of compiler imports.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path


def cache_root() -> Path:
    """Where Nightshift keeps what it can rebuild (quantized models, features of stored records):
    ``$NIGHTSHIFT_CACHE``, or ``~/.cache/nightshift``."""
    root = os.environ.get("NIGHTSHIFT_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "nightshift"


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
