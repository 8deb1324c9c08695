"""Jobs get a name, a time budget, the time they have spent, and a heartbeat.

- jobs.name (indexed, nullable for older jobs): the identity a user resumes by
  (``tune --job NAME``); several rows may share a name only when earlier ones are finished;
- jobs.time_budget_sec (nullable: no time budget) and jobs.elapsed_sec (tuning time spent
  over every run of the job, so a resumed job spends only the budget left);
- jobs.heartbeat_at: written by a running job at least every minute; a "running" job whose
  heartbeat stopped is dead (killed, or its host lost), not running.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the columns and the name index."""
    # Plain ALTER TABLE, not batch mode: on SQLite a batch copy of `jobs` would drop the
    # table that records' foreign keys point at. Nullable or defaulted columns need no copy.
    op.add_column("jobs", sa.Column("name", sa.String(256), nullable=True))
    op.add_column("jobs", sa.Column("time_budget_sec", sa.Float, nullable=True))
    op.add_column("jobs", sa.Column("elapsed_sec", sa.Float, nullable=False, server_default="0"))
    op.add_column("jobs", sa.Column("heartbeat_at", sa.DateTime, nullable=True))
    op.create_index("ix_jobs_name", "jobs", ["name"])
    op.execute("UPDATE nightshift_meta SET value = '4' WHERE key = 'schema_version'")


def downgrade() -> None:
    """Back to schema 3: job names, budgets and heartbeats are lost."""
    op.drop_index("ix_jobs_name", table_name="jobs")
    # SQLite >= 3.35 drops columns in place (see upgrade for why not batch mode).
    for column in ("heartbeat_at", "elapsed_sec", "time_budget_sec", "name"):
        op.drop_column("jobs", column)
    op.execute("UPDATE nightshift_meta SET value = '3' WHERE key = 'schema_version'")
