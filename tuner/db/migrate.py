"""Schema versions of the tuning database: check, create and upgrade through alembic.

The migrations live in ``tuner/db/migrations`` (package data). A database is one of:
empty (created on first use), current, outdated (refused with the exact upgrade command),
newer than this Nightshift (refused), or a Nightshift 0.1 database made before migrations
existed (recognised by its ``nightshift_meta`` row and treated as revision 0001).

Nightshift's revision lives in its own table, ``nightshift_alembic_version``: alembic's default
``alembic_version`` belongs to Optuna, whose studies share the database
(``tuner.search.optuna_search``). Databases made before kept Nightshift's revision in
``alembic_version``; the first use of a current one moves it (``db upgrade`` moves an outdated
one), under the migration lock. A revision there that is not Nightshift's is never read as one.
"""

from __future__ import annotations

import ast
import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine

from tuner.errors import DatabaseError

# Alembic (and the PostgreSQL dialect it loads) is imported where a schema is created, moved
# or upgraded: opening a current database, as every read-only command does (``jobs``,
# ``db stats``), reads the revision with plain SQL and the head from the migration files.
if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

logger = logging.getLogger(__name__)

_MIGRATIONS = Path(__file__).parent / "migrations"
#: Alembic's table of Nightshift's schema revision (the migrations' env.py writes it).
VERSION_TABLE = "nightshift_alembic_version"
# Alembic's default table: Optuna's revision, and Nightshift's before it had its own table.
_SHARED_VERSION_TABLE = "alembic_version"
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
    #: The revision is still in ``alembic_version``, where Nightshift kept it before.
    in_shared_table: bool = False
    #: After :func:`upgrade`: the revision it found, under its lock (None: an empty database).
    was: str | None = None

    @property
    def current(self) -> bool:
        return self.revision == self.head


def _config(conn: Connection | None = None) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    if conn is not None:
        cfg.attributes["connection"] = conn
    return cfg


@cache
def _scripts() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_config())


@cache
def head_revision() -> str:
    """The newest revision this Nightshift knows: the one no migration names as its
    ``down_revision``.

    Read from the migration files' assignments rather than through alembic's
    ``ScriptDirectory``, whose import costs every command that opens the database a fifth
    of a second; a chain this cannot read as one head is left to alembic.
    """
    revisions: set[str] = set()
    parents: set[str] = set()
    for path in sorted((_MIGRATIONS / "versions").glob("*.py")):
        values = {t.id: n.value.value for n in ast.parse(path.read_text()).body if isinstance(n, ast.Assign)
                  for t in n.targets if isinstance(t, ast.Name) and isinstance(n.value, ast.Constant)}  # fmt: skip
        if isinstance(values.get("revision"), str):
            revisions.add(values["revision"])
            if isinstance(values.get("down_revision"), str):
                parents.add(values["down_revision"])
    heads = revisions - parents
    if len(heads) == 1:
        return heads.pop()
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
    tables = set(sa.inspect(conn).get_table_names())
    revision = _own_revision(conn, tables)
    if revision is not None:
        return SchemaState(revision, head_revision())
    if _SHARED_VERSION_TABLE in tables:
        # Only a revision Nightshift knows is its own: Optuna's (v3.2.0.a...) is not, and a
        # Nightshift newer than this one writes its own table.
        known = set(known_revisions())
        rows = conn.execute(sa.text(f"SELECT version_num FROM {_SHARED_VERSION_TABLE}")).scalars()
        ours = [r for r in rows if r in known]
        if ours:
            return SchemaState(ours[0], head_revision(), in_shared_table=True)
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

    An empty database gets the newest schema when ``create`` is true. A current revision
    that an earlier Nightshift kept in ``alembic_version`` is moved to ``VERSION_TABLE``.

    Raises:
        DatabaseError: the schema is outdated (the message has the upgrade command), newer
            than this Nightshift, absent with ``create`` false, or not Nightshift's.
    """
    with engine.connect() as conn:
        revision = _own_revision(conn.execution_options(nightshift_write=False))
    if revision == head_revision():
        return SchemaState(revision, revision)
    # Anything else is decided under the migration lock: another process's first use may
    # commit the schema, or move the revision and drop alembic_version, between two reads.
    if create:
        return upgrade(engine, url, only_if_empty=True)
    with _locked(engine) as conn:
        state = schema_state(conn)
        if state.revision is None:
            raise DatabaseError(f"{_shown(url)} has no tuning schema; run `nightshift db init --db {_db_arg(url)}`")
        return _settle(conn, state, url)


def _own_revision(conn: Connection, tables: set[str] | None = None) -> str | None:
    """The revision in Nightshift's own version table (None: no table, or no row)."""
    if tables is None:
        tables = set(sa.inspect(conn).get_table_names())
    if VERSION_TABLE not in tables:
        return None
    # What alembic's MigrationContext.get_current_revision reads, without importing alembic.
    rows = conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    if len(rows) > 1:  # several heads: alembic's own error says so
        from alembic.runtime.migration import MigrationContext

        return MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()
    return rows[0] if rows else None


