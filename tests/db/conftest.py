"""Fixtures of the database tests: a password-protected PostgreSQL server, small workloads."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

PG_BIN = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin"))), None)
PG_PASSWORD = "s3cret-pw"


@pytest.fixture(scope="session", autouse=True)
def _tvm_tensor_intrinsics() -> None:
    """TVM's tensor intrinsics, imported once the fast way (else the first TuneContext takes minutes)."""
    from tuner.compile import preload_tensor_intrinsics

    preload_tensor_intrinsics()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def pg_password_url() -> Iterator[str]:
    """A private PostgreSQL server that checks passwords (scram-sha-256), user ``alice``.

    The shared server on 5432 trusts every local connection, so a wrong password cannot be
    tried there; this one is started from the same binaries in a temporary folder.
    """
    if PG_BIN is None or shutil.which("runuser") is None:
        pytest.skip("PostgreSQL server binaries or runuser not found")
    root = Path(tempfile.mkdtemp(prefix="ns-pg-"))
    data, pwfile = root / "data", root / "pw"
    pwfile.write_text(PG_PASSWORD + "\n")
    shutil.chown(root, "postgres")
    shutil.chown(pwfile, "postgres")
    port = _free_port()

    def as_postgres(*cmd: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *cmd], check=True, capture_output=True, timeout=120)

    as_postgres(str(PG_BIN / "initdb"), "-D", str(data), "-U", "alice", "--auth=scram-sha-256",
                f"--pwfile={pwfile}")  # fmt: skip
    as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(data), "-w", "-l", str(root / "log"), "-o",
                f"-p {port} -k {root} -c listen_addresses=127.0.0.1", "start")  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        yield f"postgresql+psycopg://alice:{PG_PASSWORD}@127.0.0.1:{port}/postgres"
    finally:
        as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop")
        shutil.rmtree(root, ignore_errors=True)
