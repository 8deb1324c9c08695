"""benchmarks/cuda_tune.py rehearsed on the CPU (``--device cpu``): the whole run on the tiny
model, a tuning step cut by ``--total`` that still leaves its trials in the JSON, and
``--check`` saying what a machine without a GPU lacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bench_scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "cuda_tune.py"


def _module():
    return load_script("cuda_tune")


def _run(*args: str | Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "NIGHTSHIFT_"))}
    env["NIGHTSHIFT_CACHE"] = os.environ["NIGHTSHIFT_CACHE"]  # the session's (tests/conftest.py), not ~/.cache
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)  # fmt: skip


def test_result_file_named_by_gpu_and_model():
    ct = _module()

    def args(device: str, model: str = "resnet50"):
        return type("A", (), {"device": device, "model": model})

    assert ct.default_out(args("cuda:0"), {"gpu": "NVIDIA H200"}).name == "cuda_tune_h200.json"
    assert ct.default_out(args("cuda:0"), {"gpu": "NVIDIA H100 80GB HBM3"}).name == "cuda_tune_h100.json"
    cpu = {"cpu": {"mcpu": "znver5"}}
    assert ct.default_out(args("cpu", "tiny"), cpu).name == "cuda_tune_cpu_znver5_tiny.json"
    assert ct._seconds("4m") == 240 and ct._seconds("90s") == 90 and ct._seconds("30") == 30


def test_device_commands_fit_the_limit():
    """Each device call of the transfer plan (benchmarks/README.md) is one command of at most
    2,000 characters."""
    text = (ROOT / "benchmarks" / "README.md").read_text()
    start = text.index("<!-- device-calls:start -->")
    block = text[start:text.index("<!-- device-calls:end -->")]
    commands = [line for line in block.splitlines() if line.strip() and not line.startswith(("```", "<!--"))]
    assert len(commands) >= 3, commands
    for cmd in commands:
        assert len(cmd) <= 2000, (len(cmd), cmd[:80])


@pytest.mark.slow
def test_check_names_what_a_gpu_run_lacks(tmp_path):
    """On a machine without a GPU, ``--check`` exits 1 and says what is wrong: torch sees no GPU,
    no NVIDIA driver for TVM's CUDA runtime; the CPU rehearsal's check passes."""
    gpu = _run("--check", "--work", tmp_path, timeout=300)
    if "ready" in gpu.stdout.splitlines()[-1:]:
        pytest.skip("this machine has a GPU")
    assert gpu.returncode == 1, gpu.stdout + gpu.stderr
    assert "what is wrong:" in gpu.stdout and "TVM CUDA runtime" in gpu.stdout, gpu.stdout
    cpu = _run("--check", "--device", "cpu", "--work", tmp_path, timeout=300)
    assert cpu.returncode == 0 and cpu.stdout.strip().splitlines()[-1].startswith("ready"), cpu.stdout + cpu.stderr


@pytest.mark.slow
@pytest.mark.ray
def test_rehearsal_on_the_tiny_model(tmp_path):
    """The whole script on the CPU: a real tune job, the artifact, its output against the llvm
    build, and timed against PyTorch eager in the same rounds; the JSON has each step's log."""
    out = tmp_path / "result.json"
    proc = _run("--device", "cpu", "--model", "tiny", "--time-budget", "20s", "--work", tmp_path / "work",
                "--out", out, "--rounds", "3", "--peers", "eager", "--step-scale", "3", timeout=1500)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "cuda_tune" and doc["model"] == "tiny" and doc["device"] == "cpu"
    assert list(doc["steps"]) == ["env", "reference", "tune", "compile", "bench"]
    assert all(s["rc"] == 0 and not s["timed_out"] and s["log_tail"] for s in doc["steps"].values()), doc["steps"]
    assert doc["trials"] > 0 and doc["tuning_minutes"] > 0
    assert doc["verified"] and doc["max_error_vs_cpu_build"] < 1e-3
    assert doc["error_vs_cpu_build"]["torch_eager"] < 1e-3  # the PyTorch twin computes the same network
    assert doc["ratio_vs_pytorch_eager"] > 0 and "ratio_vs_torch_compile" not in doc
    assert set(doc["latency"]) == {"tvm", "torch_eager"}


@pytest.mark.slow
@pytest.mark.ray
def test_a_tuning_step_cut_short_still_leaves_its_figures(tmp_path):
    """``--total`` leaves too little for the budget: the tune step is interrupted (SIGINT: the
    job saves and stops its Ray), marked timed out, and the JSON written after it holds the
    trials its events recorded."""
    out = tmp_path / "result.json"
    proc = _run("--device", "cpu", "--model", "tiny", "--time-budget", "10m", "--total", "100", "--steps", "env",
                "tune", "--work", tmp_path / "work", "--out", out, timeout=600)  # fmt: skip
    doc = json.loads(out.read_text())
    tune = doc["steps"]["tune"]
    assert tune["timed_out"] and tune["duration_s"] < 200, tune
    assert "trials" in doc and doc["tuning_state"] in ("stopped", "cut short", "never started"), doc
    assert proc.returncode == 1  # nothing verified
