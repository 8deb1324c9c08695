"""Records keyed without the job; the scheduled program's structural hash.

- records.program_hash (nullable): structural hash of the scheduled program, so a program
  reached from different knobs is measured once. Existing records get NULL (their programs
  are not rebuilt here: that needs TVM and the search space of each workload);
- records.record_key becomes sha256 of (workload, device, point), without the job: a
  candidate measured by one job is the same record for every later job. Where earlier jobs
  measured the same point more than once, the oldest record takes the new key and the
  others keep their schema-2 key (they stay as measurements; none is deleted);
- index ix_records_program on (workload_id, device_id, program_hash) for the "what has been
  measured here" queries.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from tuner.db.keys import record_key, record_key_v2

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_BATCH = 5000

_records = sa.table(
    "records", sa.column("id", sa.Integer), sa.column("workload_id", sa.Integer),
    sa.column("device_id", sa.Integer), sa.column("job_id", sa.Integer),
    sa.column("point", sa.Text), sa.column("record_key", sa.String),
)  # fmt: skip


def upgrade() -> None:
    """Add the column and index, then re-key existing records without their job."""
    op.add_column("records", sa.Column("program_hash", sa.String(64), nullable=True))
    op.create_index("ix_records_program", "records", ["workload_id", "device_id", "program_hash"])
    conn = op.get_bind()
    pairs = conn.execute(sa.select(_records.c.workload_id, _records.c.device_id).distinct()).all()
    # One (workload, device) at a time: the set of keys already given out stays as small as
    # the records of one workload on one device, however large the database.
    for wid, did in pairs:
        taken: set[str] = set()
        for rows in _pages(conn, wid, did):
            updates = []
            for r in rows:
                key = record_key(wid, did, r.point)
                if key not in taken:  # the oldest record of a point takes its new key
                    taken.add(key)
                    updates.append({"rid": r.id, "rkey": key})
            if updates:
                conn.execute(
                    _records.update().where(_records.c.id == sa.bindparam("rid")).values(
                        record_key=sa.bindparam("rkey")), updates)  # fmt: skip
    op.execute("UPDATE nightshift_meta SET value = '3' WHERE key = 'schema_version'")


def downgrade() -> None:
    """Back to schema 2: program hashes are lost, records get their job-keyed key again."""
    op.drop_index("ix_records_program", table_name="records")
    with op.batch_alter_table("records") as batch:
        batch.drop_column("program_hash")
    conn = op.get_bind()
    last = 0
    while True:
        rows = conn.execute(
            sa.select(_records.c.id, _records.c.workload_id, _records.c.device_id, _records.c.job_id, _records.c.point)
            .where(_records.c.id > last).order_by(_records.c.id).limit(_BATCH)
        ).all()
        if not rows:
            break
        conn.execute(
            _records.update().where(_records.c.id == sa.bindparam("rid")).values(record_key=sa.bindparam("rkey")),
            [{"rid": r.id, "rkey": record_key_v2(r.workload_id, r.device_id, r.job_id, r.point)} for r in rows],
        )
        last = rows[-1].id
    op.execute("UPDATE nightshift_meta SET value = '2' WHERE key = 'schema_version'")


def _pages(conn: sa.Connection, wid: int, did: int):
    """The records of one workload on one device, oldest first, a page at a time."""
    last = 0
    while True:
        rows = conn.execute(
            sa.select(_records.c.id, _records.c.point)
            .where(_records.c.workload_id == wid, _records.c.device_id == did, _records.c.id > last)
            .order_by(_records.c.id).limit(_BATCH)
        ).all()
        if not rows:
            return
        yield rows
        last = rows[-1].id
