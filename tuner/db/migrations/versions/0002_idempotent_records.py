"""Idempotent record writes, readable workloads, job hosts.

- records.record_key: sha256 of (workload, device, job, point), unique, replaces the
  uq_record_point constraint (which put the unbounded point text into a btree index and did
  not stop duplicates of records without a job, since NULLs never compare equal);
- records.run_wall_sec, index on records.job_id; the best-record index becomes a partial
  index of successful records in lookup order;
- workloads.summary and workloads.tvm_version; jobs.host and jobs.tvm_version.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from tuner.db.keys import record_key_v2

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_BATCH = 5000


def upgrade() -> None:
    """Add the columns, fill record keys of existing records, swap the unique constraint."""
    with op.batch_alter_table("workloads") as batch:
        batch.add_column(sa.Column("summary", sa.Text(), nullable=True))
        batch.add_column(sa.Column("tvm_version", sa.String(32), nullable=True))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("host", sa.String(256), nullable=True))
        batch.add_column(sa.Column("tvm_version", sa.String(32), nullable=True))
    with op.batch_alter_table("records") as batch:
        batch.add_column(sa.Column("record_key", sa.String(64), nullable=True))
        batch.add_column(sa.Column("run_wall_sec", sa.Float(), nullable=True))

    conn = op.get_bind()
    records = sa.table(
        "records", sa.column("id", sa.Integer), sa.column("workload_id", sa.Integer),
        sa.column("device_id", sa.Integer), sa.column("job_id", sa.Integer),
        sa.column("point", sa.Text), sa.column("record_key", sa.String),
    )  # fmt: skip
    last = 0
    while True:
        rows = conn.execute(
            sa.select(records.c.id, records.c.workload_id, records.c.device_id, records.c.job_id, records.c.point)
            .where(records.c.id > last).order_by(records.c.id).limit(_BATCH)
        ).all()
        if not rows:
            break
        conn.execute(
            records.update().where(records.c.id == sa.bindparam("rid")).values(record_key=sa.bindparam("rkey")),
            [{"rid": r.id, "rkey": record_key_v2(r.workload_id, r.device_id, r.job_id, r.point)} for r in rows],
        )
        last = rows[-1].id

    with op.batch_alter_table("records") as batch:
        batch.drop_constraint("uq_record_point", type_="unique")
        batch.alter_column("record_key", existing_type=sa.String(64), nullable=False)
        batch.create_unique_constraint("uq_records_record_key", ["record_key"])
        batch.create_index("ix_records_job", ["job_id"])
    # Replaced by a partial index in lookup order (see schema.RecordRow).
    op.drop_index("ix_records_best", table_name="records")
    ok = sa.text("error_class IS NULL AND mean_sec IS NOT NULL")
    op.create_index("ix_records_best_ok", "records", ["workload_id", "device_id", "mean_sec", "id"],
                    sqlite_where=ok, postgresql_where=ok)  # fmt: skip
    op.execute("UPDATE nightshift_meta SET value = '2' WHERE key = 'schema_version'")


def downgrade() -> None:
    """Back to the first schema (record keys and the new columns are lost)."""
    op.drop_index("ix_records_best_ok", table_name="records")
    op.create_index("ix_records_best", "records", ["workload_id", "device_id", "mean_sec"])
    with op.batch_alter_table("records") as batch:
        batch.drop_index("ix_records_job")
        batch.drop_constraint("uq_records_record_key", type_="unique")
        batch.drop_column("run_wall_sec")
        batch.drop_column("record_key")
        batch.create_unique_constraint("uq_record_point", ["workload_id", "device_id", "point", "job_id"])
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("tvm_version")
        batch.drop_column("host")
    with op.batch_alter_table("workloads") as batch:
        batch.drop_column("tvm_version")
        batch.drop_column("summary")
    op.execute("UPDATE nightshift_meta SET value = '1' WHERE key = 'schema_version'")
