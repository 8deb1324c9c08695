"""Database passwords are never printed nor handed to Ray: the resume hint and the Jobs API
entrypoint carry ``--db`` with ``***``, and the machine that runs them finds the password
in its own ``$NIGHTSHIFT_DB`` or libpq's ``.pgpass``."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest

from tuner import cli
from tuner.db.url import redact_argv, with_password

SECRET = "pa55-w0rd"
URL = f"postgresql+psycopg://alice:{SECRET}@db.example:5432/tuning"
SHOWN = "postgresql+psycopg://alice:***@db.example:5432/tuning"


def test_redacted_command_lines_and_the_password_found_again():
    assert redact_argv(["tune", "--db", URL, f"--db={URL}", "x"]) == ["tune", "--db", SHOWN, f"--db={SHOWN}", "x"]
    # The other side: the same URL in the environment gives the password back; another URL
    # (user, host, port or database) does not, and libpq's own lookup is left to find it.
    assert with_password(SHOWN, URL) == URL
    for other in (URL.replace("alice", "bob"), URL.replace("db.example", "db2"), URL.replace("5432", "5433"),
                  URL.replace("/tuning", "/other"), None, "nightshift.db"):  # fmt: skip
        assert with_password(SHOWN, other) == "postgresql+psycopg://alice@db.example:5432/tuning", other
    assert with_password(URL, None) == URL and with_password("t.db", URL) == "t.db"


def test_the_resume_hint_hides_the_password(monkeypatch):
    from tuner.cli.tune import _resume_command

    monkeypatch.setattr(sys, "argv", ["/usr/bin/tune", "--model", "tiny", "--db", URL])
    hint = _resume_command("nightly")
    assert SECRET not in hint
    assert f"tune --model tiny --db {shlex.quote(SHOWN)} --job nightly" in hint
    assert "$NIGHTSHIFT_DB or ~/.pgpass" in hint


def test_the_jobs_api_entrypoint_hides_the_password(monkeypatch, capsys):
    import ray.job_submission

    submitted: list[str] = []

    class FakeClient:
        def __init__(self, address, headers=None):
            self.address = address

        def submit_job(self, *, entrypoint):
            submitted.append(entrypoint)
            return "raysubmit_1"

        def get_job_status(self, _job_id):
            return "JobStatus.SUCCEEDED"

        def get_job_logs(self, _job_id):
            return ""

        def get_job_info(self, _job_id):
            return type("Info", (), {"message": ""})()

    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", FakeClient)
    assert cli.main(["tune", "--model", "tiny", "--db", URL, "--ray-address", "http://127.0.0.1:8265"]) == 0
    captured = capsys.readouterr()
    assert submitted and SECRET not in submitted[0] and f"--db {shlex.quote(SHOWN)}" in submitted[0], submitted
    assert SECRET not in captured.out + captured.err
    assert "the head reads it from its $NIGHTSHIFT_DB" in captured.err


def _one_line(capsys) -> str:
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), lines
    return lines[0]


def test_the_other_side_takes_the_password_from_its_environment_or_pgpass(pg_password_url, tmp_path, monkeypatch,
                                                                           capsys):  # fmt: skip
    from sqlalchemy import make_url

    real = make_url(pg_password_url)
    shown = real.render_as_string(hide_password=True)
    assert "***" in shown and real.password not in shown
    for var in ("NIGHTSHIFT_DB", "NIGHTSHIFT_DB_FILE", "PGPASSWORD", "PGPASSFILE", "PGSERVICEFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.pgpass of the machine's user
    # Neither: libpq has no password to send; one line says what to check.
    assert cli.main(["db", "init", "--db", shown]) == 2
    assert "password" in _one_line(capsys)
    # $NIGHTSHIFT_DB holds the same URL with its password.
    monkeypatch.setenv("NIGHTSHIFT_DB", pg_password_url)
    assert cli.main(["db", "init", "--db", shown]) == 0
    monkeypatch.delenv("NIGHTSHIFT_DB")
    # libpq's password file (host:port:database:user:password, mode 0600).
    pgpass = Path(tmp_path / ".pgpass")
    pgpass.write_text(f"{real.host}:{real.port}:{real.database}:{real.username}:{real.password}\n")
    os.chmod(pgpass, 0o600)
    assert cli.main(["db", "stats", "--db", shown]) == 0
    assert real.password not in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["tune", "--model", "tiny", "--db", URL, "--ray-address", "http://h:8265"]])
def test_submission_argv_is_what_the_driver_command_carries(argv):
    from tuner.measure.submit import driver_command

    command = driver_command(redact_argv(argv))
    assert SECRET not in command and shlex.quote(SHOWN) in command and "--ray-address auto" in command


def test_the_compose_application_role_has_only_the_rights_it_needs(pg_password_url, tmp_path):
    """docker/postgres-init's script, run as the image runs it (psql as the superuser, on the
    database it creates): the role Nightshift connects as creates its schema and tunes, and
    is no superuser, creates no roles or databases and reaches no other database."""
    import subprocess

    import sqlalchemy as sa
    from sqlalchemy import make_url

    from tuner.db import TuningDatabase
    from tuner.device import parse_device

    admin_url = make_url(pg_password_url)
    # psql from the binaries the fixture's server runs (tests/db/conftest.py): not on PATH.
    pg_bin = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin"))))
    script = Path(__file__).resolve().parents[2] / "docker" / "postgres-init" / "10-nightshift-role.sh"
    admin = sa.create_engine(pg_password_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text('DROP DATABASE IF EXISTS "nightshift" WITH (FORCE)'))
        conn.execute(sa.text("DROP ROLE IF EXISTS nightshift"))
        conn.execute(sa.text('CREATE DATABASE "nightshift"'))
    env = os.environ | {"POSTGRES_USER": admin_url.username, "POSTGRES_DB": "nightshift",
                        "NIGHTSHIFT_DB_PASSWORD": "app-pw", "PGHOST": admin_url.host,
                        "PGPORT": str(admin_url.port), "PGPASSWORD": admin_url.password,
                        "PATH": f"{pg_bin}:{os.environ['PATH']}"}  # fmt: skip
    proc = subprocess.run(["sh", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    app = admin_url.set(username="nightshift", password="app-pw", database="nightshift")
    db = TuningDatabase(app)  # first use: the migrations, as this role
    dev = db.device_id(parse_device("cpu"))
    assert db.start_job("tiny", dev, {}, 0, name="j") > 0
    db.close()
    as_app = sa.create_engine(app, isolation_level="AUTOCOMMIT")
    with as_app.connect() as conn:
        assert conn.execute(sa.text("SELECT rolsuper OR rolcreaterole OR rolcreatedb FROM pg_roles "
                                    "WHERE rolname = current_user")).scalar() is False  # fmt: skip
        for denied in ("CREATE ROLE intruder", "CREATE DATABASE other"):
            with pytest.raises(sa.exc.ProgrammingError, match="permission denied"):
                conn.execute(sa.text(denied))
    as_app.dispose()
    with pytest.raises(sa.exc.OperationalError, match="permission denied for database"):
        sa.create_engine(app.set(database="postgres")).connect()
    with admin.connect() as conn:
        conn.execute(sa.text('DROP DATABASE "nightshift" WITH (FORCE)'))
        conn.execute(sa.text("DROP ROLE nightshift"))
        # The session's other tests connect to `postgres` as alice, a superuser: unaffected;
        # the grant goes back all the same.
        for name in ("postgres", "template1"):
            conn.execute(sa.text(f"GRANT CONNECT ON DATABASE {name} TO PUBLIC"))
    admin.dispose()