def _settle(conn: Connection, state: SchemaState, url: URL) -> SchemaState:
    """Under the lock: a current revision still in ``alembic_version`` is moved to
    Nightshift's table (first use after the move); an unusable schema is refused."""
    if state.in_shared_table and state.current:
        state = _move_revision(conn, state, url)
    _refuse_unusable(state, url)
    return state


def _move_revision(conn: Connection, state: SchemaState, url: URL) -> SchemaState:
    """Move Nightshift's revision from ``alembic_version`` to its own table, under the lock."""
    assert state.revision is not None and state.in_shared_table
    logger.info("moving schema revision %s of %s from %s to %s", state.revision, _shown(url),
                _SHARED_VERSION_TABLE, VERSION_TABLE)  # fmt: skip
    from alembic.runtime.migration import MigrationContext

    MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).stamp(_scripts(), state.revision)
    conn.execute(sa.text(f"DELETE FROM {_SHARED_VERSION_TABLE} WHERE version_num = :rev"), {"rev": state.revision})
    # Dropped only when empty: another alembic user's row (Optuna's) stays where it expects it.
    if not conn.execute(sa.text(f"SELECT count(*) FROM {_SHARED_VERSION_TABLE}")).scalar():
        conn.execute(sa.text(f"DROP TABLE {_SHARED_VERSION_TABLE}"))
    return SchemaState(state.revision, state.head)


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
    meanwhile is checked instead of migrated. A revision an earlier Nightshift kept in
    ``alembic_version`` is moved to ``VERSION_TABLE`` first, in the same transaction.

    Raises:
        DatabaseError: the schema is newer than this Nightshift, or not Nightshift's.
    """
    with _locked(engine) as conn:
        state = schema_state(conn)
        was = state.revision
        if state.revision is not None and (only_if_empty or state.revision not in known_revisions()):
            return _settle(conn, state, url)
        if state.in_shared_table:
            state = _move_revision(conn, state, url)
        target = state.head if to == "head" else to
        if state.revision == target:
            return replace(state, was=was)
        from alembic import command

        cfg = _config(conn)
        if state.legacy:
            logger.info("stamping pre-migration database %s as revision %s", _shown(url), _LEGACY_REVISION)
            command.stamp(cfg, _LEGACY_REVISION)
        logger.info("migrating %s from %s to %s", _shown(url), state.revision or "empty", target)
        command.upgrade(cfg, target)
        return SchemaState(target, state.head, was=was)


def _shown(url: URL) -> str:
    from tuner.db.url import redact  # (database imports this module)

    return redact(url)


def _db_arg(url: URL) -> str:
    if url.get_backend_name() == "sqlite" and url.database:
        return url.database
    return _shown(url)
