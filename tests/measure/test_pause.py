"""Stopping a node's build processes while it times, and the watchdog that resumes them.

Real processes: a registered "build" that burns CPU and runs a CPU-burning child (as
``export_library`` runs the C++ linker).
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest

from tuner.measure.pause import BuildPauser, _descendants, _state_and_cpu, pausable, registry

BUILD = """
import subprocess, sys, time
from tuner.measure.pause import pausable
with pausable(sys.argv[1], with_children=sys.argv[2] == "children"):
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    print("ready", flush=True)
    while True:
        pass
"""


@pytest.fixture(params=["children"])
def build(request):
    node = f"test-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([sys.executable, "-c", BUILD, node, request.param], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 10
    while not _descendants(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    yield node, proc
    for pid in [*_descendants(proc.pid), proc.pid]:
        subprocess.run(["kill", "-CONT", str(pid)], check=False)
        subprocess.run(["kill", "-KILL", str(pid)], check=False)
    proc.wait()
    for entry in registry(node).glob("*"):
        entry.unlink()
    registry(node).rmdir()


def _states(pids):
    return [(_state_and_cpu(p) or ("gone", 0.0))[0] for p in pids]


def _cpu(pids):
    return sum((_state_and_cpu(p) or ("", 0.0))[1] for p in pids)


def test_pause_stops_build_and_its_children_then_resumes(build):
    node, proc = build
    pids = [proc.pid, *_descendants(proc.pid)]
    assert len(pids) == 2
    pauser = BuildPauser(node, lease_s=30)
    pauser.pause()
    assert set(_states(pids)) == {"T"}
    before = _cpu(pids)
    time.sleep(0.5)
    assert _cpu(pids) - before < 0.02  # stopped processes use no CPU
    report = pauser.resume()
    assert report.paused == 2 and report.cpu_s < 0.02
    time.sleep(0.3)
    assert "T" not in _states(pids)
    assert _cpu(pids) > before


def test_watchdog_resumes_builds_when_the_timing_process_dies(build):
    node, proc = build
    pids = [proc.pid, *_descendants(proc.pid)]
    pauser = BuildPauser(node, lease_s=60)
    pauser.pause()
    assert set(_states(pids)) == {"T"}
    # The actor dying closes the watchdog's stdin: the watchdog must resume what it held.
    pauser._watchdog.stdin.close()
    pauser._watchdog.wait(timeout=10)
    time.sleep(0.2)
    assert "T" not in _states(pids)


def test_watchdog_lease_resumes_builds_of_a_hung_timing(build):
    node, proc = build
    pids = [proc.pid, *_descendants(proc.pid)]
    pauser = BuildPauser(node, lease_s=0.5)
    pauser.pause()
    assert set(_states(pids)) == {"T"}
    time.sleep(1.5)  # never resumed by the pauser: the lease runs out
    assert "T" not in _states(pids)
    pauser.resume()


@pytest.mark.parametrize("build", ["alone"], indirect=True)
def test_process_registered_alone_is_stopped_without_its_children(build):
    """A Ray driver registers so: its children are the local cluster (raylet, workers)."""
    node, proc = build
    child = _descendants(proc.pid)
    pauser = BuildPauser(node, lease_s=30)
    pauser.pause()
    try:
        assert _states([proc.pid]) == ["T"]
        assert "T" not in _states(child)
    finally:
        assert pauser.resume().paused == 1


PAUSER = """
import sys, time
from tuner.measure.pause import BuildPauser
pauser = BuildPauser(sys.argv[1], lease_s=3)
start = time.monotonic()
pauser.pause()
print(pauser.resume().paused, time.monotonic() - start, flush=True)
"""


def test_pauser_never_stops_itself_nor_the_processes_it_runs_under():
    """The device actor runs under the raylet, a child of a local cluster's driver.

    Were it to stop its ancestors and itself, it would sit frozen until the watchdog's lease
    ran out (3 s here; a job's run timeout in a job), stalling every timing.
    """
    node = f"test-{uuid.uuid4().hex[:8]}"
    try:
        with pausable(node):  # this test process, children included: the pauser is one of them
            out = subprocess.run([sys.executable, "-c", PAUSER, node], capture_output=True, text=True, timeout=60)
        paused, secs = out.stdout.split()
        assert int(paused) == 0
        assert float(secs) < 1.0
    finally:
        registry(node).rmdir()
