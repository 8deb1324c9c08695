"""Provenance of every record, and device classes.

- records.os_user, records.nightshift_version: who wrote the record, beside the existing
  host, tvm_version and job_id;
- records.origin (``local``: measured by a Nightshift job or commit; ``import``: read from a
  MetaSchedule JSON database), records.source_file, source_device, source_tvm_version: for
  imports, the file and the device (target) and TVM version the records came from. Existing
  records are ``local`` (0.1 imports cannot be told apart);
- devices.device_class (indexed): devices of one machine type (kind, TVM target, CPU/GPU
  model), whose records are looked up together; filled for existing devices.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from tuner.db.keys import device_class

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_devices = sa.table("devices", sa.column("id", sa.Integer), sa.column("kind", sa.String),
                    sa.column("target", sa.Text), sa.column("description", sa.Text),
                    sa.column("device_class", sa.String))  # fmt: skip


def upgrade() -> None:
    """Add the columns (plain ALTER TABLE: no batch copy of tables others point at), fill classes."""
    op.add_column("records", sa.Column("os_user", sa.String(128), nullable=True))
    op.add_column("records", sa.Column("nightshift_version", sa.String(32), nullable=True))
    op.add_column("records", sa.Column("origin", sa.String(16), nullable=False, server_default="local"))
    op.add_column("records", sa.Column("source_file", sa.Text, nullable=True))
    op.add_column("records", sa.Column("source_device", sa.Text, nullable=True))
    op.add_column("records", sa.Column("source_tvm_version", sa.String(32), nullable=True))
    op.add_column("devices", sa.Column("device_class", sa.String(64), nullable=True))
    op.create_index("ix_devices_device_class", "devices", ["device_class"])
    conn = op.get_bind()
    rows = conn.execute(sa.select(_devices.c.id, _devices.c.kind, _devices.c.target, _devices.c.description)).all()
    if rows:
        conn.execute(
            _devices.update().where(_devices.c.id == sa.bindparam("did")).values(device_class=sa.bindparam("cls")),
            [{"did": r.id, "cls": device_class(r.kind, r.target, r.description)} for r in rows],
        )
    op.execute("UPDATE nightshift_meta SET value = '5' WHERE key = 'schema_version'")


def downgrade() -> None:
    """Back to schema 4: provenance and classes are lost."""
    op.drop_index("ix_devices_device_class", table_name="devices")
    op.drop_column("devices", "device_class")
    for column in ("source_tvm_version", "source_device", "source_file", "origin", "nightshift_version", "os_user"):
        op.drop_column("records", column)
    op.execute("UPDATE nightshift_meta SET value = '4' WHERE key = 'schema_version'")
