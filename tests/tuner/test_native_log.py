"""TVM's C++ output around a save or load: caught from fd 2 and handed to logging."""

from __future__ import annotations

import logging
import os
import sys

import pytest

from tuner.native_log import native_output

_NOISE = b"[10:34:19] /project/src/runtime/vm/executable.cc:340: Warning: Scope Loaded: \n"


def test_noise_at_debug_anything_else_at_warning(caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture):
    caplog.set_level(logging.DEBUG, logger="tuner.native_log")
    with native_output():
        os.write(2, _NOISE)  # as TVM's C++ logging writes: the descriptor, not sys.stderr
        with native_output():  # nested (a load inside a CLI's capture): one capture
            os.write(2, b"Check failed: (ptr != nullptr) is false\n")
        print("progress", file=sys.stderr, flush=True)  # Python's own output still reaches the terminal
    assert capfd.readouterr().err == "progress\n"
    seen = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "tuner.native_log"]
    assert seen == [(logging.DEBUG, "TVM: " + _NOISE.decode().strip()),
                    (logging.WARNING, "TVM: Check failed: (ptr != nullptr) is false")]  # fmt: skip


def test_lines_of_a_failed_call_are_kept(caplog: pytest.LogCaptureFixture):
    with pytest.raises(RuntimeError), native_output():
        os.write(2, b"TVMError: cannot open m.so\n")
        raise RuntimeError("load failed")
    assert [r.getMessage() for r in caplog.records] == ["TVM: TVMError: cannot open m.so"]
