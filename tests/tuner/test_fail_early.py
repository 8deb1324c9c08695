"""Fail early, in one line: what ``tune`` and ``compile`` can refuse, they refuse before the
model is tuned or compiled and before the database is created, with exit 2 and one line."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tuner import cli

TUNE = ["--model", "tiny", "--measurer", "inline", "--trials", "4", "--trials-per-batch", "4"]


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A clean working folder; tuning and compiling fail the test if they start."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NIGHTSHIFT_DB", raising=False)
    monkeypatch.delenv("NIGHTSHIFT_DB_FILE", raising=False)

    def started(*_args, **_kwargs):
        raise AssertionError("the work started before the input was checked")

    monkeypatch.setattr("tuner.job.tune_tasks", started)
    monkeypatch.setattr("tuner.compile.compile_model", started)
    return tmp_path


def _one_line(capsys: pytest.CaptureFixture[str], code: int) -> str:
    assert code == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(("args", "expect"), [
    (["-o", "/proc/x.so"], "-o /proc/x.so: cannot write in /proc"),
    (["-o", "missing/x.so"], "folder {here}/missing does not exist; create it or pass another -o"),
    (["-o", "."], "is a folder; pass a file path such as"),
    (["--db", "."], "--db {here} is a folder; pass a database file such as {here}/nightshift.db"),
    (["--db", "postgresql+psycopg://nightshift@127.0.0.1:{port}/nightshift"],
     "is the PostgreSQL server running and reachable?"),
])  # fmt: skip
def test_tune_refuses_before_tuning_and_creating_the_database(here, capsys, args, expect):
    port = _free_port()
    args = [a.format(port=port) for a in args]
    if args == ["-o", "."]:
        args = ["-o", "art.so"]
        (here / "art.so").mkdir()
    line = _one_line(capsys, cli.tune_main([*TUNE, "--db", "t.db", *args]))
    assert expect.format(here=here, port=port) in line, line
    assert not (here / "t.db").exists()


def test_a_graph_tvm_fails_to_extract_is_one_line_before_the_database(here, capsys, monkeypatch):
    """TVM's failure inside the graph passes (the concat of 5 and 7 channels gave this one
    under the default layout) ends ``tune`` before the database exists, ``tasks`` likewise."""
    import tvm

    def fails(_self):
        raise tvm.error.InternalError("Traceback (most recent call last):\n  0: tvm::relax::ConvertLayout\n"
                                      "InternalError: Invalid layout axis 5b")

    monkeypatch.setattr("tuner.app.model.LoadedModel.tasks", fails)
    for run in (lambda: cli.tune_main([*TUNE, "--db", "t.db"]),
                lambda: cli.main(["tasks", "--model", "tiny"])):  # fmt: skip
        line = _one_line(capsys, run())
        assert "TVM's graph passes failed under --layout auto (InternalError: Invalid layout axis 5b)" in line
        assert "try --layout NCHW" in line and "-v" in line
        assert not (here / "t.db").exists()
    # -v shows TVM's trace behind the line.
    assert cli.tune_main([*TUNE, "--db", "t.db", "-v"]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_compile_refuses_an_unwritable_output_before_compiling(here, capsys):
    from tuner.db import TuningDatabase

    TuningDatabase(str(here / "c.db")).close()
    for out, expect in (("/proc/x.so", "cannot write in /proc"), ("no/such/x.so", "does not exist")):
        line = _one_line(capsys, cli.main(["compile", "--model", "tiny", "--db", "c.db", "-o", out]))
        assert f"-o {out}" in line and expect in line, line
