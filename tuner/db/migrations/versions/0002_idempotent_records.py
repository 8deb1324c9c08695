"""Idempotent record writes, readable workloads, job hosts.

- records.record_key: sha256 of (workload, device, job, point), unique, replaces the
  uq_record_point constraint (which put the unbounded point text into a btree index and did
  not stop duplicates of records without a job, since NULLs never compare equal); such
  duplicates are removed first, keeping one record of each;
- records.run_wall_sec, index on records.job_id; the best-record index becomes a partial
  index of successful records in lookup order;
- workloads.summary and workloads.tvm_version; jobs.host and jobs.tvm_version.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from alembic import op

from tuner.db.keys import record_key_v2

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_BATCH = 5000

logger = logging.getLogger(__name__)


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
    removed = _drop_duplicates(conn)
    if removed:
        logger.warning("schema 0002: removed %d duplicate records (same workload, device, point, no job)", removed)

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


def _drop_duplicates(conn: sa.Connection) -> int:
    """Delete the records that would break the new unique key; return how many.

    Schema 0001's unique key let the same point of a workload and device be stored again
    whenever the job was NULL (NULLs never compare equal): imports and compile-time commits
    applied twice. Of each such group one record stays: the oldest successful one, else the
    oldest that is not a lost measurement, else the oldest.
    """
    records = sa.table("records", sa.column("id", sa.Integer), sa.column("record_key", sa.String),
                       sa.column("mean_sec", sa.Float), sa.column("error_class", sa.String))  # fmt: skip
    dup_keys = conn.execute(
        sa.select(records.c.record_key).group_by(records.c.record_key).having(sa.func.count() > 1)
    ).scalars().all()
    removed = 0
    for key in dup_keys:
        group = conn.execute(sa.select(records.c.id, records.c.mean_sec, records.c.error_class)
                             .where(records.c.record_key == key).order_by(records.c.id)).all()  # fmt: skip
        keep = min(group, key=lambda r: (r.error_class is not None or r.mean_sec is None,
                                         r.error_class == "lost", r.id))  # fmt: skip
        doomed = [r.id for r in group if r.id != keep.id]
        conn.execute(records.delete().where(records.c.id.in_(doomed)))
        removed += len(doomed)
    return removed


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
