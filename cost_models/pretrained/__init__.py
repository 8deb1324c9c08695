"""Cost models that ship with the package, trained on this project's own measurements.

``xgb_<kind>.json`` is an XGBoost model in XGBoost's JSON format (never a pickle), made by
``nightshift model train``; ``xgb_<kind>.provenance.json`` says what it was trained on
(devices, models, trials, records), when, and by which command.
"""

from __future__ import annotations

import json
import logging
from importlib import resources
from typing import Any

logger = logging.getLogger(__name__)


def shipped_model(kind: str = "cpu", model: str = "xgb") -> bytes | None:
    """The shipped ``model`` for devices of ``kind`` (``cpu``, ``cuda``) as bytes, or None."""
    path = resources.files(__name__) / f"{model}_{kind}.json"
    if not path.is_file():
        return None
    return path.read_bytes()


def shipped_provenance(kind: str = "cpu", model: str = "xgb") -> dict[str, Any] | None:
    """What the shipped model of ``kind`` was trained on (see the module docstring), or None."""
    path = resources.files(__name__) / f"{model}_{kind}.provenance.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text())
