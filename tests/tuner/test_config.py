"""Config files of ``tune``: durations, validation naming the key, the command line winning."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.cli.tune import _add_tune_args
from tuner.config import apply_config, load_config, parse_duration
from tuner.errors import UserInputError

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize(("text", "seconds"), [
    ("90s", 90), ("45m", 2700), ("2h", 7200), ("8h", 28800), ("1h30m", 5400), ("1.5h", 5400), ("600", 600),
    (120, 120), (" 2H ", 7200),
])  # fmt: skip
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(("text", "seconds"), [("30d", 30 * 86400), ("12h", 43200), ("7", 7 * 86400), (1.5, 129600)])
def test_durations_whose_plain_number_is_days(text, seconds):
    """db prune --older-than: the same syntax as --time-budget, a plain number in days as before."""
    assert parse_duration(text, what="--older-than", plain="d") == seconds


@pytest.mark.parametrize("text", ["", "abc", "5x", "-5m", "0s", "h", "5m3", True])
def test_bad_durations(text):
    with pytest.raises(UserInputError, match="--time-budget"):
        parse_duration(text)


@pytest.mark.parametrize(("body", "key", "expect"), [
    ('trials = "ten"', "trials", "positive integer"),
    ("trials = 0", "trials", "positive integer"),
    ('time_budget = "soon"', "time_budget", "duration"),
    ('strategy = "annealing"', "strategy", "evolutionary"),
    ('scheduler = "fifo"', "scheduler", "round-robin"),
    ('layout = "NCWH"', "layout", "NCHWc"),
    ('fresh = "yes"', "fresh", "true or false"),
    ("seed = 1.5", "seed", "integer"),
    ('db = "postgresql+psycopg://bob:hunter2@db/x"', "db", "password"),
    ("trails = 5", "trails", "unknown key"),
])  # fmt: skip
def test_validation_names_the_key(tmp_path, body, key, expect):
    path = tmp_path / "c.toml"
    path.write_text(f'model = "tiny"\n{body}\n')
    with pytest.raises(UserInputError) as err:
        load_config(path)
    assert f"'{key}'" in str(err.value) and expect in str(err.value)
    assert "hunter2" not in str(err.value)


def test_unparsable_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("model = \n")
    with pytest.raises(UserInputError, match="not valid TOML"):
        load_config(path)
    with pytest.raises(UserInputError, match="cannot read config"):
        load_config(tmp_path / "missing.toml")


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.toml")), ids=lambda p: p.name)
def test_shipped_configs_load(path):
    values = load_config(path)
    assert values["model"]
    assert "password" not in path.read_text().lower() or "db" not in values


def test_shipped_configs_cover_the_issue():
    names = {p.name for p in CONFIGS.glob("*.toml")}
    assert {"resnet50-cpu.toml", "resnet50-cuda.toml", "bert-base-cpu.toml", "team-cluster.toml"} <= names
    team = load_config(CONFIGS / "team-cluster.toml")
    assert "db" not in team and team["ray_address"] == "auto"  # the URL comes from $NIGHTSHIFT_DB


def _parse(argv: list[str]):
    import argparse

    p = argparse.ArgumentParser()
    _add_tune_args(p)
    args = p.parse_args(argv)
    apply_config(args)
    return args


def test_command_line_wins_even_with_zero_and_false(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('model = "tiny"\nseed = 5\ntrials = 40\nbatch_size = 2\ntime_budget = "2h"\n'
                    'skip_after = 100\noutput = "m.so"\n')  # fmt: skip
    args = _parse(["--config", str(path), "--seed", "0", "--skip-after", "0", "--trials", "8"])
    assert (args.seed, args.skip_after, args.trials) == (0, 0, 8)
    assert (args.batch_size, args.time_budget, args.output) == (2, "2h", Path("m.so"))
    # Unset everywhere: the defaults.
    assert (args.device, args.dtype, args.trials_per_batch, args.fresh, args.quiet) == ("cpu", "float32", 16,
                                                                                       False, False)  # fmt: skip


def test_cli_config_error_is_one_line_exit_2(tmp_path):
    (tmp_path / "bad.toml").write_text('model = "tiny"\ntrials_per_batch = -4\n')
    env = os.environ | {"COLUMNS": "200", "NO_COLOR": "1"}
    proc = subprocess.run([str(Path(sys.executable).parent / "tune"), "--config", "bad.toml"], cwd=tmp_path,
                          capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "trials_per_batch" in lines[0] and "positive integer" in lines[0], proc.stderr
    proc = subprocess.run([str(Path(sys.executable).parent / "tune"), "--model", "tiny", "--time-budget", "soon"],
                          cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and "--time-budget must be a duration" in proc.stderr, proc.stderr
