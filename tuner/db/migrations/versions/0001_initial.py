"""The first schema (Nightshift 0.1, before migrations): created by create_all then.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the schema exactly as Nightshift 0.1's create_all did."""
    op.create_table(
        "nightshift_meta",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.Text(), nullable=False),
    )
    op.create_table(
        "devices",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("fingerprint", sa.String(32), nullable=False, unique=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("arch", sa.String(64), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    op.create_index("ix_devices_arch", "devices", ["arch"])
    op.create_table(
        "workloads",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("key", sa.String(64), nullable=False, unique=True),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("flops", sa.Float(), nullable=False),
        sa.Column("workload_json", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("model", sa.String(512), nullable=False),
        sa.Column("device_id", sa.Integer(), sa.ForeignKey("devices.id"), nullable=False),
        sa.Column("config", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("trials_done", sa.Integer(), nullable=False),
        sa.Column("trials_total", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
    )
    op.create_table(
        "records",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("workload_id", sa.Integer(), sa.ForeignKey("workloads.id"), nullable=False),
        sa.Column("device_id", sa.Integer(), sa.ForeignKey("devices.id"), nullable=False),
        sa.Column("job_id", sa.Integer(), sa.ForeignKey("jobs.id"), nullable=True),
        sa.Column("point", sa.Text(), nullable=False),
        sa.Column("record_json", sa.Text(), nullable=False),
        sa.Column("run_secs", sa.Text(), nullable=False),
        sa.Column("mean_sec", sa.Float(), nullable=True),
        sa.Column("error_class", sa.String(32), nullable=True),
        sa.Column("error_msg", sa.Text(), nullable=True),
        sa.Column("build_sec", sa.Float(), nullable=True),
        sa.Column("tvm_version", sa.String(32), nullable=False),
        sa.Column("host", sa.String(256), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.UniqueConstraint("workload_id", "device_id", "point", "job_id", name="uq_record_point"),
    )
    op.create_index("ix_records_best", "records", ["workload_id", "device_id", "mean_sec"])
    op.create_table(
        "cost_models",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("device_id", sa.Integer(), sa.ForeignKey("devices.id"), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("format", sa.String(16), nullable=False),
        sa.Column("num_samples", sa.Integer(), nullable=False),
        sa.Column("blob", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    op.bulk_insert(
        sa.table("nightshift_meta", sa.column("key", sa.String), sa.column("value", sa.Text)),
        [{"key": "schema_version", "value": "1"}],
    )


def downgrade() -> None:
    """Drop every table."""
    for table in ("cost_models", "records", "jobs", "workloads", "devices", "nightshift_meta"):
        op.drop_table(table)
