"""Checks every entry point makes before any work: an output path that can be written, a
database that can be reached, the model's tasks extracted with TVM's failure said in one line.

Shared by the command line (``tuner.cli``) and the Python API (``tuner.api``); nothing here
prints. The database's location from the environment (:func:`environment_db`) is read only
when an entry point asks for it: the library below never reads the environment.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.errors import NightshiftError, UserInputError

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

    from tuner.app.model import LoadedModel
    from tuner.db import TuningDatabase
    from tuner.graph.tasks import Task

logger = logging.getLogger(__name__)

DEFAULT_DB = "nightshift.db"
DB_ENV = "NIGHTSHIFT_DB"
DB_FILE_ENV = "NIGHTSHIFT_DB_FILE"


def environment_db() -> str | None:
    """``$NIGHTSHIFT_DB``, else the first line of the file ``$NIGHTSHIFT_DB_FILE``, else None.

    Raises:
        UserInputError: ``$NIGHTSHIFT_DB_FILE`` names a file that cannot be read or is empty.
    """
    if os.environ.get(DB_ENV):
        return os.environ[DB_ENV]
    path = os.environ.get(DB_FILE_ENV)
    if not path:
        return None
    try:
        text = next((ln.strip() for ln in Path(path).read_text().splitlines() if ln.strip()), "")
    except OSError as err:
        raise UserInputError(f"${DB_FILE_ENV}: cannot read {path} ({err.strerror})") from err
    if not text:
        raise UserInputError(f"${DB_FILE_ENV}: {path} is empty; write the database URL in it")
    return text


def check_output(path: Path, option: str = "-o", *, artifact: bool | None = None) -> None:
    """Refuse an output path that cannot be written, before any work: an artifact ``X.so``
    (``X.json`` beside it) or a folder (created), or another file (``--json``). ``option``
    names the path in the message; ``artifact`` (default: ``option`` is ``-o``) says it is
    an artifact's.

    Raises:
        UserInputError: its folder does not exist or cannot be written, or the path is a
            folder where a file is wanted (or the reverse).
    """
    artifact_folder = (option == "-o" if artifact is None else artifact) and path.suffix != ".so"
    if artifact_folder and path.exists() and not path.is_dir():
        raise UserInputError(f"{option} {path} is a file; an artifact is X.so or a folder: pass another {option}")
    if not artifact_folder and path.is_dir():
        raise UserInputError(f"{option} {path} is a folder; pass a file path such as {path / 'model.so'}"
                             if option == "-o" or artifact else f"{option} {path} is a folder; pass a file path")
    # A folder artifact is created by the writer: its parent must exist; a file's folder must.
    folder = path if artifact_folder and path.is_dir() else path.resolve().parent
    if not folder.is_dir():
        raise UserInputError(f"{option} {path}: folder {folder} does not exist; create it or pass another {option}")
    try:
        # What the export does, minutes or hours later: create a file there (/proc refuses).
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".nightshift-write-test-"):
            pass
    except OSError as err:
        raise UserInputError(f"{option} {path}: cannot write in {folder} ({err.strerror}); "
                             f"pass a writable {option}") from err


def check_db(text: str) -> URL:
    """The URL of ``text``, checked before any work and without creating anything: a SQLite
    file's folder is writable and the path is not a folder; a PostgreSQL server answers.

    Raises:
        UserInputError: a malformed URL or an unusable SQLite path.
        DatabaseError: the PostgreSQL server cannot be reached or refuses the login.
    """
    from tuner.db import database_url
    from tuner.db.store import check_reachable

    url = database_url(text)
    if url.get_backend_name() == "postgresql":
        check_reachable(url)
    return url


def open_existing(text_or_url: str | URL, *, create: bool = False) -> TuningDatabase:
    """Open the tuning database; only with ``create`` may a missing SQLite file or an empty
    database be initialised (``tune`` and ``db init``), else a one-line error says so."""
    from tuner.db import TuningDatabase, database_url

    url = database_url(text_or_url) if isinstance(text_or_url, str) else text_or_url
    if not create and url.get_backend_name() == "sqlite" and url.database and not Path(url.database).exists():
        # Connecting would leave an empty file behind.
        raise UserInputError(f"no tuning database at {url.database}; run `nightshift db init --db {url.database}` "
                             "or pass another --db")
    return TuningDatabase(url, create=create)


def extract_tasks(loaded: LoadedModel) -> list[Task]:
    """The model's tasks (:meth:`LoadedModel.tasks`); TVM's failure in its graph passes
    becomes one line that says which layout failed and what to try.

    Raises:
        UserInputError: TVM's graph passes or task extraction failed (the cause is chained:
            ``-v`` shows its trace).
    """
    try:
        return loaded.tasks()
    except (NightshiftError, KeyboardInterrupt):
        raise
    except Exception as err:
        layout = loaded.options.layout
        other = "--layout NCHW" if layout != "NCHW" else "another --layout"
        raise UserInputError(
            f"{loaded.spec.name}: TVM's graph passes failed under --layout {layout} ({one_line(err)}); "
            f"try {other}, or run again with -v for the trace and report it with the model"
        ) from err


def one_line(err: BaseException) -> str:
    """``Type: the message's last line`` (TVM's errors end with the check that failed)."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    name = type(err).__name__
    # TVM's own last line often names the type already ("InternalError: Check failed: ...").
    text = (lines[-1] if lines[-1].startswith(f"{name}:") else f"{name}: {lines[-1]}") if lines else name
    return text if len(text) <= 300 else text[:297] + "..."
