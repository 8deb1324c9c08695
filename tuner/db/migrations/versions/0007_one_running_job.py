"""One running job per name and device.

- ux_jobs_running: a unique index on jobs (name, device_id) over rows whose state is
  ``running``, so that two processes starting ``tune --job X`` at once cannot both insert a
  running row (a unique index, not a check in the code: only the database sees both inserts).
  Rows without a name (jobs older than schema 4, library use) are not constrained.

Databases used before this schema may already hold several running rows of one name (the
race this closes): the newest stays running, the others become ``stopped`` (resumable;
their records are kept).

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_RUNNING = "state = 'running'"


def upgrade() -> None:
    """Stop all but the newest running row of each name and device, then add the index."""
    op.execute(
        "UPDATE jobs SET state = 'stopped' WHERE state = 'running' AND name IS NOT NULL AND id < "
        "(SELECT max(j.id) FROM jobs j WHERE j.state = 'running' AND j.name = jobs.name "
        "AND j.device_id = jobs.device_id)"
    )
    op.create_index("ux_jobs_running", "jobs", ["name", "device_id"], unique=True,
                    sqlite_where=sa.text(_RUNNING), postgresql_where=sa.text(_RUNNING))  # fmt: skip
    op.execute("UPDATE nightshift_meta SET value = '7' WHERE key = 'schema_version'")


def downgrade() -> None:
    """Back to schema 6: nothing stops a second running row."""
    op.drop_index("ux_jobs_running", table_name="jobs")
    op.execute("UPDATE nightshift_meta SET value = '6' WHERE key = 'schema_version'")
