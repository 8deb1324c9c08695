"""Schema versions of the tuning database: check, create and upgrade through alembic.

The migrations live in ``tuner/db/migrations`` (package data). A database is one of:
empty (created on first use), current, outdated (refused with the exact upgrade command),
newer than this Nightshift (refused), or a Nightshift 0.1 database made before migrations
existed (recognised by its ``nightshift_meta`` row and treated as revision 0001).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import URL, Connection, Engine

from tuner.errors import DatabaseError

logger = logging.getLogger(__name__)

_MIGRATIONS = Path(__file__).parent / "migrations"
# Revision of the schema that Nightshift 0.1 created with create_all, before alembic.
_LEGACY_REVISION = "0001"
# Serializes concurrent `init`/first use of one PostgreSQL database (any fixed 64-bit number).
_PG_LOCK_ID = 0x6E_69_67_68_74_73_68  # "nightsh"


@dataclass(frozen=True)
class SchemaState:
    """Where a database stands: its revision (None when empty) and this code's head."""

    revision: str | None
    head: str
    legacy: bool = False

    @property
    def current(self) -> bool:
        return self.revision == self.head


def _config(conn: Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    if conn is not None:
        cfg.attributes["connection"] = conn
    return cfg


@cache
def _scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(_config())


def head_revision() -> str:
    """The newest revision this Nightshift knows."""
    head = _scripts().get_current_head()
    assert head is not None  # the package ships at least one migration
    return head


def known_revisions() -> list[str]:
    """Every revision this Nightshift knows, oldest first."""
    return [s.revision for s in reversed(list(_scripts().walk_revisions()))]


def upgrade_command(url: URL) -> str:
    """The exact command that upgrades ``url``, password hidden."""
    if url.get_backend_name() == "sqlite" and url.database:
        return f"nightshift db upgrade --db {url.database}"
    return f"nightshift db upgrade --db {_shown(url)}"


def schema_state(conn: Connection) -> SchemaState:
    """Read the schema revision of the database behind ``conn``."""
    revision = MigrationContext.configure(conn).get_current_revision()
    if revision is not None:
        return SchemaState(revision, head_revision())
    tables = set(sa.inspect(conn).get_table_names())
    if "nightshift_meta" in tables:
        value = conn.execute(sa.text("SELECT value FROM nightshift_meta WHERE key = 'schema_version'")).scalar()
        if value == "1":
            return SchemaState(_LEGACY_REVISION, head_revision(), legacy=True)
        return SchemaState(f"schema_version={value}", head_revision(), legacy=True)
    ours = {"records", "workloads", "devices", "jobs"}
    if tables & ours:
        raise DatabaseError(
            f"the database has tables {sorted(tables & ours)} but no Nightshift schema version; "
            "it is not a Nightshift tuning database, pass another --db"
        )
    return SchemaState(None, head_revision())


def check(engine: Engine, url: URL, *, create: bool) -> SchemaState:
    """Make sure the database is usable by this Nightshift.

    An empty database gets the newest schema when ``create`` is true.

    Raises:
        DatabaseError: the schema is outdated (the message has the upgrade command), newer
            than this Nightshift, absent with ``create`` false, or not Nightshift's.
    """
    with engine.connect() as conn:
        state = schema_state(conn.execution_options(nightshift_write=False))
    if state.current:
        return state
    # Anything else is decided again under the migration lock: another process's first use
    # may commit the schema between the reads of schema_state (seen as a bogus legacy state).
    if create:
        return upgrade(engine, url, only_if_empty=True)
    with _locked(engine) as conn:
        state = schema_state(conn)
    if state.revision is None:
        raise DatabaseError(f"{_shown(url)} has no tuning schema; run `nightshift db init --db {_db_arg(url)}`")
    _refuse_unusable(state, url)
    return state


@contextlib.contextmanager
def _locked(engine: Engine) -> Iterator[Connection]:
    """A transaction that holds the migration lock of the database."""
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:id)"), {"id": _PG_LOCK_ID})
        # SQLite: the engine opens write transactions with BEGIN IMMEDIATE, which is the lock.
        yield conn


def _refuse_unusable(state: SchemaState, url: URL) -> None:
    if state.revision not in known_revisions():
        raise DatabaseError(
            f"tuning database {_shown(url)} has schema {state.revision}, newer than this Nightshift's "
            f"{state.head}; upgrade Nightshift (pip install -U nightshift) to use it"
        )
    if not state.current:
        raise DatabaseError(
            f"tuning database {_shown(url)} has schema {state.revision}, older than {state.head}; "
            f"back it up, then run `{upgrade_command(url)}`"
        )


def upgrade(engine: Engine, url: URL, *, only_if_empty: bool = False, to: str = "head") -> SchemaState:
    """Migrate the database to revision ``to`` (the newest), in one transaction, under a lock.

    With ``only_if_empty`` (first use), a database that another process initialised
    meanwhile is checked instead of migrated.

    Raises:
        DatabaseError: the schema is newer than this Nightshift, or not Nightshift's.
    """
    with _locked(engine) as conn:
        state = schema_state(conn)
        if state.revision is not None and only_if_empty:
            _refuse_unusable(state, url)
            return state
        if state.revision is not None and state.revision not in known_revisions():
            _refuse_unusable(state, url)
        target = state.head if to == "head" else to
        if state.revision == target:
            return state
        cfg = _config(conn)
        if state.legacy:
            logger.info("stamping pre-migration database %s as revision %s", _shown(url), _LEGACY_REVISION)
            command.stamp(cfg, _LEGACY_REVISION)
        logger.info("migrating %s from %s to %s", _shown(url), state.revision or "empty", target)
        command.upgrade(cfg, target)
        return SchemaState(target, state.head)


def _shown(url: URL) -> str:
    from tuner.db.database import redact  # (database imports this module)

    return redact(url)


def _db_arg(url: URL) -> str:
    if url.get_backend_name() == "sqlite" and url.database:
        return url.database
    return _shown(url)
