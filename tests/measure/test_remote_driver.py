"""A driver outside the cluster: ``tune --ray-address http://HEAD:8265`` against real ``ray start``
processes on free ports (head without the device, a worker offering it), as a team would
run them; and Ray Client addresses refused with the command that works.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tuner import cli

REPO = Path(__file__).resolve().parents[2]


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _node_ports() -> list[str]:
    """Ports a node would otherwise take at fixed defaults (another node or user may hold them)."""
    agent, grpc, metrics, env = _free_ports(4)
    return ["--dashboard-agent-listen-port", str(agent), "--dashboard-agent-grpc-port", str(grpc),
            "--metrics-export-port", str(metrics), "--runtime-env-agent-port", str(env)]  # fmt: skip


def _wait_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise AssertionError(f"nothing listens on {port} after {timeout} s")


@pytest.fixture
def ray_processes(cpu_device) -> Iterator[dict]:
    """``ray start --head`` (no device resource, so timings must go to the worker) and a worker
    with the device resource, each ``--block``ed in a subprocess of ours: ending the subprocess
    stops its node, and no other Ray on the machine is touched."""
    from tuner.measure.base import device_resource

    gcs, dashboard, client = _free_ports(3)
    temp = tempfile.mkdtemp(prefix="nsray-")  # short: Ray's socket paths live under it
    token = secrets.token_hex(32)  # as in docker-compose.yml: Ray's token authentication, our own token
    env = os.environ | {"PYTHONPATH": str(REPO), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                        "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}  # fmt: skip
    ray_bin = str(Path(sys.executable).parent / "ray")
    head = subprocess.Popen(
        [ray_bin, "start", "--head", "--block", "--port", str(gcs), "--node-ip-address", "127.0.0.1",
         "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard), "--include-dashboard", "true",
         "--ray-client-server-port", str(client), "--num-cpus", "1", "--temp-dir", temp, *_node_ports()],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    procs = [head]
    try:
        _wait_port(gcs, 120)
        _wait_port(dashboard, 180)
        worker = subprocess.Popen(
            [ray_bin, "start", "--block", "--address", f"127.0.0.1:{gcs}", "--node-ip-address", "127.0.0.1",
             "--num-cpus", "1", "--resources", json.dumps({device_resource(cpu_device): 1}), *_node_ports()],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        procs.append(worker)
        yield {"dashboard": f"http://127.0.0.1:{dashboard}", "gcs": gcs, "env": env, "token": token}
    finally:
        for p in reversed(procs):
            p.terminate()  # `ray start --block` stops its node's processes on SIGTERM
        for p in reversed(procs):
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()


def test_tune_submitted_through_the_jobs_api_times_on_the_worker(ray_processes, tmp_path, cpu_device, monkeypatch):
    from tuner.measure.base import device_resource

    db = tmp_path / "team.db"  # the head runs on this machine: the same file is reachable there
    # The job needs the worker's device resource: wait until the worker has joined.
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            out = subprocess.run(
                [sys.executable, "-c", "import ray, json; ray.init(address='auto', logging_level='ERROR'); "
                 "print(json.dumps(ray.cluster_resources()))"],
                env=ray_processes["env"] | {"RAY_ADDRESS": f"127.0.0.1:{ray_processes['gcs']}"},
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            # Seen once in the full suite on a loaded 2-core machine: a probe's ray.init
            # hung on the GCS; the next probe asks again until the deadline.
            continue
        if out.returncode == 0 and device_resource(cpu_device) in out.stdout:
            break
        time.sleep(2)
    # Without the cluster's token the Jobs API refuses the job; with it, the job runs.
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    assert cli.main(["tune", "--model", "tiny", "--no-verify", "--ray-address", ray_processes["dashboard"]]) == 2
    monkeypatch.setenv("RAY_AUTH_TOKEN", ray_processes["token"])
    rc = cli.main(["tune", "--model", "tiny", "--trials", "4", "--trials-per-batch", "2", "--no-verify",
                   "--db", f"sqlite:///{db}", "--ray-address", ray_processes["dashboard"]])  # fmt: skip
    assert rc == 0
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT error_class FROM records").fetchall()
    assert len(rows) == 4
    assert any(e is None for (e,) in rows), rows


@pytest.mark.parametrize("address", ["ray://localhost:10001", "ray://10.0.0.5:10001"])
def test_ray_client_address_is_refused_with_the_jobs_api_command(address, capsys):
    rc = cli.main(["tune", "--model", "tiny", "--trials", "2", "--no-verify", "--ray-address", address])
    assert rc == 2
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert "Ray Client" in out and ":8265" in out and "--ray-address auto" in out
