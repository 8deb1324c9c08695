"""The JSON every benchmark script writes into benchmarks/results/: what ran, when, where."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Any


def run_commands(doc: dict[str, Any]) -> list[str]:
    """Every command that wrote a result file, oldest first: the runs a ``--resume`` continued
    (``earlier_commands``), then the last one (``command``)."""
    return [*doc.get("earlier_commands", []), *([doc["command"]] if doc.get("command") else [])]


def write_result(path: Path, benchmark: str, body: dict[str, Any]) -> None:
    """Write ``body`` to ``path`` after the benchmark's name, the UTC date and the command line."""
    doc = {
        "benchmark": benchmark,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        **body,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")


def machine(device: Any, load_before: tuple[float, float, float], **extra: Any) -> dict[str, Any]:
    """Where a CPU benchmark ran: the CPU, its TVM target, and the load average before and after."""
    return {"cpu": device.description.get("model", platform.processor()), "target": str(device.target), **extra,
            "load_before": load_before, "load_after": os.getloadavg()}  # fmt: skip
