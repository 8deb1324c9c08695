"""TVM's C++ log lines, caught and handed to Python's logging.

TVM's runtime logs from C++ straight to file descriptor 2, so Python's logging never sees
those lines and cannot filter them. Saving or loading a Relax VM executable
(``export_library``, ``load_module``, ``VirtualMachine`` on an ``Executable``, which exports
and loads it) prints one ``executable.cc:...: Warning: Scope Saving:`` / ``Scope Loaded:``
line per virtual device: noise, 61 lines at the end of a ResNet-50 job. :func:`native_output`
points fd 2 at a temporary file around such a call and re-emits each captured line to this
module's logger: the known noise at DEBUG (``-v`` and a log file keep it), anything else (an
error, a failed check) at WARNING, so nothing is lost.

Only the standard library is imported: ``tuner.artifact`` uses this under
``TVM_USE_RUNTIME_LIB=1``, where the compiler is not there.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import IO

logger = logging.getLogger(__name__)

#: Lines TVM prints on every save or load of a VM executable, whatever the model.
_NOISE = re.compile(r"executable\.cc:\d+: Warning: Scope (Saving|Loaded):")
# fd 2 belongs to the whole process: one thread redirects it at a time. Reentrant, so a
# wrapped call made inside another wrapped region (load_artifact inside a CLI's region)
# just runs inside the outer capture.
_lock = threading.RLock()
_depth = 0
# A copy of the real fd 2 and a text stream on it, made once and kept open for the process:
# a thread that took ``sys.stderr`` during a capture and writes after it still reaches the
# terminal, never a closed descriptor whose number was reused.
_real_fd: int | None = None
_real_stream: io.TextIOWrapper | None = None


@contextlib.contextmanager
def native_output() -> Iterator[None]:
    """Capture what C++ code writes to fd 2 inside the block; re-emit it to the log after.

    Python's own writes to ``sys.stderr`` in the meantime (a live progress display's refresh
    thread, a log handler writing through ``sys.stderr``) still reach the terminal:
    ``sys.stderr`` is pointed at a copy of the original descriptor for the duration. Keep the
    block short (one save or load): other threads' C++ output is captured with it, and the
    lock makes other threads' captures wait.
    """
    global _depth
    with _lock:
        if _depth:  # an outer capture already holds fd 2
            _depth += 1
            try:
                yield
            finally:
                _depth -= 1
            return
        python_stderr = sys.stderr
        with contextlib.suppress(AttributeError, OSError, ValueError):  # no usable stderr (closed, None)
            python_stderr.flush()
        opened = _open(python_stderr)
        if opened is None:  # fd 2 closed (a daemon), no temporary space: the call runs uncaptured
            yield
            return
        real, sink = opened
        with sink:
            os.dup2(sink.fileno(), 2)
            _depth = 1
            try:
                sys.stderr = real
                yield
            finally:
                _depth = 0
                with contextlib.suppress(OSError, ValueError):
                    real.flush()
                sys.stderr = python_stderr
                os.dup2(real.fileno(), 2)
                sink.seek(0)
                # Emitted on the way out of an error too: TVM's reason may be among the lines.
                _emit(sink.read().decode(errors="replace"))


def _open(like: object) -> tuple[io.TextIOWrapper, IO[bytes]] | None:
    """The kept copy of fd 2 (:func:`_real_copy`) and a temporary file for the capture, or None
    where either cannot be had."""
    try:
        real = _real_copy(like)
        return real, tempfile.TemporaryFile(mode="w+b")  # closed by native_output
    except OSError as err:
        logger.debug("TVM's output not captured: %s", err)
        return None


def _real_copy(like: object) -> io.TextIOWrapper:
    """The kept copy of fd 2, refreshed to where fd 2 points now, and its text stream."""
    global _real_fd, _real_stream
    if _real_fd is None:
        _real_fd = os.dup(2)
    else:
        os.dup2(2, _real_fd)  # fd 2 may have been pointed elsewhere since (a test's capture)
    if _real_stream is None:
        encoding = getattr(like, "encoding", None) or "utf-8"
        raw = io.FileIO(_real_fd, "w", closefd=False)
        _real_stream = io.TextIOWrapper(raw, encoding=encoding, errors="backslashreplace",
                                        line_buffering=True, write_through=True)  # fmt: skip
    return _real_stream


def _emit(captured: str) -> None:
    """Each captured line to the log: known noise at DEBUG, anything else at WARNING."""
    for line in captured.splitlines():
        line = line.rstrip()
        if not line:
            continue
        if _NOISE.search(line):
            logger.debug("TVM: %s", line)
        else:
            logger.warning("TVM: %s", line)
