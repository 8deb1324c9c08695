"""The local cluster ``tune`` starts (``connect()``): on 127.0.0.1 only, token auth always,
its token file private. Run in a fresh process with its own home, as a user's ``tune`` is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

_PROBE = r"""
import json, os, stat, sys
from pathlib import Path
import psutil, ray
from tuner.measure.ray_measure import connect

connect(num_cpus=1)

@ray.remote
def pid():
    return os.getpid()

ray.get(pid.remote())  # a worker up, listening too
me = psutil.Process()
procs = [me, *me.children(recursive=True)]
listening = sorted({f"{c.laddr.ip}" for p in procs for c in p.net_connections("inet") if c.status == "LISTEN"})
token = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
print(json.dumps({"listening": listening, "mode": os.environ.get("RAY_AUTH_MODE"),
                  "token_mode": oct(stat.S_IMODE(token.stat().st_mode)), "token_len": len(token.read_text()),
                  "node_ip": ray.util.get_node_ip_address(), "processes": len(procs)}))
ray.shutdown()
"""


@pytest.mark.slow
@pytest.mark.parametrize("loose_token", [False, True], ids=["new-token", "token-0644"])
def test_local_cluster_binds_loopback_with_token_auth(tmp_path: Path, loose_token: bool):
    home = tmp_path / "home"
    home.mkdir()
    if loose_token:  # as Ray leaves the token it generates, with the umask
        (home / ".ray").mkdir()
        (home / ".ray" / "auth_token").write_text("a" * 64)
        (home / ".ray" / "auth_token").chmod(0o644)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "NIGHTSHIFT_"))}
    # The environment that opened everything before: auth disabled.
    env |= {"HOME": str(home), "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["processes"] >= 3, seen  # GCS, raylet, a worker at least
    assert seen["listening"] and set(seen["listening"]) <= {"127.0.0.1", "::ffff:127.0.0.1"}, seen
    assert seen["node_ip"] == "127.0.0.1"
    assert seen["mode"] == "token" and seen["token_mode"] == "0o600" and seen["token_len"] == 64, seen
    assert "RAY_AUTH_MODE=disabled ignored" in proc.stderr


_PLAIN_INIT = r"""
import ray
from tuner.device import parse_device
from tuner.errors import UserInputError
from tuner.measure.ray_measure import RayMeasurer

ray.init(num_cpus=1, include_dashboard=False)
try:
    RayMeasurer(parse_device("cpu"))
except UserInputError as e:
    print(e)
ray.shutdown()
"""


@pytest.mark.slow
def test_plain_ray_init_gets_a_notebook_hint(tmp_path: Path):
    """A notebook's plain ``ray.init()`` lacks the device resource: the error says to start the
    cluster with ``connect()``, not to start a worker on a head node the user never ran."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "NIGHTSHIFT_"))} | {"HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", _PLAIN_INIT], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    message = proc.stdout.strip().splitlines()[-1]
    assert "does not offer device resource 'nightshift_cpu_" in message, message
    assert "connect()" in message and "ray start" not in message, message
