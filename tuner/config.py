"""``tune``'s options from a TOML file: read, validated key by key, merged under the command line.

Every ``tune`` option can come from a config file (``configs/`` ships some). Values are
checked when the file is loaded, and an error names the file and the key. Options given on
the command line win over the file, the file over the defaults.
"""

from __future__ import annotations

import argparse
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuner.errors import UserInputError
from tuner.precision import PRECISIONS

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_UNIT_NAMES = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])")


def parse_duration(text: str | float | int, *, what: str = "--time-budget", plain: str = "s") -> float:
    """Seconds of a duration: ``90s``, ``45m``, ``2h``, ``1h30m``, ``8h``, ``30d``, or a plain
    number in the unit ``plain`` (seconds for ``--time-budget``; days for ``--older-than``, as
    before it took units). Every command's durations go through here, so they read alike.

    Raises:
        UserInputError: not a positive duration.
    """
    if plain not in _UNITS:
        raise ValueError(f"plain must be one of {', '.join(_UNITS)}, got {plain!r}")
    hint = ("a duration such as 45m, 2h or 90s" if plain == "s" else
            f"a duration such as 30d, 7d or 12h (a plain number: {_UNIT_NAMES[plain]})")  # fmt: skip
    if isinstance(text, bool):
        raise UserInputError(f"{what} must be {hint}, got {text!r}")
    if isinstance(text, int | float):
        seconds = float(text) * _UNITS[plain]
    else:
        s = text.strip().lower().replace(" ", "")
        if re.fullmatch(r"\d+(\.\d+)?", s):
            seconds = float(s) * _UNITS[plain]
        elif s and re.fullmatch(rf"(?:{_DURATION.pattern})+", s):
            seconds = sum(float(n) * _UNITS[u] for n, u in _DURATION.findall(s))
        else:
            raise UserInputError(f"{what} must be {hint}, got {text!r}")
    if not seconds > 0:
        raise UserInputError(f"{what} must be positive, got {text!r}")
    return seconds


def seconds_arg(text: str) -> float:
    """``argparse`` type of an option in seconds (``--build-timeout``): ``90``, ``90s``, ``2m``.

    Raises:
        argparse.ArgumentTypeError: not a positive duration (argparse names the option).
    """
    try:
        return parse_duration(text, what="the value")
    except UserInputError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def _str(v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise ValueError("must be a non-empty string")
    return v


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError("must be true or false")
    return v


def _pos_int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError("must be a positive integer")
    return v


def _nonneg_int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError("must be an integer >= 0")
    return v


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError("must be an integer")
    return v


def _seconds(v: Any) -> float:
    # A number of seconds, or a duration string as on the command line ("90s", "2m").
    try:
        return parse_duration(v, what="the value")
    except UserInputError as err:
        raise ValueError("must be a positive number of seconds or a duration such as 90s or 2m") from err


def _duration(v: Any) -> str:
    try:
        parse_duration(v)
    except UserInputError as err:
        raise ValueError("must be a duration such as 45m, 2h or 90s") from err
    return str(v) if isinstance(v, str) else f"{float(v)}s"


def _choice(*options: str) -> Callable[[Any], str]:
    def check(v: Any) -> str:
        if v not in options:
            raise ValueError(f"must be one of {', '.join(options)}")
        return v

    return check


def _strategy(v: Any) -> str:
    from tuner import search

    if v not in search.strategies():
        raise ValueError(f"must be one of {', '.join(search.strategies())}")
    return v


def _db(v: Any) -> str:
    from sqlalchemy.engine import make_url

    v = _str(v)
    if "://" in v:
        try:
            url = make_url(v)
        except Exception as err:
            raise ValueError("is not a database URL") from err
        if url.password:
            # Config files get committed and shared; a password belongs in the environment.
            raise ValueError("must not hold a password: set $NIGHTSHIFT_DB or use ~/.pgpass")
    return v


#: Every key a config file may hold, with its check. Keys are ``tune``'s long options with
#: ``_`` (``-`` is accepted too).
OPTIONS: dict[str, Callable[[Any], Any]] = {
    "model": _str,
    "device": _str,
    "target_arch": _str,
    "num_cores": _pos_int,
    "batch_size": _pos_int,
    "seq_len": _pos_int,
    "image_size": _pos_int,
    "dtype": _str,
    "layout": _choice("auto", "NCHW", "NHWC", "NCHWc", "NCHWc:w4", "NCHWc:w2"),
    "precision": _choice(*PRECISIONS),
    "accuracy_inputs": _pos_int,
    "calibration": _pos_int,
    "quantize_ops": _str,
    "db": _db,
    "job": _str,
    "time_budget": _duration,
    "trials": _pos_int,
    "trials_per_batch": _pos_int,
    "build_timeout": _seconds,
    "timing": _choice("warm", "cold"),
    "seed": _int,
    "strategy": _strategy,
    "cost_model": _choice("pretrained", "online", "none"),
    "scheduler": _choice("gradient", "round-robin"),
    "fresh": _bool,
    "skip_after": _nonneg_int,
    "rerank_top": _nonneg_int,
    "ray_address": _str,
    "measurer": _choice("ray", "inline"),
    "output": _str,
    "no_verify": _bool,
    "quiet": _bool,
    "log_json": _str,
    "verbose": _bool,
}

#: Values of options that neither the command line nor the config file gives.
DEFAULTS: dict[str, Any] = {
    "device": "cpu", "batch_size": 1, "dtype": "float32", "trials_per_batch": 16, "build_timeout": 60.0,
    "seed": 0, "strategy": "evolutionary", "cost_model": "pretrained", "skip_after": 512, "rerank_top": 4,
    "scheduler": "gradient", "fresh": False, "no_verify": False,
    "quiet": False, "verbose": False, "precision": "fp32", "accuracy_inputs": 8,
    "calibration": 32, "measurer": "ray",
}  # fmt: skip

_PATHS = ("output", "log_json")


def _redact(text: str) -> str:
    from tuner.db.url import redact

    return repr(redact(text))


def load_config(path: Path) -> dict[str, Any]:
    """The validated options of a TOML config file, keys with ``_``.

    Raises:
        UserInputError: the file cannot be read or parsed, a key is unknown, or a value is
            of the wrong type or out of range (the message names the key).
    """
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as err:
        raise UserInputError(f"cannot read config {path}: {err.strerror}") from err
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise UserInputError(f"config {path} is not valid TOML: {err}") from err
    values: dict[str, Any] = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        check = OPTIONS.get(name)
        if check is None:
            raise UserInputError(f"config {path}: unknown key {key!r} (known: {', '.join(OPTIONS)})")
        try:
            values[name] = check(value)
        except ValueError as err:
            shown = _redact(value) if name == "db" and isinstance(value, str) else repr(value)
            raise UserInputError(f"config {path}: key {key!r} {err}, got {shown}") from err
    return values


def apply_config(args: argparse.Namespace) -> None:
    """Fill ``args`` from ``args.config`` and :data:`DEFAULTS`: an option given on the
    command line (any value other than None, ``0`` and ``False`` included) wins.

    Raises:
        UserInputError: see :func:`load_config`; or no model was given anywhere.
    """
    values = load_config(args.config) if getattr(args, "config", None) is not None else {}
    for key, value in values.items():
        if getattr(args, key, None) is None:
            setattr(args, key, Path(value) if key in _PATHS else value)
    for key, value in DEFAULTS.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if not args.model:
        raise UserInputError("no model: pass --model NAME|FILE.onnx|package.module:factory or a --config with one")
