"""Keeping a CPU node quiet while it times: build processes are stopped, then resumed.

A CPU timing must not share its cores with a build. Rather than reserving the node's CPUs
for the device actor (which would leave them idle between timings), every build process
registers itself in a node-local directory; the device actor stops the registered
processes (SIGSTOP) for the few hundred milliseconds a timing takes and resumes them
(SIGCONT) after. A watchdog subprocess resumes them if the actor dies or hangs while they
are stopped, so a crashing candidate cannot leave builds frozen.

A build's children (the linker) are stopped with it; a driver that registers its search
thread does so without its children, which on a local cluster are Ray itself (GCS, raylet
and every worker, the device actor included).

Linux only (``/proc``). Run as ``python -m tuner.measure.pause`` it is the watchdog.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

_ROOT = Path(tempfile.gettempdir()) / "nightshift-pause"


def registry(node_id: str) -> Path:
    """The directory where pausable processes of Ray node ``node_id`` register."""
    return _ROOT / node_id


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state first), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: split after the last ')'.
    return stat.rsplit(")", 1)[1].split()


def _start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks (identifies it across pid reuse)."""
    fields = _stat(pid)
    return fields[19] if fields else None


def _state_and_cpu(pid: int) -> tuple[str, float] | None:
    fields = _stat(pid)
    if not fields:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return fields[0], (int(fields[11]) + int(fields[12])) / ticks


def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (e.g. the C++ linker that ``export_library`` runs)."""
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        kids: list[int] = []
        for task in Path(f"/proc/{parent}/task").glob("*"):
            with contextlib.suppress(OSError, ValueError):
                kids += [int(k) for k in (task / "children").read_text().split()]
        out += kids
        todo += kids
    return out


def _ancestors(pid: int) -> set[int]:
    """The parent of ``pid``, its parent, and so on up to init."""
    out = set()
    while pid > 1 and (fields := _stat(pid)):
        pid = int(fields[1])
        out.add(pid)
    return out


@contextlib.contextmanager
def pausable(node_id: str | None, *, with_children: bool = True) -> Iterator[None]:
    """Let the device actor of node ``node_id`` stop this process while it times.

    Args:
        node_id: the Ray node whose device actor may stop this process; None: no pausing.
        with_children: stop this process's descendants too (a build's linker). A Ray driver
            passes False: its children are the local cluster's own processes.
    """
    if node_id is None or not Path("/proc/self/stat").exists():
        yield
        return
    pid = os.getpid()
    directory = registry(node_id)
    directory.mkdir(parents=True, exist_ok=True)
    entry = directory / str(pid)
    entry.write_text(f"{_start_ticks(pid) or ''} {'children' if with_children else 'alone'}")
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            entry.unlink()


@dataclass(frozen=True)
class PauseReport:
    """What a pause did: how many processes were held and the CPU they still used."""

    paused: int
    cpu_s: float


class BuildPauser:
    """Stops and resumes the pausable processes of one node; used by the device actor."""

    def __init__(self, node_id: str, *, lease_s: float) -> None:
        self.directory = registry(node_id)
        self.lease_s = lease_s
        self._watchdog: subprocess.Popen | None = None
        self._stopped: dict[int, float] = {}

    def _ensure_watchdog(self) -> subprocess.Popen:
        if self._watchdog is None or self._watchdog.poll() is not None:
            self._watchdog = subprocess.Popen(
                [sys.executable, "-m", "tuner.measure.pause"], stdin=subprocess.PIPE, text=True
            )
        return self._watchdog

    def pause(self) -> None:
        """Stop every live registered process (but this one) and wait until they are stopped."""
        pids, parents = [], []
        # Never this process nor what it runs in: stopping either would freeze the timing
        # until the watchdog's lease ran out.
        mine = {os.getpid(), *_ancestors(os.getpid())}
        for entry in self.directory.glob("*") if self.directory.is_dir() else []:
            with contextlib.suppress(ValueError, OSError):
                pid = int(entry.name)
                if pid in mine:
                    continue
                ticks, _, scope = entry.read_text().partition(" ")
                if not ticks or _start_ticks(pid) != ticks:
                    entry.unlink()  # the process is gone (or its pid was reused)
                    continue
                pids.append(pid)
                if scope != "alone":
                    parents.append(pid)
        if not pids:
            return
        watchdog = self._ensure_watchdog()
        # Tell the watchdog first: if this process dies from here on, it resumes them.
        assert watchdog.stdin is not None
        watchdog.stdin.write(f"stop {self.lease_s} {' '.join(map(str, pids))}\n")
        watchdog.stdin.flush()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        # Then their children: a stopped build cannot start new ones, but a linker it already
        # runs would keep a core busy during the timing.
        kids = [k for pid in parents for k in _descendants(pid) if k not in mine]
        if kids:
            watchdog.stdin.write(f"stop {self.lease_s} {' '.join(map(str, pids + kids))}\n")
            watchdog.stdin.flush()
            for kid in kids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(kid, signal.SIGSTOP)
            pids += kids
        deadline = time.monotonic() + 0.5
        for pid in pids:
            while True:
                info = _state_and_cpu(pid)
                if info is None or info[0] in "TtZX" or time.monotonic() > deadline:
                    break
                time.sleep(0.0005)
            if info is not None:
                self._stopped[pid] = info[1]

    def resume(self) -> PauseReport:
        """Resume what ``pause`` stopped; report their count and the CPU time they used."""
        cpu = 0.0
        for pid, before in self._stopped.items():
            info = _state_and_cpu(pid)
            if info is not None:
                cpu += max(info[1] - before, 0.0)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        report = PauseReport(len(self._stopped), cpu)
        if self._stopped and self._watchdog is not None and self._watchdog.stdin is not None:
            with contextlib.suppress(OSError):
                self._watchdog.stdin.write("cont\n")
                self._watchdog.stdin.flush()
        self._stopped = {}
        return report


def _watchdog_main() -> None:
    """Resume stopped processes when told, when their lease ends, or when stdin closes."""
    held: list[int] = []
    deadline = float("inf")

    def release() -> None:
        for pid in held:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        held.clear()

    buf = ""
    while True:
        wait = None if not held else max(deadline - time.monotonic(), 0.0)
        ready, _, _ = select.select([sys.stdin], [], [], wait)
        if not ready:
            release()  # the lease ran out: the actor hangs or forgot
            continue
        chunk = os.read(sys.stdin.fileno(), 4096).decode()
        if not chunk:
            release()  # the actor died
            return
        buf += chunk
        while "\n" in buf:
            line, buf = buf.split("\n", 1)
            words = line.split()
            if words and words[0] == "stop":  # more processes of the current pause
                deadline = time.monotonic() + float(words[1])
                held.extend(int(p) for p in words[2:] if int(p) not in held)
            elif words and words[0] == "cont":
                release()


if __name__ == "__main__":
    _watchdog_main()
