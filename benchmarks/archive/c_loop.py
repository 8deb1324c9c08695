"""Build a C micro-benchmark with gcc and run it several times (``amx_tile_config``,
``amx_conv_steps``): each run prints JSON on stdout."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path


def run_c(source: Path, flags: Sequence[str], runs: int) -> list[str]:
    """The stdout of ``runs`` runs of ``source`` built with ``gcc -O2 flags``."""
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / source.stem
        subprocess.run(["gcc", "-O2", *flags, str(source), "-o", str(exe)], check=True)
        return [subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout for _ in range(runs)]


def cpu_model() -> str:
    """/proc/cpuinfo's model name ('' where there is none)."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
