"""The CLI never does a quiet wrong thing, and never shows a password."""

from __future__ import annotations

import dataclasses
import json

import pytest
import sqlalchemy as sa

from tuner import cli
from tuner.compile import compile_model, fallback_record, verify_model
from tuner.db import NewRecord, TuningDatabase, redact
from tuner.frontends import load_model
from tuner.graph.tasks import extract_tasks

PW = "hunter2"


@pytest.mark.parametrize("text", [
    f"postgresql+psycopg://alice:{PW}@db.example:5432/tuning",
    f"postgresql+psycopg://alice@db.example/tuning?password={PW}&sslmode=require",
    f"postgresql://alice@db.example/tuning?sslpassword={PW}",
    f"host=db.example user=alice password={PW} dbname=tuning",
    f"postgresql+psycopg://alice:{PW}@db.example:notaport/tuning",
])  # fmt: skip
def test_every_form_of_password_is_redacted(text):
    assert PW not in redact(text)


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error:"), err
    return err


def test_bad_database_arguments_exit_2_with_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("NIGHTSHIFT_DB", raising=False)
    typo = tmp_path / "typo.db"
    assert cli.main(["compile", "--model", "tiny", "--db", str(typo), "-o", str(tmp_path / "x.so")]) == 2
    assert "no tuning database" in _one_line_error(capsys) and not typo.exists()
    assert cli.main(["db", "upgrade", "--db", str(typo)]) == 2
    assert "no tuning database" in _one_line_error(capsys) and not typo.exists()
    for url, says in ((f"postgresql+psycopg2://alice:{PW}@127.0.0.1/x", "not installed"),
                      (f"postgresql://alice:{PW}@127.0.0.1:port/x", "not a database URL"),
                      (f"mysql://alice:{PW}@127.0.0.1/x", "unsupported")):  # fmt: skip
        assert cli.main(["db", "stats", "--db", url]) == 2
        err = capsys.readouterr().err
        assert says in err and PW not in err and err.count("error:") == 1
    # Only `db init` (and tune) create a database.
    assert cli.main(["db", "init", "--db", str(typo)]) == 0 and typo.exists()
    # --older-than takes a duration as tune's --time-budget does; a plain number is still days.
    for age in ("30d", "12h", "7"):
        assert cli.main(["db", "prune", "--db", str(typo), "--older-than", age, "--dry-run"]) == 0
        assert "would delete 0 records" in capsys.readouterr().out
    assert cli.main(["db", "prune", "--db", str(typo), "--older-than", "soon"]) == 2
    assert "--older-than must be a duration such as 30d, 7d or 12h (a plain number: days)" in _one_line_error(capsys)


def test_config_values_are_typed_and_the_command_line_wins(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('model = "tiny"\ntrials = "many"\n')
    assert cli.main(["tune", "--config", str(bad)]) == 2
    assert "'trials' must be a positive integer" in _one_line_error(capsys)
    good = tmp_path / "good.toml"
    good.write_text('model = "tiny"\nseed = 5\ntrials = 8\n')
    args = cli.build_parser("nightshift").parse_args(["tune", "--config", str(good), "--seed", "0"])
    from tuner.config import apply_config

    apply_config(args)
    assert (args.seed, args.trials) == (0, 8)


def test_url_from_environment_file_and_pgpass(pg_password_url, tmp_path, capsys, monkeypatch):
    """A password-checking server reached with no password on any command line."""
    url = sa.make_url(pg_password_url)
    bare = url.set(password=None).render_as_string(hide_password=False)
    pgpass = tmp_path / "pgpass"
    pgpass.write_text(f"{url.host}:{url.port}:*:{url.username}:{url.password}\n")
    pgpass.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(pgpass))
    monkeypatch.delenv("NIGHTSHIFT_DB", raising=False)
    url_file = tmp_path / "db-url"
    url_file.write_text(bare + "\n")
    monkeypatch.setenv("NIGHTSHIFT_DB_FILE", str(url_file))
    assert cli.main(["db", "init"]) == 0
    assert cli.main(["db", "stats"]) == 0
    out = capsys.readouterr()
    assert "schema" in out.out and url.password not in out.out + out.err
    # The full URL in the environment works too; a wrong password fails in one line, redacted.
    monkeypatch.delenv("PGPASSFILE")
    monkeypatch.setenv("NIGHTSHIFT_DB", url.set(password="wrong-pw").render_as_string(hide_password=False))
    assert cli.main(["db", "stats"]) == 2
    err = _one_line_error(capsys)
    assert "password" in err and "wrong-pw" not in err
    # A password on the command line works, with a warning that it is visible there.
    assert cli.main(["db", "stats", "--db", pg_password_url]) == 0
    err = capsys.readouterr().err
    assert "warning" in err and url.password not in err


def test_coverage_and_compile_verify(tmp_path, cpu_device, capsys, monkeypatch):
    monkeypatch.delenv("NIGHTSHIFT_DB", raising=False)
    path = tmp_path / "team.db"
    db = TuningDatabase(str(path))
    spec = load_model("tiny")
    tasks = extract_tasks(spec.bound(), cpu_device.target)
    dev = db.device_id(cpu_device)
    # One operator has a record (its fallback schedule, timed as a job would store it).
    t = tasks[0]
    from tvm.s_tir.meta_schedule.database import Workload

    db.workload_id(t.workload_key, t.name, t.mod, t.flops)
    record, _ = fallback_record(Workload(t.mod), cpu_device.target)
    db.add_records(dev, None, [NewRecord(t.workload_key, "fallback", json.dumps(record.as_json()), [1e-3])])
    assert cli.main(["db", "coverage", "--db", str(path), "--model", "tiny"]) == 0
    out = capsys.readouterr().out
    from tuner.graph.layout.plan import LayoutPlan

    plan = LayoutPlan.for_target(cpu_device.target)
    assert f"1 of {len(tasks)} operators (the {plan} plan's tasks) tuned" in " ".join(out.split()), out
    assert "untuned" in out

    # compile checks the output against the untuned build by default for a small model...
    lib = tmp_path / "tiny.so"
    assert cli.main(["compile", "--model", "tiny", "--db", str(path), "-o", str(lib)]) == 0
    assert "output checked against the untuned build" in capsys.readouterr().out and lib.exists()
    # ...and a build whose output differs is caught (a reference with other weights).
    compiled = compile_model(spec, cpu_device, db)
    other = dataclasses.replace(spec, params={k: v * 1.5 for k, v in spec.params.items()})
    assert verify_model(spec, cpu_device, compiled) is None
    assert verify_model(spec, cpu_device, compiled, reference=compile_model(other, cpu_device, None)) > 1e-2

