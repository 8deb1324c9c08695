"""Alembic environment: migrate on the connection Nightshift hands over, inside its transaction."""

from __future__ import annotations

from alembic import context

from tuner.db.migrate import VERSION_TABLE
from tuner.db.schema import Base

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    # SQLite cannot ALTER constraints; batch mode rebuilds the table instead.
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
    # Not alembic_version: that one is Optuna's, whose studies share the database.
    version_table=VERSION_TABLE,
)
with context.begin_transaction():
    context.run_migrations()
