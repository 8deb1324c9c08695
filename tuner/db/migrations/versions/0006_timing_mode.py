"""The timing mode of every record.

- records.timing: ``warm`` (repeated calls on warm caches, what every record before this
  schema was) or ``cold`` (inputs and weights flushed from the CPU caches before each run).
  A warm time is lower than a cold one of the same program, so lookups never rank them
  together;
- ix_records_best_ok gains the column, between the device and the time, so that the best
  records of one mode are still one range of the index.

Record keys of warm records are unchanged (tuner.db.keys.record_key).

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_OK = "error_class IS NULL AND mean_sec IS NOT NULL"


def _best_index(*columns: str) -> None:
    op.create_index("ix_records_best_ok", "records", list(columns),
                    sqlite_where=sa.text(_OK), postgresql_where=sa.text(_OK))  # fmt: skip


def upgrade() -> None:
    """Add the column (existing records are warm) and rebuild the best-record index with it."""
    op.add_column("records", sa.Column("timing", sa.String(8), nullable=False, server_default="warm"))
    op.drop_index("ix_records_best_ok", table_name="records")
    _best_index("workload_id", "device_id", "timing", "mean_sec", "id")
    op.execute("UPDATE nightshift_meta SET value = '6' WHERE key = 'schema_version'")


def downgrade() -> None:
    """Back to schema 5: cold records go (schema 5 would rank them with warm ones)."""
    op.execute("DELETE FROM records WHERE timing <> 'warm'")
    op.drop_index("ix_records_best_ok", table_name="records")
    _best_index("workload_id", "device_id", "mean_sec", "id")
    op.drop_column("records", "timing")
    op.execute("UPDATE nightshift_meta SET value = '5' WHERE key = 'schema_version'")
