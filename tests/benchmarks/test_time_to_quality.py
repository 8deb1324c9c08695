"""benchmarks/time_to_quality.py run for real on the tiny model: two arms, each one job grown
through two budgets from an empty database, each point timed against the peers."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "time_to_quality.py"


@pytest.mark.slow
def test_two_arms_grow_through_two_budgets(tmp_path):
    """Every (arm, budget) has a point, the trials grow with the budget and each point has the
    build's latency (and its ratio to the peer where ONNX Runtime is installed); the PNG is
    written where matplotlib is."""
    out = tmp_path / "ttq.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "NIGHTSHIFT_"))}
    # The inline measurer: four Ray start-ups would double the test's time.
    cmd = [sys.executable, str(SCRIPT), "--models", "tiny", "--seeds", "1", "--budgets", "4", "8",
           "--arms", "random", "evo-online", "--rounds", "3", "--measurer", "inline", "--settle", "0",
           "--workdir", str(tmp_path / "work"), "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    points = json.loads(out.read_text())["points"]
    assert sorted((p["arm"], p["budget"]) for p in points) == [
        ("evo-online", 4), ("evo-online", 8), ("random", 4), ("random", 8)]  # fmt: skip
    peer = importlib.util.find_spec("onnxruntime") is not None
    for arm in ("random", "evo-online"):
        curve = sorted((p for p in points if p["arm"] == arm), key=lambda p: p["budget"])
        assert [p["trials"] for p in curve] == [4, 8], curve
        assert curve[0]["tuning_min"] < curve[1]["tuning_min"], curve
        for p in curve:
            assert p["tune"]["exit_code"] == 0 and p["tvm_ms"] > 0, p
            assert not peer or p["ratio"] > 0, p
    if importlib.util.find_spec("matplotlib") is not None:
        assert out.with_suffix(".png").stat().st_size > 0
