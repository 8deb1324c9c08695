"""Database URLs: what ``--db`` and ``$NIGHTSHIFT_DB`` may say, and the same URL with its password hidden."""

from __future__ import annotations

import logging
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from tuner.errors import UserInputError

logger = logging.getLogger(__name__)
#: What a hidden password reads as (SQLAlchemy's own rendering).
REDACTED = "***"
_SECRET_PARAMS = {"password", "passwd", "pwd", "sslpassword", "sslkey_password", "secret", "token"}
_SECRET_RE = re.compile(r"(?i)\b(password|passwd|pwd|sslpassword|secret|token)(\s*=\s*)('[^']*'|[^\s&;]+)")
_USERINFO_RE = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^/@\s:]*):([^/@\s]*)@")


def database_url(text: str) -> URL:
    """A SQLAlchemy URL from a URL or a plain file path (SQLite).

    Raises:
        UserInputError: the URL is malformed or the SQLite file's folder is not writable.
    """
    try:
        url = make_url(text) if "://" in text else make_url(f"sqlite:///{Path(text).resolve()}")
        url.port  # noqa: B018 (parsing the port raises on a non-number)
    except (ArgumentError, ValueError) as err:
        raise UserInputError(f"database {_redact_text(text)!r} is not a database URL or file path "
                             f"({_redact_text(_first_line(err))})") from err
    backend = url.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise UserInputError(
            f"--db {redact(url)}: unsupported database {backend!r}; use a SQLite file path or "
            "postgresql+psycopg://user@host/db"
        )
    if backend == "postgresql" and url.drivername == "postgresql":
        # psycopg 3 is what Nightshift installs; plain postgresql:// would ask for psycopg2.
        url = url.set(drivername="postgresql+psycopg")
    if backend == "sqlite" and url.database not in (None, "", ":memory:"):
        if Path(url.database).is_dir():
            raise UserInputError(f"--db {url.database} is a folder; pass a database file such as "
                                 f"{Path(url.database) / 'nightshift.db'}")  # fmt: skip
        folder = Path(url.database).resolve().parent
        if not folder.is_dir():
            raise UserInputError(f"database folder {folder} does not exist; create it or pass another --db")
        try:
            # A unique name: several processes open the same database at once.
            with tempfile.NamedTemporaryFile(dir=folder, prefix=".nightshift-write-test-"):
                pass
        except OSError as err:
            raise UserInputError(
                f"cannot write the database in {folder} ({err.strerror}); pass a writable --db path"
            ) from err
    return url


def redact(url: URL | str) -> str:
    """The URL as text with every password hidden: in the user info, in query parameters
    (``?password=``, ``sslpassword``...), and in libpq ``key=value`` strings."""
    if isinstance(url, str):
        try:
            url = make_url(url)
        except (ArgumentError, ValueError):
            return _redact_text(url)
    if url.query:
        url = url.update_query_dict(
            {k: "***" for k in url.query if k.lower() in _SECRET_PARAMS}, append=False)  # fmt: skip
    return _redact_text(url.render_as_string(hide_password=True))


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A command line with every password in it hidden (``--db postgresql://u:***@h/db``): what
    may be printed, or handed to Ray's Jobs API, whose job list keeps the entrypoint."""
    return [_redact_text(arg) for arg in argv]


def with_password(text: str, source: str | None) -> str:
    """``text`` with a hidden password (``***``, as :func:`redact_argv` leaves it) restored.

    The password comes from ``source`` (``$NIGHTSHIFT_DB`` on the machine that runs the
    command) when it names the same user, server and database; otherwise it is dropped, and
    libpq looks it up itself (``~/.pgpass``, ``PGPASSFILE``, ``PGPASSWORD``). Any other text
    is returned as it is.
    """
    if "://" not in text:
        return text
    try:
        url = make_url(text)
    except (ArgumentError, ValueError):
        return text
    if url.password != REDACTED:
        return text
    password = None
    if source and "://" in source:
        try:
            other = make_url(source)
        except (ArgumentError, ValueError):
            other = None
        same = other is not None and (other.get_backend_name(), other.username, other.host, other.port,
                                      other.database) == (url.get_backend_name(), url.username, url.host,
                                                          url.port, url.database)  # fmt: skip
        if same and other is not None and other.password not in (None, REDACTED):
            password = other.password
    # URL.set() takes None as "unchanged"; the named tuple's _replace clears it.
    return url._replace(password=password).render_as_string(hide_password=False)


def _redact_text(text: str) -> str:
    # Any text that may hold a URL or DSN: user:password@ and password=... wherever they are.
    text = _USERINFO_RE.sub(lambda m: f"{m[1]}{m[2]}:***@" if m[3] != "***" else m[0], text)
    return _SECRET_RE.sub(lambda m: f"{m[1]}{m[2]}***" if m[3] != "***" else m[0], text)


def _first_line(err: object) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__
