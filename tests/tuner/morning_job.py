"""One real tiny tuning job (tune -> SQLite -> artifact), run once per test session.

Shared by test_artifact.py, test_report.py and test_jobs_cli.py: the job is the real CLI in a
subprocess (local Ray cluster, real builds and timings), cached under pytest's base temp
folder so the three modules pay for it once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent
TRIALS = 8


def run(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run a console script (``tune``, ``nightshift``) as a user would, plain output."""
    full = os.environ | {"COLUMNS": "200", "NO_COLOR": "1"} | (env or {})
    full.pop("NIGHTSHIFT_DB", None)
    return subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True,
                          cwd=cwd, env=full, timeout=timeout)  # fmt: skip


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    """The single ``error: ...`` line of a usage error (exit 2, no traceback)."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def tiny_job(tmp_path_factory) -> Path:
    """The folder of the session's tiny job: ``t.db``, ``tiny.so`` + ``tiny.json``, ``tune.out``."""
    # Development only: reuse the job folder of an earlier session instead of tuning again.
    reuse = os.environ.get("NIGHTSHIFT_TEST_MORNING_JOB")
    if reuse:
        return Path(reuse)
    root = tmp_path_factory.getbasetemp() / "morning_job"
    done = root / "tune.out"
    if not done.exists():
        root.mkdir(exist_ok=True)
        proc = run("tune", "--model", "tiny", "--device", "cpu", "--trials", str(TRIALS), "--trials-per-batch", "4",
                   "--db", "t.db", "-o", "tiny.so", cwd=root)  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        done.write_text(proc.stdout)
    return root
